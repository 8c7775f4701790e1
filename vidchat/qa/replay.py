"""Replay a video file through vidchat's pipeline, headless and deterministic,
or re-ask a recorded bundle.

Examples::

    python -m vidchat.replay clip.mp4 --model tiny --ask "2:What is happening?" --ask "5:And now?"
    python -m vidchat.replay clip.mp4 --every 2 "Describe the scene." --json --set temperature=0
    python -m vidchat.replay clip.mp4 --ask "3:What moved?" --out bundles/
    python -m vidchat.replay clip.mp4 --watch "What changed?" --watch-every 5 --json
    python -m vidchat.replay bundles/0001-t3.0 --set frames_as=video --json
    python -m vidchat.replay bundles/ --set temperature=0 --model /models/other   # every bundle in a folder

A file is decoded with PyAV. Every video frame goes, as RGB with the file's
own presentation time in seconds, into a session made exactly as the server
makes sessions (the same filter, buffer size, sampling and stored frame size,
from the same options), and the audio goes in resampled to 16 kHz mono,
placed by its presentation time. Nothing is paced: the file plays as fast as
the machine decodes it. When playback reaches a question's second T (every
frame before T is in, and the audio up to T, split there; a frame at exactly
T counts for the next question, as with ``vidchat.qa.client --fast``) the
question is asked through the app's one answer path (:func:`vidchat.conversation.asking.ask`)
and its answer awaited before playback goes on. No wall-clock time decides
anything, so two runs with the same file and options send the engine the same
frames and audio (identical ``frame_times`` and ``inputs_sha256``) and, at
temperature 0, get the same answer text. The session's timeline starts at the
file's start, so ``frame_times`` and ``audio_span`` are seconds of the file,
within [0, T], and ``frame_source_times``/``audio_source_span`` (the file
positions the page's file source also records) equal them. A question at 0 s
therefore has no frame and fails.

Questions are asked in time order; by default each one carries the earlier
questions and answers as its chat history, as the page does (``--no-history``
asks each alone). A question past the end of the file is asked at the end;
``--every`` stops with the file. Sampled answers (temperature > 0) repeat
only with a fixed seed (``--set seed=1``).

Watch mode (``--watch QUESTION``, with or without --ask/--every) asks
QUESTION whenever the session's filter counts a scene change (a kept frame
where at least ``vidchat.media.frame_buffer.SCENE_CHANGE_SHARE`` of the picture changed;
:class:`vidchat.conversation.modes.SceneWatch`), at most once every ``--watch-every``
seconds of the file (default ``vidchat.conversation.modes.DEFAULT_EVERY_S``); changes
during that pause are asked about once, at the first frame after it. The
rate limit runs on the file's clock, not the wall clock, so the same file
gives the same watch questions on every run. A watch question is asked
right after the frame that triggered it is in (that frame is the newest the
model gets; the audio is what has been fed by then), its ``t`` is that
frame's time, and its record says ``"watch": true`` (false for the others).

A bundle (a folder or zip written by ``--out`` or the server's
``--record-dir``, layout in :mod:`vidchat.conversation.bundles`; or a folder of bundles,
each in turn) is re-asked (:mod:`vidchat.qa.replay`) with its exact frames, audio and chat history: its
recorded settings, changed by ``--set`` (and by the app's answer flags given
explicitly), on its recorded model unless ``--model`` names another. Frame
selection is frozen; only ``num_sample_frames`` may pick fewer of the
bundle's frames. With frames and audio unchanged the answer's
``inputs_sha256`` equals the bundle's (``frames_as``, sampling and prompt
settings do not change it). Several sources may be given; one engine serves
them all, each file in its own session.

Output: one line per answer on stdout (``--json``: one JSON object per line
with t, question, answer, frame_times, frame_indices, audio_seconds,
audio_span, inputs_sha256, prompt_tokens, ttft_ms, settings, prompt, model,
seed, bundle, ...; a failed question prints {"t", "question", "error"}).
Logs and errors go to stderr, quiet unless ``-v``. Exit status: 0 all
answered, 1 a question failed (the reason on stderr) or the engine did not
start, 2 bad usage (no such file, malformed --ask/--set, a setting out of
range).

Nothing is written to disk unless ``--out`` (or ``--record-dir``) is given.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import heapq
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterator, Sequence, TextIO

import numpy as np

from vidchat.app.models import resolve_settings as resolve  # noqa: F401 (replay's and suites' name for it)
from vidchat.conversation.modes import SceneWatch
from vidchat.media import AUDIO_RATE
from vidchat.qa.commands import Changes, UsageError, build_parser, parse_every, parse_sets, parse_watch

# What one replay run carries (its command line, the app's settings, --set's
# changes, where bundles go) and how its answers come out: one line per answer
# on stdout, text or JSON, and each failure on stderr. File replay, bundle
# re-asks and QA suites (which keep the records instead of printing them)
# share it.

# Exit statuses: a setting out of range would be refused for every source, so
# USAGE stops the run; FAILED lets the other sources go on.
USAGE = 2

FAILED = 1


def answer_record(answer, *, t: float | None, settings: dict[str, Any], source: str,
                  watch: bool = False) -> dict[str, Any]:
    """The JSON line: the question, the answer, and the app's answer record."""
    record: dict[str, Any] = {"t": t, "question": answer.question, "answer": answer.reply.text, "watch": watch}
    record.update(answer.summary())
    record["settings"] = {**settings, "seed": answer.options.seed}  # the seed it used, drawn when none was set
    record["source"] = source
    record["bundle"] = None
    return record


