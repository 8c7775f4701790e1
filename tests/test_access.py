"""Hosting safely: credentials, Origin/Host checks, body and session limits,
the answer queue, the session time limit and readiness, each through the real
server (uvicorn subprocess, real vLLM on the tiny model) and, for the
password-protected page, Debian's Chromium."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import subprocess
import sys
import time
import urllib.request

import pytest
import websockets
from aiortc import RTCPeerConnection
from conftest import (
    CACHE_DIR,
    ROOT,
    SERVER_ARGS,
    TEST_MAX_IMAGES,
    TEST_MAX_MODEL_LEN,
    Server,
    eventually,
    eventually_async,
    free_port,
    stop_server,
)
from playwright.async_api import async_playwright
from test_protocol import SHORT, check_answer, expect_error, frames, recv, send, until

from vidchat.devtools.page import ask as page_ask
from vidchat.devtools.page import launch, wait_for_answer, write_wav, write_y4m

TOKEN = "s3cret-token"
USER, PASSWORD = "alice", "wonderland"
TIME_LIMIT_S = 25


def call(server, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
         host: str | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=15)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host or f"127.0.0.1:{server.port}")
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        raw = r.read()
        try:
            return r.status, json.loads(raw)
        except ValueError:
            return r.status, {"raw": raw[:200].decode(errors="replace")}
    finally:
        conn.close()


async def handshake_status(url: str, **kwargs) -> int:
    """The HTTP status a refused WebSocket handshake got (101 when accepted)."""
    try:
        ws = await websockets.connect(url, max_size=None, **kwargs)
    except websockets.exceptions.InvalidStatus as exc:
        return exc.response.status_code
    await ws.close()
    return 101


@pytest.fixture(scope="module")
def guarded(tiny_omni_path, artifacts_dir, tmp_path_factory):
    """A server with a token, a page password and tight limits. Its start is
    watched: the port must answer (healthz) while the model still loads."""
    port = free_port()
    log_path = artifacts_dir / "server-guarded.log"
    media = tmp_path_factory.mktemp("media")
    (media / "clip.webm").write_bytes(b"\x1aE\xdf\xa3 not really a video")
    (media / "notes.txt").write_text("not a video")
    (media / "sub").mkdir()
    (media / "sub" / "hidden.webm").write_bytes(b"x")
    (media.parent / "outside.webm").write_bytes(b"secret")
    args = ["--model", "tiny", "--max-images", str(TEST_MAX_IMAGES), "--max-model-len", str(TEST_MAX_MODEL_LEN),
            "--kv-cache-gb", "0.25", *SERVER_ARGS, "--token", TOKEN, "--auth", f"{USER}:{PASSWORD}",
            "--max-sessions", "3", "--connect-timeout", "3", "--max-concurrent-answers", "1",
            "--session-time-limit", str(TIME_LIMIT_S), "--media-dir", str(media),
            "--record-dir", str(media.parent / "recordings")]
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port), "--cache-dir",
                             str(CACHE_DIR), *args], cwd=ROOT, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    srv = Server(proc, port, log_path)
    srv.while_loading = None
    srv.record_dir = media.parent / "recordings"
    srv.media_dir = media

    def ready() -> bool:
        assert proc.poll() is None, srv.log()[-3000:]
        healthz = call(srv, "GET", "/healthz")  # OSError while nothing listens yet: "not yet"
        readyz = call(srv, "GET", "/readyz")
        if readyz[0] != 200 and srv.while_loading is None:
            srv.while_loading = (healthz, readyz)
        return readyz[0] == 200

    try:
        eventually(ready, 180, "the guarded server is ready", interval=0.2)
    except AssertionError:
        proc.kill()
        raise
    yield srv
    stop_server(srv)


BEARER = {"Authorization": f"Bearer {TOKEN}"}


# ---- readiness ----------------------------------------------------------------

@pytest.mark.engine
def test_port_answers_while_the_model_loads(guarded):
    assert guarded.while_loading is not None, "the model was ready before the port answered"
    (hz_status, hz), (rz_status, rz) = guarded.while_loading
    assert hz_status == 200 and hz == {"ok": True}
    assert rz_status == 503 and rz["ready"] is False and rz["reason"].startswith("Loading the model…")
    status, ready = call(guarded, "GET", "/readyz")
    assert status == 200 and ready["ready"] is True and ready["reason"] == "ready" and ready["draining"] is False
    assert isinstance(ready["sessions"], int)


# ---- credentials --------------------------------------------------------------

@pytest.mark.engine
@pytest.mark.parametrize("path", ["/api/config", "/webrtc/stats?session_id=x"])
def test_http_endpoints_need_the_token(guarded, path):
    assert call(guarded, "GET", path)[0] == 401
    assert "Bearer" in call(guarded, "GET", path)[1]["detail"]
    assert call(guarded, "GET", path, headers={"Authorization": "Bearer wrong"})[0] == 403
    right = call(guarded, "GET", path, headers=BEARER)[0]
    assert right in (200, 404)  # 404: no such session, past the guard
    assert call(guarded, "GET", path + ("&" if "?" in path else "?") + f"token={TOKEN}")[0] == right


@pytest.mark.engine
def test_health_endpoints_need_no_token(guarded):
    for path in ("/healthz", "/readyz", "/api/health"):
        assert call(guarded, "GET", path)[0] == 200, path


@pytest.mark.engine
def test_webrtc_offer_needs_a_login_or_the_token(guarded):
    offer = json.dumps({"type": "offer", "sdp": "v=0\r\n"}).encode()
    assert call(guarded, "POST", "/webrtc/offer", offer, {"Content-Type": "application/json"})[0] == 401
    forged = {"Authorization": "Bearer p.eyJ4Ijo1fQ.0123456789abcdef0123456789abcdef"}
    assert call(guarded, "POST", "/webrtc/offer", offer, forged)[0] == 403
    assert call(guarded, "POST", "/webrtc/offer", offer, BEARER)[0] == 400  # past the guard: a bad offer


@pytest.mark.engine
async def test_websocket_needs_the_token(guarded):
    url = f"ws://127.0.0.1:{guarded.port}/v1/video/chat/stream"
    assert await handshake_status(url) == 401
    assert await handshake_status(url, additional_headers={"Authorization": "Bearer nope"}) == 403
    assert await handshake_status(url + "?token=nope") == 403
    for kwargs in ({"additional_headers": BEARER}, {}):
        target = url if kwargs else url + f"?token={TOKEN}"
        ws = await websockets.connect(target, max_size=None, **kwargs)
        await send(ws, {"type": "session.config", **SHORT})
        await frames(ws, n=4)
        await send(ws, {"type": "video.query", "text": "What is happening?"})
        msgs = await until(ws, "response.text.done")
        check_answer([m for m in msgs if m["type"] != "response.queued"])
        await ws.close()
    assert TOKEN not in guarded.log(), "the token must never be logged"


# ---- the page behind a password, in Chromium ------------------------------------

async def wrong_password_keeps_the_user_name(page, screenshot) -> None:
    """A wrong password is refused with a message; the user name stays as typed, the
    password box is emptied and focused for the next try (issue 59, point 11)."""
    await page.locator("input[type=password]").wait_for(timeout=30_000)
    await page.locator("input[name=username]").fill(USER)
    await page.locator("input[type=password]").fill("wrong")
    await page.locator("button").filter(has_text="Login").click()
    await page.get_by_text("Incorrect user name or password").wait_for(timeout=10_000)
    assert await page.input_value("input[name=username]") == USER
    assert await page.input_value("input[type=password]") == ""
    assert await page.evaluate("document.activeElement.name") == "password"
    await page.screenshot(path=str(screenshot))


@contextlib.asynccontextmanager
async def signing_in(guarded, tmp_path, width: int, height: int):
    """A Chromium tab (fake camera and microphone) at the guarded server's sign-in form."""
    video, audio = tmp_path / "cam.y4m", tmp_path / "mic.wav"
    write_y4m(video, (40, 160, 60))
    write_wav(audio)
    async with async_playwright() as pw:
        browser = await launch(pw, video, audio, tmp_path)
        try:
            page = await browser.new_page(viewport={"width": width, "height": height})
            await page.goto(f"http://127.0.0.1:{guarded.port}/")
            yield page
        finally:
            await browser.close()


