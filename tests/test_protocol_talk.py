"""vllm-omni's newer streaming-video fields on the seed WebSocket protocol
(/v1/video/chat/stream), against the real server (uvicorn subprocess, real
vLLM on the tiny random omni model): frame acks, questions spoken in
video.query's audio_data, video.frames.consumed, use_audio_in_video, the
notice for clients that ask for spoken answers, and server-side turn
detection (turn_detection: server_vad) over audio.chunk messages carrying
espeak-ng speech. Replies are gibberish: only shapes, order and the inputs
the model got are checked, never the words."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
from test_protocol import (
    MOVING,
    SHORT,
    STATIC_JPEG,
    answer,
    check_answer,
    connect,
    expect_closed,
    expect_error,
    recv,
    send,
    still_alive,
    until,
)

from vidchat.devtools import synthetic as sa
from vidchat.doors.socket.session import NO_AUDIO_OUTPUT_NOTICE
from vidchat.media import AUDIO_RATE

pytestmark = pytest.mark.engine

NOT_AN_IMAGE = base64.b64encode(b"hello, not a picture").decode()


@pytest.fixture(scope="module")
def question_speech() -> np.ndarray:
    return sa.speech("What is on the table in front of me?")


def pcm16_b64(audio: np.ndarray) -> str:
    return base64.b64encode((np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes()).decode()


async def named_frames(ws, n: int, step_ms: int = 100) -> list[dict]:
    """Send n different frames named f0.. with pts_ms; returns their acks."""
    acks = []
    for i, data in enumerate(MOVING[:n]):
        await send(ws, {"type": "video.frame", "data": data, "frame_id": f"f{i}", "pts_ms": i * step_ms})
        acks.append(await recv(ws))
    return acks


# ---- video.frame.ack ------------------------------------------------------

async def test_frames_with_an_id_are_acked_kept_or_filtered_and_others_are_not(server):
    ws = await connect(server, **SHORT)  # the filter (EVS) is on
    await send(ws, {"type": "video.frame", "data": STATIC_JPEG, "frame_id": "a", "pts_ms": 0,
                    "capture_ts_ms": 1234.5})
    ack = await recv(ws)
    assert ack["type"] == "video.frame.ack" and ack["frame_id"] == "a"
    assert ack["accepted"] is True and ack["buffered_frames"] == 1 and "reason" not in ack
    assert ack["pts_ms"] == 0 and ack["capture_ts_ms"] == 1234.5 and ack["server_receive_ts_ms"] > 0

    # The same picture again: a near-duplicate, dropped by the filter.
    await send(ws, {"type": "video.frame", "data": STATIC_JPEG, "frame_id": 7, "pts_ms": 100})
    ack = await recv(ws)
    assert ack == {**ack, "type": "video.frame.ack", "frame_id": 7, "accepted": False, "reason": "filtered",
                   "buffered_frames": 1, "capture_ts_ms": None}

    # No frame_id: the seed's silence (a pong is the next message).
    await send(ws, {"type": "video.frame", "data": MOVING[0]})
    await still_alive(ws)

    # Unusable frames: the error as before, then a refusal naming why.
    for data, reason, error in [("not base64!!", "invalid_data", "Invalid base64 in video.frame"),
                                (NOT_AN_IMAGE, "invalid_image", "Invalid image in video.frame")]:
        await send(ws, {"type": "video.frame", "data": data, "frame_id": reason})
        await expect_error(ws, error)
        ack = await recv(ws)
        assert ack["type"] == "video.frame.ack" and ack["frame_id"] == reason
        assert ack["accepted"] is False and ack["reason"] == reason and ack["buffered_frames"] == 2
    await send(ws, {"type": "video.frame", "data": MOVING[1], "frame_id": {"no": 1}})
    await expect_error(ws, "'frame_id' must be a non-empty string")
    await send(ws, {"type": "video.frame", "data": MOVING[1], "frame_id": "late", "capture_ts_ms": "noon"})
    await expect_error(ws, "'capture_ts_ms' must be a number")
    ack = await recv(ws)
    assert ack["accepted"] is False and ack["reason"] == "invalid_capture_ts"
    await still_alive(ws)
    await ws.close()


async def test_a_full_buffer_names_the_frame_it_pushed_out(server):
    ws = await connect(server, max_frames=2, **SHORT)
    acks = await named_frames(ws, 3)
    assert [a["accepted"] for a in acks] == [True, True, True]
    assert [a["buffered_frames"] for a in acks] == [1, 2, 2]
    assert "dropped_frame_id" not in acks[1] and acks[2]["dropped_frame_id"] == "f0"
    await ws.close()


async def test_seed_clients_see_nothing_new(server):
    ws = await connect(server, modalities=["text"], **SHORT)
    await send(ws, {"type": "video.frame", "data": MOVING[0], "pts_ms": 0})
    await send(ws, {"type": "video.frame", "data": MOVING[1]})
    msgs = await answer(ws)
    assert msgs[0] == {"type": "response.start"}
    check_answer(msgs)  # no ack, no frames.consumed, no notice
    await ws.close()


# ---- video.frames.consumed ------------------------------------------------

async def test_frames_consumed_names_the_sampled_frames_before_the_first_delta(server):
    ws = await connect(server, num_sample_frames=3, **SHORT)
    acks = await named_frames(ws, 8)
    assert all(a["accepted"] for a in acks)
    await send(ws, {"type": "video.frame", "data": MOVING[0]})  # an unnamed one: newest, so sampled
    for _ in range(2):
        await send(ws, {"type": "video.query", "text": "What changed?"})
        msgs = await until(ws, "response.text.done")
        assert msgs[0] == {"type": "response.start"} and msgs[1]["type"] == "video.frames.consumed"
        consumed = msgs[1]
        done = check_answer([msgs[0], *msgs[2:]])
        picked = done["stats"]["frame_indices"]  # ring indices: the order sent (nothing was pushed out)
        assert len(picked) == 3 and picked[-1] == 8
        assert consumed["frame_ids"] == [f"f{i}" for i in picked if i < 8]
        assert [f["frame_id"] for f in consumed["frames"]] == consumed["frame_ids"]
        assert [f["pts_ms"] for f in consumed["frames"]] == [i * 100 for i in picked if i < 8]
        assert consumed["latest_pts_ms"] is None  # the newest sampled frame had no pts_ms
    await send(ws, {"type": "video.frame", "data": MOVING[1], "frame_id": "last", "pts_ms": 5000})
    assert (await recv(ws))["accepted"] is True
    msgs = await answer(ws)
    assert msgs[1]["frame_ids"][-1] == "last" and msgs[1]["latest_pts_ms"] == 5000
    await ws.close()


# ---- video.query audio_data: spoken questions ------------------------------

async def test_a_question_spoken_in_the_query_is_the_audio_the_model_gets(server, question_speech):
    from test_operations import scrape, value

    before = scrape(server)
    ws = await connect(server, **SHORT)
    for i, data in enumerate(MOVING):
        await send(ws, {"type": "video.frame", "data": data, "pts_ms": i * 500})
    # Stream audio the question must NOT carry: only the spoken question is sent.
    await send(ws, {"type": "audio.chunk", "data": pcm16_b64(sa.silence(2.0) + 0.01), "pts_ms": 0})
    spoken = pcm16_b64(question_speech)
    seconds = question_speech.size / AUDIO_RATE

    await send(ws, {"type": "video.query", "text": "", "audio_data": spoken})
    done = check_answer(await until(ws, "response.text.done"))
    stats = done["stats"]
    assert stats["audio_seconds"] == pytest.approx(seconds, abs=2 / AUDIO_RATE)
    assert stats["spoken_question"]["seconds"] == pytest.approx(seconds, abs=1e-3)
    assert stats["audio_span"][1] - stats["audio_span"][0] == pytest.approx(seconds, abs=2e-3)
    assert stats["include_audio"] is True and stats["completion_tokens"] == SHORT["max_tokens"]

    # With text too: the audio is the question, the text follows it in the prompt.
    await send(ws, {"type": "video.query", "text": "Answer in one word.", "audio_data": spoken})
    stats = check_answer(await until(ws, "response.text.done"))["stats"]
    assert stats["spoken_question"] is not None and "Answer in one word." in stats["prompt"]
    assert stats["audio_seconds"] == pytest.approx(seconds, abs=2 / AUDIO_RATE)
    # /metrics counts spoken questions as Talk's, not the chat's typed ones.
    after = scrape(server)
    for kind, grew in (("talk", 2), ("chat", 0)):
        labels = {"door": "socket", "status": "completed", "engine": "main", "kind": kind}
        assert value(after, "vidchat_answers_total", **labels) - value(before, "vidchat_answers_total", **labels) \
            == grew, kind

    # Unusable audio: a clear error, and the session goes on.
    for audio_data, error in [("not base64!!", "Invalid base64 in video.query 'audio_data'"),
                              (base64.b64encode(b"abc").decode(), "must be PCM16"),
                              (pcm16_b64(np.zeros(31 * AUDIO_RATE, np.float32)), "'audio_data' is too long"),
                              (123, "requires 'audio_data' as a base64 string")]:
        await send(ws, {"type": "video.query", "text": "", "audio_data": audio_data})
        await expect_error(ws, error)
    await send(ws, {"type": "video.query", "audio_data": pcm16_b64(np.zeros(80, np.float32))})
    await expect_error(ws, "too short")
    await send(ws, {"type": "video.query", "text": ""})  # no audio: the seed's rule
    await expect_error(ws, "video.query requires a non-empty 'text' field")
    check_answer(await answer(ws))
    await ws.close()


# ---- session.config: modalities, use_audio_in_video -------------------------

async def test_asking_for_spoken_answers_gets_text_and_one_notice(server):
    ws = await connect(server, modalities=["text", "audio"], **SHORT)
    await send(ws, {"type": "video.frame", "data": MOVING[0]})
    first = await answer(ws)
    assert first[0] == {"type": "response.start", "notice": NO_AUDIO_OUTPUT_NOTICE}
    check_answer([{"type": "response.start"}, *first[1:]])
    second = await answer(ws)
    assert second[0] == {"type": "response.start"}
    check_answer(second)
    await ws.close()


async def test_use_audio_in_video_decides_whether_typed_questions_carry_audio(server):
    ws = await connect(server, use_audio_in_video=False, **SHORT)
    for i, data in enumerate(MOVING[:4]):
        await send(ws, {"type": "video.frame", "data": data, "pts_ms": i * 500})
    await send(ws, {"type": "audio.chunk", "data": pcm16_b64(np.full(2 * AUDIO_RATE, 0.05, np.float32)),
                    "pts_ms": 0})
    stats = check_answer(await answer(ws))["stats"]
    assert stats["audio_seconds"] == 0 and stats["include_audio"] is False

    await send(ws, {"type": "session.update", "use_audio_in_video": True})
    updated = await recv(ws)
    assert updated["type"] == "session.updated" and updated["settings"]["include_audio"] is True
    stats = check_answer(await answer(ws))["stats"]
    assert stats["audio_seconds"] > 1.0 and stats["include_audio"] is True

    await send(ws, {"type": "session.update", "use_audio_in_video": True, "include_audio": False})
    await expect_error(ws, "are the same setting but have different values")
    await ws.close()


# ---- turn_detection: server_vad ---------------------------------------------

async def test_bad_turn_detection_is_a_config_error(server):
    ws = await connect(server, turn_detection={"type": "server_vad", "silence_duration_ms": 20})
    await expect_error(ws, "turn_detection.silence_duration_ms")
    await expect_closed(ws)
    ws = await connect(server, turn_detection={"type": "semantic_vad"})
    await expect_error(ws, "only 'server_vad' is supported")
    await expect_closed(ws)


async def test_server_vad_asks_what_the_client_says_without_a_query(server, question_speech):
    ws = await connect(server, evs_enabled=False, num_sample_frames=4, **SHORT,
                       turn_detection={"type": "server_vad", "silence_duration_ms": 500,
                                       "prefix_padding_ms": 50, "interrupt_response": True})
    lead, pause = 2.0, 1.5
    track = sa.compose([(sa.silence(lead), False), (question_speech, True), (sa.silence(pause), False)])
    # The listener follows the audio from where it first finds it: the
    # leading silence goes at about real time while it starts, the rest as
    # fast as it goes (pts_ms places it), with a frame every 200 ms.
    chunk = AUDIO_RATE // 10  # 100 ms
    for i in range(0, track.audio.size, chunk):
        ms = i * 1000 // AUDIO_RATE
        if ms % 200 == 0:
            await send(ws, {"type": "video.frame", "data": MOVING[(ms // 200) % len(MOVING)], "pts_ms": ms})
        await send(ws, {"type": "audio.chunk", "data": pcm16_b64(track.audio[i:i + chunk]), "pts_ms": ms})
        if ms < lead * 1000:
            await asyncio.sleep(0.1)

    msgs = await until(ws, "response.text.done", timeout=60)
    types = [m["type"] for m in msgs]
    assert types[:2] == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped"], types
    started, stopped = msgs[0], msgs[1]
    done = check_answer(msgs[2:])
    stats = done["stats"]
    spoken = stats["spoken_question"]
    true_start, true_end = track.speech[0]
    assert spoken["seconds"] == pytest.approx(true_end - true_start, abs=0.3)
    assert spoken["start"] == pytest.approx(true_start, abs=0.2) and spoken["end"] == pytest.approx(true_end, abs=0.2)
    # The model got exactly the utterance's audio, and frames from its span.
    assert stats["audio_span"] == [pytest.approx(spoken["start"], abs=1e-3), pytest.approx(spoken["end"], abs=1e-3)]
    assert stats["audio_seconds"] == pytest.approx(spoken["seconds"], abs=2 / AUDIO_RATE)
    assert stats["frames"] == 4 and stats["frame_times"][0] <= spoken["start"]
    assert all(spoken["start"] <= t <= spoken["end"] for t in stats["frame_times"][1:])
    # The speech events are on the same timeline (ms since the session's first media).
    assert stopped["audio_start_ms"] == pytest.approx(spoken["start"] * 1000, abs=1)
    assert stopped["audio_end_ms"] == pytest.approx(spoken["end"] * 1000, abs=1)
    assert started["audio_start_ms"] == pytest.approx(spoken["start"] * 1000 + 50, abs=1)
    await still_alive(ws)
    await send(ws, {"type": "video.done"})
    assert (await until(ws, "session.done"))[-1] == {"type": "session.done"}
    await expect_closed(ws)


async def test_without_interrupt_response_speech_is_answered_after_the_answer_streaming(server, question_speech):
    """interrupt_response false: the client's speech neither cuts the answer
    streaming (no barge-in) nor cancels it by being asked (as any newer
    question would): its utterance is answered once that answer has ended."""
    ws = await connect(server, evs_enabled=False, num_sample_frames=2, max_tokens=1500, temperature=0.0,
                       turn_detection={"type": "server_vad", "silence_duration_ms": 500,
                                       "prefix_padding_ms": 50, "interrupt_response": False})
    lead = 2.0
    track = sa.compose([(sa.silence(lead), False), (question_speech, True), (sa.silence(1.5), False)])
    chunk = AUDIO_RATE // 10  # 100 ms
    lead_chunks = int(lead * 10)
    chunks = [(i * 100, pcm16_b64(track.audio[i * chunk:(i + 1) * chunk])) for i in range(track.audio.size // chunk)]
    # The lead at about real time, while the listener starts (as in the test above).
    for ms, data in chunks[:lead_chunks]:
        if ms % 200 == 0:
            await send(ws, {"type": "video.frame", "data": MOVING[(ms // 200) % len(MOVING)], "pts_ms": ms})
        await send(ws, {"type": "audio.chunk", "data": data, "pts_ms": ms})
        await asyncio.sleep(0.1)
    await send(ws, {"type": "video.query", "text": "Describe everything you see."})
    msgs = await until(ws, "response.start")
    # The question while the typed answer streams.
    for ms, data in chunks[lead_chunks:]:
        await send(ws, {"type": "audio.chunk", "data": data, "pts_ms": ms})
    while sum(m["type"] == "response.text.done" for m in msgs) < 2:
        msgs.append(await recv(ws, timeout=120))
    types = [m["type"] for m in msgs if m["type"] != "response.text.delta"]
    first_done = types.index("response.text.done")
    assert "input_audio_buffer.speech_stopped" in types[:first_done], \
        f"the utterance must end while the typed answer streams, for this test to say anything: {types}"
    typed = msgs[[m["type"] for m in msgs].index("response.text.done")]["stats"]
    assert not typed.get("cancelled") and typed["completion_tokens"] == 1500, typed
    # The spoken question's answer starts only after the typed one's end.
    assert types[first_done + 1:] == ["response.start", "response.text.done"], types
    spoken = msgs[-1]["stats"]
    assert spoken["spoken_question"] is not None and not spoken.get("cancelled"), spoken
    await ws.close()