class Output:
    def __init__(self, stream: TextIO, as_json: bool):
        self.stream, self.as_json = stream, as_json

    def answer(self, rec: dict[str, Any]) -> None:
        if self.as_json:
            self._line(json.dumps(rec, ensure_ascii=False))
            return
        when = "" if rec["t"] is None else f"[{rec['t']:g} s] "
        if rec.get("watch"):
            when += "(scene change) "
        times = rec.get("frame_times") or []
        if len(times) == 1:
            parts = [f"1 frame at {times[0]:g} s"]
        else:
            parts = [f"{len(times)} frames {times[0]:g}–{times[-1]:g} s" if times else "no frames"]
        if rec.get("frames_as") == "video":
            parts[0] += " as video"
        if rec.get("audio_seconds"):
            parts.append(f"{rec['audio_seconds']:.2f} s audio")
        parts.append(f"{rec.get('prompt_tokens')} prompt tokens")
        if rec.get("ttft_ms") is not None:
            parts.append(f"first token {rec['ttft_ms']:.0f} ms")
        parts.append(f"inputs {rec.get('inputs_sha256', '')[:16]}")
        if rec.get("bundle"):
            parts.append(f"bundle {rec['bundle']}")
        self._line(f"{when}Q: {rec['question']}\nA: {rec['answer']}\n   ({', '.join(parts)})")

    def failure(self, t: float | None, question: str, reason: str, watch: bool = False) -> None:
        when = "" if t is None else f" at {t:g} s"
        print(f"vidchat.replay: {'watch ' if watch else ''}question{when} failed: {reason}", file=sys.stderr,
              flush=True)
        if self.as_json:
            rec = {"t": t, "question": question, "error": reason, **({"watch": True} if watch else {})}
            self._line(json.dumps(rec, ensure_ascii=False))

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)


@dataclass
class Run:
    args: argparse.Namespace
    settings: Any  # vidchat.app.settings.Settings
    model_option: str
    changes: Changes
    out_dir: str | None
    output: Output
    watch: str | None = None  # watch mode's question
    role: str = "main"  # which of the app's engines answers ("main" or "compare"), looked up at each ask


@contextlib.asynccontextmanager
async def replay_session(state: Any, why: str) -> AsyncIterator[Any]:
    """A "replay" session of the app's registry for one file or bundle,
    closed when the block ends however it ends (a setting the engine
    refuses, a clip that fails partway, a cancelled run). On a server it
    would otherwise stay registered for good: it counts against
    --max-sessions, holds its frames, and keeps a draining replica's
    /readyz from reaching zero sessions."""
    entry = state.new_session("replay")
    try:
        yield entry
    finally:
        await state.registry.close(entry.session.id, why)


# A video file played into a session on the file's own clock, for
# ``python -m vidchat.replay``: when each question is due (:class:`Schedule`),
# the file's frames and audio as one stream of events in time order
# (:func:`media_events`, audio split at question times), and each event put
# into the session with watch mode's decision (:class:`Playback`). No wall
# clock decides anything, so every run feeds the session the same way.

log = logging.getLogger("vidchat.qa.replay")

# Times closer than this are the same instant (float pts arithmetic).
EPS = 1e-6


