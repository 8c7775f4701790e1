"""Suite runs at their edges (issue 57, points 3, 7, 8, 9, 13 and 15),
without a model: two runs asked at once (one starts, the other is told
which one runs), a folder of its own for every run, old runs pruned
(--suite-keep-runs), an ask with no baseline an error (JUnit counts it
among errors), a run that accepts its answers holding them to what it
accepts, a setting out of range refused before any engine starts, and the
run's folder shown relative to the suite. The same runs through real vLLM
on a server are tests/test_suite_server.py."""

from __future__ import annotations

import asyncio
import types

import httpx
import pytest
from fastapi import FastAPI

from vidchat.app import qa_cli, qa_host, routes
from vidchat.qa import suite
from vidchat.qa import suite as suite_cli
from vidchat.qa.suite_file import read_suite
from vidchat.qa.suite_report import junit, new_run_folder, prune_runs

pytestmark = pytest.mark.unit

SUITE = """name = "door-checks"
[[case]]
name = "red-door"
bundle = "bundles/red"
  [[case.ask]]
  expect = { same_as_baseline = true }
"""


class _State:
    """What the routes read of the app: its settings, and a main model that is ready."""

    def __init__(self, suite_dir: str) -> None:
        self.settings = types.SimpleNamespace(suite_dir=suite_dir, model="tiny", compare_model="",
                                              suite_keep_runs=20)
        self.compare_model_path = ""

    def readiness(self, role: str = "main") -> tuple[bool, str]:
        return True, "ready"


def _suite(tmp_path):
    (tmp_path / "suite.toml").write_text(SUITE)
    (tmp_path / "bundles" / "red").mkdir(parents=True)
    return tmp_path


async def test_two_runs_asked_at_once_start_one_and_the_other_is_told_which(tmp_path, monkeypatch):
    release = asyncio.Event()

    async def held_ask_cases(*args, **kwargs):
        await release.wait()
        return []

    monkeypatch.setattr(suite, "ask_cases", held_ask_cases)
    state = _State(str(_suite(tmp_path)))
    app = FastAPI()
    app.include_router(routes.router(state))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://suite") as client:
        answers = await asyncio.gather(*(client.post("/suites/run", json={"engine": "main"}) for _ in range(2)))
        assert sorted(r.status_code for r in answers) == [200, 409], [r.text for r in answers]
        started = next(r for r in answers if r.status_code == 200).json()
        refused = next(r for r in answers if r.status_code == 409).json()["detail"]
        assert f"run {started['run']} of this suite is going on" in refused  # names the one that runs
        # Its folder, as the page is shown it: relative to the suite, not the server's path.
        assert started["folder"].startswith("runs/") and started["folder"].endswith("-main")
        assert (tmp_path / started["folder"]).is_dir()
        assert (await client.get("/suites")).json()["folder"] == tmp_path.name
        release.set()
        await state.suite_runs._task  # the run ends: its reports are written into its folder
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [started["folder"].split("/")[1]]


def test_every_run_has_a_folder_of_its_own_and_old_ones_are_pruned(tmp_path):
    runs = tmp_path / "runs"
    made = [new_run_folder(runs, "-main") for _ in range(5)]  # within the same second, mostly
    assert len(set(made)) == 5 and all(p.is_dir() for p in made)
    (runs / "notes").mkdir()  # not a run's folder: never touched
    gone = prune_runs(runs, 2)
    assert gone == made[:3]
    assert sorted(p.name for p in runs.iterdir()) == sorted([made[3].name, made[4].name, "notes"])
    assert prune_runs(runs, 0) == [] and len(list(runs.iterdir())) == 3  # 0 keeps every run


def _bundle_case(tmp_path):
    return read_suite(_suite(tmp_path)).cases[0]


def test_an_ask_with_no_baseline_is_an_error_and_junit_counts_it_among_errors(tmp_path):
    case = _bundle_case(tmp_path)
    rec = {"question": "What colour?", "answer": "red", "ttft_ms": 10.0}
    result = suite_cli._result(case, 0, "tiny", rec, baseline={})
    assert result.status == "error" and result.answer == "red"
    assert result.error == "same_as_baseline: no baseline for this model: run with --update-baseline first"
    report = suite_cli.report_of(read_suite(tmp_path), ["tiny"], [result])
    assert report["summary"] == {"passed": 0, "failed": 0, "errors": 1}
    root = junit(report).getroot()
    assert (root.get("failures"), root.get("errors")) == ("0", "1") and root.find("testcase/error") is not None
    # Held to a baseline, the same answer passes and another one fails.
    held = {"tiny": {"red-door": {"0": "red"}}}
    assert suite_cli._result(case, 0, "tiny", rec, held).status == "passed"
    assert suite_cli._result(case, 0, "tiny", {**rec, "answer": "blue"}, held).status == "failed"


def test_a_run_that_accepts_its_answers_holds_them_to_what_it_accepts(tmp_path):
    case = _bundle_case(tmp_path)
    rec = {"question": "What colour?", "answer": "blue"}
    for baseline in ({}, {"tiny": {"red-door": {"0": "red"}}}):  # none yet, or an older answer it replaces
        result = suite_cli._result(case, 0, "tiny", rec, baseline, accepting=True)
        assert result.status == "passed", result
        assert "accepted as the baseline" in result.checks[0]["detail"]
    assert result.changed_from_baseline is True  # and it still says the answer changed


def test_a_setting_out_of_range_is_refused_before_any_engine_starts(tmp_path, capsys, monkeypatch):
    def no_engine(*args, **kwargs):
        raise AssertionError("an engine was started for a suite that can't run")

    monkeypatch.setattr(qa_host, "start_host", no_engine)
    (tmp_path / "suite.toml").write_text('[settings]\ntemperature = -3\n[[case]]\nname = "red-door"\n'
                                         'video = "c.mp4"\n[[case.ask]]\nat = 1\nquestion = "Q"\n')
    assert qa_cli.suite_main(["run", str(tmp_path), "--model", "tiny"]) == 2
    said = capsys.readouterr().err
    assert str(tmp_path / "suite.toml") in said and "case 'red-door'" in said, said
    assert "temperature must be a number in 0..2, got -3" in said and "[settings]" in said
    (tmp_path / "suite.toml").write_text('[[case]]\nname = "few"\nvideo = "c.mp4"\n'
                                         'settings = { num_sample_frames = 0 }\n[[case.ask]]\nat = 1\nquestion = "Q"\n')
    assert qa_cli.suite_main(["run", str(tmp_path), "--model", "tiny"]) == 2
    assert "case 'few': settings: num_sample_frames must be an integer in 1..1024, got 0" in capsys.readouterr().err