@pytest.mark.browser
async def test_a_wrong_password_on_a_phone_keeps_the_user_name(guarded, tmp_path, artifacts_dir):
    async with signing_in(guarded, tmp_path, 390, 844) as page:
        await wrong_password_keeps_the_user_name(page, artifacts_dir / "login-phone.png")
        assert await page.evaluate("document.documentElement.scrollWidth") <= 390  # nothing off the side


@pytest.mark.browser
async def test_password_page_logs_in_starts_the_camera_and_answers(guarded, tmp_path, artifacts_dir):
    async with signing_in(guarded, tmp_path, 1280, 800) as page:
        try:
            await wrong_password_keeps_the_user_name(page, artifacts_dir / "login.png")
            await page.locator("input[type=password]").fill(PASSWORD)
            await page.locator("button").filter(has_text="Login").click()
            await page.locator("#vc-start").wait_for(timeout=30_000)
            await page.wait_for_function(
                "document.querySelector('#vidchat-page-token textarea, #vidchat-page-token input')?.value"
                ".startsWith('p.')", timeout=15_000)
            await page.click("#vc-start")
            await page.wait_for_function("document.querySelector('#vc-conn')?.dataset.tone === 'live'",
                                         timeout=30_000)
            await page.wait_for_function(
                "/buffer (\\d+)/.exec(document.querySelector('#vc-stats').textContent)?.[1] >= 4", timeout=30_000)
            await page_ask(page, "What colour is the room?")
            texts = await wait_for_answer(page, 1)
            assert texts[0].strip() and "⚠" not in texts[0]
            stats = await page.locator("#vc-stats").inner_text()
            assert "session ends in" in stats  # --session-time-limit shows as a countdown
            await page.screenshot(path=str(artifacts_dir / "page-logged-in.png"))
            # The server's files: one added to --media-dir shows once the picker is
            # opened again, without reloading the page.
            await page.select_option("#vc-source", "file")
            media_names = "[...document.querySelectorAll('#vc-media option')].map((o) => o.textContent)"
            await page.wait_for_function(f"{media_names}.includes('clip.webm')", timeout=10_000)
            (guarded.media_dir / "added.webm").write_bytes(b"\x1aE\xdf\xa3 added later")
            await page.focus("#vc-media")
            await page.wait_for_function(f"{media_names}.includes('added.webm')", timeout=10_000)
            sid = await page.evaluate("window.vidchat.sessionId")
            await page.click("#vc-stop")  # a pause: the session waits for its tab
        finally:
            (guarded.media_dir / "added.webm").unlink(missing_ok=True)  # the listing test expects clip.webm alone
    # The tab gone, its stopped session ends after the reload grace (the next tests count places).
    eventually(lambda: call(guarded, "GET", f"/webrtc/stats?session_id={sid}", headers=BEARER)[0] == 404, 45,
               "the stopped tab's session ends once the tab is gone")
    log = guarded.log()
    assert "session_id=" not in log.replace("session_id=…", ""), "session ids must stay out of the access log"


