"""Add to suite's files (issue 57 points 4, 13 and 14), without a model: what
suite_cases writes into a suite's folder is read back by the suite's own
reader, keeps a hand-edited suite.toml as it was, never names two cases alike,
is refused whole (nothing on disk) when it can't be written, counts against
--suite-max-cases per login, and baseline.json loses no entry to writers in
other processes. The same through the real server and real vLLM is
tests/test_suite_add.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import tomllib

import pytest
from conftest import ROOT

from vidchat.conversation import bundles, suite_cases
from vidchat.conversation.safe_files import Unwritable
from vidchat.qa.suite_file import read_suite

pytestmark = pytest.mark.unit

HAND_EDITED = """# Door checks, kept by hand.
name = "door-checks"   # the report's title

[settings]
temperature = 0        # one answer per input

[[case]]
video = "clips/door.mp4"   # no name: a run calls it case-1
  [[case.ask]]
  at = 1.5
  question = "What colour is the door?"
  expect = { contains = ["red"] }

[[case]]
video = "clips/door.mp4"   # case-2
  [[case.ask]]
  at = 3
  question = "Is it open?"
# the end of the hand-written part
"""


def _saver(made: list):
    """A bundle writer standing in for the recording's (what it makes is all these tests look at)."""
    def save(bundles, name):
        folder = bundles / name
        folder.mkdir()
        (folder / "manifest.json").write_text("{}")
        made.append(name)
        return folder
    return save


def _add(root, wanted="what-is-there", login=None, max_cases=500, made=None, **kw):
    return suite_cases.add_case(root, wanted, _saver([] if made is None else made), model="tiny",
                                answer=kw.pop("answer", "A red door."), login=login, max_cases=max_cases, **kw)


def _files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_a_note_with_a_del_is_written_escaped_and_the_suite_still_reads(tmp_path):
    root = tmp_path / "suite"
    name, _ = _add(root, note="a\x7fb", contains=["re\x7fd"], mark={"mark": "bad", "note": "x\x7fy"})
    text = (root / "suite.toml").read_text()
    assert "\x7f" not in text and "a\\u007fb" in text  # a raw DEL is illegal in TOML; escaped it is not
    case = read_suite(root).cases[0]
    assert (case.name, case.note, case.mark) == (name, "a\x7fb", {"mark": "bad", "note": "x\x7fy"})
    # Marked bad: held to the words asked for, not to its own answer as a baseline.
    assert case.asks[0].expect == {"contains": ["re\x7fd"]}
    assert not (root / "baseline.json").exists()


def test_an_answer_marked_bad_is_added_without_becoming_the_baseline(tmp_path):
    root = tmp_path / "suite"
    good, _ = _add(root, wanted="good", mark={"mark": "good", "note": ""})
    bad, _ = _add(root, wanted="bad", mark={"mark": "bad", "note": "wrong colour"})
    cases = {c.name: c for c in read_suite(root).cases}
    assert cases[good].asks[0].expect == {"same_as_baseline": True} and cases[bad].asks[0].expect == {}
    assert list(json.loads((root / "baseline.json").read_text())["tiny"]) == [good]
    assert suite_cases.keeps_baseline({"mark": "good"}) and suite_cases.keeps_baseline(None)
    assert not suite_cases.keeps_baseline({"mark": "bad", "note": ""})


@pytest.mark.parametrize("field, given", [
    ("note", {"note": "a\ud800b"}),
    ("expect", {"contains": ["red", "\udfff"]}),
    ("mark.note", {"mark": {"mark": "bad", "note": "\ud83d"}}),
])
def test_text_no_file_can_hold_is_refused_naming_its_field_and_nothing_is_made(tmp_path, field, given):
    root = tmp_path / "suite"
    made: list[str] = []
    with pytest.raises(Unwritable, match=f"^{field} can't be written") as refused:
        _add(root, made=made, **given)
    assert refused.value.field == field
    assert made == [] and not root.exists()  # not even the folder
    (root / "bundles").mkdir(parents=True)
    (root / "suite.toml").write_text(HAND_EDITED)
    with pytest.raises(Unwritable):
        _add(root, made=made, **given)
    assert made == [] and _files(root) == ["bundles", "suite.toml"]
    assert (root / "suite.toml").read_text() == HAND_EDITED


