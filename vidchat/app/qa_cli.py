"""The QA tools' command lines: ``vidchat replay`` (``python -m
vidchat.replay``), ``vidchat suite`` (``python -m vidchat.suite``) and
``vidchat client`` (``python -m vidchat.client``). Thin shells over the
library (vidchat.qa): each parses its flags, brings the host the library
asks on (vidchat.app.qa_host), prints what comes back and picks the exit
status. What each does is in its library module's docstring.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TextIO

from vidchat.app.settings import ENV_PREFIX, Settings, settings_from_args
from vidchat.app.settings import build_parser as app_parser
from vidchat.conversation.modes import DEFAULT_EVERY_S
from vidchat.media.frame_buffer import DEFAULT_SCENE_CHANGE_SHARE
from vidchat.qa.client import (
    DEFAULT_URL,
    FAST_FPS,
    ClientError,
    Event,
    Question,
    file_events,
    parse_ask,
    synthetic_events,
)
from vidchat.qa.commands import UsageError, parse_every, parse_sets, parse_watch
from vidchat.qa.replay import (
    Answered,
    Failed,
    Outcome,
    ReplayPlan,
    SettingsRefused,
    Source,
    find_sources,
    replay_sources,
)
from vidchat.qa.suite import AskResult, run_suite

log = logging.getLogger("vidchat.qa")

# Exit statuses: a setting out of range would be refused for every source, so
# USAGE stops the run; FAILED lets the other sources go on.
USAGE = 2
FAILED = 1
INTERRUPTED = 130  # Ctrl-C


def _quiet(verbose: bool, level: str) -> None:
    """Logs on stderr, quiet unless ``verbose``: stdout is for results."""
    logging.basicConfig(level=logging.INFO if verbose else level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    # vLLM logs to stdout by default: keep stdout for results.
    os.environ["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"
    if not verbose:
        from vidchat.app.logs import quiet_libraries

        quiet_libraries()


# ``vidchat replay``: vidchat.qa.replay on a host of its own.

def replay_parser() -> argparse.ArgumentParser:
    """The app's parser (every model, engine and session option) plus replay's own."""
    parser = app_parser()
    parser.prog = "python -m vidchat.replay"
    parser.description = (
        "Play a video file through vidchat's pipeline as fast as the machine allows, on the file's own "
        "timestamps, asking questions when playback reaches their second; or re-ask a recorded bundle.")
    parser.epilog = (
        "Exit status: 0 all answered, 1 a question failed or the engine did not start, 2 bad usage. "
        "The app's options apply as in app.py (--model tiny, --frames-per-question, --temperature ...). "
        f"Every app option can also be set by an environment variable {ENV_PREFIX}<OPTION>.")
    if ENV_PREFIX + "LOG_LEVEL" not in os.environ:
        parser.set_defaults(log_level="warning")  # quiet by default; results go to stdout
    g = parser.add_argument_group("replay")
    g.add_argument("sources", nargs="+", metavar="FILE|BUNDLE",
                   help="a video file (anything PyAV/FFmpeg reads), a bundle folder or zip to re-ask, or a folder "
                   "of bundles; several may be given")
    g.add_argument("--ask", action="append", type=parse_ask, default=[], metavar="T:QUESTION",
                   help="ask QUESTION when playback reaches second T of the file (repeatable)")
    g.add_argument("--every", nargs=2, action="append", default=[], metavar=("SECONDS", "QUESTION"),
                   help="ask QUESTION at SECONDS, 2×SECONDS, … until the file ends (repeatable)")
    g.add_argument("--watch", metavar="QUESTION", default=None,
                   help="watch mode: ask QUESTION whenever the filter sees a scene change (a kept frame where at "
                   f"least {DEFAULT_SCENE_CHANGE_SHARE * 100:g}%% of the picture differs from the scene's first "
                   "frame, --set scene_change_share=…), at most once every "
                   "--watch-every seconds of the file")
    g.add_argument("--watch-every", type=float, default=DEFAULT_EVERY_S, metavar="SECONDS",
                   help="with --watch: the fewest seconds of the file between two watch questions (changes in "
                   "between are asked about once, when the pause ends)")
    g.add_argument("--set", dest="set_", action="append", default=[], metavar="KEY=VALUE",
                   help="an answer or sampling setting, named as in the WebSocket session.config (temperature, "
                   "frames_as, max_tokens, seed, system_prompt, include_audio, num_sample_frames, sampling, "
                   "evs_threshold, …); VALUE is JSON (0.5, true, null, \"text\") or else plain text (repeatable)")
    g.add_argument("--json", action="store_true", help="print one JSON object per answer, one per line")
    g.add_argument("--out", metavar="DIR", default=None,
                   help="write each answer's recording bundle into a new folder under DIR (--record-dir does "
                   "the same); nothing is written to disk when neither is set")
    g.add_argument("--no-history", action="store_true",
                   help="ask each question alone, without the earlier questions and answers")
    g.add_argument("-v", "--verbose", action="store_true", help="log progress (and vLLM's own log) on stderr")
    return parser


class ReplayPrinter:
    """Each answer as it comes: a line of text (or JSON) on ``stream``; each
    failure on stderr (and, with --json, as a JSON line too)."""

    def __init__(self, stream: TextIO, as_json: bool):
        self.stream, self.as_json = stream, as_json

    def __call__(self, outcome: Outcome) -> None:
        if isinstance(outcome, Answered):
            self.answer(outcome.record)
        else:
            self.failure(outcome)

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

    def failure(self, failed: Failed) -> None:
        when = "" if failed.t is None else f" at {failed.t:g} s"
        print(f"vidchat.replay: {'watch ' if failed.watch else ''}question{when} failed: {failed.reason}",
              file=sys.stderr, flush=True)
        if self.as_json:
            self._line(json.dumps(failed.as_dict(), ensure_ascii=False))

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)


async def _replay(plan: ReplayPlan, settings: Settings, model_path: str, banner: str | None,
                  sources: list[Source], printer: ReplayPrinter) -> int:
    from vidchat.app.qa_host import close_host, start_host
    from vidchat.engine.interface import EngineError

    try:
        host = await start_host(settings, plan.model_option, model_path, banner)
    except EngineError as exc:
        print(f"vidchat.replay: {exc}", file=sys.stderr)
        return FAILED
    try:
        results = await replay_sources(host, plan, sources, printer)
    except SettingsRefused as exc:
        print(f"vidchat.replay: {exc}", file=sys.stderr)
        return USAGE
    finally:
        await close_host(host)
    return FAILED if any(r.failed for r in results) else 0


def replay_main(argv: Sequence[str] | None = None, stdout: TextIO | None = None) -> int:
    """``vidchat replay``'s exit status: 0 all answered, 1 a question failed or the
    engine did not start, 2 bad usage."""
    from vidchat.app.models import resolve_settings
    from vidchat.app.qa_host import flag_defaults
    from vidchat.conversation.bundles import Bundle, BundleError
    from vidchat.engine.interface import EngineError

    parser = replay_parser()
    args = parser.parse_args(argv)
    settings = settings_from_args(parser, args)
    _quiet(args.verbose, settings.log_level)
    try:
        sources = find_sources(args.sources)
        files = [s for s in sources if not isinstance(s, Bundle)]
        bundles = [s for s in sources if isinstance(s, Bundle)]
        watch = parse_watch(args.watch, args.watch_every)
        if files and not args.ask and not args.every and not watch:
            raise UsageError("nothing to ask: give --ask T:QUESTION, --every SECONDS QUESTION or --watch QUESTION")
        if not files and (args.ask or args.every or watch):
            raise UsageError("--ask, --every and --watch are for video files: a bundle re-asks its own question")
        every = parse_every(args.every)
        changes = parse_sets(args.set_)
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
        settings, model_path, banner = resolve_settings(settings)
    except (EngineError, ValueError) as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return USAGE

    plan = ReplayPlan(asks=[(q.at, q.text) for q in args.ask], every=every, watch=watch,
                      watch_every=args.watch_every, no_history=args.no_history, changes=changes,
                      flag_defaults=flag_defaults(), out_dir=args.out or settings.record_dir or None,
                      model_option=model_option)
    try:
        return asyncio.run(_replay(plan, settings, model_path, banner, sources,
                                   ReplayPrinter(stdout or sys.stdout, args.json)))
    except KeyboardInterrupt:
        return INTERRUPTED


# ``vidchat suite``: vidchat.qa.suite, each model on a host of its own.

SUITE_USAGE = ("    python -m vidchat.suite run SUITE [--model M]... [--engine-url URL]... [--out DIR] [--update-baseline] "
               "[--jobs N]\n"
               "    python -m vidchat.suite add SUITE BUNDLE [--name NAME] [--contains WORD]... [--same-as-baseline]")


def split_models(argv: list[str]) -> tuple[list[str], list[str]]:
    """The repeatable --model and --engine-url (each a model, named by its
    URL) out of the app's flags, where each is given once."""
    models, rest, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--model", "--engine-url") and i + 1 < len(argv):
            models.append(argv[i + 1])
            i += 2
            continue
        if arg.startswith(("--model=", "--engine-url=")):
            models.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
        i += 1
    return models, rest


