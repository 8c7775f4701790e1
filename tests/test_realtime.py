"""The OpenAI Realtime door (/v1/realtime, vidchat.doors.socket.realtime) with the
official ``openai`` SDK as its client, against the real server (uvicorn
subprocess, real vLLM on the tiny random omni model): session events, frames
as input_image items, text and spoken questions, responses and their events
in order, cancel, server VAD with barge-in, errors that leave the session
going, the token, and the answer record. Replies are gibberish: shapes,
counts and order are checked, never the words."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
import websockets
from conftest import SERVER_ARGS, TINY_SERVER_ARGS, start_server, stop_server, until_idle
from openai import AsyncOpenAI
from openai.types.realtime import RealtimeServerEvent
from PIL import Image
from pydantic import TypeAdapter
from test_protocol import MOVING

from vidchat.app.settings import Settings
from vidchat.conversation.answers import AnswerOptions
from vidchat.devtools import synthetic as sa
from vidchat.doors.socket import realtime as items
from vidchat.doors.socket import realtime_events as rt
from vidchat.doors.socket.config import ConfigError, TurnDetection
from vidchat.doors.socket.intake import Refused, pcm16_audio
from vidchat.doors.socket.realtime import RealtimeConnection
from vidchat.doors.socket.session import NO_AUDIO_OUTPUT_NOTICE, SocketTurns
from vidchat.doors.socket.transport import Disconnected
from vidchat.engine import NO_SPOKEN_QUESTIONS
from vidchat.media import AUDIO_RATE
from vidchat.media.audio import AudioInput, ClipTooShort, Pcm16Resampler

RATE = 24_000
TOKEN = "realtime-test-token"
# What one response says, in order (the deltas between content_part.added and output_text.done).
RESPONSE_EVENTS = ["response.created", "response.output_item.added", "conversation.item.added",
                   "response.content_part.added", "response.output_text.delta", "response.output_text.done",
                   "response.content_part.done", "response.output_item.done", "conversation.item.done",
                   "response.done"]


def image_item(b64_jpeg: str, pts_ms: int | None = None) -> dict:
    part = {"type": "input_image", "image_url": "data:image/jpeg;base64," + b64_jpeg}
    if pts_ms is not None:
        part["pts_ms"] = pts_ms  # vidchat's extra field: the frame's time
    return {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [part]}}


def text_item(text: str) -> dict:
    return {"type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


def pcm24k_b64(audio16k: np.ndarray) -> str:
    """16 kHz float samples as base64 PCM16 at 24 kHz (the API's default input format)."""
    n = int(round(audio16k.size * RATE / AUDIO_RATE))
    up = np.interp(np.arange(n) * AUDIO_RATE / RATE, np.arange(audio16k.size), audio16k)
    return base64.b64encode((np.clip(up, -1, 1) * 32767).astype("<i2").tobytes()).decode()


def client(srv, token: str | None = None) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{srv.url}/v1", api_key=token or "no-token-needed")


# The SDK's own union of server events: what the SDK's connection builds
# leniently, validated here field by field (types, literals, what is required).
SERVER_EVENT = TypeAdapter(RealtimeServerEvent)


async def recv(conn) -> object:
    """The next server event, checked against the SDK's types (vidchat's extras ride as extra fields)."""
    event = await conn.recv()
    assert not isinstance(SERVER_EVENT.validate_python(event.to_dict()), dict), event.type
    return event


async def until(conn, kind: str, timeout: float = 60.0) -> list:
    """Events up to and including the first of type ``kind``."""
    out = []
    async with asyncio.timeout(timeout):
        while not out or out[-1].type != kind:
            out.append(await recv(conn))
    return out


def collapsed(types: list[str]) -> list[str]:
    """Runs of deltas as one."""
    return [t for i, t in enumerate(types) if not (t == "response.output_text.delta" and i and types[i - 1] == t)]


async def configured(conn, **vidchat) -> object:
    created = await recv(conn)
    assert created.type == "session.created"
    await conn.send({"type": "session.update", "session": {"type": "realtime", "vidchat": vidchat}})
    return (await until(conn, "session.updated"))[-1]


def check_response(events: list) -> object:
    """One whole response in order (the item events before it skipped); returns its response.done."""
    events = events[[e.type for e in events].index("response.created"):]
    types = [e.type for e in events]
    text_done = next((e for e in events if e.type == "response.output_text.done"), None)
    # A random model's few tokens may decode to no text (special or partial
    # characters): then no delta is sent, the rest of the order stands.
    expected = RESPONSE_EVENTS if text_done is None or text_done.text else [t for t in RESPONSE_EVENTS
                                                       if t != "response.output_text.delta"]
    assert collapsed(types) == expected, types
    done = events[-1]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text_done.text == deltas and done.response.output[0].content[0].text == deltas
    rid = events[0].response.id
    assert all(getattr(e, "response_id", rid) == rid for e in events) and done.response.id == rid
    usage = done.response.usage
    assert usage.output_tokens >= 1
    assert usage.input_tokens > 0 and usage.input_token_details.cached_tokens >= 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    finished = done.vidchat["finish_reason"]
    assert done.response.status == ("incomplete" if finished == "length" else "completed"), finished
    return done


# ---- the translation itself (no server) ------------------------------------

@pytest.mark.unit
def test_session_update_is_read_by_the_settings_table_and_refusals_name_the_field():
    update = rt.parse_session({"type": "realtime", "instructions": "Be brief.", "max_output_tokens": "inf",
                               "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                                                   "turn_detection": {"type": "server_vad",
                                                                      "silence_duration_ms": 400}}},
                               "vidchat": {"num_frames": 4, "frames_as": "video", "record": False}})
    assert update.answer == {"instructions": "Be brief.", "max_output_tokens": None} and update.input_rate == 24000
    assert update.turn_detection.settings.min_silence_s == pytest.approx(0.4) and update.record is False
    assert update.settings == {"session": {"num_sample_frames": 4}, "answer": {"frames_as": "video"}}
    assert rt.parse_session({"type": "realtime"}).answer == {} and rt.parse_session({}).input_rate is rt.UNSET
    for session, param in [({"vidchat": {"num_sample_frames": "4"}}, "session.vidchat"),
                           ({"vidchat": {"bogus": 1}}, "session.vidchat"),
                           ({"max_output_tokens": 0}, "session.max_output_tokens"),
                           ({"audio": {"input": {"format": {"type": "audio/pcmu"}}}}, "session.audio.input.format"),
                           ({"audio": "pcm16"}, "session.audio"), ({"audio": {"input": 5}}, "session.audio.input"),
                           ({"audio": {"input": {"turn_detection": {"type": "no_such_vad"}}}},
                            "session.audio.input.turn_detection"),
                           ({"audio": {"input": {"transcription": "whisper-1"}}},
                            "session.audio.input.transcription"),
                           ({"tools": {"type": "function"}}, "session.tools"),
                           ({"output_modalities": ["video"]}, "session.output_modalities")]:
        with pytest.raises(rt.EventError) as refused:
            rt.parse_session({"type": "realtime", **session})
        assert refused.value.param.startswith(param), (session, refused.value.param)


