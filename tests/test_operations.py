"""Running vidchat as a service (issue 45): /metrics with vidchat's families
and vLLM's own, an in-process engine that comes back by itself after it is
killed (and one that stays down when told to), and logs a machine reads.
Through real vLLM on the tiny model, in servers started as users start them."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import urllib.error
import urllib.request

import psutil
import pytest
import websockets
from conftest import eventually_async
from prometheus_client.parser import text_string_to_metric_families

from vidchat.devtools import synthetic

# Small, all different: the filter keeps every one of them.
MOVING = [base64.b64encode(j).decode() for j in synthetic.cuts_clip(120, 160, cuts=8, hold=1).jpegs()]
VIDCHAT_FAMILIES = (
    "vidchat_sessions", "vidchat_frames_received", "vidchat_frames_kept", "vidchat_answers",
    "vidchat_first_token_seconds", "vidchat_answer_tokens", "vidchat_answers_waiting", "vidchat_warmups",
    "vidchat_event_loop_lag_seconds", "vidchat_session_buffer_bytes", "vidchat_engine_up",
    "vidchat_engine_restarts",
)
# A few of vLLM's own families, as `vllm serve` exposes them (its Prometheus stat logger).
VLLM_FAMILIES = ("vllm:num_requests_running", "vllm:time_to_first_token_seconds", "vllm:prefix_cache_hits")


def scrape(srv, headers: dict | None = None) -> dict[tuple[str, tuple], float]:
    """/metrics as {(sample name, sorted labels): value}."""
    req = urllib.request.Request(srv.url + "/metrics", headers=headers if headers is not None else srv.headers())
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def families(samples: dict) -> set[str]:
    return {name for name, _ in samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def recv(ws, timeout: float = 60.0) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def until_done(ws) -> list[dict]:
    """Messages up to and including the answer's response.text.done."""
    out = [await recv(ws)]
    while out[-1]["type"] != "response.text.done":
        out.append(await recv(ws))
    return out