@dataclass(frozen=True)
class Question:
    at: float  # seconds of the file
    text: str
    periodic: bool = False
    watch: bool = False  # asked by watch mode, on a scene change


class Schedule:
    """The questions in time order (ties: in the order given); --every ones
    come back at k×S, computed as k*S so the audio cuts land on the same times."""

    def __init__(self, asks: Sequence[tuple[float, str]], every: Sequence[tuple[float, str]]):
        self._heap: list[tuple[float, int, str, float, int]] = []
        for order, (at, text) in enumerate(asks):
            self._heap.append((at, order, text, 0.0, 0))
        for j, (period, text) in enumerate(every):
            self._heap.append((period, len(asks) + j, text, period, 1))
        heapq.heapify(self._heap)
        self._asks = sorted(at for at, _ in asks)
        self._periods = [period for period, _ in every]

    def peek(self) -> Question | None:
        if not self._heap:
            return None
        at, _, text, period, _ = self._heap[0]
        return Question(at, text, period > 0)

    def pop(self) -> Question:
        at, order, text, period, k = heapq.heappop(self._heap)
        if period > 0:
            heapq.heappush(self._heap, ((k + 1) * period, order, text, period, k + 1))
        return Question(at, text, period > 0)

    def stop_periodic(self) -> None:
        """Drop the --every questions (the file has ended); the others stay."""
        self._heap = [e for e in self._heap if e[3] == 0]
        heapq.heapify(self._heap)

    def cuts(self, start: float, end: float) -> list[float]:
        """Question times strictly inside (start, end): where an audio chunk is split."""
        found = [a for a in self._asks if start < a < end]
        for period in self._periods:
            k = math.floor(start / period) + 1
            while k * period < end:
                if k * period > start:
                    found.append(k * period)
                k += 1
        return sorted(set(found))


def _file_start(container) -> float:
    import av

    start = container.start_time
    return start / av.time_base if start is not None else 0.0


def video_events(path: str) -> Iterator[tuple]:
    """Every decoded video frame as RGB, at its presentation time."""
    import av

    with av.open(path) as container:
        if not container.streams.video:
            raise UsageError(f"{path} has no video stream")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"  # frame threads: faster, same pictures
        start = _file_start(container)
        rate = float(stream.average_rate) if stream.average_rate else 30.0
        last = None
        for frame in container.decode(stream):
            if frame.time is not None:
                t = frame.time - start
            else:  # no pts: continue at the stream's rate
                t = 0.0 if last is None else last + 1.0 / rate
            if t < -EPS:
                log.debug("skipping a video frame before the file's start (%.3f s)", t)
                continue
            last = t = max(t, 0.0)
            # rank 0: a frame before audio of the same instant (ties in a fixed order).
            yield t, 0, "frame", frame.to_ndarray(format="rgb24")


def audio_events(path: str, schedule: Schedule) -> Iterator[tuple]:
    """The audio track as float32 mono 16 kHz chunks, placed from the first
    frame's time on by sample count, split at question times."""
    import av

    with av.open(path) as container:
        if not container.streams.audio:
            return
        stream = container.streams.audio[0]
        start = _file_start(container)
        resampler = av.AudioResampler(format="flt", layout="mono", rate=AUDIO_RATE)
        origin: float | None = None
        count = 0  # samples placed so far

        def pieces(samples: np.ndarray) -> Iterator[tuple]:
            nonlocal count
            t0 = origin + count / AUDIO_RATE
            if t0 < 0:  # priming before the file's start
                skip = min(samples.size, math.ceil(-t0 * AUDIO_RATE - EPS))
                samples, count = samples[skip:], count + skip
                t0 = origin + count / AUDIO_RATE
            if samples.size == 0:
                return
            for cut in schedule.cuts(t0 + EPS, t0 + samples.size / AUDIO_RATE - EPS):
                k = round((cut - origin) * AUDIO_RATE) - count
                if 0 < k < samples.size:
                    yield origin + count / AUDIO_RATE, 1, "audio", samples[:k]
                    samples, count = samples[k:], count + k
            yield origin + count / AUDIO_RATE, 1, "audio", samples
            count += samples.size

        for frame in container.decode(stream):
            if origin is None:
                origin = frame.time - start if frame.time is not None else 0.0
            for out in resampler.resample(frame):
                yield from pieces(out.to_ndarray().reshape(-1).astype(np.float32))
        if origin is not None:
            for out in resampler.resample(None):
                yield from pieces(out.to_ndarray().reshape(-1).astype(np.float32))