@pytest.mark.unit
def test_user_items_are_checked_before_anything_is_taken_in():
    parts = items.user_parts({"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "hi"}, {"type": "input_image", "image_url": "data:image/png;base64,AA",
                                               "pts_ms": 40}]})
    assert [(p.kind, p.pts_ms, p.index) for p in parts] == [("input_text", None, 0), ("input_image", 40, 1)]
    acked = items.acked_item("item_1", parts)
    assert acked["content"] == [{"type": "input_text", "text": "hi"}, {"type": "input_image"}]  # no image echoed
    for item, code in [({"type": "function_call", "name": "f", "arguments": "{}"}, "unsupported_item"),
                       ({"type": "message", "role": "developer", "content": []}, "unsupported_item"),
                       ({"type": "message", "role": "user", "content": []}, "invalid_value"),
                       ({"type": "message", "role": "user", "content": [{"type": "input_image",
                                                                        "image_url": "https://x/y.jpg"}]},
                        "invalid_image"),
                       ({"type": "message", "role": "user", "content": [{"type": "output_text", "text": "x"}]},
                        "unsupported_content")]:
        with pytest.raises(rt.EventError) as refused:
            items.user_parts(item)
        assert refused.value.code == code
    # Assistant and system messages are history (issue 57 point 21), checked as the GA types have them.
    assert items.history_text({"role": "assistant", "content": [{"type": "output_text", "text": "Hi."}, {
        "type": "output_audio", "transcript": "There."}]}, "assistant") == "Hi.\nThere."
    assert items.history_text({"role": "system", "content": [{"type": "input_text", "text": "Be kind."}]},
                              "system") == "Be kind."
    for item, role, code in [({"content": [{"type": "input_text", "text": "x"}]}, "assistant", "unsupported_content"),
                             ({"content": [{"type": "output_text", "text": 3}]}, "assistant", "invalid_value"),
                             ({"content": []}, "system", "invalid_value")]:
        with pytest.raises(rt.EventError) as refused:
            items.history_text(item, role)
        assert refused.value.code == code, item


@pytest.mark.unit
def test_usage_and_the_response_object_have_the_sdk_shapes():
    stats = {"prompt_tokens": 120, "cached_tokens": 100, "completion_tokens": 7}
    body = rt.response("resp_1", "cancelled", max_output_tokens=None, stats=stats, reason="client_cancelled")
    assert body["usage"]["input_tokens"] == 120 and body["usage"]["output_tokens"] == 7
    assert body["usage"]["input_token_details"]["cached_tokens"] == 100 and body["usage"]["total_tokens"] == 127
    assert body["status_details"] == {"type": "cancelled", "reason": "client_cancelled", "error": None}
    assert body["max_output_tokens"] == "inf"
    assert rt.response("resp_2", "completed")["status_details"] is None
    event = rt.error_event("event_9", rt.EventError("no", "unknown_event", "type"), "evt_client")
    assert event["error"] == {"type": "invalid_request_error", "code": "unknown_event", "message": "no",
                              "param": "type", "event_id": "evt_client"}


