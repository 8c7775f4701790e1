"""The Realtime door's responses one at a time, without a server: a fake
engine behind the engine interface (vidchat.engine.ChatEngine) whose
prepare can be held or made to fail, so the races and failures of issue 43
point 8 are driven deterministically. The connection is the real one; only
its socket (test_realtime.FakeSocket) and the engine are fakes. Every event
it sends is checked against the official SDK's server event types."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import numpy as np
import pytest
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter, ValidationError
from test_realtime import FakeSocket, text_item

from vidchat.app.settings import Settings
from vidchat.app.state import AppState
from vidchat.doors.socket.config import TurnDetection
from vidchat.doors.socket.realtime import RealtimeConnection
from vidchat.engine import EngineOptions, Prepared, ReplyStats
from vidchat.media.vad import Utterance

SERVER_EVENT = TypeAdapter(RealtimeServerEvent)
ACTIVE = "conversation_already_has_active_response"


class FakeReply:
    """A reply of a few words; aborting it (aclose) ends it."""

    def __init__(self, engine: "FakeEngine", words: list[str]) -> None:
        self.engine = engine  # the answer record names its model
        self.stats = ReplyStats(prompt_tokens=5)
        self.text = ""
        self._words = list(words)
        self._closed = False

    def __aiter__(self) -> "FakeReply":
        return self

    async def __anext__(self) -> str:
        if self._closed or not self._words:
            self.stats.finish_reason = self.stats.finish_reason or "stop"
            raise StopAsyncIteration
        word = self._words.pop(0)
        self.text += word
        self.stats.completion_tokens += 1
        return word

    async def aclose(self) -> None:
        if not self._closed and self._words:
            self.stats.cancelled = True
        self._closed = True


class FakeEngine:
    """What the conversation uses of an engine. ``hold`` keeps the next
    prepare (it runs in a worker thread) waiting until ``release``;
    ``fail`` is raised by every prepare."""

    accepts_audio = accepts_video = True
    is_dead = False
    splits_audio = False
    running_requests = running_warmups = 0
    encoder_cache_tokens = None
    model_path = model_revision = "fake"
    tokens_per_frame = None
    processor_kwargs: dict[str, Any] = {}

    def __init__(self) -> None:
        self.options = EngineOptions(model="fake")
        self.entered = threading.Event()  # a held prepare has started
        self.released = threading.Event()
        self.hold = False
        self.fail: Exception | None = None
        self.prepared = 0

    def check_request(self, n_frames: int, frames_as: str) -> None:
        pass

    def prepare(self, question: str, frames: Any = (), audio: Any = None, **options: Any) -> Prepared:
        self.prepared += 1
        if self.fail is not None:
            raise self.fail
        if self.hold:
            self.hold = False
            self.entered.set()
            assert self.released.wait(30), "the test never released the held prepare"
        return Prepared(prompt={}, prompt_text=question, params=None, stats=ReplyStats(frames=len(frames)))

    def submit(self, prepared: Prepared, request_id: str | None = None) -> FakeReply:
        return FakeReply(self, ["a", " b"])


async def until(condition, timeout: float = 10.0) -> None:
    """Wait for ``condition()`` (looked at between event-loop turns)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def connection(engine: FakeEngine) -> tuple[RealtimeConnection, FakeSocket]:
    state = AppState(settings=Settings(), model_path="fake", engine=engine)
    ws = FakeSocket()
    conn = RealtimeConnection(state, ws)
    conn.start_session()
    # A second of audio on the timeline: where server VAD's times are counted from.
    conn.entry.session.add_audio(np.zeros(16_000, np.float32))
    return conn, ws


async def dispatch(conn: RealtimeConnection, event: dict) -> None:
    """A client event through the connection's own dispatch (refusals become error events)."""
    await conn._dispatch(json.loads(json.dumps(event)), time.monotonic())


async def settled(conn: RealtimeConnection) -> None:
    """Every response task of this connection has ended (also ones it no longer holds)."""
    tasks = [t for t in asyncio.all_tasks() if (t.get_name() or "").startswith("realtime-")]
    async with asyncio.timeout(10):
        await asyncio.gather(*tasks, return_exceptions=True)
    await conn.finish_answer()


