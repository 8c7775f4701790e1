"""Adding a recorded answer to a QA suite's folder (docs/suites.md): the
case that re-asks it, appended to suite.toml, and its answer kept as a
model's baseline. The one rule for ``vidchat suite add`` (vidchat.qa.suite)
and the page's Add to suite (vidchat.doors.suite_routes); reading and
checking a suite is vidchat.qa.suite_file."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Sequence

SUITE_FILE = "suite.toml"
BASELINE_FILE = "baseline.json"


def _toml_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # a JSON string is a valid TOML basic string


def taken_names(root: Path) -> set[str]:
    """The case names suite.toml already has (read as text: the file is checked when a run reads it)."""
    file = root / SUITE_FILE
    if not file.is_file():
        return set()
    return set(re.findall(r'^\s*name\s*=\s*"((?:[^"\\]|\\.)*)"\s*$', file.read_text(), flags=re.M))


def free_name(root: Path, wanted: str) -> str:
    """``wanted``, or with -2, -3 … after it when the suite has a case of that name."""
    taken = taken_names(root)
    name, n = wanted, 2
    while name in taken:
        name, n = f"{wanted}-{n}", n + 1
    return name


def append_case(root: Path, name: str, bundle: Path, *, contains: Sequence[str] = (),
                same_as_baseline: bool = False, note: str = "", mark: dict | None = None) -> None:
    """Append a bundle case to suite.toml (made, with the folder's name, when there is none)."""
    file = root / SUITE_FILE
    expect = []
    if contains:
        expect.append("contains = [" + ", ".join(_toml_string(w) for w in contains) + "]")
    if same_as_baseline:
        expect.append("same_as_baseline = true")
    lines = ["", "[[case]]", f"name = {_toml_string(name)}",
             f"bundle = {_toml_string(bundle.relative_to(root).as_posix())}"]
    if note:
        lines.append(f"note = {_toml_string(note)}")
    if mark:  # the answer's QA verdict (vidchat.conversation.answer_marks)
        lines.append(f"mark = {{ mark = {_toml_string(mark['mark'])}, note = {_toml_string(mark.get('note', ''))} }}")
    lines += ["  [[case.ask]]", f"  expect = {{ {', '.join(expect)} }}"]
    with file.open("a") as out:
        if out.tell() == 0:
            out.write(f"name = {_toml_string(root.resolve().name)}\n")
        out.write("\n".join(lines) + "\n")


def keep_baseline(root: Path, model: str, case: str, answers: dict[str, str]) -> None:
    """Set ``case``'s answers (by ask index) as ``model``'s baseline."""
    path = root / BASELINE_FILE
    baseline = json.loads(path.read_text()) if path.is_file() else {}
    baseline.setdefault(model, {})[case] = answers
    path.write_text(json.dumps(baseline, indent=2, ensure_ascii=False) + "\n")