@pytest.mark.unit
def test_what_is_not_served_is_refused_by_name():
    for kind in ("conversation.item.retrieve", "conversation.item.delete", "conversation.item.truncate",
                 "output_audio_buffer.clear", "transcription_session.update"):
        refused = rt.not_served(kind)
        assert refused.code == "unsupported_event" and refused.message.startswith(f"{kind} is not served here: ")
    # Issue 57 point 20: in session.update, what can't be honoured is left
    # out and named, and the rest applies; empty or null ones ask for nothing.
    update = rt.parse_session({"type": "realtime", "instructions": "Be brief.", "tools": [
        {"type": "function", "name": "f"}], "audio": {"input": {"transcription": {"model": "whisper-1"},
                                                                "turn_detection": {"type": "semantic_vad"}}}})
    assert update.left_out == ["session.tools", "session.audio.input.transcription",
                               "session.audio.input.turn_detection"]
    assert update.answer == {"instructions": "Be brief."} and update.turn_detection is rt.UNSET
    nothing_asked = rt.parse_session({"type": "realtime", "tools": [], "audio": {"input": {"transcription": None}}})
    assert nothing_asked.left_out == []
    # Null is no change, in a response as in a session (point 19): the session's instructions stay.
    assert rt.response_fields({"instructions": None, "max_output_tokens": None}) == {}
    assert rt.parse_session({"type": "realtime", "instructions": None}).answer == {}
    # A response's metadata is echoed (point 18); a malformed one is refused by name.
    assert rt.response_metadata({"metadata": {"client_event_id": "e1"}}) == {"client_event_id": "e1"}
    assert rt.response_metadata({}) is None and rt.response_metadata(None) is None
    for bad in ({"k": 1}, ["x"], {f"k{i}": "v" for i in range(17)}):
        with pytest.raises(rt.EventError) as refused:
            rt.response_metadata({"metadata": bad})
        assert refused.value.param == "response.metadata"
    with pytest.raises(rt.EventError) as refused:
        rt.response_fields({"tools": [{"type": "function", "name": "f"}]})
    assert refused.value.param == "response.tools"