def test_a_hand_edited_suite_keeps_its_comments_and_layout(tmp_path):
    root = tmp_path / "suite"
    root.mkdir()
    (root / "suite.toml").write_text(HAND_EDITED)
    _add(root, note="first")
    _add(root, note="second")
    text = (root / "suite.toml").read_text()
    assert text.startswith(HAND_EDITED)  # every byte of it, comments and all, where it was
    suite = read_suite(root)
    assert suite.name == "door-checks" and [c.note for c in suite.cases] == ["", "", "first", "second"]
    assert suite.cases[0].settings == {"temperature": 0}
    assert "\n\n[[case]]\nname = \"what-is-there\"\n" in text  # laid out as docs/suites.md shows a case


def test_a_question_named_like_a_default_case_name_never_makes_a_duplicate(tmp_path):
    root = tmp_path / "suite"
    root.mkdir()
    (root / "suite.toml").write_text(HAND_EDITED)  # two unnamed cases: case-1 and case-2
    names = [_add(root, "case-2")[0], _add(root, "case-2")[0], _add(root, "case-5")[0], _add(root, "case-5")[0]]
    assert names == ["case-2-2", "case-2-3", "case-5", "case-5-2"]
    assert [c.name for c in read_suite(root).cases] == ["case-1", "case-2", *names]  # read whole: no two alike
    # A new suite: "Case 4" asked twice (the route's slug is case-4) is two cases.
    other = tmp_path / "new"
    assert [_add(other, "case-4")[0], _add(other, "case-4")[0]] == ["case-4", "case-4-2"]
    assert read_suite(other).name == "new"


def test_an_orphan_bundle_does_not_block_an_add_and_a_failed_add_leaves_nothing(tmp_path, monkeypatch):
    root = tmp_path / "suite"
    (root / "bundles" / "what-is-there").mkdir(parents=True)  # left by a failed add before this fix
    name, bundle = _add(root)
    assert name == "what-is-there-2" and bundle == root / "bundles" / name
    before = {p: (root / p).read_bytes() for p in ("suite.toml", "baseline.json", suite_cases.ADDED_BY_FILE)}
    real_write = suite_cases.write_whole

    def baseline_fails(path, text, check=None):
        if path.name == suite_cases.BASELINE_FILE:
            raise OSError(28, "No space left on device")
        real_write(path, text, check)

    monkeypatch.setattr(suite_cases, "write_whole", baseline_fails)
    with pytest.raises(OSError, match="No space"):
        _add(root)
    monkeypatch.undo()
    # The suite as it was: the case written before the failure taken back, its bundle removed, no temp file.
    assert {p: (root / p).read_bytes() for p in before} == before
    assert sorted(p.name for p in (root / "bundles").iterdir()) == ["what-is-there", "what-is-there-2"]
    assert not [p for p in root.iterdir() if p.name.endswith(".tmp")]
    assert _add(root)[0] == "what-is-there-3"  # and the next add goes through


def test_an_unreadable_suite_is_not_added_to(tmp_path):
    root = tmp_path / "suite"
    root.mkdir()
    (root / "suite.toml").write_text('name = "a\x7fb"\n')  # what a DEL written as is did to a suite
    made: list[str] = []
    with pytest.raises(suite_cases.SuiteConflict, match="fix it before adding to it"):
        _add(root, made=made)
    (root / "suite.toml").write_text('name = "s"\ncase = [{ video = "v.mp4" }]\n')  # a static array: no [[case]] after it
    with pytest.raises(suite_cases.SuiteConflict):
        _add(root, made=made)
    assert made == [] and (root / "suite.toml").read_text() == 'name = "s"\ncase = [{ video = "v.mp4" }]\n'


def test_add_to_suite_is_capped_per_login(tmp_path):
    root = tmp_path / "suite"
    assert [_add(root, login="ann", max_cases=2)[0] for _ in range(2)] == ["what-is-there", "what-is-there-2"]
    made: list[str] = []
    with pytest.raises(suite_cases.TooManyCases, match="2 cases added by this login.*--suite-max-cases") as full:
        _add(root, login="ann", max_cases=2, made=made)
    assert made == [] and "remove some of them from suite.toml" in str(full.value)
    assert _add(root, login="bob", max_cases=2)[0] == "what-is-there-3"  # another login has its own allowance
    with pytest.raises(suite_cases.TooManyCases, match="callers without a login"):
        _add(root, login=None, max_cases=0)
    # A case ann added, taken out of suite.toml by hand, frees its place.
    text = (root / "suite.toml").read_text()
    first = text.index("\n[[case]]")
    (root / "suite.toml").write_text(text[:first] + text[text.index("\n[[case]]", first + 1):])
    assert _add(root, login="ann", max_cases=2)[0] == "what-is-there-4"  # its bundle stays: a new name
    assert len(read_suite(root).cases) == 3