def media_events(path: str, schedule: Schedule) -> Iterator[tuple]:
    """Video and audio of one file merged by time (each stream decoded on its
    own, so the file's interleaving does not matter)."""
    return heapq.merge(video_events(path), audio_events(path, schedule), key=lambda e: (e[0], e[1]))


class Playback:
    """One file's media into a session, event by event in time order, and
    watch mode's decision: after each frame, whether the scene changed (the
    session counts scene changes) and the watch question may be asked now,
    rate-limited on the file's clock, so it is the same on every run."""

    def __init__(self, session, watch_every: float | None = None, name: str | None = None):
        self.session = session
        # The file's start is the session timeline's start: answer records then
        # give frame and audio times in seconds of the file.
        session.timeline_start = 0.0
        # The timeline is the file's own clock, so its position is the identity:
        # records carry frame_source_times as the page's file source does.
        # Audio primed before the start may begin a fraction of a sample
        # before 0; until 0 the file is at its start.
        session.set_source("file", name, 0.0, playing=False, t=-math.inf)
        session.set_source("file", name, 0.0, playing=True, rate=1.0, t=0.0)
        self.watch = SceneWatch(session, watch_every) if watch_every is not None else None
        self.frames = self.bad_frames = 0
        self.end = 0.0  # seconds of media fed so far

    def feed(self, t: float, kind: str, payload) -> bool:
        """Put one event from :func:`media_events` into the session; True
        when the watch question is due at ``t`` (only ever after a frame)."""
        from vidchat.media.evs import FrameError

        if kind != "frame":
            self.end = max(self.end, t + payload.size / AUDIO_RATE)
            self.session.add_audio(payload, t)
            return False
        self.frames += 1
        self.end = max(self.end, t)
        try:
            self.session.add_frame(payload, t=t)
        except FrameError as exc:
            self.bad_frames += 1
            log.warning("frame at %.3f s dropped: %s", t, exc)
        return self.watch is not None and self.watch.due(t)


# Re-asking a recorded bundle: its exact frames, audio and chat history put
# to an engine again through the app's one answer path, with its recorded
# settings changed by --set and the app's answer flags. Frame selection is
# frozen (only ``num_sample_frames`` may pick fewer of the bundle's frames), so
# unchanged frames and audio give the bundle's own ``inputs_sha256``.

log = logging.getLogger("vidchat.qa.replay")

# Keys of the answer options the app also sets by flags (--temperature ...).
_ANSWER_FLAGS = ("frames_as", "max_tokens", "temperature", "system_prompt")


def _bundle_options(run: Run, recorded: dict[str, Any]) -> Any:
    """A bundle's recorded answer options, then the app's answer flags where
    given (not at their default), then --set."""
    from vidchat.app.settings import Settings
    from vidchat.conversation.answers import AnswerOptions

    names = {f.name for f in dataclasses.fields(AnswerOptions)}
    options = AnswerOptions(**{k: v for k, v in recorded.items() if k in names})
    defaults = Settings()
    flags = {k: getattr(run.settings, k) for k in _ANSWER_FLAGS if getattr(run.settings, k) != getattr(defaults, k)}
    if "system_prompt" in flags:
        flags["system_prompt"] = flags["system_prompt"] or None
    return options.updated(**flags, **run.changes.answer)