@pytest.mark.unit
async def test_the_input_audio_buffer_and_the_pending_question():
    audio = AudioInput(max_s=1.0, rate=16_000)
    pcm = {"audio": base64.b64encode(np.full(AUDIO_RATE // 2, 1000, "<i2").tobytes()).decode()}  # 0.5 s
    for _ in range(4):
        audio.append(await pcm16_audio(pcm, "input_audio_buffer.append", "audio", 30, audio.stream))
    # Whole chunks: the oldest goes while the rest still hold more than max_s.
    assert len(audio.chunks) == 3 and audio.take().size == 3 * AUDIO_RATE // 2 and not audio.chunks
    with pytest.raises(ClipTooShort, match="buffer too small: 0 ms of audio, at least 100 ms"):
        audio.take()
    # The PCM16 rules are the seed door's (video.query's audio_data): one shared reader.
    for data, reason in [("AA==", "invalid_audio"), ("***", "invalid_data"),
                         (base64.b64encode(bytes(2 * 24_000 + 2)).decode(), "too_large")]:
        with pytest.raises(Refused) as refused:
            await pcm16_audio({"audio": data}, "input_audio_buffer.append", "audio", 1.0, Pcm16Resampler(24_000))
        assert refused.value.reason == reason
    audio.set_rate(24_000)
    assert audio.rate == 24_000 and audio.stream.rate == 24_000

    question = items.Question()
    assert not question
    question.add(["What is this?", "And that?"], [np.zeros(AUDIO_RATE, np.float32)])
    with pytest.raises(rt.EventError) as refused:
        question.check([], [np.zeros(AUDIO_RATE, np.float32)], max_audio_s=1.5)
    assert refused.value.code == "question_too_long"
    with pytest.raises(rt.EventError):
        question.check(["x" * items.MAX_QUESTION_CHARS], [], max_audio_s=30)
    text, spoken = question.take()
    assert text == "What is this?\nAnd that?" and spoken.size == AUDIO_RATE and not question


@pytest.mark.unit
def test_input_audio_appends_cost_the_same_however_much_is_held():
    """Review item 7: each append summed every chunk held (quadratic on the
    event loop for a client streaming tiny chunks) and kept empty arrays
    (the resampler holding samples back). Now: a running total, no empty
    chunk kept, small chunks kept merged, so the arrays held stay few."""
    audio = AudioInput(max_s=1.0, rate=16_000)
    for _ in range(1000):
        audio.append(np.zeros(0, np.float32))
    assert audio.samples == 0 and not audio.chunks
    ramp = np.arange(3 * AUDIO_RATE, dtype=np.float32)  # 3 s, one sample per append: each sample's place is checked
    for sample in np.split(ramp, ramp.size):
        audio.append(sample)
        audio.append(np.zeros(0, np.float32))
    # Whole chunks of at least MERGE_SAMPLES, and a bounded list however many appends came.
    merged = AudioInput.MERGE_SAMPLES
    assert len(audio.chunks) <= audio.max_samples // merged + 2, len(audio.chunks)
    assert all(c.size >= merged for c in audio.chunks)
    held = audio.samples
    assert audio.max_samples <= held <= audio.max_samples + merged
    clip = audio.take()
    assert clip.size == held and np.array_equal(clip, ramp[-held:])  # the newest, in order
    assert audio.samples == 0 and not audio.chunks

    # The review's case: 2-byte appends at 24 kHz, where the resampler often returns nothing.
    audio = AudioInput(max_s=30.0, rate=24_000)
    pcm = (np.sin(np.arange(24_000) / 5) * 8000).astype("<i2").tobytes()
    out = 0
    for i in range(0, len(pcm), 2):
        samples = audio.stream.feed(pcm[i:i + 2])
        out += samples.size
        audio.append(samples)
    assert out > 0 and audio.samples == out and len(audio.chunks) <= out // merged + 1
    assert all(c.size > 0 for c in audio.chunks)
    assert audio.take().size == out


@pytest.mark.unit
async def test_turn_detection_asked_while_the_model_loads_waits_for_it_at_both_socket_doors():
    """One rule for the seed and Realtime doors (vidchat.doors.socket.session):
    turn_detection asked for while the model loads is kept (and described)
    and set once it runs; a model that takes no spoken questions is then an
    error, and the session goes on. Refused at once when the model runs."""
    loaded = asyncio.Event()
    state = SimpleNamespace(engine=None)

    def engine_now(role="main"):
        return state.engine

    async def engine_for(role="main"):
        await loaded.wait()
        return state.engine

    errors = []

    async def error(message):
        errors.append(message)
        return True

    state.engine_now, state.engine_for = engine_now, engine_for
    turns = SocketTurns(SimpleNamespace(state=state, entry=object(), error=error), None)
    asked = TurnDetection()
    turns.check(asked)  # while it loads, what it hears is not known yet
    await turns.request(asked)
    waiting = turns._loading
    assert waiting is not None and turns.describe() == asked.describe() and errors == []
    state.engine = SimpleNamespace(accepts_audio=False)
    loaded.set()
    await waiting
    assert errors == [f"turn_detection is off: {NO_SPOKEN_QUESTIONS}"] and turns.describe() is None
    with pytest.raises(ConfigError, match=re.escape(f"turn_detection: {NO_SPOKEN_QUESTIONS}")):
        turns.check(asked)
    turns.check(None)  # off is always taken


class FakeSocket:
    """Just enough of a Starlette WebSocket to drive a connection's event loop without a server."""

    client = SimpleNamespace(host="127.0.0.1", port=1)
    headers: dict = {}
    query_params = {"model": "tiny"}

    def __init__(self, *texts: str) -> None:
        self.incoming = [{"type": "websocket.receive", "text": t} for t in texts]
        self.incoming.append({"type": "websocket.disconnect", "code": 1000})
        self.sent: list[dict] = []

    async def receive(self) -> dict:
        return self.incoming.pop(0)

    async def send_text(self, text: str) -> None:
        self.sent.append(json.loads(text))


@pytest.mark.unit
async def test_the_shared_event_loop_answers_every_bad_event_with_an_error_and_goes_on():
    # The loop is vidchat.doors.socket.session's (the seed door's too); the errors are shaped by this door.
    events = [{"type": "conversation.item.retrieve", "item_id": "item_1", "event_id": "evt_1"},
              {"type": "conversation.item.delete", "item_id": "item_1"},
              {"type": "conversation.item.truncate", "item_id": "item_1", "content_index": 0, "audio_end_ms": 0},
              {"type": "output_audio_buffer.clear"}, {"type": "no.such.event"}, [1, 2]]
    ws = FakeSocket(*map(json.dumps, events), "{not json")
    state = SimpleNamespace(settings=Settings(), model_path="tiny", answer_defaults=AnswerOptions)
    with pytest.raises(Disconnected):
        await RealtimeConnection(state, ws)._loop()
    assert [e["type"] for e in ws.sent] == ["error"] * 7
    errors = [e["error"] for e in ws.sent]
    assert [e["code"] for e in errors] == ["unsupported_event"] * 4 + ["unknown_event", "invalid_event", "invalid_json"]
    for event, error in zip(events[:4], errors):
        assert error["message"].startswith(f"{event['type']} is not served here") and error["param"] == "type"
    assert errors[0]["event_id"] == "evt_1" and errors[1]["event_id"] is None
    assert "no.such.event" in errors[4]["message"]


# ---- through the server ----------------------------------------------------

@pytest.mark.engine
async def test_session_created_then_updated_with_the_effective_session(server):
    async with client(server).realtime.connect(model="tiny") as conn:
        created = await recv(conn)
        assert created.type == "session.created" and created.session.type == "realtime"
        assert created.session.model == "tiny" and created.session.output_modalities == ["text"]
        assert created.session.audio.input.format.rate == RATE
        assert created.session.audio.input.turn_detection is None
        await conn.send({"type": "session.update", "session": {
            "type": "realtime", "instructions": "Answer in one word.", "max_output_tokens": 12,
            "output_modalities": ["audio"],
            "vidchat": {"num_sample_frames": 3, "temperature": 0.0, "seed": 7, "evs_threshold": 0.5}}})
        updated = (await until(conn, "session.updated"))[-1]
        session = updated.session
        assert session.instructions == "Answer in one word." and session.max_output_tokens == 12
        assert session.output_modalities == ["text"]  # text only: said once, in a notice
        assert updated.vidchat == {"notice": NO_AUDIO_OUTPUT_NOTICE}
        assert session.vidchat["num_sample_frames"] == 3 and session.vidchat["seed"] == 7
        assert session.vidchat["temperature"] == 0.0 and session.vidchat["evs_threshold"] == 0.5
        await conn.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["audio"]}})
        again = (await until(conn, "session.updated"))[-1]
        assert getattr(again, "vidchat", None) is None and again.session.vidchat["num_sample_frames"] == 3
        # 16 kHz input is taken too; the GA type's PCM rate is 24000 only, so it is said in an extra
        # (and a format said that way is read back the same).
        for fmt in ({"type": "audio/pcm", "rate": 16_000}, {"type": "audio/pcm", "vidchat": {"rate": 16_000}}):
            await conn.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
                "format": fmt}}}})
            said = (await until(conn, "session.updated"))[-1].session.audio.input.format
            assert said.type == "audio/pcm" and said.rate is None and said.vidchat == {"rate": 16_000}
        await conn.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": RATE}}}}})
        assert (await until(conn, "session.updated"))[-1].session.audio.input.format.rate == RATE


