"""The access and limit rules on their own (no server): page tokens, the
--auth list, log redaction, per-client caps and the fair answer queue."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from conftest import eventually_async

from vidchat.app.access import Access, AccessError, default_allowed_hosts, parse_auth
from vidchat.app.logs import RedactAccessLog, redact_query
from vidchat.conversation.answers import Abandoned, AnswerQueue
from vidchat.conversation.registry import SessionRegistry, TooManySessions

pytestmark = pytest.mark.unit


def test_page_tokens_are_signed_expire_and_die_with_a_restart():
    access = Access(passwords={"alice": "pw"})
    token = access.page_token("alice")
    assert access.page_user(token) == "alice" and access.accepts(token)
    assert not access.accepts(token[:-1] + ("0" if token[-1] != "0" else "1"))  # tampered signature
    assert access.page_user(access.page_token("alice", now=time.time() - 13 * 3600)) is None  # expired
    assert not Access(passwords={"alice": "pw"}).accepts(token)  # another process, another secret
    assert not access.accepts("") and not access.accepts("pw")


def test_program_token_and_no_credentials():
    assert Access().accepts(None)  # nothing configured: localhost stays friction-free
    access = Access(token="t0k")
    assert access.accepts("t0k") and not access.accepts("t0") and not access.accepts(None)
    login = access.gradio_auth()
    assert login("anyone", "t0k") and not login("anyone", "nope")  # the page's login takes the token


def test_auth_entries_and_files(tmp_path):
    f = tmp_path / "users"
    f.write_text("# team\nbob:builder\ncarol:x:y\n")
    assert parse_auth(["alice:wonder land", str(f)]) == {"alice": "wonder land", "bob": "builder", "carol": "x:y"}
    with pytest.raises(AccessError, match="USER:PASSWORD"):
        parse_auth(["no-colon-no-file"])
    with pytest.raises(AccessError, match="non-empty"):
        parse_auth([":pw"])
    login = Access(passwords={"alice": "pw"}).gradio_auth()
    assert login("alice", "pw") and not login("alice", "PW") and not login("mallory", "\x00")


def test_hf_allow_list():
    access = Access(hf_oauth=True, hf_users=frozenset({"alice"}))
    assert access.hf_user_allowed("Alice")  # Hugging Face names are case-insensitive
    assert access.hf_user_allowed("alice") and not access.hf_user_allowed("bob") and not access.hf_user_allowed(None)
    assert Access(hf_oauth=True).hf_user_allowed("anyone")


def test_default_hosts_follow_the_bind_address():
    assert set(default_allowed_hosts("127.0.0.1")) >= {"localhost", "127.0.0.1", "::1"}
    assert default_allowed_hosts("0.0.0.0") == ["*"]


def test_secrets_are_redacted_from_request_lines():
    assert redact_query("/webrtc/stats?session_id=abc123&x=1") == "/webrtc/stats?session_id=…&x=1"
    assert redact_query("/v1/video/chat/stream?token=s3cret") == "/v1/video/chat/stream?token=…"
    record = logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d',
                               ("1.2.3.4:5", "GET", "/webrtc/stats?session_id=abc123", "1.1", 200), None)
    RedactAccessLog().filter(record)
    assert "abc123" not in record.getMessage()
    # A session's id in a path (its memory, issue 60) is as much a secret as in a query.
    assert redact_query("/sessions/abc123/memory/4.jpg?full=1") == "/sessions/…/memory/4.jpg?full=1"


def test_sessions_are_capped_per_client_and_reservations_count():
    registry = SessionRegistry(max_sessions=4, max_per_client=2, uncapped_client=lambda c: c == "127.0.0.1")
    registry.create("ws", client="10.0.0.1")
    held = registry.reserve("10.0.0.1")
    with pytest.raises(TooManySessions, match="--max-sessions-per-client"):
        registry.create("webrtc", client="10.0.0.1")
    registry.create("ws", client="127.0.0.1")
    registry.create("ws", client="127.0.0.1")  # loopback is uncapped (when the server is bound to it)
    with pytest.raises(TooManySessions, match="--max-sessions"):
        registry.create("ws", client="10.0.0.2")  # the reservation holds the fourth place
    registry.create("ws", reservation=held)  # becomes its session, without needing a fifth place
    assert len(registry) == 4


async def test_answer_queue_is_first_come_first_served_and_tells_places():
    queue = AnswerQueue(limit=1)
    first = await queue.acquire()
    told: dict[str, list[int]] = {"b": [], "c": []}

    def teller(name):
        async def tell(ahead):
            told[name].append(ahead)
        return tell

    b = asyncio.create_task(queue.acquire(teller("b")))
    await eventually_async(lambda: told["b"] == [0], 2, "b is told it is next")
    abandon_c = asyncio.Event()
    c = asyncio.create_task(queue.acquire(teller("c"), abandon_c))
    await eventually_async(lambda: told["c"] == [1], 2, "c is told one is ahead")
    assert told == {"b": [0], "c": [1]} and queue.snapshot() == {"limit": 1, "running": 1, "waiting": 2}
    first.release()
    second = await asyncio.wait_for(b, 1)
    await eventually_async(lambda: told["c"] == [1, 0], 2, "c moves up")  # moved up
    abandon_c.set()
    with pytest.raises(Abandoned):
        await asyncio.wait_for(c, 1)
    assert queue.snapshot() == {"limit": 1, "running": 1, "waiting": 0}
    second.release()
    second.release()  # a slot is released once, however often asked
    assert queue.snapshot()["running"] == 0


async def test_unlimited_queue_never_waits():
    queue = AnswerQueue(limit=0)
    slots = [await queue.acquire() for _ in range(50)]
    assert queue.snapshot()["waiting"] == 0
    for slot in slots:
        slot.release()


def test_hf_users_need_hf_sign_in():
    from vidchat.app.access import build_access
    from vidchat.app.settings import parse_settings

    with pytest.raises(AccessError, match="--hf-users needs Hugging Face sign-in"):
        build_access(parse_settings(["--hf-users", "alice"]))


def test_on_a_space_the_page_signs_in_with_hugging_face(monkeypatch):
    """A Space with hf_oauth: the page gets a sign-in button, only allowed
    users get a page token, and nothing guarded answers without one."""
    import gradio.oauth
    from starlette.testclient import TestClient

    from vidchat.app.access import build_access
    from vidchat.app.server import create_app
    from vidchat.app.settings import parse_settings
    from vidchat.app.state import AppState
    from vidchat.doors.page import access_mode, hf_page_token

    oauth_env = {"SYSTEM": "spaces", "SPACE_ID": "team/vidchat", "OAUTH_CLIENT_ID": "client", "OAUTH_CLIENT_SECRET": "secret",
                 "OAUTH_SCOPES": "openid profile", "OPENID_PROVIDER_URL": "https://hf.invalid"}
    for name, value in oauth_env.items():
        monkeypatch.setenv(name, value)
        if hasattr(gradio.oauth, name):  # gradio reads these when first imported
            monkeypatch.setattr(gradio.oauth, name, value)
    settings = parse_settings(["--hf-users", "Alice,bob"])
    state = AppState(settings=settings, model_path="tiny", access=build_access(settings))
    assert state.access.hf_oauth and access_mode(state) == "hf"
    client = TestClient(create_app(state), base_url="http://localhost")  # lifespan not run: no engine needed
    page = client.get("/config").json()
    assert any("Hugging Face" in str(c["props"].get("value")) for c in page["components"] if c["type"] == "button")
    assert client.post("/webrtc/offer", json={"type": "offer", "sdp": "v=0"}).status_code == 401
    assert client.get("/api/config").status_code == 401
    assert hf_page_token(state, None) == "" and hf_page_token(state, "mallory") == ""
    token = hf_page_token(state, "alice")
    assert token.startswith("p.")
    assert client.get("/api/config", headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_the_access_log_keeps_what_a_person_reads_not_what_a_page_polls():
    import logging

    from vidchat.app.logs import QuietPolling

    def kept(method, path, status):
        record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                                   ("127.0.0.1:1", method, path, "1.1", status), None)
        return QuietPolling().filter(record)

    for polled in ("/webrtc/stats?session_id=x", "/webrtc/live?session_id=x", "/webrtc/talk/stream?session_id=x",
                   "/webrtc/events?session_id=x", "/static/vidchat/js/peer.js", "/assets/index-1.js",
                   "/api/health", "/gradio_api/heartbeat/abc"):
        assert not kept("GET", polled, 200), polled
    assert not kept("GET", "/api/health", 503)  # "loading", asked again and again
    assert kept("GET", "/webrtc/stats?session_id=x", 404)  # a failure is worth reading
    assert kept("POST", "/webrtc/offer", 200) and kept("GET", "/", 200)
    # A playing file's position, reported every second (issue 59, point 11), unless it fails.
    assert not kept("POST", "/webrtc/source", 200) and kept("POST", "/webrtc/source", 400)
    assert not kept("GET", "/readyz", 200)
    # The memory strip's log and thumbnails (issue 60), polled while a tab is open.
    assert not kept("GET", "/sessions/abc/memory", 200) and not kept("GET", "/sessions/abc/memory/7.jpg", 200)
    assert kept("POST", "/sessions/abc/memory", 200) and kept("GET", "/sessions/abc/memory", 404)
