"""docs/options.md, written from the server's own option table
(vidchat.app.settings.Settings, the same fields its parser is built from), so
no option, default or help text in the docs can drift from the code:
``python -m vidchat.devtools.options_doc`` rewrites it, and a test fails when
the file differs from what this would write."""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from pathlib import Path

from vidchat.app.settings import ENV_PREFIX, Settings

OPTIONS_MD = Path(__file__).resolve().parents[2] / "docs" / "options.md"

HEADER = """# Options

Every option of `vidchat` (`vidchat serve`, `python app.py`), in the order
`vidchat --help` lists them. Each is also an environment variable:
`{prefix}` and the option's name in capitals (`--max-sessions 4` is
`{prefix}MAX_SESSIONS=4`); a flag wins over the variable. Options that may
be given more than once take the variable's values separated by spaces.

This page is written from the server's option table
(`vidchat/app/settings.py`) by `python -m vidchat.devtools.options_doc`; a
test fails when it differs, so it cannot drift from the code.
"""


def _sections() -> dict[str, str]:
    """Each field's section, from the ``# --- name ---`` comments of the Settings class (and its bases)."""
    source = "\n".join(inspect.getsource(cls) for cls in reversed(Settings.__mro__) if dataclasses.is_dataclass(cls))
    out, current = {}, "Options"
    for line in source.splitlines():
        heading = re.match(r"\s*# --- (.+?) -*$", line)
        if heading:
            current = heading.group(1).strip()
            continue
        name = re.match(r"\s{4}(\w+): ", line)
        if name:
            out[name.group(1)] = current
    return out


def _default(value: object) -> str:
    if value == "" or value is None:
        return "(none)"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def options_markdown() -> str:
    sections = _sections()
    lines = [HEADER.format(prefix=ENV_PREFIX).rstrip("\n")]
    current = None
    for f in dataclasses.fields(Settings):
        section = sections.get(f.name, "Options")
        if section != current:
            current = section
            lines += ["", f"## {section[0].upper()}{section[1:]}", "",
                      "| option | default | what it does |", "|---|---|---|"]
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata["help"]
        if "choices" in f.metadata:
            help_text += " One of: " + ", ".join(f"`{c}`" for c in f.metadata["choices"]) + "."
        if f.metadata.get("repeat"):
            help_text += " Repeatable."
        lines.append(f"| `{flag}` | {_default(f.default)} | {_cell(help_text)} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    OPTIONS_MD.parent.mkdir(exist_ok=True)
    OPTIONS_MD.write_text(options_markdown())
    print(f"wrote {OPTIONS_MD.relative_to(Path.cwd()) if OPTIONS_MD.is_relative_to(Path.cwd()) else OPTIONS_MD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