async def closed(conn: RealtimeConnection, ws: FakeSocket) -> list[dict]:
    """Everything the connection sent, once it is closed: sends are queued
    to a writer (vidchat.doors.socket.transport), and the close sends what is queued first."""
    await settled(conn)
    async with asyncio.timeout(10):
        await conn.close()
    return ws.sent


def check_one_at_a_time(sent: list[dict]) -> list[dict]:
    """Every event is the SDK's; responses never overlap: each response.created
    is followed by its own response.done before the next one, and every event
    of a response carries its id. Returns the response.done events."""
    for event in sent:
        try:
            SERVER_EVENT.validate_python(event)
        except ValidationError as exc:  # the union's whole report is thousands of lines: the event is enough
            pytest.fail(f"not an SDK server event: {event}: {exc.error_count()} errors")
    open_id, dones = None, []
    for event in sent:
        kind = event["type"]
        if kind == "response.created":
            assert open_id is None, f"response.created {event['response']['id']} before {open_id}'s response.done"
            open_id = event["response"]["id"]
        elif kind == "response.done":
            assert event["response"]["id"] == open_id, (event["response"]["id"], open_id)
            dones.append(event)
            open_id = None
        elif "response_id" in event:
            assert event["response_id"] == open_id, (kind, event["response_id"], open_id)
    assert open_id is None, f"response {open_id} never got its response.done"
    return dones


@pytest.mark.unit
async def test_a_server_vad_response_and_a_client_response_create_never_overlap():
    """Review item 8: while a response started by server VAD waits for the
    previous one to wind down (here: still being prepared), a client's
    response.create used to pass the "one at a time" guard and start a
    second response before the first had its response.done."""
    engine = FakeEngine()
    conn, ws = connection(engine)
    conn.turns.turns = TurnDetection(create_response=True, interrupt_response=True)
    engine.hold = True
    await dispatch(conn, text_item("First?"))
    await dispatch(conn, {"type": "response.create"})
    await until(engine.entered.is_set)  # the first response is being prepared, in a worker thread
    first = conn.answer_task
    heard = asyncio.create_task(conn.turns.utterance(Utterance(0.0, 1.0, -20.0)))
    # The heard response waits for the first one's end: no answer task is held meanwhile.
    await until(lambda: conn.answer_task is None and not first.done())
    await dispatch(conn, text_item("Me too?"))
    await dispatch(conn, {"type": "response.create", "event_id": "evt_race"})
    engine.released.set()
    async with asyncio.timeout(10):
        await heard
    await settled(conn)
    # The refused question is still pending: the next response.create answers it.
    await dispatch(conn, {"type": "response.create"})

    sent = await closed(conn, ws)
    dones = check_one_at_a_time(sent)
    refused = [e["error"] for e in sent if e["type"] == "error"]
    assert [(e["code"], e["event_id"]) for e in refused] == [(ACTIVE, "evt_race")]
    # The first was cancelled by the heard one, which was then answered; then the client's.
    assert [d["response"]["status"] for d in dones] == ["cancelled", "completed", "completed"]
    assert all(d["response"]["output"][0]["content"][0]["text"] == "a b" for d in dones[1:])
    assert engine.prepared == 3


@pytest.mark.unit
async def test_a_failure_while_the_question_is_prepared_still_ends_the_response():
    """Review item 8: an exception that is not an engine error, raised after
    response.created, used to leave the client without response.done."""
    engine = FakeEngine()
    conn, ws = connection(engine)
    engine.fail = KeyError("frame_times")
    await dispatch(conn, text_item("What now?"))
    await dispatch(conn, {"type": "response.create"})
    await settled(conn)
    # The session goes on: the next question is answered.
    engine.fail = None
    await dispatch(conn, text_item("And now?"))
    await dispatch(conn, {"type": "response.create"})

    sent = await closed(conn, ws)
    dones = check_one_at_a_time(sent)
    assert [d["response"]["status"] for d in dones] == ["failed", "completed"]
    response = dones[0]["response"]
    assert response["status"] == "failed" and response["output"] == []
    details = response["status_details"]
    assert details["type"] == "failed" and "KeyError" in details["error"]["message"], details
    errors = [e["error"] for e in sent if e["type"] == "error"]
    assert [e["code"] for e in errors] == ["answer_failed"] and errors[0]["type"] == "server_error"
