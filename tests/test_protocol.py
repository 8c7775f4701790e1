"""The seed WebSocket protocol (/v1/video/chat/stream) against the real server
(uvicorn subprocess, real vLLM on the tiny random model), plus the
`python -m vidchat.client` command. Replies are gibberish: these tests check
message shapes, order, counts and timing, never the words."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import websockets
from conftest import ROOT, SESSION_IDLE_TIMEOUT, eventually_async, free_port

from vidchat.devtools import synthetic

NO_FRAMES = "No frames available. Send video.frame before video.query."
# The seed's four, and the frames dropped over --ws-max-fps before the filter saw them.
EVS_KEYS = {"retained_count", "dropped_count", "total_count", "drop_rate", "rate_dropped_count"}
STATIC_JPEG = base64.b64encode(synthetic.encode_jpeg(synthetic.static_clip(120, 160, n=1).frames[0])).decode()
# Small, all different: the filter keeps every one of them.
MOVING = [base64.b64encode(j).decode() for j in synthetic.cuts_clip(120, 160, cuts=8, hold=1).jpegs()]


# ---- helpers --------------------------------------------------------------

async def send(ws, msg) -> None:
    await ws.send(msg if isinstance(msg, (str, bytes)) else json.dumps(msg))


async def recv(ws, timeout: float = 15.0) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def connect(server, **config) -> websockets.ClientConnection:
    ws = await websockets.connect(server.ws_url, max_size=None)
    await send(ws, {"type": "session.config", **config})
    return ws


async def frames(ws, jpegs=MOVING, n: int | None = None) -> None:
    for data in jpegs[:n]:
        await send(ws, {"type": "video.frame", "data": data})


async def until(ws, kind: str, timeout: float = 30.0) -> list[dict]:
    """Messages up to and including the first of type `kind`."""
    out: list[dict] = []
    deadline = time.monotonic() + timeout
    while not out or out[-1]["type"] != kind:
        out.append(await recv(ws, max(deadline - time.monotonic(), 0.01)))
    return out


async def answer(ws, text: str = "What is happening?") -> list[dict]:
    await send(ws, {"type": "video.query", "text": text})
    return await until(ws, "response.text.done")


def check_answer(msgs: list[dict]) -> dict:
    """One well-formed answer: start, deltas, done whose text is the joined deltas."""
    types = [m["type"] for m in msgs]
    assert types[0] == "response.start" and types[-1] == "response.text.done", types
    assert set(types[1:-1]) <= {"response.text.delta"}, types
    deltas = [m["delta"] for m in msgs[1:-1]]
    assert all(isinstance(d, str) and d for d in deltas)
    done = msgs[-1]
    assert done["text"] == "".join(deltas)
    return done


async def expect_error(ws, fragment: str) -> str:
    msg = await recv(ws)
    assert msg["type"] == "error", msg
    assert fragment in msg["message"], msg["message"]
    return msg["message"]


async def expect_closed(ws, timeout: float = 5.0) -> None:
    """The server closes the socket and sends nothing more."""
    with pytest.raises(websockets.ConnectionClosed):
        msg = await asyncio.wait_for(ws.recv(), timeout)
        pytest.fail(f"unexpected message before close: {msg}")


async def still_alive(ws) -> None:
    await send(ws, {"type": "ping"})
    assert await recv(ws) == {"type": "pong"}


async def no_sessions_left(server, timeout: float = 3.0) -> None:
    """No WebSocket session open and nothing generating (browser tabs of other
    tests may still be winding down; they are not this door's)."""
    def clean() -> bool:
        health = server.get_json("/api/health")
        return health["sessions_by_kind"].get("ws", 0) == 0 and health["running_requests"] == 0

    await eventually_async(lambda: asyncio.to_thread(clean), timeout, "no socket session open and nothing generating")


SHORT = dict(max_tokens=6, temperature=0.0)
# Greedy decoding of the random model runs on without an end token: a long answer.
LONG = dict(max_tokens=3500, temperature=0.0)


# ---- happy path and order ------------------------------------------------

@pytest.mark.engine
async def test_config_frames_query_done(server):
    ws = await connect(server, model="whatever", modalities=["text"], **SHORT)
    await frames(ws, n=4)
    done = check_answer(await answer(ws))
    assert len(done["text"]) > 0
    stats = done["stats"]
    assert stats["frames"] == 4 and stats["completion_tokens"] == 6 and stats["prompt_tokens"] > 10
    assert stats["ttft_s"] > 0 and stats["cancelled"] is False
    await send(ws, {"type": "video.done"})
    evs = await recv(ws)
    assert evs["type"] == "response.evs_stats" and set(evs) == EVS_KEYS | {"type"}
    assert evs["total_count"] == 4 and evs["retained_count"] + evs["dropped_count"] == 4
    assert 0.0 <= evs["drop_rate"] <= 1.0
    assert await recv(ws) == {"type": "session.done"}
    await expect_closed(ws)
    assert ws.close_code == 1000
    await no_sessions_left(server)


@pytest.mark.engine
async def test_video_done_waits_for_the_running_answer(server):
    ws = await connect(server, **SHORT)
    await frames(ws, n=2)
    await send(ws, {"type": "video.query", "text": "Describe it."})
    await send(ws, {"type": "video.done"})
    msgs = await until(ws, "session.done")
    check_answer(msgs[:-2])
    assert [m["type"] for m in msgs[-2:]] == ["response.evs_stats", "session.done"]
    await expect_closed(ws)


@pytest.mark.engine
async def test_frames_sent_during_an_answer_count_for_the_next(server):
    ws = await connect(server, evs_enabled=False, max_tokens=48, temperature=0.0)
    await frames(ws, n=3)
    await send(ws, {"type": "video.query", "text": "First?"})
    first = [await recv(ws)]
    assert first[0]["type"] == "response.start"
    await frames(ws, MOVING[3:5])  # while the answer streams
    first += await until(ws, "response.text.done")
    assert check_answer(first)["stats"]["frames"] == 3
    second = check_answer(await answer(ws, "Second?"))
    assert second["stats"]["frames"] == 5
    await send(ws, {"type": "video.done"})
    assert await recv(ws) == {"type": "session.done"}  # no response.evs_stats with the filter off
    await expect_closed(ws)


@pytest.mark.engine
async def test_new_query_cancels_the_running_one(server):
    ws = await connect(server, **LONG)
    await frames(ws, n=1)
    await send(ws, {"type": "video.query", "text": "Talk for a long time."})
    msgs = await until(ws, "response.text.delta")
    # Later questions are short; answer options apply from the next question on.
    await send(ws, {"type": "session.update", "max_tokens": 5})
    await send(ws, {"type": "video.query", "text": "Now something short."})
    msgs += await until(ws, "response.start")
    types = [m["type"] for m in msgs]
    assert types.count("response.text.done") == 1 and types.count("response.start") == 2
    assert types.index("response.text.done") < len(types) - 1  # the old done came before the new start
    updated = [m for m in msgs if m["type"] == "session.updated"]
    assert len(updated) == 1 and updated[0]["settings"]["max_tokens"] == 5
    old = [m for m in msgs if m["type"] != "session.updated"][:-1]
    done = check_answer(old)
    assert done["stats"]["cancelled"] is True and done["stats"]["completion_tokens"] < LONG["max_tokens"]
    new = [msgs[-1]] + await until(ws, "response.text.done")
    assert check_answer(new)["stats"]["completion_tokens"] == 5
    await still_alive(ws)
    await ws.close()
    await no_sessions_left(server)


@pytest.mark.engine
async def test_disconnect_aborts_generation_and_idle_timer_waits_for_the_answer(server):
    ws = await connect(server, **LONG)
    await frames(ws, n=1)
    await send(ws, {"type": "video.query", "text": "Talk for a long time."})
    # Longer than the server's 4 s idle timeout, without sending anything: the
    # answer keeps streaming and no idle error comes.
    t0 = time.monotonic()
    while time.monotonic() - t0 < 5.0:
        msg = await recv(ws)
        assert msg["type"] in ("response.start", "response.text.delta"), msg
    assert server.running_requests() == 1
    await ws.close()
    await eventually_async(lambda: asyncio.to_thread(lambda: server.running_requests() == 0), 1.0,
                           "the generation is aborted once the client closed")
    await no_sessions_left(server)


@pytest.mark.engine
async def test_abrupt_disconnect_aborts_generation(server):
    ws = await connect(server, **LONG)
    await frames(ws, n=1)
    await send(ws, {"type": "video.query", "text": "Talk."})
    await until(ws, "response.text.delta")
    ws.transport.abort()  # no closing handshake: the TCP connection just drops
    await eventually_async(lambda: asyncio.to_thread(lambda: server.running_requests() == 0), 1.0,
                           "the generation is aborted once the connection dropped")
    await no_sessions_left(server)


# ---- session.config ----------------------------------------------------------

@pytest.mark.engine
@pytest.mark.parametrize(
    "config, fragment",
    [
        ({"max_frames": "64"}, "Invalid type for 'max_frames': expected int, got str"),
        ({"num_sample_frames": 2.5}, "Invalid type for 'num_sample_frames'"),
        ({"evs_enabled": 1}, "Invalid type for 'evs_enabled': expected bool"),
        ({"evs_threshold": "high"}, "Invalid type for 'evs_threshold'"),
        ({"model": 7}, "Invalid type for 'model'"),
        ({"modalities": "text"}, "Invalid type for 'modalities': expected list"),
        ({"max_frames": True}, "Invalid type for 'max_frames'"),
        ({"num_frames": "8"}, "Invalid type for 'num_frames'"),
        ({"enable_frame_filter": "yes"}, "Invalid type for 'enable_frame_filter'"),
        ({"max_tokens": 1.5}, "Invalid type for 'max_tokens'"),
        ({"include_audio": "no"}, "Invalid type for 'include_audio'"),
        ({"system_prompt": ["a"]}, "Invalid type for 'system_prompt'"),
        ({"sampling": "random"}, "Invalid value for 'sampling'"),
        ({"frames_as": "film"}, "Invalid value for 'frames_as'"),
        ({"max_frames": 0}, "max_frames must be an integer in 1.."),
        ({"evs_threshold": 1.5}, "evs_threshold must be a number in [0, 1]"),
        ({"max_tokens": 0}, "max_tokens must be a whole number in 1.."),
        ({"temperature": -1}, "temperature must be a number in 0.."),
        ({"num_frames": 4, "num_sample_frames": 8}, "same setting"),
    ],
)
async def test_bad_config_ends_the_session(server, config, fragment):
    ws = await connect(server, **config)
    await expect_error(ws, fragment)
    await expect_closed(ws)


@pytest.mark.engine
@pytest.mark.parametrize(
    "first, fragment",
    [
        ({"type": "video.frame", "data": STATIC_JPEG}, "Expected session.config, got: video.frame"),
        ({"text": "no type"}, "Expected session.config, got: None"),
        ([1, 2], "Expected session.config, got: list"),
        ("{not json", "Invalid JSON in session.config"),
    ],
)
async def test_first_message_must_be_session_config(server, first, fragment):
    ws = await websockets.connect(server.ws_url)
    await send(ws, first if isinstance(first, (dict, str)) else json.dumps(first))
    await expect_error(ws, fragment)
    await expect_closed(ws)


@pytest.mark.engine
async def test_config_timeout(server):
    ws = await websockets.connect(server.ws_url)
    t0 = time.monotonic()
    await expect_error(ws, "Timeout waiting for session.config")
    assert 1.5 < time.monotonic() - t0 < 5.0  # the fixture's --ws-config-timeout 2
    await expect_closed(ws)


@pytest.mark.engine
async def test_idle_timeout(server):
    ws = await connect(server, **SHORT)
    await frames(ws, n=1)
    await still_alive(ws)
    t0 = time.monotonic()
    message = await expect_error(ws, "Idle timeout")
    assert 3.5 < time.monotonic() - t0 < 7.0, message  # the fixture's --ws-idle-timeout 4
    await expect_closed(ws)
    await no_sessions_left(server)


@pytest.mark.engine
async def test_aliases_ping_and_unknown_keys(server):
    ws = await connect(
        server, num_frames=2, enable_frame_filter=False, frame_filter_threshold=0.5,
        system_prompt="Answer briefly.", future_option={"x": 1}, sampling="latest_frames", **SHORT,
    )
    await still_alive(ws)
    await frames(ws, n=5)
    done = check_answer(await answer(ws))
    assert done["stats"]["frames"] == 2 and done["stats"]["frame_indices"] == [3, 4]  # the 2 newest
    await send(ws, {"type": "video.done"})
    assert await recv(ws) == {"type": "session.done"}  # filter off: no evs stats
    await expect_closed(ws)


@pytest.mark.engine
async def test_session_update(server):
    ws = await connect(server, **SHORT)
    await send(ws, {"type": "session.update", "num_frames": 3, "evs_enabled": False, "frames_as": "video"})
    updated = await recv(ws)
    assert updated["type"] == "session.updated"
    assert updated["settings"]["num_sample_frames"] == 3 and updated["settings"]["frames_as"] == "video"
    await send(ws, {"type": "session.update", "max_frames": -1})
    await expect_error(ws, "session.update rejected: max_frames must be")
    await send(ws, {"type": "session.update", "model": "other"})
    await expect_error(ws, "only be set in session.config")
    await send(ws, {"type": "session.config"})
    await expect_error(ws, "already received")
    await frames(ws, n=4)
    done = check_answer(await answer(ws))
    assert done["stats"]["frames"] == 3  # the rejected updates changed nothing
    await ws.close()


# ---- errors that do not end the session -----------------------------------

@pytest.mark.engine
async def test_bad_frames_are_reported_and_the_session_goes_on(server):
    ws = await connect(server, **SHORT)
    bad = [
        ({"type": "video.frame", "data": "***not base64***"}, "Invalid base64 in video.frame"),
        ({"type": "video.frame", "data": base64.b64encode(b"plain text, not a picture").decode()},
         "Invalid image in video.frame"),
        ({"type": "video.frame", "data": base64.b64encode(base64.b64decode(STATIC_JPEG)[:300]).decode()},
         "Invalid image in video.frame"),  # a truncated JPEG
        ({"type": "video.frame", "data": ""}, "has no data"),
        ({"type": "video.frame"}, "has no data"),
        ({"type": "video.frame", "data": 12}, "base64 string"),
        ({"type": "audio.chunk", "data": "%%%"}, "Invalid base64 in audio.chunk"),
        ({"type": "audio.chunk", "data": base64.b64encode(b"\x01\x02\x03").decode()}, "even number of bytes"),
    ]
    for msg, fragment in bad:
        await send(ws, msg)
        await expect_error(ws, fragment)
    # Over the 10 MB cap (the cap applies to the decoded JPEG).
    limit = 10 * 1024 * 1024
    await send(ws, {"type": "video.frame", "data": base64.b64encode(b"\xff" * (limit + 1)).decode()})
    await expect_error(ws, f"Frame too large: {limit + 1} bytes (limit {limit})")
    # Refused before decoding (still under the WebSocket server's 16 MiB message limit).
    await send(ws, {"type": "video.frame", "data": "A" * (limit // 3 * 4 + 400_000)})
    await expect_error(ws, "Frame too large")
    await still_alive(ws)
    # Good input still works; a data: URL prefix is accepted too.
    # Audio interleaved with the frames, as a live client sends it (0.5 s per chunk).
    tone = (0.2 * np.sin(np.arange(8000) * 2 * np.pi * 440 / 16000) * 32767).astype("<i2")
    chunk = {"type": "audio.chunk", "data": base64.b64encode(tone.tobytes()).decode()}
    # A 1280×720 frame of a few hundred KB: filtered and stored off the event loop.
    big = synthetic.encode_jpeg(synthetic.motion_clip(720, 1280, n=1).frames[0], quality=95)
    assert len(big) > 128 * 1024
    await send(ws, {"type": "video.frame", "data": "data:image/jpeg;base64," + base64.b64encode(big).decode()})
    await send(ws, chunk)
    await frames(ws, MOVING[1:2])
    await send(ws, chunk)
    await frames(ws, MOVING[2:3])
    done = check_answer(await answer(ws))
    assert done["stats"]["frames"] == 3
    assert done["stats"]["audio_seconds"] >= 0.4  # the omni model got the audio as samples
    await send(ws, {"type": "video.done"})
    evs = await recv(ws)
    assert evs["type"] == "response.evs_stats" and evs["total_count"] == 3  # bad frames were not counted
    assert await recv(ws) == {"type": "session.done"}


@pytest.mark.engine
async def test_query_errors(server):
    ws = await connect(server, **SHORT)
    await send(ws, {"type": "video.query", "text": "Anything there?"})
    assert await expect_error(ws, NO_FRAMES) == NO_FRAMES
    for msg in ({"type": "video.query"}, {"type": "video.query", "text": ""},
                {"type": "video.query", "text": "   "}, {"type": "video.query", "text": 5}):
        await send(ws, msg)
        await expect_error(ws, "video.query requires a non-empty 'text' field")
    await still_alive(ws)
    await ws.close()


@pytest.mark.engine
async def test_unknown_types_and_bad_json(server):
    ws = await connect(server, **SHORT)
    cases = [
        ({"type": "video.rewind"}, "Unknown message type: video.rewind"),
        ({"data": "x"}, "Unknown message type: None"),
        ({"type": ["x"]}, "Unknown message type"),
        ("{broken json", "Invalid JSON"),
        ("[1, 2, 3]", "Messages must be JSON objects"),
        ('"text"', "Messages must be JSON objects"),
        (b"\xff\xfe\x00binary", "Invalid JSON"),
    ]
    for msg, fragment in cases:
        await send(ws, msg)
        await expect_error(ws, fragment)
    await frames(ws, n=1)
    check_answer(await answer(ws))
    await ws.close()
    await no_sessions_left(server)


# ---- the client command --------------------------------------------------------

def run_client(server, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vidchat.client", "--url", server.ws_url, *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )


def make_video(path: Path, seconds: float = 3.0, fps: int = 10, size=(320, 240)) -> Path:
    """A clip with a moving box and a 440 Hz stereo tone at 44.1 kHz (resampled by the client)."""
    import av

    w, h = size
    with av.open(str(path), "w") as out:
        video = out.add_stream("mpeg4", rate=fps)
        video.width, video.height, video.pix_fmt = w, h, "yuv420p"
        audio = out.add_stream("aac", rate=44100)
        audio.layout = "stereo"
        n = int(seconds * fps)
        for i in range(n):
            img = np.full((h, w, 3), (30, 40, 90), np.uint8)
            x = int(i * (w - 60) / (n - 1))
            img[h // 3: h // 3 + 80, x: x + 60] = (230, 180, 40)
            out.mux(video.encode(av.VideoFrame.from_ndarray(img, format="rgb24")))
        out.mux(video.encode())
        rate = 44100
        for start in range(0, int(seconds * rate), 1024):
            k = np.arange(start, min(start + 1024, int(seconds * rate)))
            tone = (0.2 * np.sin(2 * np.pi * 440 * k / rate)).astype(np.float32)
            frame = av.AudioFrame.from_ndarray(np.stack([tone, tone]), format="fltp", layout="stereo")
            frame.sample_rate, frame.pts = rate, start
            out.mux(audio.encode(frame))
        out.mux(audio.encode())
    return path


@pytest.mark.engine
def test_client_synthetic_real_time(server):
    t0 = time.monotonic()
    res = run_client(server, "--synthetic", "--duration", "3", "--fps", "5", "--ask", "1.5:What is happening?",
                     "--max-tokens", "8", "--temperature", "0")
    assert res.returncode == 0, res.stdout + res.stderr
    assert time.monotonic() - t0 > 2.5  # paced in real time
    out = res.stdout
    assert "Q [1.5s]: What is happening?" in out and "\nA: " in out
    assert " tokens, " in out and " frames" in out
    assert "s audio" in out  # the synthetic tone reached the model
    assert "EVS filter: kept" in out and "of 15 frames" in out


@pytest.mark.engine
def test_client_streams_a_video_file(server, tmp_path):
    video = make_video(tmp_path / "clip.mp4")
    res = run_client(server, str(video), "--fast", "--json", "--fps", "10", "--max-tokens", "4",
                     "--ask", "1:What moves?", "--ask", "60:After the end?")
    assert res.returncode == 0, res.stdout + res.stderr
    msgs = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    types = [m["type"] for m in msgs]
    assert types.count("response.start") == 2 and types.count("response.text.done") == 2
    assert types[-2:] == ["response.evs_stats", "session.done"] and "error" not in types
    first, second = [m["stats"] for m in msgs if m["type"] == "response.text.done"]
    assert not first["cancelled"] and not second["cancelled"]  # --fast waits for each answer
    assert 1 <= first["frames"] < second["frames"]  # the 1 s question saw only the first second
    assert second["audio_seconds"] > 1.0  # the file's audio track, resampled to 16 kHz
    assert msgs[-2]["total_count"] == 30


@pytest.mark.engine
def test_client_fast_paces_a_long_clip_under_the_servers_frame_rate(server):
    """--fast sends a clip quicker than real time but at most --fast-fps
    frames a second (50, under the server's --ws-max-fps of 60): a clip
    longer than the server's one-second burst loses no frame to the rate
    limit. Sent unpaced, 200 frames in well under a second were cut to about
    60 (acked reason "rate")."""
    res = run_client(server, "--synthetic", "--duration", "8", "--fps", "25", "--fast", "--json", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    msgs = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    evs = next(m for m in msgs if m["type"] == "response.evs_stats")
    assert evs["total_count"] == 200, evs


@pytest.mark.engine
async def test_frames_over_the_rate_are_dropped_before_the_filter_and_counted(server):
    """150 frames sent at once, far above --ws-max-fps (60, in bursts of a
    second's worth): the filter sees only those taken, and video.done's
    evs_stats counts the rest as rate_dropped_count; those asked with a
    frame_id are acked reason "rate"."""
    ws = await connect(server, max_tokens=2)
    for i in range(150):
        await send(ws, {"type": "video.frame", "data": MOVING[i % len(MOVING)], "frame_id": str(i)})
    await send(ws, {"type": "video.done"})
    acks, evs = [], None
    while evs is None:
        msg = await recv(ws, 60)
        if msg["type"] == "video.frame.ack":
            acks.append(msg)
        elif msg["type"] == "response.evs_stats":
            evs = msg
    assert evs["rate_dropped_count"] >= 1 and evs["total_count"] + evs["rate_dropped_count"] == 150, evs
    # (An ack may itself be dropped for a client that falls behind: at most one per frame.)
    assert 1 <= sum(a.get("reason") == "rate" for a in acks) <= evs["rate_dropped_count"]
    await ws.close()


@pytest.mark.engine
def test_client_fails_without_a_server(server):
    res = run_client(server, "--synthetic", "--url", f"ws://127.0.0.1:{free_port()}/v1/video/chat/stream",
                     timeout=30)
    assert res.returncode == 1 and "cannot connect" in res.stderr


@pytest.mark.engine
def test_client_reports_server_errors(server):
    # A refused session.config: the server reports it and closes.
    res = run_client(server, "--synthetic", "--duration", "1", "--fast", "--num-frames", "0")
    assert res.returncode != 0
    assert "num_sample_frames must be" in res.stderr
    # Said once, without asyncio's "never retrieved" traceback of the closed connection.
    assert "Traceback" not in res.stderr and "never retrieved" not in res.stderr, res.stderr[-2000:]


@pytest.mark.unit
def test_client_help():
    res = subprocess.run([sys.executable, "-m", "vidchat.client", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 0 and "--ask" in res.stdout and "--synthetic" in res.stdout


# ---- one timeline: pts_ms --------------------------------------------------

@pytest.mark.engine
async def test_pts_ms_places_frames_and_audio_on_the_session_timeline(server):
    ws = await connect(server, evs_enabled=False, num_sample_frames=4, max_tokens=2, temperature=0.0)
    pcm = base64.b64encode((np.full(1600, 3000, np.int16)).tobytes()).decode()  # 0.1 s each
    # Sent as fast as possible, but stamped 0.5 s apart: the clip's own timing counts.
    for i in range(4):
        await send(ws, {"type": "audio.chunk", "data": pcm, "pts_ms": 1000 + 500 * i})
        await send(ws, {"type": "video.frame", "data": MOVING[i], "pts_ms": 1000 + 500 * i})
    stats = check_answer(await answer(ws))["stats"]
    assert stats["frame_times"] == [0.0, 0.5, 1.0, 1.5] and stats["frame_indices"] == [0, 1, 2, 3]
    # Audio: 0.1 s chunks at 0.5 s steps, silence between, from the first frame to the last chunk's end.
    assert stats["audio_span"] == [0.0, 1.6]
    assert stats["audio_seconds"] == pytest.approx(1.6, abs=0.01)
    # A bad pts_ms is reported and the session goes on.
    await send(ws, {"type": "video.frame", "data": MOVING[4], "pts_ms": "soon"})
    await expect_error(ws, "'pts_ms' must be a number of milliseconds")
    await still_alive(ws)
    await ws.close()


@pytest.mark.engine
def test_fast_and_real_time_sends_give_the_same_inputs(server):
    """The same clip streamed in real time and with --fast: the question sees
    the same frames at the same times and the same audio span."""
    runs = []
    for mode in ([], ["--fast"]):
        res = run_client(server, "--synthetic", "--duration", "3", "--fps", "5", "--json", "--max-tokens", "2",
                         "--temperature", "0", "--ask", "2:What now?", *mode)
        assert res.returncode == 0, res.stdout + res.stderr
        done = [json.loads(line) for line in res.stdout.splitlines() if '"response.text.done"' in line]
        assert len(done) == 1
        runs.append(done[0]["stats"])
    real, fast = runs
    for key in ("frame_times", "frame_indices", "audio_span", "audio_seconds"):
        assert real[key] == fast[key], (key, real[key], fast[key])
    assert real["frame_times"][0] == 0.0 and real["audio_span"] == [0.0, 2.0]


# ---- draining a replica ---------------------------------------------------------

@pytest.mark.engine
async def test_a_drained_replica_takes_no_new_sessions_and_keeps_its_open_ones(server):
    import urllib.error
    import urllib.request

    def readyz() -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(server.url + "/readyz", timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    # The drain counts every open session: a tab or peer of an earlier test
    # on this shared server may still be ending (a vanished peer lasts until
    # its idle timeout).
    def no_session_at_all() -> bool:
        return sum(server.get_json("/api/health")["sessions_by_kind"].values()) == 0

    await eventually_async(lambda: asyncio.to_thread(no_session_at_all), SESSION_IDLE_TIMEOUT + 10,
                           "no session of an earlier test is left on the shared server")
    open_ws = await connect(server, **SHORT)
    await frames(open_ws, n=2)
    # The server reads a socket's messages in order: its pong means the
    # session is configured and registered (sending alone raced that).
    await still_alive(open_ws)
    try:
        assert server.post_json("/api/drain", {"draining": True}) == {"draining": True, "sessions": 1}
        status, body = readyz()
        assert status == 503 and body["draining"] is True and body["sessions"] == 1, body
        assert body["reason"] == "draining: 1 session(s) still open"
        # New sessions are refused at both doors, with the reason.
        refused = await websockets.connect(server.ws_url, max_size=None)
        msg = await recv(refused)
        assert msg["type"] == "error" and "being drained" in msg["message"], msg
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await refused.recv()
        assert closed.value.rcvd.code == 1013
        offer = urllib.request.Request(server.url + "/webrtc/offer",
                                       b'{"type": "offer", "sdp": "v=0\\r\\nm=video 9 UDP/TLS/RTP/SAVPF 96"}',
                                       {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(offer, timeout=10)
        assert err.value.code == 503 and "being drained" in json.loads(err.value.read())["detail"]
        # The open session still answers.
        assert check_answer(await answer(open_ws))["stats"]["frames"] == 2
        await open_ws.close()
        await no_sessions_left(server)
        status, body = readyz()
        assert status == 503 and body["sessions"] == 0  # empty: safe to stop
    finally:
        server.post_json("/api/drain", {"draining": False})
    status, body = readyz()
    assert status == 200 and body["draining"] is False
    again = await connect(server, **SHORT)
    await still_alive(again)
    await again.close()
    # Bad bodies get a 400.
    req = urllib.request.Request(server.url + "/api/drain", b'{"draining": "yes"}', {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 400


# ---- issue 43: the question cap, and undated audio (the seed's rule) -----------------

@pytest.mark.engine
async def test_an_oversize_query_is_refused_naming_the_field_and_the_session_goes_on(server):
    from vidchat.conversation.asking import MAX_QUESTION_CHARS

    ws = await connect(server, **SHORT)
    await frames(ws, n=2)
    await send(ws, {"type": "video.query", "text": "x" * (MAX_QUESTION_CHARS + 1)})
    await expect_error(ws, f"question must be at most {MAX_QUESTION_CHARS} characters")
    check_answer(await answer(ws))
    await ws.close()
    await no_sessions_left(server)


@pytest.mark.engine
async def test_undated_audio_sent_in_a_burst_after_the_frames_all_reaches_the_model(server):
    """vllm-omni's streaming client sends its frames, then its audio as 1-s
    chunks all at once, without pts_ms. The seed sends the model all audio
    received since the previous query: so does vidchat for such a client
    (a client that dates its audio keeps the aligned audio, test above)."""
    ws = await connect(server, evs_enabled=False, num_sample_frames=4, max_tokens=2, temperature=0.0)
    second = base64.b64encode(np.full(16_000, 2000, np.int16).tobytes()).decode()
    await frames(ws, n=4)
    for _ in range(6):
        await send(ws, {"type": "audio.chunk", "data": second})
    stats = check_answer(await answer(ws))["stats"]
    assert stats["audio_seconds"] == pytest.approx(6.0, abs=0.02), stats
    # The next question gets what arrived since this one: 2 s more.
    for _ in range(2):
        await send(ws, {"type": "audio.chunk", "data": second})
    stats = check_answer(await answer(ws))["stats"]
    assert stats["audio_seconds"] == pytest.approx(2.0, abs=0.02), stats
    await ws.close()
    await no_sessions_left(server)