async def reask_bundle(run: Run, state: Any, bundle: Any) -> int:
    """Re-ask one bundle on the engine of ``run.role`` (as it is now) and
    print its answer; an exit status (0, FAILED or USAGE)."""
    from vidchat.conversation import asking
    from vidchat.engine import EngineError
    from vidchat.media.sampling import uniform_indices
    from vidchat.media.session import SessionSettings

    manifest = bundle.manifest
    recorded = dict(manifest.get("settings") or {})
    options = _bundle_options(run, recorded)
    frozen = sorted(set(run.changes.session) - {"num_sample_frames"})
    if frozen:
        print(f"vidchat.replay: a bundle's frames are fixed: {', '.join(frozen)} cannot change "
              "(num_sample_frames may pick fewer of them)", file=sys.stderr)
        return USAGE
    sample = bundle.sample()
    n_frames = run.changes.session.get("num_sample_frames")
    if n_frames is not None:
        if not isinstance(n_frames, int) or n_frames < 1:
            print(f"vidchat.replay: num_sample_frames must be a positive integer, got {n_frames!r}",
                  file=sys.stderr)
            return USAGE
        sample = sample.frames_at(uniform_indices(len(sample.frames), n_frames))
    try:
        engine = await state.engine_for(run.role)
    except EngineError as exc:
        run.output.failure(manifest.get("t"), bundle.question, str(exc))
        return FAILED
    try:
        asking.check_options(options, engine)
        engine.check_request(len(sample.frames), options.frames_as)
    except (ValueError, EngineError) as exc:
        print(f"vidchat.replay: {exc}", file=sys.stderr)
        return USAGE
    if bundle.digest() != bundle.inputs_sha256:
        log.warning("%s: its frames and audio hash to %s, not to the recorded inputs_sha256 %s (edited?)",
                    bundle.path, bundle.digest(), bundle.inputs_sha256)
    session_names = {f.name for f in dataclasses.fields(SessionSettings)}
    settings = {**{k: v for k, v in recorded.items() if k in session_names or k == "store_max_pixels"},
                **dataclasses.asdict(options)}
    if n_frames is not None:
        settings["num_sample_frames"] = n_frames
    history = [] if run.args.no_history else bundle.history()
    t = manifest.get("t")
    # The app's one answer path, with the bundle's frozen sample in place of a buffer's.
    error = None
    async with replay_session(state, "re-ask finished") as entry:
        try:
            done = await (await entry.ask(bundle.question, options, engine=engine, history=history, sample=sample,
                                          spoken=bundle.spoken)).finish()
        except EngineError as exc:
            done, error = None, str(exc)
    if done is not None:
        error = done.error
    if error:
        run.output.failure(t, bundle.question, error)
        return FAILED
    _say_reasked(run, engine, bundle, done.answer, settings, history, t)
    return 0


def _say_reasked(run: Run, engine, bundle, answer, settings: dict[str, Any], history: Any, t: float | None) -> None:
    """A re-asked bundle's line (and its own bundle with --out)."""
    rec = answer_record(answer, t=t, settings=settings, source=bundle.path)
    rec["bundle_inputs_sha256"] = bundle.inputs_sha256
    if run.out_dir:
        from vidchat.conversation.bundles import write_bundle

        rec["bundle"] = str(write_bundle(run.out_dir, answer, history=history, settings=settings, t=t,
                                         source=bundle.path, model_option=run.model_option,
                                         engine_options=engine.options))
    run.output.answer(rec)


# An engine for a tool without a server (replay, QA suites): an app state
# with a started engine (in-process, or a model served elsewhere with
# --engine-url), made as the server makes them. The model is resolved as
# app.py resolves it (vidchat.app.models.resolve_settings).

log = logging.getLogger("vidchat.qa")


async def start_engine(settings: Any, model_option: str, model_path: str, banner: str | None) -> tuple[Any, Any]:
    """An app state (its session registry) and a started engine (in-process,
    or --engine-url's), as the server makes them from ``settings``; raises EngineError."""
    from vidchat.app.engine_keeper import engine_options, open_engine
    from vidchat.app.state import AppState, default_session_settings
    from vidchat.conversation.registry import SessionRegistry

    state = AppState(settings=settings, model_path=model_path, banner=banner,
                     registry=SessionRegistry(settings.max_sessions, lambda: default_session_settings(settings)))
    state.engine_options = engine_options(settings, model_path, state.tiny)
    if banner:
        # Asked for by name it is no surprise; a fallback from 'auto' is.
        (log.info if model_option.startswith("tiny") else log.warning)(banner)
    engine = await open_engine(state)  # in-process, or a model served elsewhere (--engine-url)
    state.engine_settled(engine)
    log.info("engine ready in %.1f s", engine.start_s)
    return state, engine


log = logging.getLogger("vidchat.qa.replay")


def effective_settings(options, session_settings, store_max_pixels: int | None) -> dict[str, Any]:
    """Answer options and sampling settings, flat, under the names --set takes."""
    return {**dataclasses.asdict(options), **dataclasses.asdict(session_settings),
            "store_max_pixels": store_max_pixels}