# ---- limits -------------------------------------------------------------------

@pytest.mark.engine
async def test_connections_count_from_the_handshake_and_free_their_place(guarded):
    url = f"ws://127.0.0.1:{guarded.port}/v1/video/chat/stream?token={TOKEN}"
    idle = [await websockets.connect(url) for _ in range(3)]  # never send session.config
    late = await websockets.connect(url)
    msg = json.loads(await asyncio.wait_for(late.recv(), 10))
    assert msg["type"] == "error" and "full" in msg["message"] and "--max-sessions" in msg["message"]
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await asyncio.wait_for(late.recv(), 5)
    assert closed.value.rcvd.code == 1013
    # The silent ones are ended by --ws-config-timeout (2 s here): their places come back.
    for ws in idle:
        await expect_error(ws, "Timeout waiting for session.config")
    ws = await websockets.connect(url)
    await send(ws, {"type": "session.config"})
    await send(ws, {"type": "ping"})
    assert await recv(ws) == {"type": "pong"}
    await ws.close()


@pytest.mark.engine
async def test_an_offer_that_never_connects_is_ended_after_connect_timeout(guarded):
    pc = RTCPeerConnection()
    pc.addTransceiver("video", direction="sendonly")
    await pc.setLocalDescription(await pc.createOffer())
    body = json.dumps({"type": "offer", "sdp": pc.localDescription.sdp}).encode()
    status, answer = await asyncio.to_thread(call, guarded, "POST", "/webrtc/offer", body, BEARER)
    assert status == 200, answer
    sid = answer["session_id"]
    await pc.close()  # the answer is never applied: ICE never completes

    def ended():
        status, stats = call(guarded, "GET", f"/webrtc/stats?session_id={sid}", None, BEARER)
        return stats if status == 404 else None

    stats = await eventually_async(lambda: asyncio.to_thread(ended), 15, "the unconnected session is ended")
    assert "not established within 3 s" in stats["detail"], stats


