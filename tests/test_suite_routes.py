"""The Suites panel's routes (issue 46), without a model: what they refuse
and to whom. A run through real vLLM, started from the page in Chromium, is
tests/test_page_suite.py; these check the rules around it: no --suite-dir,
a bad engine name, a second run while one goes on, another login's run and
report, the second model when there is none or it is not ready."""

from __future__ import annotations

import asyncio
import types

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from vidchat.app import routes
from vidchat.doors import answer_routes
from vidchat.qa import suite

pytestmark = pytest.mark.unit

SUITE = """name = "door-checks"
[[case]]
name = "red-door"
bundle = "bundles/red"
  [[case.ask]]
  expect = { contains = ["red"] }
"""


class _State:
    """What the routes read of the app: the settings and whether each model is ready."""

    def __init__(self, suite_dir: str, compare: str = "", compare_ready: bool = False) -> None:
        self.settings = types.SimpleNamespace(suite_dir=suite_dir, model="tiny", compare_model=compare,
                                              suite_keep_runs=20)
        self.compare_model_path = compare
        self.engine, self.ready = object(), True
        self.compare_engine = object() if compare_ready else None
        self._compare_ready = compare_ready

    def readiness(self, role: str = "main") -> tuple[bool, str]:
        """As the Host says it (vidchat.conversation.host): each engine's by its role."""
        if role == "main":
            return self.ready, "ready"
        if not self.compare_model_path:
            return False, "No second model: start vidchat with --compare-model to compare two models."
        return self._compare_ready, "The second model is loading."


def _client(state: _State, login: str | None = None) -> TestClient:
    app = FastAPI()
    app.include_router(answer_routes.suite_router(state))
    app.include_router(routes.router(state))
    # The access guard sets the caller's login in this header (vidchat.app.guard).
    return TestClient(app, headers={"x-vidchat-login": login} if login else {})


def _suite(tmp_path):
    (tmp_path / "suite.toml").write_text(SUITE)
    (tmp_path / "bundles" / "red").mkdir(parents=True)
    return tmp_path


def test_without_a_suite_dir_there_is_no_suite(tmp_path):
    client = _client(_State(""))
    for method, path in (("get", "/suites"), ("post", "/suites/run")):
        r = getattr(client, method)(path, **({"json": {}} if method == "post" else {}))
        assert r.status_code == 404 and "--suite-dir" in r.json()["detail"]


def test_the_suite_is_listed_with_the_models_it_can_run_on(tmp_path):
    listed = _client(_State(str(_suite(tmp_path)), compare="tiny-vl")).get("/suites").json()
    assert listed["suite"] == "door-checks" and listed["engines"] == ["main", "compare"]
    assert listed["cases"] == [{"name": "red-door", "kind": "bundle", "questions": ["(the recorded question)"],
                                "note": "", "mark": None}]
    assert listed["run"] is None and listed["error"] is None
    (tmp_path / "suite.toml").write_text("name = 3\n")
    broken = _client(_State(str(tmp_path))).get("/suites").json()
    assert broken["cases"] == [] and "suite.toml" in broken["error"]  # said, not a server error


@pytest.mark.parametrize("body, status, said", [
    ({"engine": "other"}, 400, 'engine must be "main" or "compare"'),
    ([1], 400, "the body must be a JSON object"),
    ({"engine": "compare"}, 503, "No second model"),
])
def test_a_run_is_refused_with_the_reason(tmp_path, body, status, said):
    r = _client(_State(str(_suite(tmp_path)))).post("/suites/run", json=body)
    assert r.status_code == status and said in r.json()["detail"]


def test_an_empty_suite_says_how_to_add_a_case(tmp_path):
    r = _client(_State(str(tmp_path))).post("/suites/run", json={"engine": "main"})
    assert r.status_code == 400 and "Add to suite" in r.json()["detail"]