class _FileAsker:
    """Asks one file's questions in turn through the conversation, each with
    the chat so far, and prints (and records) each answer or failure."""

    def __init__(self, run: Run, state: Any, talking, options, settings: dict[str, Any], path: str,
                 playback: Playback) -> None:
        from vidchat.engine import Turn

        self.run, self.state, self.talking, self.options = run, state, talking, options
        self.settings, self.path, self.playback = settings, path, playback
        self.history: list[Turn] = []
        self.failures = 0
        self.answer_s = 0.0  # seconds spent answering, apart from decoding and filtering

    def _failed(self, q: Question, reason: str) -> None:
        self.failures += 1
        self.run.output.failure(q.at, q.text, reason, q.watch)

    async def ask(self, q: Question, at_end: bool = False) -> None:
        from vidchat.conversation import asking, runs
        from vidchat.engine import EngineError, Turn

        run, path = self.run, self.path
        t0 = time.perf_counter()
        if at_end and not q.periodic:
            log.warning("question at %g s is past the end of the file (%.3f s): asked at the end", q.at,
                        self.playback.end)
        try:
            engine = await self.state.engine_for(run.role)  # now: the engine may have restarted since the last ask
            answer_run = await self.talking.ask(q.text, self.options, engine=engine, history=tuple(self.history))
            done = await answer_run.finish()
        except asking.NoFrames:
            self._failed(q, f"no video frame before {q.at:g} s of {path}")
            return
        except EngineError as exc:
            self._failed(q, str(exc))
            return
        finally:
            self.answer_s += time.perf_counter() - t0
        if done.error:
            self._failed(q, done.error)
            return
        answer = done.answer
        if done.status == runs.CANCELLED or answer.reply.stats.finish_reason == "abort":
            self._failed(q, "the answer was aborted")
            return
        rec = answer_record(answer, t=q.at, settings=self.settings, source=path, watch=q.watch)
        if run.out_dir:
            from vidchat.conversation.bundles import write_bundle

            rec["bundle"] = str(write_bundle(run.out_dir, answer, history=self.history, settings=self.settings,
                                             t=q.at, source=path, model_option=run.model_option,
                                             engine_options=engine.options))
        run.output.answer(rec)
        if not run.args.no_history and answer.reply.text:
            self.history.extend([Turn("user", q.text), Turn("assistant", answer.reply.text)])


async def replay_file(run: Run, state: Any, path: str) -> int:
    """Play one file into a new session, asking each question when playback
    reaches it, on the engine of ``run.role`` as it is at each ask."""
    from vidchat.conversation import asking
    from vidchat.engine import EngineError

    schedule = Schedule([(q.at, q.text) for q in run.args.ask], parse_every(run.args.every))
    async with replay_session(state, "replay finished") as entry:
        session = entry.session
        playback = Playback(session, run.args.watch_every if run.watch else None, name=os.path.basename(path))
        options = state.answer_defaults().updated(**run.changes.answer)
        try:
            asking.apply_settings(session, await state.engine_for(run.role), options, run.changes.session)
        except ValueError as exc:  # OptionError included
            print(f"vidchat.replay: {exc}", file=sys.stderr)
            return USAGE
        except EngineError as exc:  # down for good: each question fails, saying why
            for q in run.args.ask:
                run.output.failure(q.at, q.text, str(exc))
            return FAILED
        settings = effective_settings(options, session.settings, session.store_max_pixels)
        asker = _FileAsker(run, state, entry, options, settings, path, playback)
        await _play(run, path, schedule, playback, asker)
    return FAILED if asker.failures else 0


async def _play(run: Run, path: str, schedule: Schedule, playback: Playback, asker: _FileAsker) -> None:
    """The file, decoded into the session, each question asked when playback reaches it."""
    t_start = time.perf_counter()
    for t, _, kind, payload in media_events(path, schedule):
        # Playback has reached T: what starts at T or later is for later questions.
        while (q := schedule.peek()) is not None and q.at <= t + EPS:
            await asker.ask(schedule.pop())
        # Watch mode: asked at the frame that (after the pause) shows the changed scene.
        if playback.feed(t, kind, payload):
            await asker.ask(Question(t, run.watch, watch=True))
    feed_s = time.perf_counter() - t_start - asker.answer_s
    end = playback.end
    # Questions left: explicit ones past the end are asked at the end; periodic ones stop with the file.
    while (q := schedule.peek()) is not None:
        if q.periodic and q.at > end + EPS:
            schedule.stop_periodic()
            continue
        await asker.ask(schedule.pop(), at_end=q.at > end + EPS)
    stats = playback.session.stats
    wall = time.perf_counter() - t_start
    log.info("replayed %s: %d frames (%d kept, %d bad, %d scene changes) over %.2f s of media; decoding and "
             "filtering took %.2f s (%.1f× real time), answering %.2f s; %.2f s in all", path, playback.frames,
             stats["frames_kept"], playback.bad_frames, playback.session.scene_changes, end, feed_s,
             end / feed_s if feed_s > 0 else float("inf"), asker.answer_s, wall)