def readyz(srv) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(srv.url + "/readyz", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def engine_cores(srv) -> list[psutil.Process]:
    """vLLM's EngineCore child process(es) of the server."""
    found = []
    for child in psutil.Process(srv.proc.pid).children(recursive=True):
        try:
            if "EngineCore" in child.name() or any("EngineCore" in part for part in child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found


# ---- /metrics ----------------------------------------------------------------------------

@pytest.mark.unit
def test_metrics_is_guarded_like_the_api():
    from starlette.testclient import TestClient

    from vidchat.app.access import build_access
    from vidchat.app.server import create_app
    from vidchat.app.settings import Settings
    from vidchat.app.state import AppState

    settings = Settings(token="s3cret-token")
    state = AppState(settings=settings, model_path="none", access=build_access(settings))
    client = TestClient(create_app(state), base_url="http://localhost")
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong-token"}).status_code == 403
    ok = client.get("/metrics", headers={"Authorization": "Bearer s3cret-token"})
    assert ok.status_code == 200 and "vidchat_engine_up" in ok.text


@pytest.mark.unit
def test_api_health_tells_anyone_liveness_and_counts_and_only_an_operator_the_rest():
    """/api/health is public (load balancers poll it): to anyone, whether it
    is up and how many sessions and answers there are; the model's path, the
    process's threads and tasks and the engines' figures only to an operator
    (the server token, or a call on this machine not through a proxy)."""
    from starlette.testclient import TestClient

    from vidchat.app.access import build_access
    from vidchat.app.server import create_app
    from vidchat.app.settings import Settings
    from vidchat.app.state import AppState

    settings = Settings(token="s3cret-token")
    state = AppState(settings=settings, model_path="/srv/models/secret-path", access=build_access(settings))
    client = TestClient(create_app(state), base_url="http://localhost")  # from "testclient": not this machine
    counts = {"ok", "status", "sessions", "sessions_by_kind", "answers", "questions_asked"}
    public = client.get("/api/health")
    assert public.status_code == 503  # no engine: not ready, and it says so to anyone
    assert set(public.json()) == counts and "secret-path" not in public.text
    operator = client.get("/api/health", headers={"Authorization": "Bearer s3cret-token"}).json()
    assert counts < set(operator) and operator["model"] == "/srv/models/secret-path"
    assert "threads_by_name" in operator["process"]
    # From this machine, but through a proxy: a visitor, not an operator.
    local = TestClient(create_app(state), base_url="http://localhost", client=("127.0.0.1", 5000))
    assert set(local.get("/api/health").json()) > counts
    assert set(local.get("/api/health", headers={"X-Forwarded-For": "203.0.113.9"}).json()) == counts


@pytest.mark.engine
async def test_metrics_count_a_socket_session_and_carry_vllms_own_families(server):
    before = scrape(server)
    names = families(before)
    for family in VIDCHAT_FAMILIES:
        assert any(name == family or name.startswith(family + "_") for name in names), family
    for family in VLLM_FAMILIES:
        assert any(name == family or name.startswith(family + "_") for name in names), family
    assert value(before, "vidchat_engine_up", engine="main") == 1.0
    assert not any(name.startswith("vidchat_gpu_") for name in names)  # no GPU here: no GPU figures

    async with websockets.connect(server.ws_url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", "max_tokens": 6, "temperature": 0.0}))
        for data in MOVING[:5]:
            await ws.send(json.dumps({"type": "video.frame", "data": data}))
        await ws.send(json.dumps({"type": "video.query", "text": "What is there?"}))
        done = (await until_done(ws))[-1]
        during = scrape(server)
        assert value(during, "vidchat_sessions", door="socket") >= 1
        assert value(during, "vidchat_session_buffer_bytes") > 0
    after = scrape(server)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("vidchat_frames_received_total", door="socket") >= 5
    assert grew("vidchat_frames_kept_total", door="socket") >= 5
    chat = {"door": "socket", "engine": "main", "kind": "chat"}
    assert grew("vidchat_answers_total", status="completed", **chat) == 1
    assert grew("vidchat_first_token_seconds_count", **chat) == 1
    assert grew("vidchat_answer_tokens_total", **chat) == done["stats"]["completion_tokens"]
    assert done["stats"]["engine"] == "main"  # the record names the engine that answered
    assert value(after, "vidchat_event_loop_lag_seconds_count") > value(before, "vidchat_event_loop_lag_seconds_count")
    # vLLM's own counters moved with the answer.
    assert value(after, "vllm:generation_tokens_total", **_vllm_labels(after)) > \
        value(before, "vllm:generation_tokens_total", **_vllm_labels(before))


@pytest.mark.engine
async def test_the_start_ups_objects_are_set_aside_so_the_full_collection_runs_as_sessions_come_and_go(server):
    """With the start-up's ~800,000 objects counted, Python's full collection
    (the one that frees what closed sessions leave in cycles) waited for
    200,000 new survivors and almost never ran (the soak, docs/operations.md)."""
    before = server.get_json("/api/health")["process"]
    assert before["gc_frozen_objects"] > 100_000, before

    async def a_session_then_full_passes() -> int:
        async with websockets.connect(server.ws_url, max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.config", "max_tokens": 4, "temperature": 0.0}))
            for data in MOVING[:5]:
                await ws.send(json.dumps({"type": "video.frame", "data": data}))
            await ws.send(json.dumps({"type": "video.query", "text": "What is there?"}))
            await until_done(ws)
        return (await asyncio.to_thread(server.get_json, "/api/health"))["process"]["gc_full_collections"]

    await eventually_async(lambda: _more(a_session_then_full_passes(), before["gc_full_collections"]), 120,
                           "a full collection while sessions come and go", interval=0.0)


async def _more(count, than: int) -> bool:
    return await count > than


def _vllm_labels(samples: dict) -> dict[str, str]:
    """The labels vLLM puts on its series (model_name, engine)."""
    for (name, labels) in samples:
        if name == "vllm:generation_tokens_total":
            return dict(labels)
    return {}


# ---- the engine comes back ---------------------------------------------------------------

@pytest.mark.engine
async def test_a_killed_engine_comes_back_and_the_same_session_is_answered(restarting_server):
    srv = restarting_server  # shared with tests/test_suite_server.py, which kills it again
    before = scrape(srv)
    restarts = value(before, "vidchat_engine_restarts_total", engine="main")
    failed = value(before, "vidchat_answers_total", door="socket", status="failed", engine="main", kind="chat")
    async with websockets.connect(srv.ws_url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", "max_tokens": 3000, "temperature": 0.0}))
        for data in MOVING[:4]:
            await ws.send(json.dumps({"type": "video.frame", "data": data}))
        await ws.send(json.dumps({"type": "video.query", "text": "Tell me everything."}))
        first = [await recv(ws), await recv(ws)]
        assert [m["type"] for m in first] == ["response.start", "response.text.delta"], first
        cores = engine_cores(srv)
        assert cores, "no EngineCore process found"
        for core in cores:
            core.send_signal(signal.SIGKILL)  # mid-answer
        rest = await until_done(ws)
        errors = [m["message"] for m in rest if m["type"] == "error"]
        assert len(errors) == 1 and "The model engine has stopped" in errors[0], rest[-3:]
        assert "killed" in errors[0]  # the cause is named
        status, body = await eventually_async(lambda: (r := readyz(srv))[0] == 503 and r, 10,
                                              "/readyz says the engine is down")
        assert "engine" in body["reason"] and ("Restarting" in body["reason"] or "stopped" in body["reason"]), body
        # Asked while it restarts: the question waits, then is answered from the frames kept.
        await ws.send(json.dumps({"type": "video.query", "text": "And now?", "max_tokens": 4}))
        again = await until_done(ws)
        assert not [m for m in again if m["type"] == "error"], again
        assert again[-1]["stats"]["frames"] == 4
    assert readyz(srv)[0] == 200
    samples = scrape(srv)
    assert value(samples, "vidchat_engine_restarts_total", engine="main") == restarts + 1
    assert value(samples, "vidchat_engine_up", engine="main") == 1
    assert value(samples, "vidchat_answers_total", door="socket", status="failed", engine="main",
                  kind="chat") == failed + 1
    await eventually_async(lambda: srv.get_json("/api/health")["running_requests"] == 0, 10,
                           "nothing left running")
    assert "the main model engine stopped" in srv.log() and f"is back (restart {int(restarts) + 1})" in srv.log()
