"""Hosting, round 2 (issue 21), through the real server (uvicorn subprocess,
answered by real vLLM on the tiny model: the suite's shared `vllm serve`) and Gradio's real HTTP API, raw (no
gradio_client for the refusals), in each access mode:

* none (loopback, --forwarded-allow-ips): clients behind a local proxy get
  separate per-client caps; operator routes refuse proxied calls; the memory
  budget; 16 seed clients past the answer cap see only the seed's messages;
  hostile and bomb bundles through the page's API;
* --token, --auth, and HF sign-in as a Space starts it: every route that is
  not public refuses a call without a credential (401/403) and runs nothing
  (questions asked and uploads stored, counted before and after); sessions
  belong to the login that opened them (403 for any other); operator
  routes refuse a page login.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import time
from contextlib import closing
from pathlib import Path

import hostile_bundles as hb
import httpx
import pytest
import websockets
import websockets.exceptions
from conftest import SERVER_ARGS, TEST_MAX_IMAGES, TEST_MAX_MODEL_LEN, eventually_async, start_server, stop_server
from itsdangerous import TimestampSigner
from test_hosting_rules import build_app, sample_path
from test_protocol import MOVING, check_answer, recv, send, until

from vidchat.app.access import OPERATOR_ROUTES, PUBLIC_ROUTES, WS_PATH

pytestmark = pytest.mark.engine

TOKEN = "s3cret-hosting-token"
USERS = {"alice": "wonderland", "bob": "builder"}
OAUTH_SECRET = "space-oauth-secret"
BASE_ARGS = ["--model", "tiny", "--max-images", str(TEST_MAX_IMAGES), "--max-model-len", str(TEST_MAX_MODEL_LEN),
             "--kv-cache-gb", "0.25", *SERVER_ARGS, "--max-tokens", "8", "--connect-timeout", "60"]
SPACE_ENV = {"SYSTEM": "spaces", "SPACE_ID": "someone/vidchat", "SPACE_HOST": "someone-vidchat.hf.space",
             "OAUTH_CLIENT_ID": "space-client-id", "OAUTH_CLIENT_SECRET": OAUTH_SECRET,
             "OPENID_PROVIDER_URL": "https://huggingface.co", "OAUTH_SCOPES": "openid profile"}
RELAY = json.dumps([{"urls": "turn:turn.example:3478", "username": "u", "credential": "p"}])
GUARDED_MODES = {
    "token": ["--token", TOKEN],
    "auth": ["--token", TOKEN, *[a for u, p in USERS.items() for a in ("--auth", f"{u}:{p}")]],
    "hf": ["--ice-servers", RELAY, "--hf-users", "alice,bob", "--token", TOKEN],
}


def start(name: str, args: list[str], artifacts_dir: Path, tmp: Path, engine_url: str, env: dict | None = None):
    """app.py in one access mode. What these tests check is the guard in front
    of the engine, so the answers come from the suite's shared `vllm serve`
    (``--engine-url``) instead of a model loaded by each of the four servers."""
    uploads = tmp / "gradio-uploads"
    uploads.mkdir(parents=True, exist_ok=True)
    srv = start_server([*BASE_ARGS, "--engine-url", engine_url, *args], artifacts_dir / f"server-hosting-{name}.log",
                       env_extra={"GRADIO_TEMP_DIR": str(uploads), **(env or {})})
    srv.uploads = uploads
    return srv


@pytest.fixture(scope="module")
def plain(tiny_vllm_serve, artifacts_dir, tmp_path_factory):
    """No credentials (loopback), proxies on this machine trusted, one session per client address."""
    srv = start("none", ["--forwarded-allow-ips", "127.0.0.1", "--max-sessions-per-client", "1",
                         "--max-concurrent-answers", "4", "--max-sessions", "24"],
                artifacts_dir, tmp_path_factory.mktemp("none"), tiny_vllm_serve)
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module", params=list(GUARDED_MODES))
def guarded(request, tiny_vllm_serve, artifacts_dir, tmp_path_factory):
    mode = request.param
    srv = start(mode, GUARDED_MODES[mode], artifacts_dir, tmp_path_factory.mktemp(mode), tiny_vllm_serve,
                SPACE_ENV if mode == "hf" else None)
    srv.mode = mode
    yield srv
    stop_server(srv)


# ---- HTTP helpers -------------------------------------------------------------------------

def client(srv, **kwargs) -> httpx.Client:
    return httpx.Client(base_url=srv.url, timeout=30, follow_redirects=False, **kwargs)


def health(srv) -> dict:
    return httpx.get(srv.url + "/api/health", timeout=10).json()


def hf_cookie(user: str) -> dict[str, str]:
    """The session cookie Gradio's SessionMiddleware sets after an HF sign-in,
    signed the way it signs it (with the Space's OAuth secret)."""
    session = {"oauth_info": {"access_token": "hf_oauth_x", "expires_at": int(time.time()) + 3600,
                              "userinfo": {"preferred_username": user, "name": user.title(),
                                           "profile": f"https://huggingface.co/{user}", "picture": ""}}}
    secret = hashlib.sha256((OAUTH_SECRET + "-v4").encode()).hexdigest()
    value = TimestampSigner(secret).sign(base64.b64encode(json.dumps(session).encode())).decode()
    return {"session": value}


def login(srv, user: str) -> httpx.Client:
    """A client holding the page login of ``user`` in the server's mode."""
    if srv.mode == "hf":
        return client(srv, cookies=hf_cookie(user))
    c = client(srv)
    password = USERS.get(user, TOKEN) if srv.mode == "auth" else TOKEN
    r = c.post("/login", data={"username": user, "password": password})
    assert r.status_code == 200, r.text
    return c


def cookie_header(c: httpx.Client) -> str:
    return "; ".join(f"{k}={v}" for k, v in c.cookies.items())


def page_call(c: httpx.Client, api_name: str, data: list, timeout: float = 60) -> tuple[str, object]:
    """Run a page function through /gradio_api/call: ('complete' | 'error', its data)."""
    r = c.post(f"/gradio_api/call/{api_name}", json={"data": data})
    assert r.status_code == 200, (r.status_code, r.text)
    event_id = r.json()["event_id"]
    kind, payload = None, None
    with c.stream("GET", f"/gradio_api/call/{api_name}/{event_id}", timeout=timeout) as stream:
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kind = line[7:].strip()
            elif line.startswith("data: ") and kind in ("complete", "error"):
                payload = json.loads(line[6:]) if line[6:].strip() not in ("", "null") else None
                break
    return kind, payload


def upload(c: httpx.Client, path: Path) -> dict:
    r = c.post("/gradio_api/upload", files={"files": (path.name, path.read_bytes(), "application/zip")})
    assert r.status_code == 200, r.text
    return {"path": r.json()[0], "orig_name": path.name, "meta": {"_type": "gradio.FileData"}}


def settings_args(max_frames: int = 16) -> list:
    """The page's settings, in /ask's order after the session id."""
    return [4, "uniform", 10, True, 0.95, max_frames, "images", True, 4, 0.0, "", False, ""]


async def raw_offer(srv, headers: dict[str, str]) -> str:
    """A WebRTC session opened with these credentials (never connected); its id."""
    from aiortc import RTCPeerConnection

    pc = RTCPeerConnection()
    pc.addTransceiver("video", direction="sendonly")
    await pc.setLocalDescription(await pc.createOffer())
    body = {"type": "offer", "sdp": pc.localDescription.sdp}
    r = await asyncio.to_thread(httpx.post, srv.url + "/webrtc/offer", json=body, headers=headers, timeout=30)
    await pc.close()
    assert r.status_code == 200, r.text
    return r.json()["session_id"]


async def ws_asked(url: str, headers: dict[str, str] | None = None, **config):
    """A WebSocket session (still open) that asked one question; (socket, its messages)."""
    ws = await websockets.connect(url, max_size=None, additional_headers=headers or {})
    await send(ws, {"type": "session.config", **config})
    for data in MOVING[:4]:
        await send(ws, {"type": "video.frame", "data": data})
    await send(ws, {"type": "video.query", "text": "What is there?"})
    return ws, await until(ws, "response.text.done", timeout=60)


def guarded_routes(mode: str) -> list[tuple[str, str]]:
    """(method, path) of every route of this mode's real route table that is
    not public, as a caller would reach it."""
    with pytest.MonkeyPatch.context() as mp:
        app, _ = build_app(GUARDED_MODES[mode], mp, space=mode == "hf")
        out = []
        for route in _routes_with_methods(app):
            template, methods = route
            if template in PUBLIC_ROUTES:
                continue
            for method in sorted(methods - {"HEAD"}) or ["GET"]:
                out.append((method, sample_path(template)))
    return out


def _routes_with_methods(app):
    from starlette.routing import Mount

    found = []

    def walk(routes, prefix=""):
        for r in routes:
            if isinstance(r, Mount):
                if hasattr(r.app, "routes"):
                    walk(r.app.routes, prefix + r.path)
                else:
                    found.append((prefix + r.path + "/{path:path}", {"GET"}))
            else:
                found.append((prefix + r.path, set(getattr(r, "methods", None) or {"WS"})))

    walk(app.routes)
    return found


def uploads_stored(srv) -> int:
    return sum(1 for p in srv.uploads.rglob("*") if p.is_file())


# ---- every route that is not public, without a credential ---------------------------------------

async def test_every_non_public_route_refuses_a_caller_without_a_credential_and_runs_nothing(guarded):
    routes = guarded_routes(guarded.mode)
    assert ("POST", "/gradio_api/upload") in routes and ("POST", "/gradio_api/call/x1") in routes
    asked, stored = health(guarded)["questions_asked"], uploads_stored(guarded)
    statuses = {}
    with client(guarded) as anonymous:
        for method, path in routes:
            if method == "WS":
                continue
            headers = {"X-Forwarded-For": "203.0.113.50"} if path in OPERATOR_ROUTES else {}
            if method == "POST" and path == "/gradio_api/upload":
                r = anonymous.post(path, files={"files": ("b.zip", b"PK\x05\x06" + b"\0" * 18)}, headers=headers)
            elif method == "POST":
                r = anonymous.post(path, json={"data": ["x", [], "x", *settings_args()], "fn_index": 1},
                                   headers=headers)
            else:
                r = anonymous.request(method, path, headers=headers)
            statuses[(method, path)] = r.status_code
    wrong = {k: v for k, v in statuses.items() if v not in (401, 403)}
    assert not wrong, wrong
    assert statuses[("POST", "/gradio_api/upload")] == 401
    for path in (WS_PATH,):
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            await websockets.connect(f"ws://127.0.0.1:{guarded.port}{path}")
        assert refused.value.response.status_code == 401
    after = health(guarded)
    assert after["questions_asked"] == asked and uploads_stored(guarded) == stored


def test_the_page_shell_still_loads_for_a_visitor(guarded):
    with client(guarded) as anonymous:
        assert anonymous.get("/").status_code == 200
        assert anonymous.get("/healthz").status_code == 200 and anonymous.get("/readyz").status_code == 200
        assert anonymous.get("/static/vidchat/vidchat.js").status_code == 200
        # A path that climbs out of the static folder reaches nothing (the
        # client may resolve it to /gradio_api/upload, which is guarded).
        assert anonymous.get("/static/../gradio_api/upload").status_code in (401, 404)


def test_a_signed_in_login_passes_and_one_outside_hf_users_does_not(guarded):
    with closing(login(guarded, "alice")) as alice:
        assert alice.get("/gradio_api/info").status_code == 200
        kind, out = page_call(alice, "reask", ["no-session", "no-answer", *settings_args(), "main"])
        assert kind == "complete" and "Pick an answer" in str(out)  # the function ran, for a login
    if guarded.mode == "hf":
        with client(guarded, cookies=hf_cookie("carol")) as carol:  # signed in, not on --hf-users
            r = carol.post("/gradio_api/upload", files={"files": ("b.zip", b"x")})
            assert r.status_code == 403 and "--hf-users" in r.json()["detail"]
        forged = hf_cookie("alice")["session"][:-4] + "AAAA"  # not signed with the Space's secret
        with client(guarded, cookies={"session": forged}) as mallory:
            assert mallory.post("/gradio_api/call/reask", json={"data": []}).status_code == 401


def test_operator_routes_refuse_a_page_login_and_take_the_server_token(guarded):
    with closing(login(guarded, "alice")) as alice:
        for path in OPERATOR_ROUTES:
            assert alice.post(path, json={}).status_code == 403, path
    bearer = {"Authorization": f"Bearer {TOKEN}", "X-Forwarded-For": "203.0.113.51"}
    r = httpx.post(guarded.url + "/api/prewarm", json={"mode": "off"}, headers=bearer, timeout=10)
    assert r.status_code == 200 and r.json()["mode"] == "off"
    r = httpx.post(guarded.url + "/api/drain", json={"draining": False}, headers=bearer, timeout=10)
    assert r.status_code == 200 and r.json()["draining"] is False


# ---- a session belongs to whoever opened it ---------------------------------------------------

SESSION_CALLS = {"ask": 2, "stop": 0, "watch": 4, "talk": 5, "reask": 0}


async def test_another_logins_session_id_is_refused(guarded):
    other_user = "bob"
    with closing(login(guarded, "alice")) as alice, closing(login(guarded, other_user)) as bob:
        cookie = {"Cookie": cookie_header(alice)}
        sid = await raw_offer(guarded, cookie)
        asked = health(guarded)["questions_asked"]
        token = {"Authorization": f"Bearer {TOKEN}"}
        for name, position in SESSION_CALLS.items():
            data = [None] * position + [sid] + [None] * 3
            for intruder in (bob, client(guarded, headers=token)):
                r = intruder.post(f"/gradio_api/call/{name}", json={"data": data})
                assert r.status_code == 403, (name, r.status_code, r.text)
        ask = next(d["id"] for d in bob.get("/config").json()["dependencies"] if d.get("api_name") == "ask")
        r = bob.post("/gradio_api/queue/join", json={"data": ["hi", [], sid, *settings_args()], "fn_index": ask,
                                                      "session_hash": "bobs-tab", "trigger_id": None})
        assert r.status_code == 403
        assert bob.get(f"/webrtc/stats?session_id={sid}").status_code == 403
        assert bob.post("/webrtc/close", json={"session_id": sid}).status_code == 403
        assert health(guarded)["questions_asked"] == asked
        assert alice.get(f"/webrtc/stats?session_id={sid}").status_code == 200
        kind, _ = page_call(alice, "stop", [sid])  # the owner's own call goes through
        assert kind == "complete"
        assert alice.post("/webrtc/close", json={"session_id": sid}).json() == {"closed": True}
        # Answers too: another login cannot read what the model got.
        ws_url = f"ws://127.0.0.1:{guarded.port}{WS_PATH}"
        ws, msgs = await ws_asked(ws_url, cookie, max_tokens=2, temperature=0.0)
        try:
            answer_id = msgs[-1]["stats"]["answer_id"]
            assert bob.get(f"/inputs/{answer_id}/record.json").status_code == 403
            assert httpx.get(f"{guarded.url}/inputs/{answer_id}/record.json", timeout=10).status_code == 401
            record = alice.get(f"/inputs/{answer_id}/record.json")
            assert record.status_code == 200 and record.json()["id"] == answer_id
        finally:
            await ws.close()


# ---- none mode: proxies, operator routes, memory, seed clients, bundles ----------------------------

async def test_clients_behind_a_local_proxy_get_their_own_per_client_caps(plain):
    url = plain.ws_url

    async def opened(address: str) -> tuple[websockets.ClientConnection, dict | None]:
        ws = await websockets.connect(url, additional_headers={"X-Forwarded-For": address})
        try:
            await send(ws, {"type": "session.config"})
            await send(ws, {"type": "ping"})
        except websockets.ConnectionClosed:
            pass  # refused: the server may close before our messages go; its reason came first
        return ws, await recv(ws)

    first, reply = await opened("203.0.113.7")
    assert reply == {"type": "pong"}
    again, reply = await opened("203.0.113.7")
    assert reply["type"] == "error" and "--max-sessions-per-client" in reply["message"]
    other, reply = await opened("198.51.100.8")
    assert reply == {"type": "pong"}  # another client behind the same proxy: its own cap
    for ws in (first, again, other):
        await ws.close()
    assert "203.0.113.7" in plain.log() and "198.51.100.8" in plain.log()  # logs name the real client


def test_operator_routes_refuse_a_call_through_a_proxy(plain):
    for path in OPERATOR_ROUTES:
        r = httpx.post(plain.url + path, json={}, headers={"X-Forwarded-For": "203.0.113.9"}, timeout=10)
        assert r.status_code == 403 and "Operator" in r.json()["detail"], path
    assert httpx.post(plain.url + "/api/loop-lag/reset", json={}, timeout=10).json() == {"reset": True}


async def test_max_frames_over_the_session_budget_is_refused_everywhere(plain):
    ws = await websockets.connect(plain.ws_url, max_size=None)
    await send(ws, {"type": "session.config", "max_frames": 1024})
    msg = await recv(ws)
    assert msg["type"] == "error" and "--max-session-mb" in msg["message"] and "max_frames" in msg["message"]
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await recv(ws)
    assert closed.value.rcvd.code == 1008
    ws = await websockets.connect(plain.ws_url, max_size=None)
    await send(ws, {"type": "session.config", "max_frames": 16})
    await send(ws, {"type": "session.update", "max_frames": 1024})
    msg = await recv(ws)
    assert msg["type"] == "error" and msg["message"].startswith("session.update rejected: max_frames 1024")
    await send(ws, {"type": "ping"})
    assert await recv(ws) == {"type": "pong"}  # the session goes on, unchanged
    await ws.close()
    # The page: a live tab asking with the buffer set past the budget.
    from vidchat.devtools.rtc_client import RtcClient, SyntheticVideo

    tab = RtcClient(plain.url, SyntheticVideo(width=320, height=240))
    await tab.connect()
    try:
        with client(plain) as page:
            kind, out = await asyncio.to_thread(page_call, page, "ask", ["What?", [], tab.session_id,
                                                                        *settings_args(max_frames=256)])
        assert kind == "complete"
        notice = out[0][-1]["content"]
        assert "Settings not accepted" in str(notice) and "--max-session-mb" in str(notice)
    finally:
        await tab.close()


async def test_sixteen_seed_clients_past_the_answer_cap_see_only_the_seeds_messages(plain):
    """A load client that reads exactly the seed's message order: config with
    the seed's fields only, frames, one question, then start, deltas, done."""
    async def seed_client(n: int) -> list[dict]:
        ws = await websockets.connect(plain.ws_url, max_size=None,
                                      additional_headers={"X-Forwarded-For": f"192.0.2.{n + 1}"})
        try:
            await send(ws, {"type": "session.config", "model": "seed-load", "max_frames": 16,
                            "num_sample_frames": 4, "evs_enabled": False, "evs_threshold": 0.95})
            for data in MOVING[:4]:
                await send(ws, {"type": "video.frame", "data": data})
            await ready.wait()
            await send(ws, {"type": "video.query", "text": f"What is in frame {n}?"})
            return await until(ws, "response.text.done", timeout=240)
        finally:
            await ws.close()

    ready = asyncio.Event()
    tasks = [asyncio.create_task(seed_client(n)) for n in range(16)]
    await eventually_async(lambda: health(plain)["sessions"] >= 16, 60, "16 seed sessions are open")
    asked = health(plain)["questions_asked"]
    ready.set()
    results = await asyncio.gather(*tasks)
    for msgs in results:
        check_answer(msgs)  # response.start, deltas, response.text.done: nothing else
    assert health(plain)["questions_asked"] - asked == 16
    assert health(plain)["answers"]["limit"] == 4  # 16 at once were past the cap


async def test_only_a_client_that_opted_in_is_told_its_place_in_the_queue(plain):
    busy = []
    for n in range(4):  # long answers hold all --max-concurrent-answers places
        ws = await websockets.connect(plain.ws_url, max_size=None)
        await send(ws, {"type": "session.config", "max_tokens": 3000, "temperature": 0.0})
        for data in MOVING[:4]:
            await send(ws, {"type": "video.frame", "data": data})
        await send(ws, {"type": "video.query", "text": "long"})
        assert (await recv(ws, timeout=60))["type"] == "response.start"
        busy.append(ws)
    opted = await websockets.connect(plain.ws_url, max_size=None)
    seed = await websockets.connect(plain.ws_url, max_size=None)
    try:
        for ws, config in ((opted, {"vidchat_events": True, "max_frames": 16}), (seed, {"max_frames": 16})):
            await send(ws, {"type": "session.config", **config})
            for data in MOVING[:4]:
                await send(ws, {"type": "video.frame", "data": data})
            await send(ws, {"type": "video.query", "text": "wait"})
        told = await recv(opted)
        assert told["type"] == "response.queued" and told["position"] == told["ahead"] + 1 in (1, 2)
        await eventually_async(lambda: health(plain)["answers"]["waiting"] >= 2, 15, "both questions wait")
        assert health(plain)["answers"]["waiting"] == 2
    finally:
        # Hung up, not closed: these clients read nothing after response.start,
        # so a polite close would wait (10 s each) behind the deltas they left unread.
        for ws in busy:
            ws.transport.abort()
    check_answer(await until(seed, "response.text.done", timeout=120))  # waited, and was told nothing
    check_answer([m for m in await until(opted, "response.text.done", timeout=120) if m["type"] != "response.queued"])
    await opted.close()
    await seed.close()


def panel(outputs: list) -> str:
    """The compare panel's HTML among /load_bundle's outputs (the Re-ask
    list beside it is a dropdown, whose labels the page shows as text)."""
    return "".join(x for x in outputs if isinstance(x, str))


def test_a_hostile_bundle_shows_text_through_the_page_api(plain, tmp_path):
    with client(plain) as page:
        kind, out = page_call(page, "load_bundle", [upload(page, hb.hostile_zip(tmp_path / "h.zip")), ""])
        assert kind == "complete"
        shown = panel(out)
        assert "Loaded the bundle" in shown
        assert "<img" not in shown and "<script" not in shown and "<svg" not in shown
        assert "&lt;img src=x onerror=" in shown
        pixels = hb.frames()
        meta = hb.with_value(hb.manifest(pixels), "settings", "temperature", hb.MARKUP)
        bad = hb.write_zip(tmp_path / f"{hb.MARKUP[:20]}.zip", pixels, meta)
        kind, out = page_call(page, "load_bundle", [upload(page, bad), ""])
        shown = panel(out)
        assert kind == "complete" and "Invalid type for" in shown and "temperature" in shown
        assert "<img" not in shown and "<script" not in shown


def _peak_rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+)", status).group(1))


def test_a_bomb_bundle_is_refused_in_milliseconds_with_memory_flat(plain, tmp_path):
    bomb = hb.bomb_zip(tmp_path / "bomb.zip", 16)  # 16 x 4096² x 3 = 768 MB decoded, a small zip
    assert bomb.stat().st_size < 8 << 20
    peak = _peak_rss_kb(plain.proc.pid)
    with client(plain) as page:
        file_data = upload(page, bomb)
        started = time.monotonic()
        kind, out = page_call(page, "load_bundle", [file_data, ""])
        took = time.monotonic() - started
    assert kind == "complete" and "would decode to 768 MB" in json.dumps(out)
    assert took < 3.0, took  # the refusal itself takes milliseconds; the rest is the HTTP round trips
    assert _peak_rss_kb(plain.proc.pid) - peak < 100_000  # KB: nothing was decoded
