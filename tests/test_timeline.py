"""The media timeline: track clocks that survive RTP wrap-around and jumps,
client timestamps on the WebSocket door, audio placed by its timestamp, and
media consumers that fail loudly (no engine needed)."""

from __future__ import annotations

import asyncio
import fractions
import threading
import time
import types

import av
import numpy as np
import pytest

from vidchat.conversation.registry import SessionRegistry
from vidchat.doors import webrtc
from vidchat.media import AUDIO_RATE, DEFAULT_MAX_FRAME_BYTES
from vidchat.media import clock as vidchat_clock
from vidchat.media.audio import AudioWindow
from vidchat.media.clock import REANCHOR_S, ClientClock, TrackClock
from vidchat.media.session import Session, SessionSettings

pytestmark = pytest.mark.unit

WRAP = 2**32
VIDEO_CLOCK = 90_000


# -- track clock ------------------------------------------------------------------

def test_track_clock_follows_media_time_across_the_rtp_wrap():
    clock = TrackClock()
    start_pts = WRAP - 45_000  # half a second before the 32-bit RTP counter wraps
    arrived0 = 1000.0
    stamps = []
    for i in range(30):  # 30 frames at 15 fps cross the wrap after ~7 frames
        pts = (start_pts + i * 6000) % WRAP
        stamps.append(clock.place(pts / VIDEO_CLOCK, arrived0 + i / 15))
    steps = np.diff(stamps)
    # Every frame lands at its arrival: no frame stamped ~13 h in the past.
    assert np.allclose(stamps, arrived0 + np.arange(30) / 15, atol=1e-6)
    assert (steps > 0).all() and clock.reanchors == 1


@pytest.mark.parametrize("jump_s", [-30.0, -REANCHOR_S - 0.5, +40.0])
def test_track_clock_reanchors_on_a_jump_either_way(jump_s):
    clock = TrackClock()
    for i in range(10):
        clock.place(100.0 + i * 0.1, 5.0 + i * 0.1)
    # The sender restarts its clock (or it jumps ahead): the frame still lands at its arrival.
    assert clock.place(100.0 + 1.0 + jump_s, 6.0) == pytest.approx(6.0)
    assert clock.place(100.0 + 1.1 + jump_s, 6.1) == pytest.approx(6.1)
    assert clock.reanchors == 1


def test_track_clock_keeps_jitter_as_lag():
    clock = TrackClock()
    assert clock.place(0.0, 10.0) == 10.0
    # Arriving 0.3 s late (network jitter) keeps media time: the lag shows.
    assert clock.place(0.1, 10.4) == pytest.approx(10.1)


def _video_frames(pts_list, colour_step=40):
    for i, pts in enumerate(pts_list):
        img = np.full((48, 64, 3), (i * colour_step) % 256, np.uint8)
        frame = av.VideoFrame.from_ndarray(img, format="rgb24")
        frame.pts = pts
        frame.time_base = fractions.Fraction(1, VIDEO_CLOCK)
        yield frame


