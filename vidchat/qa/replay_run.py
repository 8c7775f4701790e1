"""What one replay run carries (its command line, the app's settings, --set's
changes, where bundles go) and how its answers come out: one line per answer
on stdout, text or JSON, and each failure on stderr. File replay, bundle
re-asks and QA suites (which keep the records instead of printing them)
share it."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import dataclass
from typing import Any, AsyncIterator, TextIO

from vidchat.qa.replay_options import Changes

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
