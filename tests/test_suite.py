"""QA suites (python -m vidchat.suite): a suite file refused before any
engine starts, naming the file, the case and the field; and, through real
vLLM on two tiny models, a suite of a video case and a bundle case run
twice: exit status, results.json, junit.xml and report.html, the baseline
written (the run that writes it holding its asks to what it accepts) and
then held to, the same inputs and answers on a second run, a missing clip
an error of its own case only, an ask with no baseline an error, and a
bundle added by ``suite add`` re-asked with its exact inputs."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import CACHE_DIR, ROOT, TEST_MAX_IMAGES, TEST_MAX_MODEL_LEN
from test_replay import make_clip

from vidchat.app import qa_cli, qa_host
from vidchat.qa.suite_file import SuiteError, read_suite

ENGINE_ARGS = ["--cache-dir", str(CACHE_DIR), "--max-model-len", str(TEST_MAX_MODEL_LEN), "--kv-cache-gb", "0.25",
               "--max-images", str(TEST_MAX_IMAGES)]

SUITE = """name = "checks"
[settings]
temperature = 0
max_tokens = 6
num_sample_frames = 4

[[case]]
name = "moving"
video = "clips/clip.mp4"
  [[case.ask]]
  at = 1.5
  question = "What moves?"
  expect = { not_contains = ["zzzq never said"], max_first_token_ms = 600000, same_as_baseline = true }
  [[case.ask]]
  at = 3.0
  question = "And now?"
  expect = { contains = ["zzzq never said"] }

[[case]]
name = "lost-clip"
video = "clips/missing.mp4"
  [[case.ask]]
  at = 1.0
  question = "Anything?"