async def _run(run: Run, model_path: str, banner: str | None, sources: list[tuple[str, Any]]) -> int:
    from vidchat.engine import EngineError

    try:
        state, engine = await start_engine(run.settings, run.model_option, model_path, banner)
    except EngineError as exc:
        print(f"vidchat.replay: {exc}", file=sys.stderr)
        return FAILED
    status = 0
    try:
        for kind, source in sources:
            if kind == "bundle":
                code = await reask_bundle(run, state, source)
            else:
                code = await replay_file(run, state, source)
            if code == USAGE:
                return USAGE  # the same settings would be refused for the rest too
            status = status or code
        return status
    finally:
        await state.registry.close_all()
        engine.shutdown()


def _quiet(verbose: bool, level: str) -> None:
    logging.basicConfig(level=logging.INFO if verbose else level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    # vLLM logs to stdout by default: keep stdout for results.
    os.environ["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"
    if not verbose:
        from vidchat.app.logs import quiet_libraries

        quiet_libraries()


def find_sources(paths: Sequence[str], is_bundle, read_bundle) -> list[tuple[str, Any]]:
    """("bundle", Bundle) or ("file", path) for each argument; a folder of
    bundles gives each of its bundles, in name order. Bundles are read now,
    so a broken one is reported before the engine starts."""
    from pathlib import Path

    from vidchat.conversation.bundles import MANIFEST

    found: list[tuple[str, Any]] = []
    for path in paths:
        if is_bundle(path):
            found.append(("bundle", read_bundle(path)))
        elif os.path.isdir(path):
            inner = sorted(p for p in Path(path).iterdir()
                           if not p.name.startswith(".") and (p / MANIFEST).is_file())
            if not inner:
                raise UsageError(f"{path} is a folder with no bundles in it")
            found.extend(("bundle", read_bundle(p)) for p in inner)
        elif os.path.isfile(path):
            found.append(("file", path))
        else:
            raise UsageError(f"no such file: {path}")
    return found


def main(argv: Sequence[str] | None = None, stdout: TextIO | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from vidchat.app.settings import settings_from_args

    settings = settings_from_args(parser, args)
    _quiet(args.verbose, settings.log_level)

    from vidchat.conversation.bundles import BundleError, is_bundle, read_bundle
    from vidchat.engine import EngineError

    try:
        sources = find_sources(args.sources, is_bundle, read_bundle)
        files = [s for kind, s in sources if kind == "file"]
        watch = parse_watch(args.watch, args.watch_every)
        if files and not args.ask and not args.every and not watch:
            raise UsageError("nothing to ask: give --ask T:QUESTION, --every SECONDS QUESTION or --watch QUESTION")
        if not files and (args.ask or args.every or watch):
            raise UsageError("--ask, --every and --watch are for video files: a bundle re-asks its own question")
        parse_every(args.every)  # checked now; the schedule is built once the engine runs
        changes = parse_sets(args.set_)
        bundles = [s for kind, s in sources if kind == "bundle"]
        recorded = {b.manifest.get("model_option") or b.manifest.get("model") for b in bundles}
    except (UsageError, BundleError) as exc:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return USAGE

    # The model: as app.py resolves it; a bundle's own unless --model names another.
    model_option = settings.model
    if bundles and settings.model == "auto" and "VIDCHAT_MODEL" not in os.environ:
        if len(recorded) > 1:
            print(f"{parser.prog}: the bundles were recorded with different models ({', '.join(map(str, recorded))}):"
                  " name one with --model", file=sys.stderr)
            return USAGE
        model_option = recorded.pop() or "auto"
        settings = dataclasses.replace(settings, model=model_option)
    try:
        settings, model_path, banner = resolve(settings)
    except (EngineError, ValueError) as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return USAGE

    run = Run(args, settings, model_option, changes, args.out or settings.record_dir or None,
              Output(stdout or sys.stdout, args.json), watch)
    try:
        return asyncio.run(_run(run, model_path, banner, sources))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # the guard also keeps vLLM's spawned engine process from re-running main
    sys.exit(main())
