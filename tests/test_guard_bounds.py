"""Hardening round 3 (issue 43, points 2, 3, 12, 13), the guard's part, with no
engine: the app as app.py assembles it (the real route table, Gradio's real
upload and queue routes) driven in-process, and the guard alone on a
stand-in app where what must not happen is the app being reached.

* Origin is checked on every request but GET/HEAD, the page's API and its
  upload included; the page's own origin and --allowed-origins pass.
* Uploads are capped per login (--max-upload-mb): what is still on disk
  counts, a deleted upload frees its share, one cut off leaves no file.
* Bodies: --max-body-bytes covers the page's API, checked before any
  parse; large bodies are parsed in a worker thread.
* A token with any bytes in it is refused 401/403, never 500.
* /gradio_api/call/v2 (named arguments) and Gradio's session hashes and
  event ids (/cancel, /queue/data) belong to the login that named them first.
"""

from __future__ import annotations

import asyncio
import json
import threading
import types
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from test_hosting_rules import build_app

from vidchat.app import guard as guard_module
from vidchat.app.access import MIN_UPLOAD_CHARGE, Access, PageLogins, UploadQuota, user_login
from vidchat.app.guard import Guard

pytestmark = pytest.mark.unit

BASE = "http://localhost:7860"
OWN = {"Origin": BASE}
USERS = ["--token", "t0k", "--auth", "alice:pw", "--auth", "bob:pw"]