WRITER = """
import sys
from pathlib import Path
from vidchat.conversation.suite_cases import keep_baseline
root, who, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for i in range(n):
    keep_baseline(root, "tiny", f"{who}-{i}", {"0": "x" * 2000})
"""


def test_concurrent_baseline_writers_lose_no_entry_and_a_reader_never_sees_half_a_file(tmp_path):
    root = tmp_path / "suite"
    root.mkdir()
    (root / "baseline.json").write_text("{}\n")
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(root), f"p{k}", "40"], cwd=ROOT)
               for k in range(3)]
    torn: list[str] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            text = (root / "baseline.json").read_text()
            try:
                json.loads(text)
            except ValueError:
                torn.append(text[-80:])

    watching = threading.Thread(target=reader)
    watching.start()
    try:
        added = [_add(root, login=None)[0] for _ in range(10)]  # the server's Add to suite, meanwhile
        assert [w.wait(timeout=25) for w in writers] == [0, 0, 0]
    finally:
        done.set()
        watching.join()
        for w in writers:
            w.kill()
    baseline = json.loads((root / "baseline.json").read_text())["tiny"]
    assert set(baseline) == {f"p{k}-{i}" for k in range(3) for i in range(40)} | set(added)
    assert torn == []
    assert not [p for p in root.iterdir() if p.name.endswith(".tmp")]


def test_a_marked_manifest_keeps_its_mode_and_a_refused_mark_leaves_nothing(tmp_path):
    bundle = tmp_path / "0001"
    bundle.mkdir()
    manifest = bundle / "manifest.json"
    manifest.write_text(json.dumps({"version": 1, "record": {}}))
    manifest.chmod(0o644)
    bundles.mark_bundle(bundle, {"mark": "good", "note": ""})
    assert stat.S_IMODE(manifest.stat().st_mode) == 0o644  # readable as the bundle's other files, not 0600
    assert json.loads(manifest.read_text())["mark"] == {"mark": "good", "note": ""}
    with pytest.raises(ValueError, match="note can't be written"):
        bundles.checked("bad", "\ud800")
    with pytest.raises(UnicodeEncodeError):  # even past the check: nothing is left beside the manifest
        bundles.mark_bundle(bundle, {"mark": "bad", "note": "\ud800"})
    assert sorted(os.listdir(bundle)) == ["manifest.json"]
    assert json.loads(manifest.read_text())["mark"] == {"mark": "good", "note": ""}


def test_the_written_suite_reads_with_tomllib_as_every_run_reads_it(tmp_path):
    root = tmp_path / "suite"
    _add(root, note='quote " backslash \\ tab \t newline \n end', contains=["ü", "\u2028"])
    data = tomllib.loads((root / "suite.toml").read_text())
    assert data["case"][0]["note"] == 'quote " backslash \\ tab \t newline \n end'
    assert data["case"][0]["ask"][0]["expect"]["contains"] == ["ü", "\u2028"]


def test_the_command_lines_add_refused_for_its_note_leaves_no_copy_behind(tmp_path):
    """``vidchat suite add`` copies the bundle, then adds its case: a note
    TOML can't hold is refused (ValueError naming the field, said by the
    command as its error) and the copy is taken back, so the next add of that
    bundle gets its own name, not a folder left over."""
    from vidchat.qa.suite_file import add_bundle

    source = tmp_path / "recorded" / "door"
    source.mkdir(parents=True)
    (source / "manifest.json").write_text("{}")
    suite = tmp_path / "suite"
    with pytest.raises(Unwritable, match="^note can't be written"):
        add_bundle(suite, source, note="a\ud800b")
    assert not (suite / "bundles").exists() or not list((suite / "bundles").iterdir())
    case = add_bundle(suite, source, note="a\x7fb")
    assert case.name == "door" and case.note == "a\x7fb" and (suite / "bundles" / "door").is_dir()