@pytest.mark.engine
async def test_questions_beyond_the_cap_wait_in_a_fair_queue(guarded):
    url = f"ws://127.0.0.1:{guarded.port}/v1/video/chat/stream?token={TOKEN}"
    first, second, third = [await websockets.connect(url, max_size=None) for _ in range(3)]
    for ws in (first, second, third):
        await send(ws, {"type": "session.config", "max_tokens": 3000, "temperature": 0.0})
        await frames(ws, n=4)
    await send(first, {"type": "video.query", "text": "long"})
    assert (await recv(first))["type"] == "response.start"
    await send(second, {"type": "video.query", "text": "wait"})
    assert await recv(second) == {"type": "response.queued", "position": 1, "ahead": 0}
    await send(third, {"type": "video.query", "text": "wait more"})
    assert await recv(third) == {"type": "response.queued", "position": 2, "ahead": 1}
    health = await asyncio.to_thread(call, guarded, "GET", "/api/health")
    assert health[1]["answers"] == {"limit": 1, "running": 1, "waiting": 2}
    # vLLM registers the request just after response.start.
    await eventually_async(lambda: asyncio.to_thread(lambda: call(guarded, "GET", "/api/health")[1]
                                                     ["running_requests"] == 1), 5, "vLLM runs the first answer")
    # The first answer ends (replaced by a short question that then queues at the back).
    await send(first, {"type": "session.update", "max_tokens": 2})
    await send(first, {"type": "video.query", "text": "short now"})
    msgs = await until(first, "response.text.done")
    assert msgs[-1]["stats"]["cancelled"]
    # Everyone moves up by one, in arrival order.
    assert (await recv(second))["type"] == "response.start"
    assert await recv(third) == {"type": "response.queued", "position": 1, "ahead": 0}
    await third.close()  # leaving the queue frees its place for the one behind
    while True:  # the first's new question may have queued behind the third before it left
        msg = await recv(first)
        assert msg["type"] == "response.queued", msg
        if msg["ahead"] == 0:
            break
    await second.close()  # its running answer is aborted; the first gets its turn
    msgs = await until(first, "response.text.done")
    assert check_answer(msgs[msgs.index(next(m for m in msgs if m["type"] == "response.start")):])
    await first.close()

    def settled():
        h = call(guarded, "GET", "/api/health")[1]
        return h["running_requests"] == 0 and h["answers"] == {"limit": 1, "running": 0, "waiting": 0}

    await eventually_async(lambda: asyncio.to_thread(settled), 5, "nothing runs or waits once all have left")