class SimulatedClock:
    """The consumers' clock, advanced by the track itself: arrival times are
    exactly the pace the track keeps, however loaded the machine is."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def simulated_clock(monkeypatch) -> SimulatedClock:
    clock = SimulatedClock()
    fake_time = types.SimpleNamespace(**{name: getattr(time, name) for name in dir(time) if not name.startswith("_")})
    fake_time.monotonic = clock.monotonic
    for module in (webrtc, vidchat_clock):
        monkeypatch.setattr(module, "time", fake_time)
    return clock


class ScriptedTrack:
    """A track that delivers given frames at a pace, then ends (or fails).
    With a simulated clock, each frame arrives exactly ``interval`` after the last."""

    def __init__(self, kind, frames, interval=0.02, fail_with: Exception | None = None,
                 clock: SimulatedClock | None = None):
        self.kind = kind
        self._frames = list(frames)
        self.interval = interval
        self.fail_with = fail_with
        self.clock = clock

    async def recv(self):
        await asyncio.sleep(self.interval)
        if self.clock is not None:
            self.clock.now += self.interval
        if self._frames:
            return self._frames.pop(0)
        if self.fail_with is not None:
            raise self.fail_with
        from aiortc.mediastreams import MediaStreamError

        raise MediaStreamError


async def test_video_consumer_stamps_frames_near_arrival_across_the_wrap():
    registry = SessionRegistry()
    entry = registry.create("webrtc", SessionSettings(evs_enabled=False, sampling="latest_seconds",
                                                      sample_seconds=0.5, num_sample_frames=64))
    pts = [(WRAP - 4 * 4500 + i * 4500) % WRAP for i in range(30)]  # 20 fps, wraps after 4 frames
    track = ScriptedTrack("video", _video_frames(pts), interval=0.05)
    stats = webrtc.MediaStats()
    before = time.monotonic()
    await webrtc.run_consumer(webrtc.consume_video, track, entry, stats, on_failure=None)
    after = time.monotonic()
    sample = entry.session.sample()
    stamps = sample.timestamps
    assert all(before - 0.5 <= t <= after + 0.1 for t in stamps), (before, stamps, after)
    assert stamps == sorted(stamps)
    # Every frame is kept or, where the filter fell behind on a loaded
    # machine, skipped for a newer one (by design: the newest frame wins).
    assert stats.video_frames_seen == 30
    assert entry.session.frame_count + stats.video_frames_skipped == 30
    # The last half second holds the last frames only, not the whole ring.
    assert 0 < len(stamps) < entry.session.frame_count // 2


async def test_audio_consumer_places_chunks_across_the_wrap(simulated_clock):
    registry = SessionRegistry()
    entry = registry.create("webrtc", SessionSettings(evs_enabled=False, audio_mode="last", audio_last_seconds=60))
    frames = []
    for i in range(25):  # 20 ms at 48 kHz, crossing the wrap after 5 chunks
        pcm = np.full((1, 960), 1000 * (i + 1), np.int16)
        frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
        frame.sample_rate = 48_000
        frame.pts = (WRAP - 5 * 960 + i * 960) % WRAP
        frame.time_base = fractions.Fraction(1, 48_000)
        frames.append(frame)
    track = ScriptedTrack("audio", frames, interval=0.02, clock=simulated_clock)
    before = simulated_clock.monotonic()
    await webrtc.run_consumer(webrtc.consume_audio, track, entry, webrtc.MediaStats(), on_failure=None)
    stats = entry.session.stats
    # 25 chunks of 20 ms: half a second of audio, none lost and no hours of silence inserted.
    assert stats["audio_seconds"] == pytest.approx(0.5, abs=0.03)
    sample = entry.session.sample()
    assert sample.audio_start >= before - 0.1 and sample.audio_end <= simulated_clock.monotonic() + 0.1


# -- failing consumers --------------------------------------------------------------

async def test_a_failing_track_ends_the_session_with_its_cause():
    registry = SessionRegistry()
    entry = registry.create("webrtc")
    sid = entry.session.id
    track = ScriptedTrack("video", _video_frames([0, 3000]), fail_with=RuntimeError("decoder exploded"))

    async def on_failure(reason):
        await registry.close(sid, reason)

    await webrtc.run_consumer(webrtc.consume_video, track, entry, webrtc.MediaStats(), on_failure)
    assert registry.get(sid) is None
    assert registry.closed_reason(sid) == "camera stream stopped: RuntimeError: decoder exploded"


async def test_a_failure_while_processing_a_frame_ends_the_session(monkeypatch):
    registry = SessionRegistry()
    entry = registry.create("webrtc")
    sid = entry.session.id

    def broken(*args, **kwargs):
        raise MemoryError("no room for this frame")

    monkeypatch.setattr(entry.session, "add_luma_frame", broken)
    monkeypatch.setattr(entry.session, "add_frame", broken)
    reasons = []

    async def on_failure(reason):
        reasons.append(reason)
        await registry.close(sid, reason)

    track = ScriptedTrack("video", _video_frames([0, 3000, 6000]))
    await webrtc.run_consumer(webrtc.consume_video, track, entry, webrtc.MediaStats(), on_failure)
    assert reasons == ["camera stream stopped: MemoryError: no room for this frame"]
    assert registry.get(sid) is None


async def test_a_track_that_just_ends_is_not_a_failure():
    registry = SessionRegistry()
    entry = registry.create("webrtc")
    failures = []
    track = ScriptedTrack("audio", [])
    await webrtc.run_consumer(webrtc.consume_audio, track, entry, webrtc.MediaStats(), failures.append)
    assert failures == [] and registry.get(entry.session.id) is entry


# -- the WebSocket door's clock -----------------------------------------------------

def test_client_clock_trusts_forward_time_and_reanchors_backwards():
    clock = ClientClock()
    # A fast replay: 10 s of clip arrive within 0.1 s of wall time, spacing kept.
    placed = [clock.place(i * 1000.0, arrived=50.0 + i * 0.01) for i in range(11)]
    assert np.allclose(np.diff(placed), 1.0)
    # The client restarts its clip: a new stream, anchored at its arrival.
    assert clock.place(0.0, arrived=60.0) == pytest.approx(60.0)
    assert clock.place(500.0, arrived=60.1) == pytest.approx(60.5)
    assert clock.place(None, arrived=70.0) == 70.0


def test_a_long_audio_chunk_behind_the_newest_frame_is_not_a_new_stream():
    """A client sends frames as they come and 3 s of audio once it is
    complete: the chunk's start trails the newest frame by 3 s."""
    clock = ClientClock()
    frames = [clock.place(i * 100.0, arrived=50.0 + i * 0.1, kind="video") for i in range(31)]  # 0..3 s
    audio = clock.place(0.0, arrived=53.05, kind="audio")
    later = clock.place(3100.0, arrived=53.1, kind="video")
    assert audio == pytest.approx(frames[0]) and later == pytest.approx(frames[-1] + 0.1)
    assert clock.reanchors == 0
    # A kind's own jump backwards is still a new stream, for every kind.
    assert clock.place(0.0, arrived=60.0, kind="video") == pytest.approx(60.0)
    assert clock.place(0.0, arrived=60.2, kind="audio") == pytest.approx(60.0)
    assert clock.reanchors == 1


