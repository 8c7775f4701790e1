"""A QA person's verdict on an answer: good or bad, with a note. Kept on the
answer (so its record says it), written into its bundle when it has been
recorded (its manifest's ``mark``, and the record inside it), and carried
into a suite case made from it (vidchat.conversation.suite_cases), whose
report shows it. The one rule for every door that marks answers."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from vidchat.conversation.bundle_format import MANIFEST
from vidchat.conversation.safe_files import writable, write_whole

MARKS = ("good", "bad")
MAX_NOTE = 500  # characters


def checked(mark: Any, note: Any = "") -> dict[str, str] | None:
    """The mark as kept ({"mark", "note"}), or None to take one back
    (``mark`` empty or None); raises ValueError naming the field."""
    if mark in (None, ""):
        return None
    if mark not in MARKS:
        raise ValueError(f"mark must be \"good\" or \"bad\" (or empty to take it back), got {mark!r}")
    if not isinstance(note, str) or len(note) > MAX_NOTE:
        raise ValueError(f"note must be text of at most {MAX_NOTE} characters")
    writable("note", note)  # it goes into the bundle's manifest and a suite's case
    return {"mark": mark, "note": note.strip()}


def mark_bundle(path: str | os.PathLike, mark: dict[str, str] | None) -> None:
    """Write the mark into a recorded bundle's manifest (and the record it
    holds), replacing the file whole so a reader never sees half of it."""
    manifest_path = Path(path) / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["mark"] = mark
    if isinstance(manifest.get("record"), dict):
        manifest["record"]["mark"] = mark
    write_whole(manifest_path, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")


def mark_answer(entry: Any, answer_id: str, answer: Any, mark: dict[str, str] | None) -> str | None:
    """Mark a kept answer of ``entry`` (its Conversation); returns the bundle
    it was written into, if the answer was recorded. Files: call it off the event loop."""
    answer.mark = mark
    bundle = entry.bundles.get(answer_id)
    if bundle is None or not (Path(bundle) / MANIFEST).is_file():
        return None
    mark_bundle(bundle, mark)
    return str(bundle)


def of_manifest(manifest: dict[str, Any]) -> dict[str, str] | None:
    """A bundle's mark, when it has a well-formed one (a hand-edited manifest may not)."""
    mark = manifest.get("mark")
    try:
        return checked(mark.get("mark"), mark.get("note", "")) if isinstance(mark, dict) else None
    except ValueError:
        return None