@pytest.mark.engine
async def test_session_time_limit_is_announced_then_enforced(guarded):
    url = f"ws://127.0.0.1:{guarded.port}/v1/video/chat/stream?token={TOKEN}"
    ws = await websockets.connect(url, max_size=None)
    started = time.monotonic()
    await send(ws, {"type": "session.config", "keepalive_s": 5})
    msgs = []
    try:
        while True:
            try:
                msg = await recv(ws, timeout=1)
            except asyncio.TimeoutError:
                # A quiet second: a ping keeps the idle timer from ending the session first.
                await send(ws, {"type": "ping"})
                assert time.monotonic() - started < TIME_LIMIT_S + 10, msgs
                continue
            if msg["type"] != "pong":
                msgs.append(msg)
            if msg["type"] == "error":
                break
    except websockets.ConnectionClosed:
        while True:  # what arrived before the close is still readable
            try:
                msg = await recv(ws, timeout=1)
            except (websockets.ConnectionClosed, asyncio.TimeoutError):
                break
            if msg["type"] != "pong":
                msgs.append(msg)
    ended = time.monotonic() - started
    kinds = [m["type"] for m in msgs]
    assert kinds == ["session.expiring", "error"], msgs
    assert 0 < msgs[0]["seconds_left"] <= 13
    assert "time limit" in msgs[1]["message"]
    assert TIME_LIMIT_S - 1 <= ended <= TIME_LIMIT_S + 8


# ---- Origin, Host, bodies, offers (the default server: no credentials) ---------------

@pytest.mark.engine
async def test_foreign_origin_is_refused_own_origin_and_programs_are_not(server):
    assert await handshake_status(server.ws_url, origin="http://evil.example") == 403
    assert await handshake_status(server.ws_url, origin=f"http://127.0.0.1:{server.port}") == 101
    assert await handshake_status(server.ws_url) == 101  # no Origin: a program
    offer = json.dumps({"type": "offer", "sdp": "garbage"}).encode()
    status, body = call(server, "POST", "/webrtc/offer", offer, {"Origin": "https://evil.example"})
    assert status == 403 and "--allowed-origins" in body["detail"]
    assert call(server, "POST", "/webrtc/offer", offer, {"Origin": f"http://127.0.0.1:{server.port}"})[0] == 400


@pytest.mark.engine
def test_foreign_host_is_refused(server):
    for path in ("/", "/api/health", "/static/vidchat/vidchat.css"):
        status, body = call(server, "GET", path, host="evil.example")
        assert status == 400 and "--allowed-hosts" in body["detail"], (path, body)
    assert call(server, "GET", "/healthz", host=f"localhost:{server.port}")[0] == 200


@pytest.mark.engine
async def test_foreign_host_websocket_is_refused(server):
    ws_url = f"ws://127.0.0.1:{server.port}/v1/video/chat/stream"
    # websockets sets Host from the URL; a rebinding attack arrives with the attacker's name.
    assert await handshake_status(ws_url, additional_headers={"Host": "rebind.evil.example"}) == 400


@pytest.mark.engine
def test_oversized_bodies_get_413(server):
    # Each route its own bound (vidchat.app.guard.BODY_BOUNDS): an offer 64 KiB, the page's API
    # --max-body-bytes (1 MiB by default); each refusal names the bound it met.
    big = b'{"type": "offer", "sdp": "' + b"a" * (17 << 20) + b'"}'
    for path, said in (("/webrtc/offer", "a WebRTC offer takes at most 65536 bytes"),
                       ("/gradio_api/queue/join", "--max-body-bytes")):
        status, body = call(server, "POST", path, big, {"Content-Type": "application/json"})
        assert status == 413 and said in body["detail"], (path, body)
    # Without a Content-Length (chunked), counted as it arrives.
    for path in ("/webrtc/close", "/gradio_api/call/ask"):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=15)
        conn.request("POST", path, body=iter([b"x" * (6 << 20)] * 3),
                     headers={"Content-Type": "application/json"}, encode_chunked=True)
        r = conn.getresponse()
        assert r.status == 413, (path, r.read())
        conn.close()