def suite_run_parser() -> argparse.ArgumentParser:
    parser = app_parser()
    parser.prog = "python -m vidchat.suite run"
    parser.description = "Ask every case of a QA suite on every model; write results.json, junit.xml, report.html."
    parser.set_defaults(log_level="warning")
    g = parser.add_argument_group("suite")
    g.add_argument("suite", metavar="SUITE", help="the suite's folder (suite.toml at its root)")
    g.add_argument("--out", default=None, help="where the reports go (default SUITE/runs/<UTC time>/)")
    g.add_argument("--update-baseline", action="store_true", help="write this run's answers into SUITE/baseline.json")
    g.add_argument("--jobs", type=int, default=4, help="cases asked at once on a model (default 4)")
    g.add_argument("-v", "--verbose", action="store_true", help="log progress (and vLLM's own log) on stderr")
    return parser


def _progress(stream: TextIO) -> Callable[[AskResult], None]:
    """A line per ask on a terminal; nothing otherwise."""
    if not stream.isatty():
        return lambda result: None

    def say(result: AskResult) -> None:
        mark = {"passed": "✓", "failed": "✗", "error": "!"}[result.status]
        print(f"{mark} {result.model} · {result.case} #{result.ask}: {result.error or result.answer[:60]!r}",
              file=stream, flush=True)

    return say


