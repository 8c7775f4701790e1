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
question is asked through the app's one answer path (:func:`vidchat.conversation.answer_path.ask`)
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
:class:`vidchat.conversation.watch.SceneWatch`), at most once every ``--watch-every``
seconds of the file (default ``vidchat.conversation.watch.DEFAULT_EVERY_S``); changes
during that pause are asked about once, at the first frame after it. The
rate limit runs on the file's clock, not the wall clock, so the same file
gives the same watch questions on every run. A watch question is asked
right after the frame that triggered it is in (that frame is the newest the
model gets; the audio is what has been fed by then), its ``t`` is that
frame's time, and its record says ``"watch": true`` (false for the others).

A bundle (a folder or zip written by ``--out`` or the server's
``--record-dir``, layout in :mod:`vidchat.conversation.bundle_format`; or a folder of bundles,
each in turn) is re-asked (:mod:`vidchat.qa.reask`) with its exact frames, audio and chat history: its
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

import asyncio
import dataclasses
import logging
import os
import sys
import time
from typing import Any, Sequence, TextIO

from vidchat.qa.engine_start import resolve, start_engine
from vidchat.qa.playback import EPS, Playback, Question, Schedule, media_events
from vidchat.qa.reask import reask_bundle
from vidchat.qa.replay_options import UsageError, build_parser, parse_every, parse_sets, parse_watch
from vidchat.qa.replay_run import FAILED, USAGE, Output, Run, answer_record, replay_session

log = logging.getLogger("vidchat.qa.replay")


# ---------------------------------------------------------------------------
# A file, played into a session
# ---------------------------------------------------------------------------

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
        from vidchat import conversation
        from vidchat.conversation import answer_path
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
        except answer_path.NoFrames:
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
        if done.status == conversation.CANCELLED or answer.reply.stats.finish_reason == "abort":
            self._failed(q, "the answer was aborted")
            return
        rec = answer_record(answer, t=q.at, settings=self.settings, source=path, watch=q.watch)
        if run.out_dir:
            from vidchat.conversation.recording import write_bundle

            rec["bundle"] = str(write_bundle(run.out_dir, answer, history=self.history, settings=self.settings,
                                             t=q.at, source=path, model_option=run.model_option,
                                             engine_options=engine.options))
        run.output.answer(rec)
        if not run.args.no_history and answer.reply.text:
            self.history.extend([Turn("user", q.text), Turn("assistant", answer.reply.text)])


async def replay_file(run: Run, state: Any, path: str) -> int:
    """Play one file into a new session, asking each question when playback
    reaches it, on the engine of ``run.role`` as it is at each ask."""
    from vidchat.conversation import answer_path
    from vidchat.engine import EngineError

    schedule = Schedule([(q.at, q.text) for q in run.args.ask], parse_every(run.args.every))
    async with replay_session(state, "replay finished") as entry:
        session = entry.session
        playback = Playback(session, run.args.watch_every if run.watch else None, name=os.path.basename(path))
        options = state.answer_defaults().updated(**run.changes.answer)
        try:
            answer_path.apply_settings(session, await state.engine_for(run.role), options, run.changes.session)
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


# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------

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
        from vidchat.app.console import quiet_libraries

        quiet_libraries()


def find_sources(paths: Sequence[str], is_bundle, read_bundle) -> list[tuple[str, Any]]:
    """("bundle", Bundle) or ("file", path) for each argument; a folder of
    bundles gives each of its bundles, in name order. Bundles are read now,
    so a broken one is reported before the engine starts."""
    from pathlib import Path

    from vidchat.conversation.recording import MANIFEST

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

    from vidchat.engine import EngineError
    from vidchat.conversation.recording import BundleError, is_bundle, read_bundle

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