def test_one_run_at_a_time_and_only_its_login_sees_it(tmp_path, monkeypatch):
    release = asyncio.Event()
    asked: list[tuple[object, str]] = []

    async def held_ask_cases(suite, host, model, out, jobs, baseline, progress, *, role, flag_defaults):
        asked.append((role, model))
        await release.wait()
        return []

    monkeypatch.setattr(suite, "ask_cases", held_ask_cases)
    state = _State(str(_suite(tmp_path)), compare="tiny-vl", compare_ready=True)
    app = FastAPI()
    app.include_router(answer_routes.suite_router(state))
    app.include_router(routes.router(state))
    with TestClient(app, headers={"x-vidchat-login": "user:ann"}) as ann:
        started = ann.post("/suites/run", json={"engine": "compare"})
        assert started.status_code == 200
        run = started.json()
        assert run["state"] == "running" and run["model"] == "tiny-vl" and run["total"] == 1
        busy = ann.post("/suites/run", json={"engine": "main"})
        assert busy.status_code == 409 and f"run {run['run']} of this suite is going on" in busy.json()["detail"]
        bob = TestClient(app, headers={"x-vidchat-login": "user:bob"})
        assert bob.get(f"/suites/runs/{run['run']}").status_code == 403
        assert bob.get("/suites").json()["run"] is None  # another login's run is not shown
        assert ann.get(f"/suites/runs/{run['run']}/report.html").status_code == 404  # no report yet
        assert asked == [("compare", "tiny-vl")]  # the second model's engine, by its role and name
        ann.portal.call(release.set)
        ann.portal.call(_until_finished, app, run["run"])
        finished = ann.get(f"/suites/runs/{run['run']}").json()
        assert finished["state"] == "finished" and finished["report"].endswith("/report.html")
        report = ann.get(finished["report"])
        assert report.status_code == 200 and "door-checks" in report.text
        assert bob.get(finished["report"]).status_code == 403


async def _until_finished(app, run_id: str) -> None:
    """Wait for the run's task (it ends once its asks are done and its reports written)."""
    tasks = [t for t in asyncio.all_tasks() if t.get_name() == f"suite run {run_id}"]
    await asyncio.gather(*tasks)


def test_a_second_models_answer_is_added_as_that_models_baseline(tmp_path, monkeypatch):
    """Add to suite of an answer the second model gave (Both models, or a
    re-ask on it): its bundle names --compare-model and the answering
    engine's options, and its text becomes --compare-model's baseline, never
    the main model's; the reply names paths within the suite, not the
    server's folders."""
    import json

    from vidchat.engine import EngineOptions

    suite = _suite(tmp_path)
    state = _State(str(suite), compare="tiny-vl", compare_ready=True)
    state.settings.suite_max_cases = 10
    state.engine = types.SimpleNamespace(options=EngineOptions(model="main-model"))
    compare = types.SimpleNamespace(options=EngineOptions(model="second-model", role="compare"))
    answer = types.SimpleNamespace(question="Which one?", mark=None,
                                   reply=types.SimpleNamespace(text="the second's words", engine=compare))
    answer.engine_role = "compare"
    written = {}

    def write_bundle(bundles, given, *, source, model_option, engine_options, name):
        written.update(model_option=model_option, engine=engine_options)
        (bundles / name).mkdir()
        return bundles / name

    monkeypatch.setattr(answer_routes, "write_bundle", write_bundle)
    entry = types.SimpleNamespace(session=types.SimpleNamespace(id="s" * 32))
    reply = answer_routes._add(state, entry, answer, "user:qa", "", [])
    assert written == {"model_option": "tiny-vl", "engine": compare.options}
    assert reply == {"case": "which-one", "suite": "suite.toml", "bundle": "bundles/which-one", "model": "tiny-vl",
                     "baseline": True}
    assert json.loads((suite / "baseline.json").read_text()) == {"tiny-vl": {"which-one": {"0": "the second's words"}}}