# -- audio placed by timestamp -------------------------------------------------------

def test_fast_audio_lands_where_its_timestamps_say():
    chunk = np.arange(1600, dtype=np.int16)  # 0.1 s
    real, fast = AudioWindow(30.0), AudioWindow(30.0)
    for i in range(50):
        real.add(chunk, t=100.0 + i * 0.1, now=100.1 + i * 0.1)
        fast.add(chunk, t=100.0 + i * 0.1, now=100.0 + i * 0.001)  # all within 50 ms of wall time
    a, b = real.window(101.0, 103.0), fast.window(101.0, 103.0)
    assert (a[1], a[2]) == (b[1], b[2]) == (pytest.approx(101.0), pytest.approx(103.0))
    np.testing.assert_array_equal(a[0], b[0])


def test_overlapping_audio_keeps_only_what_is_new():
    w = AudioWindow(30.0)
    w.add(np.full(16_000, 100, np.int16), t=10.0, now=11.0)  # 10..11 s
    w.add(np.full(16_000, 200, np.int16), t=10.5, now=11.5)  # 10.5..11.5 s: half overlaps
    assert w.end == pytest.approx(11.5) and w.seconds == pytest.approx(1.5)
    audio, start, end = w.window(10.0)
    assert audio[: 16_000].max() == pytest.approx(100 / 32768) and audio[-1] == pytest.approx(200 / 32768)


def test_audio_parts_cut_on_the_streams_grid_and_keep_their_names_as_it_grows():
    w = AudioWindow(30.0)
    w.add(np.ones(int(5.5 * AUDIO_RATE), np.int16), t=100.0, now=105.5)  # 100..105.5 s
    parts = w.parts(100.75, min_samples=1600)
    # A short head (to the grid at 102 s), one whole segment, and the growing tail.
    assert [size for size, _ in parts] == [20_000, 32_000, 24_000]
    assert sum(size for size, _ in parts) == w.window(100.75)[0].size
    w.add(np.ones(AUDIO_RATE, np.int16), t=105.5, now=106.5)
    grown = w.parts(100.75, min_samples=1600)
    assert grown[:2] == parts[:2] and [size for size, _ in grown] == [20_000, 32_000, 32_000, 8_000]
    # A tail (or head) shorter than min_samples joins its neighbour.
    w.add(np.ones(int(1.5 * AUDIO_RATE) + 800, np.int16), t=106.5, now=108.05)
    assert [size for size, _ in w.parts(100.75, min_samples=1600)] == [20_000, 32_000, 32_000, 32_800]
    assert [size for size, _ in w.parts(101.95, min_samples=1600)][:1] == [32_800]
    # A new stream never reuses a name, even for the same samples at the same times.
    names = {name for _, name in w.parts(100.0)}
    w.clear()
    w.add(np.ones(int(5.5 * AUDIO_RATE), np.int16), t=100.0, now=105.5)
    assert names.isdisjoint(name for _, name in w.parts(100.0))