@pytest.mark.engine
async def test_frames_then_text_then_response_create_streams_an_answer_on_those_frames(server):
    sent = MOVING[:4]
    async with client(server).realtime.connect(model="tiny") as conn:
        await configured(conn, num_sample_frames=4, temperature=0.0, max_tokens=8)
        added = []
        for i, frame in enumerate([*sent, sent[-1]]):  # the last one twice: a near-duplicate
            await conn.send(image_item(frame, pts_ms=i * 200))
            acked = await until(conn, "conversation.item.done")
            assert [e.type for e in acked] == ["conversation.item.added", "conversation.item.done"]
            added.append(acked[0])
        assert [a.vidchat["frames"][0]["accepted"] for a in added] == [True] * 4 + [False]
        assert added[-1].vidchat["frames"][0] == {"accepted": False, "reason": "filtered", "buffered_frames": 4}
        assert added[0].item.role == "user" and added[0].item.content[0].type == "input_image"
        assert added[0].item.content[0].image_url is None  # acknowledged compactly: no image sent back
        await conn.send(text_item("What do you see?"))
        item_events = await until(conn, "conversation.item.done")
        assert [e.type for e in item_events] == ["conversation.item.added", "conversation.item.done"]
        assert item_events[0].previous_item_id == added[-1].item.id
        await conn.send({"type": "response.create"})
        done = check_response(await until(conn, "response.done"))
        record = done.vidchat
        assert record["frames"] == 4 and record["frame_indices"] == [0, 1, 2, 3]
        assert record["frame_times"] == pytest.approx([0.0, 0.2, 0.4, 0.6], abs=0.02)
        assert len(record["inputs_sha256"]) == 64 and record["answer_id"]

        # The whole record (kept while its session is open), and the frames the model got are the ones sent.
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            full = (await http.get(record["record_url"])).json()
            assert full["question"] == "What do you see?" and full["inputs_sha256"] == record["inputs_sha256"]
            for k, b64 in enumerate(sent):
                png = (await http.get(f"/inputs/{record['answer_id']}/frame/{k}.png")).content
                got = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.float32)
                want = np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"), dtype=np.float32)
                assert got.shape == want.shape and np.abs(got - want).mean() < 1.0, k


@pytest.mark.engine
async def test_an_sdk_client_that_waits_for_each_items_done_gets_it_for_image_only_items(server):
    """Issue 43 point 15: as vllm-omni's Realtime server does, every item is
    conversation.item.added then conversation.item.done (the GA sequence).
    A published client sends a frame and waits for its .done before the
    next; without one for an image-only item it waited until the idle timeout."""
    async with client(server).realtime.connect(model="tiny") as conn:
        await configured(conn, num_sample_frames=8, temperature=0.0, max_tokens=2)
        ids = []
        for i, frame in enumerate(MOVING[:8]):
            await conn.send(image_item(frame, pts_ms=i * 200))
            # Without a .done, the suite's 4 s idle timeout ends the waiting client (the SDK raises).
            events = await until(conn, "conversation.item.done", timeout=30.0)
            assert [e.type for e in events] == ["conversation.item.added", "conversation.item.done"], events
            added, done = events
            assert done.item.id == added.item.id and done.previous_item_id == added.previous_item_id
            assert added.previous_item_id == (ids[-1] if ids else None)
            assert done.item.status == "completed" and [c.type for c in done.item.content] == ["input_image"]
            assert added.vidchat["frames"][0]["accepted"] is True
            ids.append(done.item.id)
        assert len(set(ids)) == 8
        await conn.send(text_item("What changed?"))
        text_events = await until(conn, "conversation.item.done")
        assert text_events[0].previous_item_id == ids[-1]
        await conn.send({"type": "response.create"})
        assert check_response(await until(conn, "response.done")).vidchat["frames"] == 8