def page_client(args: list[str], monkeypatch, uploads: Path) -> tuple[TestClient, object]:
    """A client of the assembled app (its lifespan not run: no engine), with
    Gradio's uploads under ``uploads``."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(uploads))
    app, state = build_app(args, monkeypatch)
    return TestClient(app, base_url=BASE, raise_server_exceptions=False), state


def logged_in(client: TestClient, user: str) -> TestClient:
    """Another client of the same app, holding ``user``'s page login (Gradio's cookie)."""
    other = TestClient(client.app, base_url=BASE, raise_server_exceptions=False)
    assert other.post("/login", data={"username": user, "password": "pw"}).status_code == 200
    return other


def files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


def multipart(name: str, size: int, boundary: str = "vcboundary") -> tuple[bytes, dict[str, str]]:
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{name}\"\r\n"
            "Content-Type: application/zip\r\n\r\n").encode() + b"z" * size + f"\r\n--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


# ---- Origin on every request that may change something ------------------------------------

def test_a_foreign_page_cannot_post_to_the_page_api_or_upload(monkeypatch, tmp_path):
    client, _ = page_client([], monkeypatch, tmp_path)
    evil = {"Origin": "https://evil.example"}
    r = client.post("/gradio_api/upload", files={"files": ("a.zip", b"PK" * 100)}, headers=evil)
    assert r.status_code == 403 and "--allowed-origins" in r.json()["detail"]
    for path in ("/gradio_api/queue/join", "/gradio_api/call/v2/stop", "/gradio_api/cancel", "/login"):
        assert client.post(path, json={}, headers=evil).status_code == 403, path
    assert not files_under(tmp_path)  # nothing was stored
    # What changes nothing still loads from anywhere (a link, an embed).
    assert client.get("/config", headers=evil).status_code == 200
    r = client.post("/gradio_api/upload", files={"files": ("a.zip", b"PK" * 100)}, headers=OWN)
    assert r.status_code == 200 and Path(r.json()[0]).is_file()  # the page's own origin
    assert client.post("/gradio_api/upload", files={"files": ("b.zip", b"PK")}).status_code == 200  # a program


def test_allowed_origins_may_upload(monkeypatch, tmp_path):
    client, _ = page_client(["--allowed-origins", "https://my.site"], monkeypatch, tmp_path)
    r = client.post("/gradio_api/upload", files={"files": ("a.zip", b"PK")}, headers={"Origin": "https://my.site"})
    assert r.status_code == 200
    assert client.post("/gradio_api/upload", files={"files": ("a.zip", b"PK")},
                       headers={"Origin": "https://other.site"}).status_code == 403


# ---- uploads capped per login -------------------------------------------------------------

def test_uploads_past_a_logins_cap_are_refused_until_its_files_are_gone(monkeypatch, tmp_path):
    client, state = page_client([*USERS, "--max-upload-mb", "0.25"], monkeypatch, tmp_path)  # 256 KiB
    alice, bob = logged_in(client, "alice"), logged_in(client, "bob")
    first = alice.post("/gradio_api/upload", files={"files": ("1.zip", b"a" * 100_000)})
    second = alice.post("/gradio_api/upload", files={"files": ("2.zip", b"b" * 100_000)})
    assert first.status_code == 200 and second.status_code == 200
    r = alice.post("/gradio_api/upload", files={"files": ("3.zip", b"c" * 100_000)})
    assert r.status_code == 413
    detail = r.json()["detail"]
    assert "--max-upload-mb" in detail and "256 KB" in detail and "kept now" in detail, detail
    assert len(files_under(tmp_path)) == 2  # the refused one was not stored
    # The cap is the login's own: another login uploads as before.
    assert bob.post("/gradio_api/upload", files={"files": ("4.zip", b"d" * 100_000)}).status_code == 200
    # A deleted upload (a bundle once read, or Gradio's cache cleaning) frees its share.
    Path(first.json()[0]).unlink()
    assert alice.post("/gradio_api/upload", files={"files": ("3.zip", b"c" * 100_000)}).status_code == 200


def test_an_upload_without_a_length_is_cut_off_at_the_cap_and_leaves_no_file(monkeypatch, tmp_path):
    client, state = page_client([*USERS, "--max-upload-mb", "0.25"], monkeypatch, tmp_path)
    body, headers = multipart("big.zip", 600_000)

    def chunks():
        for at in range(0, len(body), 32_768):
            yield body[at:at + 32_768]

    alice = logged_in(client, "alice")
    r = alice.post("/gradio_api/upload", content=chunks(), headers=headers)
    assert r.status_code == 413 and "--max-upload-mb" in r.json()["detail"]
    assert not files_under(tmp_path), files_under(tmp_path)  # Gradio's part file was deleted too
    # Its bytes no longer count: a small upload passes.
    assert alice.post("/gradio_api/upload", files={"files": ("s.zip", b"s")}).status_code == 200


def test_no_uploads_at_zero_and_the_page_is_told_the_largest_file(monkeypatch, tmp_path):
    client, state = page_client(["--max-upload-mb", "0"], monkeypatch, tmp_path)
    r = client.post("/gradio_api/upload", files={"files": ("a.zip", b"PK")})
    assert r.status_code == 413 and "--max-upload-mb 0" in r.json()["detail"]
    assert client.get("/config").json()["max_file_size"] == 0
    _, state = build_app([], monkeypatch)
    assert state.access.upload_bytes == 64 << 20  # the default
    blocks = state.page_logins.gradio_app.get_blocks()
    assert blocks.delete_cache is not None and blocks.max_file_size == 64 << 20  # Gradio deletes old uploads


def test_the_quota_forgets_uploads_gradio_has_deleted_by_age(tmp_path):
    now = [1000.0]
    quota = UploadQuota(10 * MIN_UPLOAD_CHARGE, lifetime_s=60, clock=lambda: now[0])
    kept = tmp_path / "kept.zip"
    kept.write_bytes(b"x")
    quota.record("user:a", [str(kept)], 10)
    assert asyncio.run(quota.refresh("user:a")) == MIN_UPLOAD_CHARGE  # a tiny file counts its minimum
    quota.record("user:gone", [str(tmp_path / "never-looked-at.zip")], 5 * MIN_UPLOAD_CHARGE)
    quota.arriving("user:a", 123)
    assert quota.held("user:a") == MIN_UPLOAD_CHARGE + 123
    quota.arriving("user:a", -123)
    now[0] += 61  # past the cache's age and a cleaning round: dropped without a look
    assert asyncio.run(quota.refresh("user:a")) == 0 and quota.held("user:gone") == 0


# ---- bodies: capped before any parse, large ones parsed off the loop -------------------------

def stand_in_guard(max_body: int = 64 * 1024, access: Access | None = None,
                   owners: dict[str, str] | None = None) -> tuple[Guard, list]:
    reached: list = []

    async def app(scope, receive, send):
        message = await receive()
        reached.append((scope["path"], message.get("body", b"")))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'{"event_id": "ev-1"}'})

    page = PageLogins()
    page.session_inputs, page.fn_by_name, page.session_params = {3: 2}, {"ask": 3}, {3: "sid"}
    return Guard(app, access or Access(), ["localhost"], [], max_body, page=page,
                 owner_of=(owners or {}).get), reached


def drive(guard: Guard, path: str, method: str = "POST", chunks: tuple[bytes, ...] = (b"",),
          headers: dict[str, str] | None = None, query: bytes = b"") -> tuple[int, dict]:
    raw = [(k.lower().encode(), v.encode("latin-1") if isinstance(v, str) else v)
           for k, v in {"host": "localhost:7860", **(headers or {})}.items()]
    scope = {"type": "http", "method": method, "path": path, "headers": raw, "query_string": query,
             "client": ("127.0.0.1", 5555)}
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    sent: list = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(guard(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    try:
        return sent[0]["status"], json.loads(body)
    except ValueError:
        return sent[0]["status"], {}


def test_an_oversize_page_call_is_refused_413_without_being_parsed(monkeypatch):
    parsed: list = []
    monkeypatch.setattr(guard_module, "json", types.SimpleNamespace(
        loads=lambda raw: parsed.append(len(raw)) or json.loads(raw), dumps=json.dumps))
    guard, reached = stand_in_guard(max_body=64 * 1024)
    big = json.dumps({"data": ["q" * 70_000, [], "sid"], "fn_index": 3}).encode()
    for path in ("/gradio_api/queue/join", "/gradio_api/call/ask", "/gradio_api/cancel", "/gradio_api/info"):
        status, body = drive(guard, path, chunks=(big,), headers={"Content-Length": str(len(big))})
        assert status == 413 and "--max-body-bytes" in body["detail"], path
        # Without a Content-Length (chunked): counted as it arrives.
        status, body = drive(guard, path, chunks=(big[:40_000], big[40_000:]))
        assert status == 413 and "--max-body-bytes" in body["detail"], path
    assert not reached and not parsed


def test_a_large_page_call_is_parsed_in_a_worker_thread(monkeypatch):
    threads: list = []
    monkeypatch.setattr(guard_module, "json", types.SimpleNamespace(
        loads=lambda raw: threads.append(threading.current_thread()) or json.loads(raw), dumps=json.dumps))
    guard, reached = stand_in_guard(max_body=1 << 20)
    small = json.dumps({"data": ["q", [], "sid"], "fn_index": 3}).encode()
    large = json.dumps({"data": ["q" * 200_000, [], "sid"], "fn_index": 3}).encode()
    assert drive(guard, "/gradio_api/queue/join", chunks=(small,))[0] == 200
    assert drive(guard, "/gradio_api/queue/join", chunks=(large[:100_000], large[100_000:]))[0] == 200
    assert threads[0] is threading.main_thread() and threads[1] is not threading.main_thread()
    assert reached[-1][1] == large  # the app got the body whole


def test_the_real_page_api_refuses_a_body_over_max_body_bytes(monkeypatch, tmp_path):
    client, _ = page_client(["--max-body-bytes", "65536"], monkeypatch, tmp_path)
    r = client.post("/gradio_api/queue/join", json={"data": ["x" * 70_000], "fn_index": 1, "session_hash": "h"})
    assert r.status_code == 413 and "--max-body-bytes" in r.json()["detail"]
    # An upload is the one route it leaves out (streamed, within --max-upload-mb).
    assert client.post("/gradio_api/upload", files={"files": ("a.zip", b"a" * 100_000)}).status_code == 200


# ---- each route its own bound (issue 57, point 6) ------------------------------------------------

def browser_offer() -> bytes:
    """The body a page posts to /webrtc/offer: a real offer (aiortc's, as
    large as a browser's) with a video and an audio track and a data channel."""
    from aiortc import RTCPeerConnection, VideoStreamTrack
    from aiortc.mediastreams import AudioStreamTrack

    async def offer() -> str:
        pc = RTCPeerConnection()
        pc.addTrack(VideoStreamTrack())
        pc.addTrack(AudioStreamTrack())
        pc.createDataChannel("vidchat")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
        await pc.close()
        return sdp

    return json.dumps({"type": "offer", "sdp": asyncio.run(offer())}).encode()


def padded_offer(size: int) -> bytes:
    """An offer of ``size`` bytes whose SDP has no media section at all: the
    route would refuse it as "no audio or video track" if it ever parsed it."""
    head = b'{"type": "offer", "sdp": "v=0\\r\\n'
    tail = b'"}'
    return head + b"a=x-pad:" + b"p" * (size - len(head) - len(tail) - 8) + tail


def test_an_offer_past_its_bound_is_refused_413_before_it_is_parsed(monkeypatch):
    parsed: list = []
    monkeypatch.setattr(guard_module, "json", types.SimpleNamespace(
        loads=lambda raw: parsed.append(len(raw)) or json.loads(raw), dumps=json.dumps))
    guard, reached = stand_in_guard(max_body=16 << 20)  # the page API's bound is no offer's
    big = padded_offer(117_000)  # the size seen from outside: parsed, and refused as having no track
    assert len(big) == 117_000
    status, body = drive(guard, "/webrtc/offer", chunks=(big,), headers={"Content-Length": str(len(big))})
    assert status == 413 and "a WebRTC offer" in body["detail"] and "65536" in body["detail"], body
    status, body = drive(guard, "/webrtc/offer", chunks=(big[:50_000], big[50_000:]))  # no Content-Length
    assert status == 413 and "a WebRTC offer" in body["detail"], body
    assert not reached and not parsed
    # A real offer is a few KB, far inside the bound, and reaches the route whole.
    offer = browser_offer()
    assert 1000 < len(offer) < 16 << 10
    assert drive(guard, "/webrtc/offer", chunks=(offer,), headers={"Content-Length": str(len(offer))})[0] == 200
    assert reached == [("/webrtc/offer", offer)]


def test_the_real_offer_route_answers_413_not_a_parse_error(monkeypatch, tmp_path):
    client, _ = page_client([], monkeypatch, tmp_path)
    r = client.post("/webrtc/offer", content=padded_offer(117_000), headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "a WebRTC offer" in r.json()["detail"], r.text
    # Under the bound the route itself reads it: the same padding, smaller, is its 400.
    r = client.post("/webrtc/offer", content=padded_offer(60_000), headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "no audio or video track" in r.json()["detail"], r.text


def test_the_page_api_takes_a_longest_question_and_refuses_more():
    from vidchat.app.settings import parse_settings
    from vidchat.conversation.asking import MAX_QUESTION_CHARS

    default = parse_settings([]).max_body_bytes
    guard, reached = stand_in_guard(max_body=default)
    # The longest question, every character escaped as JSON can (a pair of \\uXXXX each), with settings.
    question = "\U0001F600" * MAX_QUESTION_CHARS
    longest = json.dumps({"data": [question, "sid", 0.7, 256, "uniform", 16, True], "fn_index": 3,
                          "session_hash": "h"}).encode()
    assert len(longest) > 12 * MAX_QUESTION_CHARS
    assert drive(guard, "/gradio_api/queue/join", chunks=(longest,))[0] == 200
    over = json.dumps({"data": ["q" * default, "sid"], "fn_index": 3}).encode()
    status, body = drive(guard, "/gradio_api/queue/join", chunks=(over,), headers={"Content-Length": str(len(over))})
    assert status == 413 and "--max-body-bytes" in body["detail"] and "a page call" in body["detail"], body
    assert len(reached) == 1


def test_small_json_routes_take_small_bodies():
    guard, reached = stand_in_guard(max_body=16 << 20)
    report = json.dumps({"session_id": "s", "kind": "file", "name": "x" * 70_000, "position": 1}).encode()
    for path in ("/webrtc/source", "/webrtc/close", "/api/drain", "/suites/run"):
        status, body = drive(guard, path, chunks=(report,))
        assert status == 413 and "this route's request" in body["detail"], (path, body)
    assert not reached
    small = json.dumps({"session_id": "s", "kind": "camera"}).encode()
    assert drive(guard, "/webrtc/source", chunks=(small,))[0] == 200


def test_every_bound_is_in_one_table():
    assert guard_module.body_bound("/webrtc/offer", 1 << 20) == (64 << 10, "a WebRTC offer")
    assert guard_module.body_bound("/webrtc/offer/", 1 << 20)[0] == 64 << 10
    assert guard_module.body_bound("/gradio_api/call/ask", 123_456)[0] == 123_456
    assert guard_module.body_bound("/webrtc/typing", 1 << 20)[0] == 64 << 10
    assert guard_module.BODY_BOUNDS[-1].path == ""  # a catch-all: no route goes unbounded


# ---- tokens with any bytes ----------------------------------------------------------------------

def test_a_non_ascii_token_is_refused_not_a_server_error(monkeypatch, tmp_path):
    client, _ = page_client(["--token", "t0k"], monkeypatch, tmp_path)
    for value in (b"Bearer p.x.\xff", b"Bearer t\xc3\xb6k", b"Bearer \xff\xfe"):
        for path in ("/api/config", "/gradio_api/info", "/webrtc/stats?session_id=x"):
            r = client.get(path, headers={"Authorization": value})
            assert r.status_code == 403 and "Invalid" in r.json()["detail"], (value, path, r.status_code)
    assert client.get("/api/config?token=p.x.%C3%BF").status_code == 403
    guard, reached = stand_in_guard(access=Access(token="t0k"))
    assert drive(guard, "/api/config", "GET", query=b"token=p.x.\xff")[0] == 403  # raw bytes in the query
    assert drive(guard, "/api/config", "GET", headers={"Authorization": b"Bearer p.\xff.\xfe"})[0] == 403
    assert not reached


def test_a_token_that_is_not_ascii_still_works_as_sent():
    guard, reached = stand_in_guard(access=Access(token="tökén"))
    assert drive(guard, "/api/config", "GET", headers={"Authorization": "Bearer tökén".encode()})[0] == 200
    assert drive(guard, "/api/config", "GET", query=b"token=t%C3%B6k%C3%A9n")[0] == 200
    assert drive(guard, "/api/config", "GET", query=b"token=t%C3%B6k")[0] == 403
    assert len(reached) == 2


# ---- /call/v2 and Gradio's own handles ------------------------------------------------------------

def test_call_v2_naming_another_logins_session_is_refused(monkeypatch, tmp_path):
    client, state = page_client(USERS, monkeypatch, tmp_path)
    sid = state.registry.create("ws", owner=user_login("alice")).session.id
    assert state.page_logins.session_params  # the names /call/v2 takes the session id by
    alice, bob = logged_in(client, "alice"), logged_in(client, "bob")
    for name, args in (("stop", {"sid": sid}), ("reask", {"sid": sid, "answer_id": "x"}),
                       ("ask", {"message": "hi", "sid": sid})):
        r = bob.post(f"/gradio_api/call/v2/{name}", json=args)
        assert r.status_code == 403 and "another login" in r.json()["detail"], (name, r.status_code, r.text)
        assert client.post(f"/gradio_api/call/v2/{name}", json=args,
                           headers={"Authorization": "Bearer t0k"}).status_code == 403
    r = alice.post("/gradio_api/call/v2/stop", json={"sid": sid})
    assert r.status_code == 200 and r.json()["event_id"], r.text  # the owner's call is queued


def test_another_login_cannot_cancel_or_read_a_page_session(monkeypatch, tmp_path):
    client, state = page_client(USERS, monkeypatch, tmp_path)
    alice, bob = logged_in(client, "alice"), logged_in(client, "bob")
    stop = state.page_logins.fn_by_name["stop"]
    joined = alice.post("/gradio_api/queue/join",
                        json={"data": [""], "fn_index": stop, "session_hash": "alices-tab", "trigger_id": None})
    assert joined.status_code == 200, joined.text
    event_id = joined.json()["event_id"]
    for body in ({"session_hash": "alices-tab", "fn_index": stop, "event_id": "x"},
                 {"session_hash": "bobs-tab", "fn_index": stop, "event_id": event_id}):
        r = bob.post("/gradio_api/cancel", json=body)
        assert r.status_code == 403 and "another login" in r.json()["detail"], body
    for path in ("/gradio_api/queue/data?session_hash=alices-tab", f"/gradio_api/call/stop/{event_id}",
                 "/gradio_api/heartbeat/alices-tab"):
        assert bob.get(path).status_code == 403, path
    assert bob.post("/gradio_api/queue/join", json={
        "data": [""], "fn_index": stop, "session_hash": "alices-tab", "trigger_id": None}).status_code == 403
    r = alice.post("/gradio_api/cancel", json={"session_hash": "alices-tab", "fn_index": stop,
                                               "event_id": event_id})
    assert r.status_code == 200 and r.json() == {"success": True}