@pytest.mark.engine
@pytest.mark.parametrize("sdp, fragment", [
    ("v=0\r\nthis is not sdp\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\n", "could not use this offer"),
    ("v=0\r\n" + "m=video 9 UDP/TLS/RTP/SAVPF 96\r\n" * 3, "one video and one audio track"),
    ("v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n",
     "one video and one audio track"),
    ("v=0\r\n", "no audio or video track"),
])
def test_bad_offers_are_4xx_with_a_message(server, sdp, fragment):
    before = server.get_json("/api/health")["sessions"]
    status, body = call(server, "POST", "/webrtc/offer", json.dumps({"type": "offer", "sdp": sdp}).encode())
    assert status == 400 and fragment in body["detail"], body
    assert server.get_json("/api/health")["sessions"] == before  # no stuck peer or session left


@pytest.mark.engine
def test_unknown_session_ids_are_404_or_false(server):
    status, body = call(server, "GET", "/webrtc/stats?session_id=not-a-session")
    assert status == 404 and "no such session" in body["detail"]
    assert call(server, "POST", "/webrtc/close", b'{"session_id": "not-a-session"}') == (200, {"closed": False})
    assert "not-a-session" not in server.log(), "session ids stay out of the access log"


async def _buffered(tab, n: int) -> bool:
    return (await tab.stats()).get("frames_in_buffer", 0) >= n


async def logged_in_tab(guarded):
    """A WebRTC tab holding the token with 4 frames in its buffer, and a Gradio client logged in as the page
    is that also presents the token: a session serves only the login that opened it (issue 21)."""
    from gradio_client import Client

    from vidchat.devtools.rtc_client import RtcClient, SyntheticVideo

    tab = RtcClient(f"http://127.0.0.1:{guarded.port}", SyntheticVideo(), token=TOKEN)
    await tab.connect()
    await eventually_async(lambda: _buffered(tab, 4), 20, "4 frames in the tab's buffer")
    gradio = await asyncio.to_thread(Client, f"http://127.0.0.1:{guarded.port}/", auth=(USER, PASSWORD),
                                     headers=BEARER, verbose=False)
    return tab, gradio


@pytest.mark.engine
async def test_page_questions_beyond_the_cap_say_how_many_are_ahead(guarded):
    url = f"ws://127.0.0.1:{guarded.port}/v1/video/chat/stream?token={TOKEN}"
    busy = await websockets.connect(url, max_size=None)
    await send(busy, {"type": "session.config", "max_tokens": 3000, "temperature": 0.0})
    await frames(busy, n=4)
    await send(busy, {"type": "video.query", "text": "long"})
    assert (await recv(busy))["type"] == "response.start"  # holds the one place
    tab, gradio = await logged_in_tab(guarded)
    try:
        job = gradio.submit("Is anyone there?", [], tab.session_id, 4, "uniform", 10, True, 0.95, 64, "images",
                            True, 4, 0.0, "", api_name="/ask")
        def seen():
            return [str(m.get("content")) for out in job.outputs() for m in out[0] if m.get("role") == "assistant"]

        await eventually_async(lambda: any("waiting" in t for t in seen()), 20, "the page is told it waits")
        seen = seen()
        assert any("⏳ waiting: yours is the next question" in t for t in seen), seen
        await busy.close()  # its answer is aborted; the page's question gets the place
        history = (await asyncio.to_thread(job.result, 60))[0]
        answer = history[-1]
        assert answer["role"] == "assistant" and answer["content"] and "waiting" not in str(answer["content"])
        assert not (answer.get("metadata") or {}).get("log")  # the model's words, not a notice
    finally:
        await tab.close()