@pytest.mark.engine
async def test_a_text_question_without_frames_is_answered(server):
    async with client(server).realtime.connect(model="tiny") as conn:
        await configured(conn, temperature=0.0, max_tokens=4)
        await conn.send(text_item("Hello?"))
        await until(conn, "conversation.item.done")
        await conn.send({"type": "response.create", "response": {"instructions": "Be terse.",
                                                                  "max_output_tokens": 3,
                                                                  "output_modalities": ["audio"]}})
        events = await until(conn, "response.done")
        done = check_response(events)
        assert done.vidchat["frames"] == 0 and done.response.max_output_tokens == 3
        assert done.response.usage.output_tokens <= 3
        # Spoken answers asked for per response: told once, on its response.created, and answered in text.
        created = next(e for e in events if e.type == "response.created")
        assert created.vidchat == {"notice": NO_AUDIO_OUTPUT_NOTICE}
        assert done.response.output_modalities == ["text"]


@pytest.mark.engine
async def test_responses_continue_the_conversation_unless_made_outside_it(server):
    """The Realtime conversation's items are the conversation's chat on the
    server: each response is asked with the exchanges before it; one made
    with response.conversation "none" sees none and is not added."""
    async with client(server).realtime.connect(model="tiny") as conn:
        await configured(conn, temperature=0.0, max_tokens=3)
        turns = []
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            for question, conversation in (("Hello?", "auto"), ("And then?", "auto"), ("Aside?", "none"),
                                           ("Last?", None)):
                await conn.send(text_item(question))
                await until(conn, "conversation.item.done")
                response = {"conversation": conversation} if conversation else {}
                await conn.send({"type": "response.create", "response": response})
                done = check_response(await until(conn, "response.done"))
                record = (await http.get(done.vidchat["record_url"])).json()  # the whole record
                turns.append(record["history_turns_total"])
        assert turns == [0, 2, 0, 4]  # the aside neither saw the chat nor joined it
        await conn.send({"type": "response.create", "response": {"conversation": "other"}})
        error = (await until(conn, "error"))[-1].error
        assert error.param == "response.conversation" and "\"auto\" or \"none\"" in error.message


