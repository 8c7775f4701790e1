"""``python -m vidchat.replay``'s command line: the app's options plus
replay's own, and the checks that turn a malformed one into a usage error
(exit status 2) before any engine starts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Sequence

from vidchat.conversation.modes import DEFAULT_EVERY_S
from vidchat.media.frame_buffer import SCENE_CHANGE_SHARE
from vidchat.qa.client import parse_ask


class UsageError(ValueError):
    pass


def build_parser() -> argparse.ArgumentParser:
    """The app's parser (every model, engine and session option) plus replay's own."""
    from vidchat.app.settings import ENV_PREFIX
    from vidchat.app.settings import build_parser as app_parser

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
                   f"least {SCENE_CHANGE_SHARE * 100:g}%% of the picture changed), at most once every "
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


@dataclass
class Changes:
    """--set, split the way the WebSocket door splits session.config."""

    session: dict[str, Any]
    answer: dict[str, Any]


def parse_sets(items: Sequence[str]) -> Changes:
    raw: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text  # plain text: frames_as=video, system_prompt=Be brief.
        raw[key] = value
    return changes_of(raw, "--set")


def changes_of(raw: dict[str, Any], where: str) -> Changes:
    """Settings by their socket names (session.config's), checked by the
    socket's table; raises UsageError starting with ``where``, naming the
    unknown or bad setting (replay's --set, a suite's [settings])."""
    from vidchat.conversation.asking import ALIASES
    from vidchat.doors.socket.config import FIELDS, ConfigError, parse_config

    unknown = sorted(k for k in raw if ALIASES.get(k, k) not in FIELDS)
    if unknown:
        names = ", ".join(sorted(k for k, f in FIELDS.items() if f.target != "info"))
        raise UsageError(f"{where}: unknown setting(s) {', '.join(unknown)}; known: {names}")
    try:
        changes = parse_config(raw)
    except ConfigError as exc:
        raise UsageError(f"{where}: {exc}") from None
    if changes.info:
        raise UsageError(f"{where}: {', '.join(sorted(changes.info))} cannot be set here (use --model)")
    return Changes(dict(changes.session), dict(changes.answer))


def parse_every(items: Sequence[Sequence[str]]) -> list[tuple[float, str]]:
    out = []
    for seconds, question in items:
        try:
            every = float(seconds)
        except ValueError:
            every = -1.0
        if not (math.isfinite(every) and every > 0) or not question.strip():
            raise UsageError(f"--every expects a positive number of seconds and a question, got {seconds!r} "
                             f"{question!r}")
        out.append((every, question.strip()))
    return out


def parse_watch(question: str | None, every_s: float) -> str | None:
    """--watch's question (None: no watch mode), with --watch-every checked."""
    if question is None:
        return None
    if not question.strip():
        raise UsageError("--watch expects a question")
    if not (math.isfinite(every_s) and every_s > 0):
        raise UsageError(f"--watch-every expects a positive number of seconds, got {every_s:g}")
    return question.strip()
