"""A QA person's verdict on an answer (issue 46): good or bad with a note,
kept in the answer's record, written into its bundle when it was recorded,
carried into a suite case made from the bundle and shown in the report.
Without a model: the page's buttons and a suite run through real vLLM are
tests/test_page_suite.py."""

from __future__ import annotations

import json
import types

import pytest

from vidchat.conversation import bundles
from vidchat.conversation.suite_cases import append_case
from vidchat.qa.suite_file import add_bundle, read_suite
from vidchat.qa.suite_report import report_html

pytestmark = pytest.mark.unit


def fake_bundle(folder, mark=None):
    folder.mkdir(parents=True)
    manifest = {"version": 1, "question": "Red light?", "record": {"question": "Red light?"}}
    if mark is not None:
        manifest["mark"] = manifest["record"]["mark"] = mark
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


@pytest.mark.parametrize("mark, note, said", [
    ("meh", "", 'mark must be "good" or "bad"'),
    ("bad", 3, "note must be text"),
    ("good", "x" * (bundles.MAX_NOTE + 1), f"at most {bundles.MAX_NOTE} characters"),
])
def test_a_mark_is_good_or_bad_with_a_short_note(mark, note, said):
    with pytest.raises(ValueError, match=said):
        bundles.checked(mark, note)
    assert bundles.checked("bad", "  missed the red light ") == {"mark": "bad", "note": "missed the red light"}
    assert bundles.checked("", "ignored") is None  # empty takes a mark back


def test_marking_a_recorded_answer_writes_its_bundle_and_taking_it_back_clears_it(tmp_path):
    bundle = fake_bundle(tmp_path / "0001")
    entry = types.SimpleNamespace(bundles={"a1": str(bundle)})
    answer = types.SimpleNamespace(mark=None)
    verdict = bundles.checked("bad", "described the frame before")
    assert bundles.mark_answer(entry, "a1", answer, verdict) == str(bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert answer.mark == manifest["mark"] == manifest["record"]["mark"] == verdict
    assert bundles.mark_answer(entry, "a1", answer, None) == str(bundle)
    assert json.loads((bundle / "manifest.json").read_text())["mark"] is None and answer.mark is None
    # An answer never recorded keeps its mark on itself (its record says it).
    assert bundles.mark_answer(types.SimpleNamespace(bundles={}), "a2", answer, verdict) is None
    assert answer.mark == verdict
    assert not list(tmp_path.glob("0001/.manifest-*"))  # the manifest is replaced whole, nothing left beside it


def test_a_marked_bundle_becomes_a_case_with_its_mark_and_the_report_shows_it(tmp_path):
    verdict = {"mark": "bad", "note": "said blue"}
    suite = tmp_path / "suite"
    case = add_bundle(suite, fake_bundle(tmp_path / "recorded", verdict), name="red-light", same_as_baseline=True)
    assert case.mark == verdict
    append_case(suite, "by-hand", suite / "bundles" / "red-light", mark={"mark": "good", "note": ""})
    cases = {c.name: c for c in read_suite(suite).cases}
    assert cases["red-light"].mark == verdict and cases["by-hand"].mark == {"mark": "good", "note": ""}
    ask = {"case": "red-light", "ask": 0, "model": "tiny", "question": "Red light?", "answer": "Blue.",
           "status": "passed", "checks": [], "frame_times": [], "bundle": None, "note": "", "mark": verdict,
           "changed_from_baseline": None}
    html = report_html({"suite": "s", "models": ["tiny"], "asks": [ask],
                        "summary": {"passed": 1, "failed": 0, "errors": 0}}, {})
    assert "Marked bad ✗ when recorded: said blue" in html