def _suite_run(argv: list[str]) -> int:
    from vidchat.app.qa_host import flag_defaults, model_hosts
    from vidchat.conversation.suite_cases import BASELINE_FILE
    from vidchat.qa.suite_file import SuiteError, read_suite
    from vidchat.qa.suite_report import new_run_folder, prune_runs

    models, rest = split_models(argv)
    parser = suite_run_parser()
    args = parser.parse_args(rest)
    settings = settings_from_args(parser, args)
    _quiet(args.verbose, settings.log_level)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    try:
        suite = read_suite(args.suite)
    except SuiteError as exc:
        print(f"vidchat.suite: {exc}", file=sys.stderr)
        return USAGE
    out = Path(args.out) if args.out else new_run_folder(suite.root / "runs")
    report = run_suite(suite, models or [settings.model], model_hosts(settings), out, args.jobs,
                       args.update_baseline, _progress(sys.stderr), flag_defaults=flag_defaults())
    if not args.out:
        prune_runs(suite.root / "runs", settings.suite_keep_runs)
    s = report.summary
    print(f"suite {suite.name}: {s['passed']} passed, {s['failed']} failed, {s['errors']} errors "
          f"({len(report.results)} asks on {len(report.models)} model(s)); report: {out / 'report.html'}")
    if args.update_baseline:
        print(f"baseline written: {suite.root / BASELINE_FILE} (this run's answers, which its checks held to)")
    return 0 if report.ok else FAILED


def _suite_add(argv: list[str]) -> int:
    from vidchat.conversation.bundles import BundleError, read_bundle
    from vidchat.qa.suite_file import SuiteError, add_bundle

    parser = argparse.ArgumentParser(prog="python -m vidchat.suite add",
                                     description="Copy a recorded bundle into a suite as a case.")
    parser.add_argument("suite", metavar="SUITE")
    parser.add_argument("bundle", metavar="BUNDLE", help="a bundle folder or zip (the page's, a socket's or replay's)")
    parser.add_argument("--name", default=None, help="the case's name (default: the bundle's)")
    parser.add_argument("--contains", action="append", default=[], metavar="WORD",
                        help="expect the answer to contain WORD (repeatable)")
    parser.add_argument("--same-as-baseline", action="store_true", help="expect this model's baseline answer")
    parser.add_argument("--note", default="", help="a note kept with the case")
    args = parser.parse_args(argv)
    try:
        read_bundle(args.bundle)  # refused now, not at the next run
        case = add_bundle(args.suite, args.bundle, name=args.name, contains=args.contains,
                          same_as_baseline=args.same_as_baseline, note=args.note)
    except (SuiteError, BundleError, OSError, ValueError) as exc:  # ValueError: a note or name TOML can't hold
        print(f"vidchat.suite: {exc}", file=sys.stderr)
        return USAGE
    print(f"added case {case.name!r} ({case.bundle}) to {Path(args.suite) / 'suite.toml'}")
    return 0