def test_audio_clips_follow_the_parts_and_merge_the_oldest_beyond_the_cap():
    from vidchat.engine import audio_clips

    audio = np.arange(10, dtype=np.float32)
    parts = ((2, "s:0+2"), (4, "s:2+4"), (4, "s:6+4"))
    clips = audio_clips(audio, parts, max_clips=16)
    assert [(c.tolist(), n) for c, n in clips] == [([0, 1], "s:0+2"), ([2, 3, 4, 5], "s:2+4"),
                                                  ([6, 7, 8, 9], "s:6+4")]
    merged = audio_clips(audio, parts, max_clips=2)
    assert [(c.size, n) for c, n in merged] == [(6, "s:0+2~s:2+4"), (4, "s:6+4")]
    # One clip when there is one part, a cap of 1, or parts that aren't this audio.
    for bad_parts, cap in ((parts[:1], 16), (parts, 1), (parts[:2], 16)):
        assert [(c.size, n) for c, n in audio_clips(audio, bad_parts, cap)] == [(10, None)]


def test_latest_seconds_audio_starts_at_the_window_not_at_an_older_frame():
    s = Session("s", SessionSettings(evs_enabled=False, sampling="latest_seconds", sample_seconds=3.0,
                                     audio_mode="frames"))
    s.add_frame(np.zeros((48, 64, 3), np.uint8), t=0.0)  # still on screen when the window begins
    for i in range(20):
        s.add_audio(np.full(AUDIO_RATE, 0.1, np.float32), t=float(i))
    s.add_frame(np.full((48, 64, 3), 255, np.uint8), t=19.0)
    sample = s.sample()
    assert sample.timestamps == [0.0, 19.0]  # the held frame still shows the scene...
    assert sample.audio_start == pytest.approx(16.0)  # ...but audio covers the window only
    assert sample.audio.size == 4 * AUDIO_RATE


def test_sample_times_are_relative_to_the_session_timeline():
    s = Session("s", SessionSettings(evs_enabled=False))
    s.add_audio(np.zeros(1600, np.float32), t=500.0)
    s.add_frame(np.zeros((48, 64, 3), np.uint8), t=500.25)
    sample = s.sample()
    assert s.timeline_start == 500.0
    assert sample.relative(sample.timestamps[0]) == 0.25


# -- locks and limits ----------------------------------------------------------------

def test_settings_change_does_not_wait_for_a_decode_in_progress():
    s = Session("s")
    decoding, release = threading.Event(), threading.Event()

    def slow_thumbnail():
        decoding.set()
        release.wait(10)  # a 4K JPEG taking its time
        return np.zeros((24, 32), np.float32)

    worker = threading.Thread(target=s._buffer.ingest, args=(slow_thumbnail, lambda: np.zeros((4, 4, 3), np.uint8), 1.0))
    worker.start()
    assert decoding.wait(5)
    try:
        s.update_settings(num_sample_frames=4, evs_threshold=0.9)  # returns while the decode still runs
        assert s.sample().frames == [] and s.stats["frames_received"] == 0
        assert worker.is_alive()
    finally:
        release.set()
        worker.join(5)
    assert s.stats["frames_received"] == 1


def test_frame_size_cap_follows_the_server_option():
    from vidchat.app.settings import Settings
    from vidchat.app.state import AppState
    from vidchat.media.evs import FrameError

    junk = b"\x00" * (DEFAULT_MAX_FRAME_BYTES + 10)
    with pytest.raises(FrameError, match="too large"):
        Session("s").add_jpeg(junk)
    state = AppState(settings=Settings(ws_max_frame_bytes=2 * DEFAULT_MAX_FRAME_BYTES), model_path="x")
    session = state.new_session("ws").session
    assert session.max_frame_bytes == 2 * DEFAULT_MAX_FRAME_BYTES
    with pytest.raises(FrameError) as err:  # no longer too large: judged as an image (and refused as one)
        session.add_jpeg(junk)
    assert "too large" not in str(err.value)
