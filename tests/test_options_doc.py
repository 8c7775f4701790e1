"""docs/options.md is the server's option table as the code has it: a new
option, a changed default or help text fails this test until the page is
written again (python -m vidchat.devtools.options_doc)."""

from __future__ import annotations

import dataclasses

import pytest

from vidchat.app.settings import Settings, build_parser
from vidchat.devtools.options_doc import OPTIONS_MD, options_markdown

pytestmark = pytest.mark.unit


def test_the_options_page_is_what_the_option_table_writes():
    assert OPTIONS_MD.read_text() == options_markdown(), (
        "docs/options.md differs from the option table: run python -m vidchat.devtools.options_doc")


def test_every_flag_of_the_parser_has_its_row_with_its_default():
    page = OPTIONS_MD.read_text()
    flags = {a.option_strings[0] for a in build_parser()._actions if a.option_strings[0] != "-h"}
    rows = {line.split("`")[1] for line in page.splitlines() if line.startswith("| `--")}
    assert flags == rows
    port = next(f for f in dataclasses.fields(Settings) if f.name == "port")
    assert f"| `--port` | `{port.default}` |" in page


def test_a_changed_default_is_seen(monkeypatch):
    before = options_markdown()
    port = next(f for f in dataclasses.fields(Settings) if f.name == "port")
    monkeypatch.setattr(port, "default", port.default + 1)
    assert options_markdown() != before
