"""Suite runs started on a server (``POST /suites/run``, issue 57), through
real vLLM on the tiny model, in a server started as users start it: a run
whose cases end badly (a truncated clip, a max_tokens the engine refuses)
leaves no session behind; two runs asked at once start one, and the other
is told which; old run folders are pruned (--suite-keep-runs); an engine
killed mid-run is restarted and the rest of the run is asked on the new
one; and a run still going at shutdown is cancelled and awaited. The same
rules without a model are tests/test_suite_runs.py."""

from __future__ import annotations

import concurrent.futures
import json
import re
import signal
import urllib.error
import urllib.request

import pytest
from conftest import eventually, stop_server
from test_operations import engine_cores
from test_replay import make_clip

pytestmark = pytest.mark.engine

HEAD = '''name = "edges"
[settings]
temperature = 0
max_tokens = 3
num_sample_frames = 2
'''
# Each ends badly: the clip can't be decoded; the engine refuses max_tokens beyond its context.
BAD_CASES = '''
[[case]]
name = "cut-clip"
video = "clips/cut.mp4"
  [[case.ask]]
  at = 1.0
  question = "What moves?"

[[case]]
name = "too-long"
video = "clips/clip.mp4"
settings = { max_tokens = 1000000 }
  [[case.ask]]
  at = 1.0
  question = "What moves?"
'''


def good_cases(n: int) -> str:
    """``n`` cases that pass once answered (no check can fail)."""
    return "".join(f'\n[[case]]\nname = "good-{i}"\nvideo = "clips/clip.mp4"\n  [[case.ask]]\n  at = {1 + i % 3}.0\n'
                   f'  question = "What moves now ({i})?"\n' for i in range(n))


@pytest.fixture(scope="module")
def suite_server(restarting_server):
    """The suite's clips, in the shared restarting server's --suite-dir (tests/conftest.py)."""
    suite_dir = restarting_server.suite_dir
    (suite_dir / "clips").mkdir(exist_ok=True)
    clip = make_clip(suite_dir / "clips" / "clip.mp4")
    (suite_dir / "clips" / "cut.mp4").write_bytes(clip.read_bytes()[: clip.stat().st_size * 2 // 5])
    return restarting_server


def post_run(srv) -> tuple[int, dict]:
    req = urllib.request.Request(srv.url + "/suites/run", json.dumps({"engine": "main"}).encode(),
                                 {**srv.headers(), "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def until_ended(srv, run_id: str, within: float = 300) -> dict:
    return eventually(lambda: (r := srv.get_json(f"/suites/runs/{run_id}"))["state"] != "running" and r, within,
                      f"suite run {run_id} ends")


def test_runs_whose_cases_end_badly_leave_no_session_and_old_runs_are_pruned(suite_server):
    (suite_server.suite_dir / "suite.toml").write_text(HEAD + BAD_CASES)
    folders = []
    for _ in range(3):
        status, run = post_run(suite_server)
        assert status == 200, run
        ended = until_ended(suite_server, run["run"])
        assert ended["state"] == "finished" and ended["summary"] == {"passed": 0, "failed": 0, "errors": 2}, ended
        errors = {a["case"]: a["error"] for a in ended["asks"]}
        assert "cut.mp4" in errors["cut-clip"] and "can't be asked on this model" in errors["too-long"], errors
        folders.append(ended["folder"])
    # Every session a run opened was closed when its case ended: none counts against --max-sessions.
    assert suite_server.health()["sessions_by_kind"].get("replay", 0) == 0, suite_server.health()
    # Each run had a folder of its own, shown relative to the suite; the newest two are kept.
    assert len(set(folders)) == 3 and all(re.fullmatch(r"runs/\d{8}T\d{6}Z-main(-\d+)?", f) for f in folders), folders
    assert sorted(p.name for p in (suite_server.suite_dir / "runs").iterdir()) == sorted(
        f.split("/")[1] for f in folders[1:])
    assert str(suite_server.suite_dir) not in json.dumps(suite_server.get_json("/suites"))


def test_two_runs_asked_at_once_start_one_and_the_other_names_it(suite_server):
    (suite_server.suite_dir / "suite.toml").write_text(HEAD + good_cases(2))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: post_run(suite_server), range(2)))
    assert sorted(status for status, _ in answers) == [200, 409], answers
    started = next(body for status, body in answers if status == 200)
    refused = next(body for status, body in answers if status == 409)
    assert f"run {started['run']} of this suite is going on" in refused["detail"]
    assert until_ended(suite_server, started["run"])["state"] == "finished"


@pytest.mark.stops_shared_server  # restarting_server: test_operations' kill comes first
def test_a_run_goes_on_with_the_restarted_engine_and_is_cancelled_at_shutdown(suite_server):
    (suite_server.suite_dir / "suite.toml").write_text(HEAD + good_cases(8))
    status, run = post_run(suite_server)
    assert status == 200, run
    eventually(lambda: suite_server.get_json(f"/suites/runs/{run['run']}")["done"] >= 1, 120, "a first ask is done")
    restarts = suite_server.log().count("is back (restart")  # test_operations may have killed it before
    cores = engine_cores(suite_server)
    assert cores, "no EngineCore process found"
    for core in cores:
        core.send_signal(signal.SIGKILL)  # mid-run
    ended = until_ended(suite_server, run["run"], within=600)
    assert ended["state"] == "finished", ended
    # What was being asked as it died fails (at most the two cases at a time); the rest is asked on the new engine.
    assert ended["summary"]["errors"] <= 2 and ended["summary"]["passed"] >= 5, ended["summary"]
    assert ended["asks"][-1]["status"] == "passed", ended["asks"][-1]
    assert f"is back (restart {restarts + 1})" in suite_server.log()

    # Shutdown while a run goes on: it is cancelled and awaited, and writes no report of asks it never made.
    status, run = post_run(suite_server)
    assert status == 200, run
    eventually(lambda: suite_server.get_json(f"/suites/runs/{run['run']}")["done"] >= 1, 120, "a first ask is done")
    assert stop_server(suite_server) == 0
    log = suite_server.log()
    cancelled = log.find(f"cancelling run {run['run']} at shutdown")
    assert cancelled >= 0, log[-3000:]
    assert log.find("suite edges on tiny: failed (the server shut down during the run)", cancelled) > 0, log[-3000:]
    assert (suite_server.suite_dir / run["folder"]).is_dir()
    assert not (suite_server.suite_dir / run["folder"] / "results.json").exists()