@pytest.mark.engine
async def test_a_committed_buffer_and_an_input_audio_item_are_spoken_questions(server):
    """Without server VAD, the client says when a spoken question ends:
    appended audio committed, or one input_audio item; response.create
    answers it with that audio as the question (and no text)."""
    speech = sa.speech("Where is my cup?")
    async with client(server).realtime.connect(model="tiny") as conn:
        await configured(conn, temperature=0.0, max_tokens=3)
        for frame in MOVING[:2]:
            await conn.send(image_item(frame))
            await until(conn, "conversation.item.done")  # each item is added, then done
        chunk = AUDIO_RATE // 5
        for i in range(0, speech.size, chunk):
            await conn.send({"type": "input_audio_buffer.append", "audio": pcm24k_b64(speech[i:i + chunk])})
        await conn.send({"type": "input_audio_buffer.commit"})
        committed = await until(conn, "conversation.item.done")
        types = [e.type for e in committed]
        assert types[-3:] == ["input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]
        assert committed[-3].item_id == committed[-1].item.id
        assert committed[-1].item.content[0].type == "input_audio"
        await conn.send({"type": "response.create"})
        first = check_response(await until(conn, "response.done")).vidchat
        assert first["frames"] == 2
        assert first["spoken_question"]["seconds"] == pytest.approx(speech.size / AUDIO_RATE, abs=0.05)

        await conn.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_audio", "audio": pcm24k_b64(speech)}]}})
        await until(conn, "conversation.item.done")
        await conn.send({"type": "response.create"})
        second = check_response(await until(conn, "response.done")).vidchat
        assert second["spoken_question"]["seconds"] == pytest.approx(first["spoken_question"]["seconds"], abs=0.01)
        assert second["answer_id"] != first["answer_id"]


@pytest.mark.engine
async def test_response_cancel_ends_the_response_as_cancelled_and_aborts_the_generation(server):
    async with client(server).realtime.connect(model="tiny") as conn:
        await configured(conn, temperature=0.0)
        await conn.send({"type": "response.cancel", "event_id": "evt_nothing"})
        refused = (await until(conn, "error"))[-1]
        assert refused.error.code == "response_cancel_not_active" and refused.error.event_id == "evt_nothing"
        await conn.send(image_item(MOVING[0]))
        await conn.send(text_item("Tell me a long story."))
        await conn.send({"type": "response.create", "response": {"max_output_tokens": 3000}})
        await until(conn, "response.output_text.delta")
        await conn.send({"type": "response.create"})  # one at a time: refused, the answer goes on
        await conn.send({"type": "response.cancel"})
        events = await until(conn, "response.done")
        errors = [e for e in events if e.type == "error"]
        assert [e.error.code for e in errors] == ["conversation_already_has_active_response"]
        done = events[-1]
        assert done.response.status == "cancelled" and done.response.status_details.reason == "client_cancelled"
        assert done.response.output[0].status == "incomplete" and done.response.usage.output_tokens < 3000
        assert await until_idle(server, 10) == 0  # the abort reached vLLM
        await conn.send({"type": "response.create"})  # its question was answered: none is pending now
        assert (await until(conn, "error"))[-1].error.code == "empty_conversation"
        await conn.send(text_item("And then?"))
        await conn.send({"type": "response.create", "response": {"max_output_tokens": 2}})
        assert (await until(conn, "response.done"))[-1].response.status in ("completed", "incomplete")


@pytest.mark.engine
async def test_bad_events_get_an_error_and_the_session_goes_on(server):
    async with client(server).realtime.connect(model="tiny") as conn:
        await configured(conn, max_tokens=2)
        bad = [({"type": "no.such.event", "event_id": "evt_1"}, "unknown_event"),
               (image_item(base64.b64encode(b"not a picture").decode()), "invalid_image"),
               ({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
                   {"type": "input_image", "image_url": "https://example.com/a.jpg"}]}}, "invalid_image"),
               ({"type": "session.update", "session": {"type": "realtime", "vidchat": {"max_frames": 0}}},
                "invalid_value"),
               ({"type": "input_audio_buffer.append", "audio": "***"}, "invalid_data"),
               ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty"),
               ({"type": "response.create"}, "empty_conversation"),
               # The API's events this server does not serve: each named in its error.
               ({"type": "conversation.item.retrieve", "item_id": "item_1"}, "unsupported_event"),
               ({"type": "conversation.item.delete", "item_id": "item_1"}, "unsupported_event"),
               ({"type": "conversation.item.truncate", "item_id": "item_1", "content_index": 0,
                 "audio_end_ms": 0}, "unsupported_event"),
               ({"type": "output_audio_buffer.clear"}, "unsupported_event"),
               # (in a session.update, tools are left out and the rest applies: test_realtime_clients)
               ({"type": "response.create", "response": {"tools": [
                   {"type": "function", "name": "lookup", "parameters": {"type": "object"}}]}}, "unsupported"),
               # The suite's shared server has no --record-dir.
               ({"type": "session.update", "session": {"type": "realtime", "vidchat": {"record": True}}},
                "invalid_value")]
        errors = []
        for event, code in bad:
            await conn.send(event)
            errors.append((await until(conn, "error"))[-1].error)
            assert errors[-1].code == code and errors[-1].type == "invalid_request_error", (event, errors[-1])
            assert errors[-1].message
        assert errors[0].event_id == "evt_1" and errors[1].event_id is None  # the client's event named
        assert errors[2].param == "item.content[0].image_url"
        assert errors[-1].param == "session.vidchat.record" and "--record-dir" in errors[-1].message, errors[-1]
        # A value the settings table refuses is pointed at where the client set it.
        for event, param, start in [
                ({"type": "response.create", "response": {"max_output_tokens": 10 ** 6}},
                 "response.max_output_tokens", "max_output_tokens must be"),
                ({"type": "session.update", "session": {"type": "realtime", "max_output_tokens": 10 ** 6}},
                 "session.max_output_tokens", "max_output_tokens must be"),
                ({"type": "session.update", "session": {"type": "realtime", "vidchat": {"max_tokens": 10 ** 6}}},
                 "session.vidchat.max_tokens", "max_tokens must be"),
                ({"type": "session.update", "session": {"type": "realtime", "vidchat": {"evs_threshold": 7}}},
                 "session.vidchat.evs_threshold", "evs_threshold must be")]:
            await conn.send(event)
            error = (await until(conn, "error"))[-1].error
            assert error.param == param and error.message.startswith(start), (event, error)
        for (event, code), error in zip(bad, errors):
            if code == "unsupported_event":
                assert error.message.startswith(f"{event['type']} is not served here"), error.message
        await conn.send(image_item(MOVING[1]))
        assert (await until(conn, "conversation.item.added"))[-1].vidchat["frames"][0]["accepted"] is True
        await conn.send(text_item("Still there?"))
        await conn.send({"type": "response.create"})
        check_response(await until(conn, "response.done"))
    # Not JSON at all (the SDK can't send that): the same error, the session goes on.
    async with websockets.connect(server.url.replace("http", "ws") + "/v1/realtime?model=tiny") as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send("{not json")
        assert json.loads(await ws.recv())["error"]["code"] == "invalid_json"
        await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
        assert json.loads(await ws.recv())["type"] == "input_audio_buffer.cleared"