"""


def write_suite(root: Path, text: str = SUITE) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "suite.toml").write_text(text)
    return root


def suite(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vidchat.suite", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.unit
@pytest.mark.parametrize("text, said", [
    ('name = "x"\n[[case]]\nname = "a"\nvideo = "c.mp4"\n[[case.ask]]\nat = 1\nquestion = "Q"\n'
     'expect = { contians = ["red"] }\n', "case 'a', ask 0: unknown check(s) contians"),
    ('[settings]\ntemprature = 0\n[[case]]\nvideo = "c.mp4"\n[[case.ask]]\nat = 1\nquestion = "Q"\n',
     "settings: unknown setting(s) temprature"),
    ('[[case]]\nname = "b"\nvideo = "c.mp4"\nsettings = { temperature = "hot" }\n[[case.ask]]\nat = 1\n'
     'question = "Q"\n', "case 'b': settings: Invalid type for 'temperature'"),
    ('[[case]]\nname = "c"\nvideo = "c.mp4"\ncolour = "red"\n[[case.ask]]\nat = 1\nquestion = "Q"\n',
     "case 'c': unknown key(s) colour"),
    ('[[case]]\nname = "d"\nvideo = "c.mp4"\n[[case.ask]]\nat = "soon"\nquestion = "Q"\n',
     "case 'd', ask 0: at must be int or float"),
    ('[[case]]\nname = "e"\nbundle = "b.zip"\n[[case.ask]]\nat = 2\n',
     "case 'e', ask 0: a bundle case has no at"),
    ('[[case]]\nname = "f"\nvideo = "c.mp4"\n[[case.ask]]\nat = 1\nquestion = "Q"\nexpect = { matches = "(" }\n',
     "case 'f', ask 0: expect.matches is not a Python regex"),
    ('[[case]]\nname = "g"\nvideo = "c.mp4"\nmark = { mark = "meh" }\n[[case.ask]]\nat = 1\nquestion = "Q"\n',
     "case 'g': mark must be \"good\" or \"bad\""),
    ('[[case]]\nname = "h"\nvideo = "c.mp4"\nmark = { mark = "bad", why = "x" }\n[[case.ask]]\nat = 1\n'
     'question = "Q"\n', "case 'h': mark: unknown key(s) why"),
])
def test_a_suite_file_is_refused_naming_the_file_the_case_and_the_field(tmp_path, capsys, text, said):
    root = write_suite(tmp_path / "s", text)
    with pytest.raises(SuiteError) as refused:
        read_suite(root)
    assert str(root / "suite.toml") in str(refused.value) and said in str(refused.value), refused.value
    # The command says the same and exits 2, before any engine starts.
    assert qa_cli.suite_main(["run", str(root), "--model", "tiny"]) == 2
    assert said in capsys.readouterr().err


@pytest.mark.unit
def test_each_model_and_each_engine_url_is_a_model_of_the_run():
    models, rest = qa_cli.split_models(["--model", "tiny", "--engine-url", "http://127.0.0.1:8000",
                                        "--model=tiny-vl", "--max-model-len", "4096"])
    assert models == ["tiny", "http://127.0.0.1:8000", "tiny-vl"] and rest == ["--max-model-len", "4096"]
    assert [qa_host.is_url(m) for m in models] == [False, True, False]


@pytest.mark.engine
def test_a_suite_runs_on_two_models_keeps_its_baseline_and_reasks_an_added_bundle(tmp_path, tiny_omni_path,
                                                                               tiny_vl_path):
    root = write_suite(tmp_path / "suite")
    (root / "clips").mkdir()
    make_clip(root / "clips" / "clip.mp4")
    first_out = tmp_path / "run1"
    res = suite("run", str(root), "--model", "tiny", "--model", "tiny-vl", *ENGINE_ARGS, "--out", str(first_out),
                "--update-baseline", "--jobs", "2")
    assert res.returncode == 1, res.stderr[-3000:]  # the failing check (and the lost clip)
    assert "2 passed, 2 failed, 2 errors" in res.stdout and "report:" in res.stdout, res.stdout
    assert f"baseline written: {root / 'baseline.json'}" in res.stdout
    first = json.loads((first_out / "results.json").read_text())
    assert first["suite"] == "checks" and first["models"] == ["tiny", "tiny-vl"]
    by = {(a["model"], a["case"], a["ask"]): a for a in first["asks"]}
    assert len(by) == 6
    for model in ("tiny", "tiny-vl"):
        moving, later, lost = by[(model, "moving", 0)], by[(model, "moving", 1)], by[(model, "lost-clip", 0)]
        # No baseline yet, but this run writes it: same_as_baseline holds the answer to what it accepts.
        assert moving["status"] == "passed" and moving["changed_from_baseline"] is None
        assert all(c["ok"] for c in moving["checks"])
        assert "accepted as the baseline" in next(c["detail"] for c in moving["checks"]
                                                  if c["check"] == "same_as_baseline")
        assert moving["frames"] == 4 and len(moving["inputs_sha256"]) == 64 and moving["tokens"] > 0
        assert moving["first_token_ms"] > 0 and moving["question"] == "What moves?"
        assert later["status"] == "failed" and later["checks"][0]["detail"] == "lacks 'zzzq never said'"
        assert lost["status"] == "error" and "missing.mp4" in lost["error"] and "no such clip" in lost["error"]
    # The same frames went to both models (the one that hears nothing got no audio: other inputs).
    assert by[("tiny", "moving", 0)]["frame_times"] == by[("tiny-vl", "moving", 0)]["frame_times"]
    assert first["summary"] == {"passed": 2, "failed": 2, "errors": 2} and first["baseline_written"] is True
    junit = ET.parse(first_out / "junit.xml").getroot()
    assert (junit.get("tests"), junit.get("failures"), junit.get("errors")) == ("6", "2", "2")
    assert len(junit.findall("testcase/failure")) == 2 and len(junit.findall("testcase/error")) == 2
    report = (first_out / "report.html").read_text()
    assert "written as the baseline" in report
    assert report.count("data:image/jpeg;base64,") >= 4 and "show only what failed" in report
    assert "<script src" not in report and "<link" not in report and "http" not in report.split("<body")[0]
    baseline = json.loads((root / "baseline.json").read_text())
    assert set(baseline) == {"tiny", "tiny-vl"} and set(baseline["tiny"]) == {"moving"}

    # A recorded answer of the first run, added as a case that must answer as it did.
    recorded = Path(by[("tiny", "moving", 0)]["bundle"])
    added = suite("add", str(root), str(recorded), "--name", "recorded", "--same-as-baseline")
    assert added.returncode == 0 and "added case 'recorded'" in added.stdout, added.stderr
    assert [c.name for c in read_suite(root).cases] == ["moving", "lost-clip", "recorded"]

    second_out = tmp_path / "run2"
    res = suite("run", str(root), "--model", "tiny", *ENGINE_ARGS, "--out", str(second_out))
    assert res.returncode == 1, res.stderr[-3000:]
    second = {(a["case"], a["ask"]): a for a in json.loads((second_out / "results.json").read_text())["asks"]}
    again = second[("moving", 0)]
    # Deterministic: the same inputs, the same answer, so its baseline holds.
    assert again["inputs_sha256"] == by[("tiny", "moving", 0)]["inputs_sha256"]
    assert again["answer"] == by[("tiny", "moving", 0)]["answer"] and again["status"] == "passed"
    assert again["changed_from_baseline"] is False
    # The bundle is re-asked with its exact inputs; it has no baseline of its own yet: it could not be
    # judged, so it is an error (as the docs say), and JUnit counts it among the errors.
    bundle_case = second[("recorded", 0)]
    assert bundle_case["inputs_sha256"] == again["inputs_sha256"] and bundle_case["question"] == "What moves?"
    assert bundle_case["status"] == "error" and "no baseline" in bundle_case["error"]
    assert bundle_case["answer"] == again["answer"]  # answered all the same
    junit = ET.parse(second_out / "junit.xml").getroot()
    assert (junit.get("failures"), junit.get("errors")) == ("1", "2")  # "And now?"; the lost clip and the bundle


@pytest.mark.engine
def test_a_run_that_writes_the_baseline_passes_its_baseline_checks_and_exits_0(tmp_path):
    root = write_suite(tmp_path / "suite", SUITE.split("  [[case.ask]]\n  at = 3.0")[0])  # "moving"'s first ask
    (root / "clips").mkdir()
    make_clip(root / "clips" / "clip.mp4")
    res = suite("run", str(root), "--model", "tiny", *ENGINE_ARGS, "--update-baseline", "--suite-keep-runs", "1")
    assert res.returncode == 0, (res.stdout, res.stderr[-3000:])
    assert "1 passed, 0 failed, 0 errors" in res.stdout and "baseline written" in res.stdout, res.stdout
    (run,) = (root / "runs").iterdir()  # its own folder under the suite's runs/
    (asked,) = json.loads((run / "results.json").read_text())["asks"]
    assert asked["status"] == "passed"
    assert json.loads((root / "baseline.json").read_text()) == {"tiny": {"moving": {"0": asked["answer"]}}}
