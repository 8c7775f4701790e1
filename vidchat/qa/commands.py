"""What replay's and suites' settings and questions are, read from text
(replay's --set, --every and --watch, a suite's [settings]), with the checks
that refuse a malformed one as a :class:`UsageError` before any engine
starts. The command line itself (its parser, its exit statuses) is the
app's: its ``qa_cli`` module.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Sequence


class UsageError(ValueError):
    """A malformed setting, question or source: the command line's usage error (exit status 2)."""


@dataclass
class Changes:
    """--set, split the way the WebSocket door splits session.config."""

    session: dict[str, Any]
    answer: dict[str, Any]


def parse_sets(items: Sequence[str]) -> Changes:
    """--set's KEY=VALUE items (VALUE as JSON, else plain text), checked as session.config checks them."""
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
    """--every's (SECONDS, QUESTION) pairs, checked."""
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