@pytest.mark.engine
async def test_server_vad_answers_speech_and_speech_during_a_response_cancels_it(server):
    track = sa.compose([(sa.silence(0.5), False), (sa.speech("What is on the table in front of me?"), True),
                        (sa.silence(1.2), False)])
    speech_start, speech_end = track.speech[0]
    async with client(server).realtime.connect(model="tiny") as conn:
        await recv(conn)
        await conn.send({"type": "session.update", "session": {
            "type": "realtime", "max_output_tokens": 4, "vidchat": {"temperature": 0.0, "num_sample_frames": 2},
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": {
                "type": "server_vad", "silence_duration_ms": 500, "prefix_padding_ms": 50,
                "interrupt_response": True, "create_response": True}}}}})
        updated = (await until(conn, "session.updated"))[-1]
        assert updated.session.audio.input.turn_detection.type == "server_vad"
        for i, frame in enumerate(MOVING[:3]):
            await conn.send(image_item(frame, pts_ms=i * 200))
        await conn.send(text_item("Tell me a long story."))
        await conn.send({"type": "response.create", "response": {"max_output_tokens": 3000}})
        await until(conn, "response.output_text.delta")
        chunk = AUDIO_RATE // 10  # 100 ms, sent as fast as it goes: the listener follows from where it started
        for i in range(0, track.audio.size, chunk):
            await conn.send({"type": "input_audio_buffer.append", "audio": pcm24k_b64(track.audio[i:i + chunk])})
        # The cancelled response's end and the speech events interleave; the spoken response comes after both.
        events = []
        while sum(e.type == "response.done" for e in events) < 2:
            events += await until(conn, "response.done")
        types = [e.type for e in events]
        speech = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                  "input_audio_buffer.committed"]
        assert [t for t in types if t in speech] == speech, types
        barged = events[types.index("response.done")]
        assert barged.response.status == "cancelled" and barged.response.status_details.reason == "turn_detected"
        started, stopped, committed = (events[types.index(t)] for t in speech)
        assert started.item_id == stopped.item_id == committed.item_id
        # The utterance is committed as an item, then answered on its own.
        item = next(e.item for e in events if e.type == "conversation.item.added" and e.item.id == started.item_id)
        assert item.role == "user" and item.content[0].type == "input_audio"
        assert types.index("input_audio_buffer.committed") < types.index("response.created")
        done = check_response(events[types.index("response.created"):])
        spoken = done.vidchat["spoken_question"]
        assert spoken["seconds"] == pytest.approx(speech_end - speech_start, abs=0.3)
        assert done.vidchat["audio_seconds"] == pytest.approx(spoken["seconds"], abs=0.01)


# ---- the token ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def guarded(tiny_vllm_serve, artifacts_dir):
    """A server that asks for --token, answering through the suite's shared `vllm serve`."""
    srv = start_server([*TINY_SERVER_ARGS, "--engine-url", tiny_vllm_serve, *SERVER_ARGS, "--max-tokens", "4",
                        "--max-sessions", "1", "--connect-timeout", "60"],
                       artifacts_dir / "server-realtime-token.log", token=TOKEN)
    yield srv
    stop_server(srv)


@pytest.mark.engine
async def test_the_token_is_asked_for_and_the_session_counts_against_max_sessions(guarded):
    # No credential (the SDK always sends its api_key, so a plain client), then a wrong one.
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(guarded.url.replace("http", "ws") + "/v1/realtime?model=tiny"):
            pass
    assert refused.value.response.status_code == 401
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with client(guarded, "wrong-token").realtime.connect(model="tiny"):
            pass
    assert refused.value.response.status_code == 403
    # The right token from a page of another origin (a browser sends Origin): the guard's Origin check.
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(guarded.url.replace("http", "ws") + "/v1/realtime?model=tiny",
                                      origin="http://evil.example",
                                      additional_headers={"Authorization": f"Bearer {TOKEN}"}):
            pass
    assert refused.value.response.status_code == 403
    async with client(guarded, TOKEN).realtime.connect(model="tiny") as conn:
        assert (await recv(conn)).type == "session.created"
        # --max-sessions 1: a second client is told, and closed.
        async with client(guarded, TOKEN).realtime.connect(model="tiny") as second:
            refused = await second.recv()
            assert refused.type == "error" and refused.error.code == "session_refused"
        await conn.send(image_item(MOVING[2]))
        await conn.send(text_item("What is this?"))
        await conn.send({"type": "response.create"})
        done = check_response(await until(conn, "response.done"))
        assert done.vidchat["frames"] == 1
        url = done.vidchat["record_url"]
        async with httpx.AsyncClient(base_url=guarded.url, timeout=30) as http:
            assert (await http.get(url)).status_code == 401
            assert (await http.get(url, headers={"Authorization": f"Bearer {TOKEN}"})).status_code == 200