@pytest.mark.engine
async def test_only_far_larger_messages_close_the_socket_with_1009(server):
    ws = await websockets.connect(server.ws_url, max_size=None)
    await send(ws, {"type": "session.config"})
    limit = 10 * 1024 * 1024  # --ws-max-frame-bytes
    # Base64 of a frame well over the limit: the protocol's error, and the session goes on.
    await send(ws, {"type": "video.frame", "data": "A" * (limit // 3 * 4 + 2_000_000)})
    await expect_error(ws, "Frame too large")
    await send(ws, {"type": "ping"})
    assert await recv(ws) == {"type": "pong"}
    # Several times the limit: the transport refuses it.
    await send(ws, "x" * (4 * limit))
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


@pytest.mark.engine
def test_media_dir_lists_and_serves_only_its_own_video_files(guarded):
    assert call(guarded, "GET", "/api/media")[0] == 401
    assert call(guarded, "GET", "/media/clip.webm")[0] == 401
    status, listing = call(guarded, "GET", "/api/media", headers=BEARER)
    assert status == 200 and [f["name"] for f in listing["files"]] == ["clip.webm"]
    assert call(guarded, "GET", f"/media/clip.webm?token={TOKEN}")[0] == 200
    for name in ("notes.txt", "sub/hidden.webm", "..%2Foutside.webm", "%2E%2E/outside.webm", "outside.webm"):
        assert call(guarded, "GET", f"/media/{name}", headers=BEARER)[0] == 404, name


@pytest.mark.engine
async def test_recording_is_on_with_record_dir_and_bundles_download_with_the_same_inputs(guarded, tmp_path):
    """--record-dir records every answer unless the question turns it off
    (issue 59, point 4: its help says "Save every answer")."""
    import io
    import zipfile

    from vidchat.conversation.bundles import read_bundle

    tab, gradio = await logged_in_tab(guarded)
    try:

        def ask(record):
            args = [tab.session_id, 4, "uniform", 10, True, 0.95, 64, "images", True, 4, 0.0, ""]
            return gradio.predict("What is there?", [], *args, *([record] if record is not None else []),
                                  api_name="/ask")[0]

        before = sorted(guarded.record_dir.rglob("*")) if guarded.record_dir.exists() else []
        manifests_before = set(guarded.record_dir.rglob("manifest.json"))  # earlier tests' answers, recorded too
        history = await asyncio.to_thread(ask, False)  # Record turned off for this question
        assert (sorted(guarded.record_dir.rglob("*")) if guarded.record_dir.exists() else []) == before
        unrecorded = history[-1]["metadata"]["id"]
        assert call(guarded, "GET", f"/inputs/{unrecorded}/bundle.zip", headers=BEARER)[0] == 404
        history = await asyncio.to_thread(ask, None)  # Record left at its default: on, with --record-dir
        answer_id = history[-1]["metadata"]["id"]
        assert "bundle.zip" in str(history[-1]["content"])
        record = call(guarded, "GET", f"/inputs/{answer_id}/record.json", headers=BEARER)[1]
        url = f"http://127.0.0.1:{guarded.port}/inputs/{answer_id}/bundle.zip"
        with urllib.request.urlopen(urllib.request.Request(url, headers=BEARER)) as r:
            data = r.read()
        path = tmp_path / "bundle.zip"
        path.write_bytes(data)
        bundle = read_bundle(path)
        assert bundle.digest() == record["inputs_sha256"] == bundle.manifest["inputs_sha256"]
        assert len(zipfile.ZipFile(io.BytesIO(data)).namelist()) >= 3
        manifests = list(set(guarded.record_dir.rglob("manifest.json")) - manifests_before)
        assert len(manifests) == 1 and json.loads(manifests[0].read_text())["version"] == 1
    finally:
        await tab.close()