def suite_main(argv: Sequence[str] | None = None) -> int:
    """``vidchat suite``'s exit status: 0 every check passed, 1 a check failed or an ask errored, 2 bad usage."""
    args = list(sys.argv[1:] if argv is None else argv)
    commands = {"run": _suite_run, "add": _suite_add}
    if not args or args[0] not in commands:
        print(SUITE_USAGE, file=sys.stderr)
        return USAGE
    return commands[args[0]](args[1:])


# ``vidchat client``: vidchat.qa.client's one session, printed as it goes.

def _media_of(args: argparse.Namespace) -> Iterator[Event]:
    """What this client sends: a synthetic clip, or a file's frames and audio."""
    with_audio = args.audio != "none"
    if args.synthetic:
        return synthetic_events(args.duration, args.fps, args.max_width, with_audio)
    if args.audio == "tone":
        log.warning("--audio tone is only for --synthetic; sending the file's own audio")
    return file_events(args.video, args.fps, args.max_width, with_audio)


def _session_config(args: argparse.Namespace) -> dict[str, Any]:
    """The session.config this client opens with, from its flags."""
    config: dict[str, Any] = {
        "type": "session.config",
        "model": args.model,
        "modalities": ["text"],
        "max_frames": args.max_frames,
        "num_sample_frames": args.num_frames,
        "evs_enabled": not args.no_evs,
        "evs_threshold": args.evs_threshold,
        "max_tokens": args.max_tokens,
    }
    for key in ("temperature", "frames_as", "sampling", "system_prompt"):
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    return config



