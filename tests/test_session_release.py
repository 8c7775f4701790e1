"""A closed session frees its frames at once (issue 45's soak found the
leak): the conversation refers back to itself (its closers, Watch and Talk,
its runs), so without this its whole frame buffer waited for the garbage
collector's next full pass, which on a server holding a million objects
came every few minutes while sessions came and went."""

from __future__ import annotations

import gc
import types
import weakref

import numpy as np
import pytest

from vidchat.conversation.registry import SessionRegistry

pytestmark = pytest.mark.unit


class Ended:
    """What an answer that has ended keeps: its sample."""

    def __init__(self, sample) -> None:
        self.sample = sample

    async def cancel(self, why=None) -> None:
        pass


async def test_a_closed_sessions_frames_audio_and_kept_answers_go_without_the_garbage_collector():
    registry = SessionRegistry()
    entry = registry.create("ws")
    rng = np.random.default_rng(0)
    for i in range(6):
        entry.session.add_frame(rng.integers(0, 255, (120, 160, 3), dtype=np.uint8), t=float(i))
    entry.session.add_audio(np.zeros(16_000, np.float32), t=0.0)
    sample = entry.session.sample(4)
    entry.answers["kept"] = sample  # what a kept answer holds: its frames
    # ...and the last answers of the chat, a re-ask and the second model
    # (their runs' events hold them too), which doors may hold after the close
    entry._chat_run = types.SimpleNamespace(answer=Ended(entry.session.sample(4)))
    entry.side.answer = Ended(entry.session.sample(2))
    entry.second.answer = Ended(entry.session.sample(3))
    stored = [weakref.ref(f.pixels) for f in entry.session._buffer.frames]
    assert len(stored) == 6 and all(r() is not None for r in stored)
    del sample
    gc.disable()  # what the close frees, it frees by itself
    try:
        assert await registry.close(entry.session.id, "test")
        assert entry.session.frame_count == 0 and entry.session.stats["audio_seconds"] == 0
        assert not entry.answers and not entry.closers
        assert all(r() is None for r in stored), "a closed session's frames wait for the garbage collector"
    finally:
        gc.enable()


async def test_a_paused_session_is_never_idle_and_a_running_one_is():
    """The page's Stop pauses a session (issue 59, point 1): however long it
    waits for Start, the idle reaper leaves it (it ends when its tab goes,
    after the reload grace); a session with no input that is not paused expires."""
    import time

    registry = SessionRegistry()
    paused, idle = registry.create("webrtc"), registry.create("webrtc")
    paused.paused = True
    for entry in (paused, idle):
        entry.session.last_activity = time.monotonic() - 3600
    assert await registry.expire(60) == [idle.session.id]


async def test_a_request_for_the_page_naming_its_sessions_keeps_them_waiting_for_their_tab():
    """A reload's request for the page carries the browser's session ids
    (the vidchat_returning cookie): those sessions wait for their tab past the
    reload grace, and the idle reaper leaves one whose tab is loading again."""
    import time

    from vidchat.doors.webrtc_routes import RETURNING_COOKIE, RETURNING_GRACE_S, ReturningTabs

    registry = SessionRegistry()
    reloading, other, unnamed = (registry.create("webrtc") for _ in range(3))
    passed: list[str] = []

    async def app(scope, receive, send) -> None:
        passed.append(scope["path"])

    middleware = ReturningTabs(app, registry)
    cookie = f"theme=dark; {RETURNING_COOKIE}={reloading.session.id}.{other.session.id}.nope".encode()
    before = time.monotonic()
    for path in ("/", "/gradio_api/queue/join"):
        await middleware({"type": "http", "method": "GET", "path": path, "headers": [(b"cookie", cookie)]},
                         None, None)
    assert passed == ["/", "/gradio_api/queue/join"]  # every request goes on, untouched
    for entry in (reloading, other):
        assert before + RETURNING_GRACE_S <= entry.returning_until <= time.monotonic() + RETURNING_GRACE_S
    assert unnamed.returning_until == 0.0

    for entry in (reloading, other, unnamed):
        entry.session.last_activity = time.monotonic() - 3600
    reloading.away = unnamed.away = True  # their tabs went away; only one is loading again
    assert set(await registry.expire(60)) == {other.session.id, unnamed.session.id}


async def test_only_a_tab_leaving_right_after_a_request_for_the_page_is_waited_for(monkeypatch, caplog):
    """The reload grace waits for a tab whose browser asked for the page just
    before (or after) it left: a reload. A request longer before was another
    tab's: that session ends at the grace."""
    import asyncio
    import logging
    import time
    import types

    from vidchat.doors import webrtc_routes

    monkeypatch.setattr(webrtc_routes, "RELOAD_GRACE_S", 0.0)
    registry = SessionRegistry()
    state = types.SimpleNamespace(registry=registry)
    stale, reloading = registry.create("webrtc"), registry.create("webrtc")
    now = time.monotonic()
    stale.returning_until = now - webrtc_routes.PAGE_BEFORE_LEAVING_S - 5 + webrtc_routes.RETURNING_GRACE_S
    reloading.returning_until = now - 1 + webrtc_routes.RETURNING_GRACE_S

    await webrtc_routes._close_unless_resumed(state, {}, stale.session.id, stale.attachments)
    assert registry.get(stale.session.id) is None  # another tab's page load changed nothing

    caplog.set_level(logging.INFO, logger=webrtc_routes.__name__)
    waiting = asyncio.create_task(
        webrtc_routes._close_unless_resumed(state, {}, reloading.session.id, reloading.attachments))
    async def told() -> None:
        while "its tab is loading again" not in caplog.text:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(told(), 10)
    webrtc_routes._attached(reloading)  # the reloaded tab's offer
    await waiting
    assert registry.get(reloading.session.id) is reloading and "kept: its tab came back" in caplog.text
