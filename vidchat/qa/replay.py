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
where at least ``scene_change_share`` of the picture differs from the scene's first frame;
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

This module is the library the command and the QA suites share: it plays a
file or re-asks a bundle on a :class:`ReplayHost` its caller brings (the
command's own, made by the app's ``qa_host`` module, or a server's), hands each
answer or failure to a callback and returns them as a :class:`SourceResult`,
and raises :class:`SettingsRefused` for settings no source could run with. It
never prints and never picks an exit status: the command line
(the app's ``qa_cli`` module) does both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator, Protocol, Sequence

import numpy as np

from vidchat.conversation.answers import Answer, AnswerOptions
from vidchat.conversation.bundles import MANIFEST, Bundle, is_bundle, read_bundle, write_bundle
from vidchat.conversation.host import EngineRole, Host
from vidchat.conversation.memory import write_captions
from vidchat.conversation.modes import DEFAULT_EVERY_S, SceneWatch
from vidchat.engine.interface import ChatEngine, EngineError, Turn
from vidchat.media import AUDIO_RATE
from vidchat.qa.commands import Changes, UsageError

if TYPE_CHECKING:
    import av.container

    from vidchat.conversation.conversation import Conversation
    from vidchat.media.session import Sample, Session

log = logging.getLogger("vidchat.qa.replay")

# Times closer than this are the same instant (float pts arithmetic).
EPS = 1e-6


class ReplayHost(Host, Protocol):
    """A :class:`~vidchat.conversation.host.Host` that also registers a
    session as its server would (its storage size, frame cap and memory
    budget: the server's AppState.new_session): replay and suites open
    one session per file or bundle through it."""

    def new_session(self, kind: str) -> Conversation: ...


class SettingsRefused(UsageError):
    """Settings no source could be asked with (out of range, or not for a
    bundle): the command line's usage error (exit status 2)."""


@dataclass(frozen=True)
class ReplayPlan:
    """What one replay asks and how: the command line's flags, or a suite case's."""

    asks: Sequence[tuple[float, str]] = ()  # (second of the file, question)
    every: Sequence[tuple[float, str]] = ()  # (period in seconds, question)
    watch: str | None = None  # watch mode's question
    watch_every: float = DEFAULT_EVERY_S
    no_history: bool = False  # each question alone, without the earlier ones
    changes: Changes = field(default_factory=lambda: Changes({}, {}))  # --set's, or a case's settings
    # The host's answer options when none of the app's answer flags is given
    # (--frames-as, --max-tokens, --temperature, --system-prompt): where the
    # host's answer_defaults() differ from them, a flag was given, and it
    # changes a bundle's recorded options (before ``changes``). None: no flag applies.
    flag_defaults: AnswerOptions | None = None
    out_dir: str | None = None  # where each answer's bundle goes (None: nowhere)
    model_option: str = ""  # the model as the command named it, for the bundles' manifests
    role: EngineRole = "main"  # which of the host's engines answers, looked up at each ask


@dataclass(frozen=True)
class Answered:
    """One answer, as replay's JSON line has it: t, question, answer, watch,
    the app's answer record, settings, source and bundle."""

    record: dict[str, Any]

    @property
    def t(self) -> float | None:
        t: float | None = self.record["t"]
        return t

    @property
    def question(self) -> str:
        return str(self.record["question"])


@dataclass(frozen=True)
class Failed:
    """A question that got no answer, and why."""

    t: float | None
    question: str
    reason: str
    watch: bool = False

    def as_dict(self) -> dict[str, Any]:
        """Replay's JSON line for it (``"watch"`` only when true)."""
        return {"t": self.t, "question": self.question, "error": self.reason, **({"watch": True} if self.watch else {})}


Outcome = Answered | Failed
Report = Callable[[Outcome], None]


def _ignore(outcome: Outcome) -> None:
    """The default report: the outcomes come back in the result only."""


@dataclass
class SourceResult:
    """What one file or bundle gave, in the order it gave it."""

    source: str
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(isinstance(o, Failed) for o in self.outcomes)


class _Outcomes:
    """A source's outcomes, each reported as it comes and kept for its result."""

    def __init__(self, source: str, report: Report) -> None:
        self.result, self._report = SourceResult(source), report

    def add(self, outcome: Outcome) -> None:
        self.result.outcomes.append(outcome)
        self._report(outcome)


def answer_record(answer: Answer, *, t: float | None, settings: dict[str, Any], source: str,
                  watch: bool = False) -> dict[str, Any]:
    """The JSON line: the question, the answer, and the app's answer record."""
    record: dict[str, Any] = {"t": t, "question": answer.question, "answer": answer.reply.text, "watch": watch}
    record.update(answer.summary())
    record["settings"] = {**settings, "seed": answer.options.seed}  # the seed it used, drawn when none was set
    record["source"] = source
    record["bundle"] = None
    return record


@contextlib.asynccontextmanager
async def replay_session(host: ReplayHost, why: str) -> AsyncIterator[Conversation]:
    """A "replay" session of the host's registry for one file or bundle,
    closed when the block ends however it ends (a setting the engine
    refuses, a clip that fails partway, a cancelled run). On a server it
    would otherwise stay registered for good: it counts against
    --max-sessions, holds its frames, and keeps a draining replica's
    /readyz from reaching zero sessions."""
    entry = host.new_session("replay")
    try:
        yield entry
    finally:
        await host.registry.close(entry.session.id, why)


# A video file played into a session on the file's own clock: when each
# question is due (:class:`Schedule`), the file's frames and audio as one
# stream of events in time order (:func:`media_events`, audio split at
# question times), and each event put into the session with watch mode's
# decision (:class:`Playback`). No wall clock decides anything, so every run
# feeds the session the same way.

# (seconds of the file, rank, "frame" | "audio", RGB frame or float32 mono 16 kHz samples);
# rank 0: a frame before audio of the same instant (ties in a fixed order).
MediaEvent = tuple[float, int, str, np.ndarray]


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


def _file_start(container: av.container.InputContainer) -> float:
    import av

    start = container.start_time
    return float(start / av.time_base) if start is not None else 0.0


def video_events(path: str) -> Iterator[MediaEvent]:
    """Every decoded video frame as RGB, at its presentation time."""
    import av

    with av.open(path) as container:
        if not container.streams.video:
            raise UsageError(f"{path} has no video stream")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"  # frame threads: faster, same pictures
        start = _file_start(container)
        rate = float(stream.average_rate) if stream.average_rate else 30.0
        last: float | None = None
        for frame in container.decode(stream):
            if frame.time is not None:
                t = frame.time - start
            else:  # no pts: continue at the stream's rate
                t = 0.0 if last is None else last + 1.0 / rate
            if t < -EPS:
                log.debug("skipping a video frame before the file's start (%.3f s)", t)
                continue
            last = t = max(t, 0.0)
            yield t, 0, "frame", frame.to_ndarray(format="rgb24")


def audio_events(path: str, schedule: Schedule) -> Iterator[MediaEvent]:
    """The audio track as float32 mono 16 kHz chunks, placed from the first
    frame's time on by sample count, split at question times."""
    import av

    with av.open(path) as container:
        if not container.streams.audio:
            return
        stream = container.streams.audio[0]
        start = _file_start(container)
        resampler = av.AudioResampler(format="flt", layout="mono", rate=AUDIO_RATE)
        origin = 0.0  # the first audio frame's time (set when it is decoded)
        count = 0  # samples placed so far

        def pieces(samples: np.ndarray) -> Iterator[MediaEvent]:
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

        decoded = False
        for frame in container.decode(stream):
            if not decoded:
                decoded = True
                origin = frame.time - start if frame.time is not None else 0.0
            for out in resampler.resample(frame):
                yield from pieces(out.to_ndarray().reshape(-1).astype(np.float32))
        if decoded:
            for out in resampler.resample(None):
                yield from pieces(out.to_ndarray().reshape(-1).astype(np.float32))


def media_events(path: str, schedule: Schedule) -> Iterator[MediaEvent]:
    """Video and audio of one file merged by time (each stream decoded on its
    own, so the file's interleaving does not matter)."""
    return heapq.merge(video_events(path), audio_events(path, schedule), key=lambda e: (e[0], e[1]))


class Playback:
    """One file's media into a session, event by event in time order, and
    watch mode's decision: after each frame, whether the scene changed (the
    session counts scene changes) and the watch question may be asked now,
    rate-limited on the file's clock, so it is the same on every run."""

    def __init__(self, session: Session, watch_every: float | None = None, name: str | None = None):
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

    def feed(self, t: float, kind: str, payload: np.ndarray) -> bool:
        """Put one event from :func:`media_events` into the session; True
        when the watch question is due at ``t`` (only ever after a frame)."""
        from vidchat.media.images import FrameError

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


class _Recorded(Protocol):
    """What a re-ask reads of a Bundle (vidchat.conversation.bundles), typed:
    its sample() has no annotations there yet."""

    def sample(self) -> Sample: ...


# Re-asking a recorded bundle: its exact frames, audio and chat history put
# to an engine again through the app's one answer path, with its recorded
# settings changed by the app's answer flags and --set. Frame selection is
# frozen (only ``num_sample_frames`` may pick fewer of the bundle's frames), so
# unchanged frames and audio give the bundle's own ``inputs_sha256``.

# Keys of the answer options the app also sets by flags (--temperature ...).
_ANSWER_FLAGS = ("frames_as", "max_tokens", "temperature", "system_prompt")


def _bundle_options(host: Host, plan: ReplayPlan, recorded: dict[str, Any]) -> AnswerOptions:
    """A bundle's recorded answer options, then the app's answer flags where
    given (not at their default: plan.flag_defaults), then --set."""
    names = {f.name for f in dataclasses.fields(AnswerOptions)}
    options = AnswerOptions(**{k: v for k, v in recorded.items() if k in names})
    flags: dict[str, Any] = {}
    if plan.flag_defaults is not None:
        given = host.answer_defaults()
        flags = {k: getattr(given, k) for k in _ANSWER_FLAGS if getattr(given, k) != getattr(plan.flag_defaults, k)}
    return options.updated(**{**flags, **plan.changes.answer})


async def reask_bundle(host: ReplayHost, plan: ReplayPlan, bundle: Bundle, report: Report = _ignore) -> SourceResult:
    """Re-ask one bundle on the host's engine of ``plan.role`` (as it is now);
    its answer or failure goes to ``report`` and into the result. Raises
    SettingsRefused for settings a bundle can't be asked with."""
    from vidchat.conversation import asking
    from vidchat.media.sampling import uniform_indices
    from vidchat.media.session import SessionSettings

    outcomes = _Outcomes(bundle.path, report)
    manifest = bundle.manifest
    recorded = dict(manifest.get("settings") or {})
    options = _bundle_options(host, plan, recorded)
    frozen = sorted(set(plan.changes.session) - {"num_sample_frames"})
    if frozen:
        raise SettingsRefused(f"a bundle's frames are fixed: {', '.join(frozen)} cannot change "
                              "(num_sample_frames may pick fewer of them)")
    recording: _Recorded = bundle
    sample = recording.sample()
    n_frames = plan.changes.session.get("num_sample_frames")
    if n_frames is not None:
        if not isinstance(n_frames, int) or n_frames < 1:
            raise SettingsRefused(f"num_sample_frames must be a positive integer, got {n_frames!r}")
        sample = sample.frames_at(uniform_indices(len(sample.frames), n_frames))
    t = manifest.get("t")
    try:
        engine = await host.engine_for(plan.role)
    except EngineError as exc:
        outcomes.add(Failed(t, bundle.question, str(exc)))
        return outcomes.result
    try:
        asking.check_options(options, engine)
        engine.check_request(len(sample.frames), options.frames_as)
    except (ValueError, EngineError) as exc:
        raise SettingsRefused(str(exc)) from exc
    if bundle.digest() != bundle.inputs_sha256:
        log.warning("%s: its frames and audio hash to %s, not to the recorded inputs_sha256 %s (edited?)",
                    bundle.path, bundle.digest(), bundle.inputs_sha256)
    session_names = {f.name for f in dataclasses.fields(SessionSettings)}
    settings = {**{k: v for k, v in recorded.items() if k in session_names or k == "store_max_pixels"},
                **dataclasses.asdict(options)}
    if n_frames is not None:
        settings["num_sample_frames"] = n_frames
    history = [] if plan.no_history else bundle.history()
    # The app's one answer path, with the bundle's frozen sample in place of a buffer's.
    error = None
    done = None
    async with replay_session(host, "re-ask finished") as entry:
        try:
            done = await (await entry.ask(bundle.question, options, engine=engine, history=history, sample=sample,
                                          spoken=bundle.spoken, memory=bundle.memory)).finish()
        except EngineError as exc:
            error = str(exc)
    if done is not None:
        error = done.error
    if error or done is None:
        outcomes.add(Failed(t, bundle.question, error or "no answer"))
        return outcomes.result
    rec = answer_record(done.answer, t=t, settings=settings, source=str(bundle.path))
    rec["bundle_inputs_sha256"] = bundle.inputs_sha256
    if plan.out_dir:
        rec["bundle"] = str(write_bundle(plan.out_dir, done.answer, history=history, settings=settings, t=t,
                                         source=str(bundle.path), model_option=plan.model_option,
                                         engine_options=engine.options))
    outcomes.add(Answered(rec))
    return outcomes.result


def effective_settings(options: AnswerOptions, session_settings: Any,
                       store_max_pixels: int | None) -> dict[str, Any]:
    """Answer options and sampling settings, flat, under the names --set takes."""
    return {**dataclasses.asdict(options), **dataclasses.asdict(session_settings),
            "store_max_pixels": store_max_pixels}


class _FileAsker:
    """Asks one file's questions in turn through the conversation, each with
    the chat so far, and reports (and keeps) each answer or failure."""

    def __init__(self, host: ReplayHost, plan: ReplayPlan, talking: Conversation, options: AnswerOptions,
                 settings: dict[str, Any], path: str, playback: Playback, outcomes: _Outcomes) -> None:
        self.host, self.plan, self.talking, self.options = host, plan, talking, options
        self.settings, self.path, self.playback, self.outcomes = settings, path, playback, outcomes
        self.history: list[Turn] = []
        self.answer_s = 0.0  # seconds spent answering, apart from decoding and filtering

    def _failed(self, q: Question, reason: str) -> None:
        self.outcomes.add(Failed(q.at, q.text, reason, q.watch))

    async def ask(self, q: Question, at_end: bool = False) -> None:
        from vidchat.conversation import asking, runs

        plan, path = self.plan, self.path
        t0 = time.perf_counter()
        if at_end and not q.periodic:
            log.warning("question at %g s is past the end of the file (%.3f s): asked at the end", q.at,
                        self.playback.end)
        try:
            engine = await self.host.engine_for(plan.role)  # now: the engine may have restarted since the last ask
            memory = self.host.memory
            if memory is not None and self.talking.session.settings.memory:
                await write_captions(self.host, engine, self.talking, memory)  # what a live session had by now
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
        if plan.out_dir:
            rec["bundle"] = str(write_bundle(plan.out_dir, answer, history=self.history, settings=self.settings,
                                             t=q.at, source=path, model_option=plan.model_option,
                                             engine_options=engine.options))
        self.outcomes.add(Answered(rec))
        if not plan.no_history and answer.reply.text:
            self.history.extend([Turn("user", q.text), Turn("assistant", answer.reply.text)])


async def replay_file(host: ReplayHost, plan: ReplayPlan, path: str, report: Report = _ignore) -> SourceResult:
    """Play one file into a new session, asking each question when playback
    reaches it, on the host's engine of ``plan.role`` as it is at each ask;
    each answer or failure goes to ``report`` and into the result. Raises
    SettingsRefused for settings the engine refuses (they would be refused
    for every source)."""
    from vidchat.conversation import asking

    outcomes = _Outcomes(path, report)
    schedule = Schedule(plan.asks, plan.every)
    async with replay_session(host, "replay finished") as entry:
        session = entry.session
        playback = Playback(session, plan.watch_every if plan.watch else None, name=os.path.basename(path))
        options = host.answer_defaults().updated(**plan.changes.answer)
        try:
            engine: ChatEngine | None = await host.engine_for(plan.role)
            asking.apply_settings(session, engine, options, plan.changes.session)
        except ValueError as exc:  # OptionError included
            raise SettingsRefused(str(exc)) from exc
        except EngineError as exc:  # down for good: each question fails, saying why
            for at, text in plan.asks:
                outcomes.add(Failed(at, text, str(exc)))
            return outcomes.result
        settings = effective_settings(options, session.settings, session.store_max_pixels)
        asker = _FileAsker(host, plan, entry, options, settings, path, playback, outcomes)
        await _play(plan, path, schedule, playback, asker)
    return outcomes.result


async def _play(plan: ReplayPlan, path: str, schedule: Schedule, playback: Playback, asker: _FileAsker) -> None:
    """The file, decoded into the session, each question asked when playback reaches it."""
    t_start = time.perf_counter()
    for t, _, kind, payload in media_events(path, schedule):
        # Playback has reached T: what starts at T or later is for later questions.
        while (q := schedule.peek()) is not None and q.at <= t + EPS:
            await asker.ask(schedule.pop())
        # Watch mode: asked at the frame that (after the pause) shows the changed scene.
        if playback.feed(t, kind, payload) and plan.watch is not None:
            await asker.ask(Question(t, plan.watch, watch=True))
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


Source = Bundle | str  # a bundle to re-ask, or a video file's path


def find_sources(paths: Sequence[str]) -> list[Source]:
    """Each argument's bundle, or its file's path; a folder of bundles gives
    each of its bundles, in name order. Bundles are read now, so a broken one
    is reported before the engine starts (raises UsageError or BundleError)."""
    found: list[Source] = []
    for path in paths:
        if is_bundle(path):
            found.append(read_bundle(path))
        elif os.path.isdir(path):
            inner = sorted(p for p in Path(path).iterdir()
                           if not p.name.startswith(".") and (p / MANIFEST).is_file())
            if not inner:
                raise UsageError(f"{path} is a folder with no bundles in it")
            found.extend(read_bundle(p) for p in inner)
        elif os.path.isfile(path):
            found.append(path)
        else:
            raise UsageError(f"no such file: {path}")
    return found


async def replay_sources(host: ReplayHost, plan: ReplayPlan, sources: Sequence[Source],
                         report: Report = _ignore) -> list[SourceResult]:
    """Every source in turn on ``host``, each file or bundle in a session of
    its own; raises SettingsRefused at the first source whose settings are
    refused (the same settings would be refused for the rest too)."""
    results = []
    for source in sources:
        if isinstance(source, Bundle):
            results.append(await reask_bundle(host, plan, source, report))
        else:
            results.append(await replay_file(host, plan, source, report))
    return results