class ClientPrinter:
    """Shows the server's messages: streamed answers on stdout, errors on stderr."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def asked(self, q: Question) -> None:
        if not self.as_json:
            print(f"\nQ [{q.at:.1f}s]: {q.text}", flush=True)

    def message(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if self.as_json:
            print(json.dumps(msg, ensure_ascii=False), flush=True)
            return
        if kind == "response.start":
            print("A: ", end="", flush=True)
        elif kind == "response.text.delta":
            print(msg.get("delta", ""), end="", flush=True)
        elif kind == "response.text.done":
            print()
            print(f"   ({_describe_stats(msg.get('stats') or {})})", flush=True)
        elif kind == "response.evs_stats":
            total = msg.get("total_count", 0)
            print(f"\nEVS filter: kept {msg.get('retained_count')} of {total} frames, dropped "
                  f"{msg.get('dropped_count')} (drop rate {100 * msg.get('drop_rate', 0.0):.1f} %)", flush=True)
        elif kind == "error":
            print(f"server error: {msg.get('message')}", file=sys.stderr, flush=True)


def _count(n: Any, noun: str) -> str:
    return f"? {noun}s" if n is None else f"{n} {noun}{'' if n == 1 else 's'}"


def _describe_stats(stats: dict[str, Any]) -> str:
    parts = [_count(stats.get("completion_tokens"), "token"), _count(stats.get("frames"), "frame")]
    if stats.get("audio_seconds"):
        parts.append(f"{stats['audio_seconds']:.1f} s audio")
    if stats.get("ttft_s") is not None:
        parts.append(f"first token {1000 * stats['ttft_s']:.0f} ms")
    if stats.get("cancelled"):
        parts.append("interrupted")
    return ", ".join(parts)



def client_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m vidchat.client",
        description="Stream a video file (or synthetic webcam frames) to a vidchat server over the "
        "seed WebSocket protocol, ask questions at given times and print the streamed answers "
        "and the frame filter's statistics.",
        epilog="Exit status: 0 ok, 1 connection failed or ended early, 2 bad arguments, "
        "3 the server reported errors. Example: python -m vidchat.client clip.mp4 "
        "--ask '2:What is happening?' --ask '5:And now?'",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    src = parser.add_argument_group("what to stream")
    src.add_argument("video", nargs="?", help="video file to stream (anything PyAV/FFmpeg reads)")
    src.add_argument("--synthetic", action="store_true", help="stream generated webcam-like frames instead of a file")
    src.add_argument("--duration", type=float, default=5.0, help="seconds of synthetic video")
    src.add_argument("--fps", type=float, default=5.0, help="frames per second to send (a file is subsampled)")
    src.add_argument("--max-width", type=int, default=640, help="downscale wider frames to this width")
    src.add_argument("--jpeg-quality", type=int, default=85, help="JPEG quality of the frames sent (1-95)")
    src.add_argument("--audio", choices=("auto", "tone", "none"), default="auto",
                     help="auto: the file's audio track (a 440 Hz tone with --synthetic); tone; none")
    src.add_argument("--fast", action="store_true",
                     help="send as fast as possible instead of in real time; each question then waits "
                     "for the previous answer")
    src.add_argument("--fast-fps", type=float, default=FAST_FPS,
                     help="with --fast: most frames sent a second (keep it under the server's --ws-max-fps, "
                     "which drops frames above it)")
    src.add_argument("--no-pts", action="store_true",
                     help="send no pts_ms with frames and audio (as a seed-protocol client does); the server "
                     "then stamps them on arrival, so --fast compresses the clip's timeline")
    ask = parser.add_argument_group("questions")
    ask.add_argument("--ask", action="append", type=parse_ask, default=[], metavar="SECONDS:QUESTION",
                     help="ask QUESTION when the video reaches SECONDS (repeatable)")
    ask.add_argument("--max-tokens", type=int, default=128, help="longest answer in tokens")
    ask.add_argument("--temperature", type=float, default=None, help="sampling temperature (server default if unset)")
    ask.add_argument("--system-prompt", default=None, help="system prompt (server default if unset)")
    ask.add_argument("--frames-as", choices=("images", "video"), default=None,
                     help="give the model the frames as images or as one video (server default if unset)")
    sess = parser.add_argument_group("session.config")
    sess.add_argument("--model", default="", help="model name sent in session.config (vidchat ignores it)")
    sess.add_argument("--max-frames", type=int, default=64, help="frames the server keeps for this session")
    sess.add_argument("--num-frames", type=int, default=16, help="frames sampled for each question")
    sess.add_argument("--sampling", choices=("uniform", "stable", "latest_frames", "latest_seconds"), default=None,
                      help="how frames are picked for a question (server default if unset)")
    sess.add_argument("--no-evs", action="store_true", help="turn the near-duplicate frame filter off")
    sess.add_argument("--evs-threshold", type=float, default=0.95, help="filter threshold (0..1)")
    conn = parser.add_argument_group("connection and output")
    conn.add_argument("--url", default=DEFAULT_URL, help="the server's WebSocket URL")
    conn.add_argument("--connect-timeout", type=float, default=10.0, help="seconds to wait for the connection")
    conn.add_argument("--done-timeout", type=float, default=120.0,
                      help="seconds to wait for the server to finish after the last frame")
    conn.add_argument("--json", action="store_true", help="print every server message as one JSON line")
    conn.add_argument("-v", "--verbose", action="store_true", help="log progress and debug details")
    return parser


async def _client(args: argparse.Namespace) -> int:
    from vidchat.qa.client import Connection, Pacing, run

    connection = Connection(args.url, args.connect_timeout, args.done_timeout)
    pacing = Pacing(args.fast, args.jpeg_quality, send_pts=not args.no_pts, fast_fps=args.fast_fps)
    try:
        result = await run(connection, _session_config(args), _media_of(args), args.ask, pacing,
                           ClientPrinter(args.json))
    except ClientError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 3 if result.errors else 0


def client_main(argv: list[str] | None = None) -> int:
    """``vidchat client``'s exit status: 0 ok, 1 connection failed or ended early, 2 bad arguments, 3 server errors."""
    parser = client_parser()
    args = parser.parse_args(argv)
    if bool(args.video) == args.synthetic:
        parser.error("give a video file or --synthetic (not both)")
    if (args.fps <= 0 or args.fast_fps <= 0 or args.duration <= 0 or args.max_width < 16
            or not 1 <= args.jpeg_quality <= 95):
        parser.error("--fps, --fast-fps and --duration must be positive, --max-width >= 16, --jpeg-quality 1..95")
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if not args.verbose:
        logging.getLogger("websockets").setLevel(logging.WARNING)
    if args.video and not os.path.isfile(args.video):
        parser.error(f"no such file: {args.video}")
    try:
        return asyncio.run(_client(args))
    except KeyboardInterrupt:
        return INTERRUPTED
