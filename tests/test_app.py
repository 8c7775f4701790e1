"""`python app.py` as users run it: start, serve, refuse bad input, stop cleanly."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import urllib.request

import psutil
import pytest
from conftest import ROOT, eventually_async, start_server, stop_server


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


# Ctrl-C must not hang on open connections: a tab's Gradio stream, a peer, a
# socket (they get vidchat.app.server.SHUTDOWN_GRACE_S while the engine shuts
# down). Generous for a loaded CI machine; the test prints the time.
SHUTDOWN_WITHIN_S = 8.0


async def _received(ws) -> list[str]:
    """What the server sent on ``ws`` until it closed it."""
    import websockets

    out = []
    try:
        while True:
            out.append(await asyncio.wait_for(ws.recv(), 10))
    except (websockets.ConnectionClosed, asyncio.TimeoutError):
        return out


@pytest.mark.engine
def test_serves_page_health_and_banner(server):
    health = server.get_json("/api/health")
    assert health["ok"] and health["running_requests"] == 0
    assert "RANDOM weights" in health["banner"] and "--model" in health["banner"]
    status, page = fetch(server.url + "/")
    assert status == 200 and "<html" in page.lower()
    assert "RANDOM weights" in server.log()


@pytest.mark.engine
def test_static_files_only_from_static_dir(server):
    assert fetch(server.url + "/static/vidchat/vidchat.css")[0] == 200
    # Under vidchat's mount and under Gradio's /static/ beside it: refused (404,
    # or Gradio's 403 for a path that climbs out), never the file.
    for path in ("/static/../app.py", "/static/%2e%2e/app.py", "/static/..%2fpyproject.toml",
                 "/static/vidchat/../../app.py", "/static/vidchat/%2e%2e/%2e%2e/app.py",
                 "/static/vidchat/..%2f..%2fpyproject.toml"):
        status, body = fetch(server.url + path)
        assert status in (403, 404), (path, status)
        assert "ws_idle_timeout" not in body and "[project]" not in body and "def main" not in body, path


@pytest.mark.unit
def test_missing_model_folder_is_a_one_line_error():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "app.py"), "--model", "/no/such/dir"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode != 0
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, proc.stderr
    assert "/no/such/dir" in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.unit
def test_help_lists_every_option_with_its_env_var():
    from vidchat.app.settings import Settings

    out = subprocess.run(
        [sys.executable, str(ROOT / "app.py"), "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT
    ).stdout
    for name in Settings.option_names():
        assert "--" + name.replace("_", "-") in out
        assert "VIDCHAT_" + name.upper() in out


@pytest.mark.unit
def test_env_var_sets_an_option_and_flag_wins(monkeypatch):
    from vidchat.app.settings import parse_settings

    monkeypatch.setenv("VIDCHAT_WS_IDLE_TIMEOUT", "12.5")
    monkeypatch.setenv("VIDCHAT_PORT", "9000")
    s = parse_settings(["--port", "9100"])
    assert s.ws_idle_timeout == 12.5 and s.port == 9100 and s.host == "127.0.0.1"


@pytest.mark.unit
def test_the_audio_a_session_keeps_is_bounded_at_start_up_for_every_door(capsys):
    """--ws-max-audio-seconds is the one cap on a socket session's audio and
    a spoken question (seed and Realtime doors alike): a value no session
    could hold is refused at start-up, naming the flag."""
    from vidchat.app.settings import parse_settings
    from vidchat.media.session import MAX_AUDIO_SECONDS, SessionSettings

    assert parse_settings(["--ws-max-audio-seconds", str(MAX_AUDIO_SECONDS)]).ws_max_audio_seconds == 600
    SessionSettings(audio_seconds=MAX_AUDIO_SECONDS).validate()
    for value in ("0", "601"):
        with pytest.raises(SystemExit):
            parse_settings(["--ws-max-audio-seconds", value])
        assert "--ws-max-audio-seconds must be at" in capsys.readouterr().err


@pytest.mark.unit
def test_vllm_parallelism_and_the_encoder_cache_size_reach_the_engine_options():
    from vidchat.app import server
    from vidchat.app.settings import parse_settings

    s = parse_settings(["--tensor-parallel-size", "2", "--data-parallel-size", "4", "--max-sessions", "8",
                        "--frames-per-question", "12"])
    options = server.engine_options(s, "some/model", tiny=False)
    assert (options.tensor_parallel_size, options.data_parallel_size) == (2, 4)
    assert options.encoder_cache_frames == 8 * 12
    for flag in ("--tensor-parallel-size", "--data-parallel-size"):
        with pytest.raises(SystemExit):
            parse_settings([flag, "0"])


@pytest.mark.browser
async def test_a_socket_session_runs_while_the_model_loads_and_ctrl_c_leaves_no_process(artifacts_dir,
                                                                                       tiny_vl_path, tmp_path):
    """Connected as soon as the port answers: the session takes and acks
    frames while the model loads, and a question asked then waits for the
    model (the client, opted into vidchat's events, is told) and is answered.
    Server VAD asked for on /v1/realtime meanwhile waits for the model too,
    and is refused once it runs, as this model hears nothing.
    Then, with a tab streaming its camera and a socket open, Ctrl-C tells
    the socket why, exits within seconds and leaves no process behind."""
    import asyncio
    import base64
    import json
    import time

    import websockets
    from playwright.async_api import async_playwright

    from vidchat.devtools import synthetic
    from vidchat.devtools.page import launch, open_and_start, write_wav, write_y4m

    # The Realtime socket sends nothing while the model loads and answers:
    # an idle timeout longer than a slow machine's load keeps it open.
    srv = start_server(["--model", "tiny-vl", "--kv-cache-gb", "0.25", "--max-model-len", "2048",
                        "--ws-idle-timeout", "600"], artifacts_dir / "server-shutdown.log", loaded=False)

    async def recv(ws) -> dict:
        return json.loads(await asyncio.wait_for(ws.recv(), 120))

    realtime_url = srv.url.replace("http", "ws") + "/v1/realtime?model=tiny-vl"
    async with websockets.connect(realtime_url) as realtime, websockets.connect(srv.ws_url) as ws:
        # Server VAD asked for while the model loads is kept, and said in
        # session.updated; what the model hears is known only once it runs.
        assert (await recv(realtime))["type"] == "session.created"
        vad = {"type": "server_vad", "silence_duration_ms": 300}
        await realtime.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"input": {"turn_detection": vad}}}}))
        updated = await recv(realtime)
        assert updated["type"] == "session.updated", updated
        assert updated["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        await ws.send(json.dumps({"type": "session.config", "vidchat_events": True, "max_tokens": 4}))
        for i, jpeg in enumerate(synthetic.cuts_clip(120, 160, cuts=2, hold=1).jpegs()):
            await ws.send(json.dumps({"type": "video.frame", "frame_id": f"f{i}", "data": base64.b64encode(jpeg).decode()}))
        acks = [await recv(ws) for _ in range(2)]
        health = await asyncio.to_thread(srv.get_json, "/api/health")
        assert health["ok"] is False, "the model loaded before the frames were acked: nothing was shown"
        assert [(a["type"], a["frame_id"], a["accepted"]) for a in acks] == [("video.frame.ack", "f0", True),
                                                                            ("video.frame.ack", "f1", True)]
        await ws.send(json.dumps({"type": "video.query", "text": "Anyone there?"}))
        waiting = await recv(ws)
        assert waiting["type"] == "response.waiting" and waiting["reason"] == "model_loading", waiting
        assert waiting["message"].startswith("Loading the model")
        messages = [await recv(ws)]
        while messages[-1]["type"] != "response.text.done":
            messages.append(await recv(ws))
        kinds = [m["type"] for m in messages]
        assert kinds[0] == "response.start" and "error" not in kinds, kinds
        assert messages[-1]["stats"]["frames"] == 2
        # The model ran, and it hears nothing (tiny-vl): the kept server VAD
        # is refused in an error, and the session goes on with it off.
        refused = await recv(realtime)
        assert refused["type"] == "error", refused
        assert refused["error"]["message"].startswith("turn_detection is off: "), refused
        await realtime.send(json.dumps({"type": "session.update", "session": {"type": "realtime"}}))
        updated = await recv(realtime)
        assert updated["type"] == "session.updated", updated
        assert updated["session"]["audio"]["input"]["turn_detection"] is None
    children = psutil.Process(srv.proc.pid).children(recursive=True)
    assert children, "vLLM's engine core runs in a child process"
    write_y4m(tmp_path / "cam.y4m", (200, 40, 40))
    write_wav(tmp_path / "mic.wav")
    async with async_playwright() as pw, websockets.connect(srv.ws_url) as open_socket:
        # Configured at once: a socket left unconfigured while Chromium starts
        # is closed by the server's config timeout on a loaded machine.
        await open_socket.send(json.dumps({"type": "session.config"}))
        browser = await launch(pw, tmp_path / "cam.y4m", tmp_path / "mic.wav", tmp_path)
        try:
            await open_and_start(browser, srv.url + "/", min_buffer=4)  # a tab streaming its camera
            await eventually_async(lambda: asyncio.to_thread(lambda: srv.get_json("/api/health")["sessions"] >= 2),
                                   30, "the tab's and the socket's sessions are open")
            began = time.monotonic()
            code = await asyncio.to_thread(stop_server, srv)
            took = time.monotonic() - began
        finally:
            await browser.close()
        said = [json.loads(m) for m in await _received(open_socket)]
    print(f"Ctrl-C with a tab and a socket open: exited in {took:.1f} s")
    assert code == 0
    # A clean shutdown says nothing is wrong: no open stream cancelled with a traceback.
    errors = [line for line in srv.log().splitlines() if "ERROR" in line or "Traceback" in line]
    assert not errors, errors
    assert took < SHUTDOWN_WITHIN_S, f"Ctrl-C took {took:.1f} s with a tab open"
    assert {"type": "error", "message": "Session ended: closed at shutdown"} in said, said
    assert open_socket.close_code == 1001
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"stray processes after Ctrl-C: {alive}"
    assert "engine shut down" in srv.log()


@pytest.mark.engine
async def test_engine_death_is_reported_and_the_server_stays_up(artifacts_dir, tiny_vl_path):
    """Kill vLLM's engine process with --engine-restarts 0: it stays down,
    health and /readyz say why, a question gets a clear error instead of
    hanging, and the server keeps serving. With --log-format json every line
    the server logs is one JSON object."""
    import asyncio
    import base64
    import json
    import signal

    import websockets

    from vidchat.devtools import synthetic

    srv = start_server(["--model", "tiny-vl", "--kv-cache-gb", "0.25", "--max-model-len", "2048",
                        "--engine-restarts", "0", "--log-format", "json"],
                       artifacts_dir / "server-engine-death.log")
    try:
        # A session opened while the engine is up (one opened after it is down
        # for good is refused at the door, before it has a session to log).
        async with websockets.connect(srv.ws_url) as ws:
            await ws.send(json.dumps({"type": "session.config"}))
            await eventually_async(lambda: "started: model=" in srv.log(), 15, "the socket session started")
            for child in psutil.Process(srv.proc.pid).children(recursive=True):
                child.send_signal(signal.SIGKILL)
            health = await eventually_async(lambda: (h := srv.get_json("/api/health"))["ok"] is False and h, 10,
                                            "/api/health reports the engine down")
            assert health["running_requests"] is None
            await eventually_async(lambda: "stays down" in json.dumps(srv.get_json("/readyz")), 10,
                                   "the keeper says the engine stays down")
            jpeg = synthetic.motion_clip(n=1).jpegs()[0]
            await ws.send(json.dumps({"type": "video.frame", "data": base64.b64encode(jpeg).decode()}))
            await ws.send(json.dumps({"type": "video.query", "text": "Anyone there?"}))
            messages = []
            while not any(m.get("type") in ("response.text.done", "error") for m in messages):
                messages.append(json.loads(await asyncio.wait_for(ws.recv(), 15)))
            errors = [m["message"] for m in messages if m["type"] == "error"]
            assert errors and "stays down" in errors[0] and "--engine-restarts is 0" in errors[0], errors
        assert fetch(srv.url + "/")[0] == 200  # the server itself is still up
        ready = srv.get_json("/readyz")
        assert "stays down" in json.dumps(ready), ready
        lines = [line for line in srv.log().splitlines() if line.strip()]
        records = [json.loads(line) for line in lines]  # each line one JSON object
        assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
        assert any(r["level"] == "ERROR" and "stays down" in r["message"] for r in records)
        assert any(r.get("door") == "socket" and len(r.get("session", "")) == 8 for r in records)
    finally:
        srv.proc.kill()
        srv.proc.wait(timeout=30)


@pytest.mark.unit
def test_draining_is_refused_to_a_caller_on_another_machine():
    from starlette.testclient import TestClient

    from vidchat.app.server import create_app
    from vidchat.app.settings import Settings
    from vidchat.app.state import AppState

    state = AppState(settings=Settings(), model_path="none")
    client = TestClient(create_app(state), base_url="http://127.0.0.1")  # its peer is "testclient", not loopback
    r = client.post("/api/drain", json={"draining": True})
    assert r.status_code == 403 and "own machine" in r.json()["detail"] and not state.registry.draining


@pytest.mark.engine
def test_the_console_says_what_the_user_needs_before_ready(server):
    """From start to ready: the model, the URL, ready, the tiny model's
    banner; none of the libraries' warnings a user can do nothing about,
    and none of the health checks that waited for the model."""
    lines = server.log().splitlines()
    before_ready = lines[:next(i for i, ln in enumerate(lines) if "vidchat ready on http://" in ln) + 1]
    print(f"{len(before_ready)} lines from start to ready")
    text = "\n".join(before_ready)
    for needed in ("starting vidchat with model tiny (random weights)", "RANDOM weights",
                   "listening on http://127.0.0.1:", "main model tiny loaded on CPU in",
                   "warm-ups: off (auto: a 320x240 frame took",
                   "vidchat ready on http://127.0.0.1:"):
        assert needed in text, needed
    # Nor what a user can't act on: the model's cache path (with its hash), vLLM's own terms.
    for noise in ("[transformers]", "libtcmalloc", "reduce_op", "Triton is not installed", "GET /api/health",
                  "Initializing a V1 LLM engine", "processor_kwargs", "Warning", "warn(", "tiny-omni-v2-",
                  "encoder cache", "aioice"):
        assert noise not in text, noise
    assert not [ln for ln in lines if "aioice.ice" in ln], "ICE candidate pairs at INFO"
    # Every line has its time, uvicorn's request and server lines too (issue 59, point 11).
    untimed = [ln for ln in lines if ("uvicorn" in ln or '"GET ' in ln or '"POST ' in ln)
               and not re.match(r"\d\d:\d\d:\d\d ", ln)]
    assert not untimed, untimed[:5]
    assert len(before_ready) <= 20, text
    # --prewarm auto (the shared server's) timed a frame of the tiny model: cheap, so warm-ups are off, and says so.
    prewarm = server.get_json("/api/health")["prewarm"]
    assert (prewarm["setting"], prewarm["chosen"]) == ("auto", "off"), prewarm
    assert prewarm["frame_encode_ms"] is not None and "less than 150 ms" in prewarm["reason"], prewarm


@pytest.mark.unit
def test_gradio_keeps_the_page_state_of_a_bounded_number_of_tabs():
    """Gradio copies the page's state for each tab it sees (about 110 KB
    here) and by default keeps 10,000 of them: a server that visitors come
    and go on would grow by a gigabyte. vidchat bounds it by its sessions."""
    import gradio as gr

    from vidchat.app.server import create_app
    from vidchat.app.settings import Settings
    from vidchat.app.state import AppState
    from vidchat.doors.page.layout import page_state_capacity

    state = AppState(settings=Settings(max_sessions=4), model_path="none")
    app = create_app(state)
    page = next(route.app for route in app.routes if isinstance(getattr(route, "app", None), gr.routes.App))
    holder = page.state_holder
    assert holder.capacity == page_state_capacity(4) == 256
    for tab in range(300):
        holder[f"tab-{tab}"]
    assert len(holder.session_data) == 256 and "tab-299" in holder and "tab-0" not in holder
