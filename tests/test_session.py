"""Session buffer: ring, sampling, audio window, settings, errors, threads."""

from __future__ import annotations

import threading
from functools import lru_cache

import numpy as np
import pytest
from PIL import Image

from vidchat.devtools import synthetic
from vidchat.media import AUDIO_RATE
from vidchat.media.evs import FrameError
from vidchat.media.sampling import stable_indices, uniform_indices
from vidchat.media.session import Session, SessionSettings

pytestmark = pytest.mark.unit


@lru_cache(maxsize=None)
def scene(seed: int, height: int = 120, width: int = 160) -> np.ndarray:
    img = synthetic.make_scene(height, width, seed).astype(np.uint8)
    img.setflags(write=False)
    return img


def marked(i: int, size: int = 16) -> np.ndarray:
    """A small frame whose pixel values encode i (for identity checks)."""
    return np.full((size, size, 3), i % 256, np.uint8)


def no_evs(**kw) -> Session:
    return Session("s", SessionSettings(evs_enabled=False, **kw))


def fill(session: Session, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        session.add_frame(marked(i), t=float(i))


# -- seed behaviours -------------------------------------------------------------

def test_first_kept_identical_dropped_different_kept():
    s = Session("s")
    assert s.add_frame(scene(1), t=0.0) is True
    assert s.add_frame(scene(1), t=0.1) is False
    assert s.add_frame(scene(2), t=0.2) is True
    st = s.stats
    assert (st["frames_received"], st["frames_kept"], st["frames_dropped"], st["frames_in_buffer"]) == (3, 2, 1, 2)
    assert st["drop_rate"] == pytest.approx(1 / 3)
    assert st["evs"] == {"retained_count": 2, "dropped_count": 1, "total_count": 3, "drop_rate": pytest.approx(1 / 3)}
    assert s.newest_frame_time == 0.2
    h, w = s.recent_kept(1)[0][2].shape[:2]
    assert st["frame_size"] == f"{w}x{h}" and Session("empty").stats["frame_size"] is None


def test_evs_off_keeps_everything():
    s = no_evs()
    assert all(s.add_frame(scene(1), t=float(i)) for i in range(5))
    assert s.frame_count == 5
    assert s.stats["evs"] is None


def test_ring_keeps_newest_max_frames():
    s = no_evs(max_frames=4)
    fill(s, 10)
    sample = s.sample(k=16)
    assert sample.timestamps == [6.0, 7.0, 8.0, 9.0]
    assert [int(f[0, 0, 0]) for f in sample.frames] == [6, 7, 8, 9]


def test_uniform_sampling_seed_indices():
    s = no_evs()
    fill(s, 10)
    sample = s.sample(k=4)
    assert sample.indices == [0, 3, 6, 9]
    assert sample.timestamps == [0.0, 3.0, 6.0, 9.0]
    assert [int(f[0, 0, 0]) for f in sample.frames] == [0, 3, 6, 9]
    assert s.sample(k=1).indices == [9]
    assert s.sample(k=10).indices == list(range(10))
    assert s.sample(k=50).indices == list(range(10))
    assert uniform_indices(64, 16) == [int(i * 63 / 15) for i in range(16)]


def test_stable_sampling_changes_only_the_newest_pick_as_the_window_slides():
    s = no_evs(max_frames=64)
    fill(s, 100)
    before = s.sample(k=16, strategy="stable")
    assert len(before.indices) == 16 and before.indices[-1] == 63  # the newest frame is always in
    gaps = [b - a for a, b in zip(before.indices, before.indices[1:-1])]
    assert set(gaps) == {4}  # evenly spread: every 4th kept frame of 64
    grid = [t for t in before.timestamps[:-1]]
    for n in range(1, 8):
        fill_more = s.add_frame(np.full((48, 64, 3), 200, np.uint8), t=100.0 + n)
        assert fill_more
        after = s.sample(k=16, strategy="stable")
        same = sum(t in grid for t in after.timestamps[:-1])
        # Until the grid moves (every 4th frame) all 15 grid frames stay, in order;
        # then the oldest drops and the rest stay.
        assert same >= 14 and after.timestamps[:-1] == sorted(after.timestamps[:-1])
        assert after.timestamps[-1] == 100.0 + n
        grid = after.timestamps[:-1]
    assert stable_indices(list(range(5)), 16) == [0, 1, 2, 3, 4] and stable_indices([7, 8, 9], 1) == [2]


def test_with_a_budget_a_question_brings_one_new_frame_and_its_picks_still_span_the_buffer():
    """Issue 49's rule on the CPU default (4 frames, 'stable', one new frame
    a question), with warm-ups encoding one frame every third kept frame (a
    frame's encode slower than frames are kept): every question takes the
    newest kept frame and no other new one, has its 4 frames once warm-ups
    have encoded a question's worth, and its oldest pick is never older
    than the buffer and lies in its oldest quarter (plus the few kept
    frames one encode takes): the answer still sees the whole window."""
    s = no_evs(max_frames=64, num_sample_frames=4, sampling="stable")
    s.encode_budget = 1
    fill(s, 64)
    first = s.sample()
    # Nothing encoded yet: the newest frame alone, not a batch of four to encode.
    assert (first.seqs, first.new_frames, first.left_out) == ([64], 1, 3)
    s.mark_encoded(first.seqs)
    for n in range(64, 400):
        fill(s, 1, start=n)
        if n % 3 == 0:
            s.mark_encoded(s.sample(new_frames=1).seqs)  # a one-frame warm-up
        question = s.sample()
        ring = [f.t for f in s._buffer.frames]
        assert question.new_frames <= 1 and question.timestamps[-1] == ring[-1] == float(n)
        assert ring[0] <= question.timestamps[0]  # never older than the buffer
        if n >= 80:
            assert len(question.seqs) == 4, (n, question.seqs)
        if n >= 128:  # warm-ups have run for a whole buffer
            # stable's grid steps every (64 - 1) // (4 - 1) = 21 kept frames:
            # its oldest pick is within one step of the buffer's oldest frame
            # (uniform's is that frame), give or take one encode's 3 frames.
            oldest = question.timestamps[0]
            assert oldest <= ring[0] + 21 + 3, (n, ring[0], question.timestamps)


def test_with_its_newest_frame_encoded_a_question_brings_no_older_new_frame():
    """A mostly still scene keeps few frames, and each one kept moves
    stable's grid: a middle pick becomes a frame no warm-up encoded while
    the newest is ready. The budget is for the newest frame only: the
    middle pick becomes the nearest encoded frame, and the question waits
    for no encode (the page bench's still row, issue 49)."""
    s = no_evs(max_frames=64, num_sample_frames=4, sampling="stable")
    s.encode_budget = 1
    fill(s, 12)
    s.mark_encoded([1, 2, 4, 12])  # what one-frame warm-ups reached, the newest among them
    unlimited = s.sample(new_frames=None)
    assert unlimited.seqs[-1] == 12 and unlimited.new_frames >= 1  # the grid wants a frame never encoded
    question = s.sample()
    assert question.seqs[-1] == 12 and question.new_frames == 0 and len(question.seqs) == 4
    assert question.substituted == unlimited.new_frames and set(question.seqs) == {1, 2, 4, 12}
    fill(s, 1, start=12)  # a new newest frame: it, and only it, is new
    question = s.sample()
    assert question.seqs[-1] == 13 and question.new_frames == 1 and len(question.seqs) == 4


def test_a_frame_being_encoded_is_the_questions_one_new_frame():
    """A warm-up encoding frame X as the question comes: the question takes
    X as its newest, not a newer frame (it would wait for X, then for its
    own), and counts it as its one new frame."""
    s = no_evs(max_frames=64, num_sample_frames=4, sampling="stable")
    s.encode_budget = 1
    fill(s, 64)
    s.mark_encoded([f.seq for f in s._buffer.frames])
    fill(s, 1, start=64)
    in_flight = s.sample().seqs[-1]
    s.encoding([in_flight])
    fill(s, 2, start=65)  # two newer frames arrive while it is encoded
    question = s.sample()
    assert question.seqs[-1] == in_flight and question.new_frames == 1 and len(question.seqs) == 4
    s.encoding(())
    s.mark_encoded([in_flight])
    question = s.sample()
    assert question.timestamps[-1] == 66.0 and question.new_frames == 1


def test_default_k_is_num_sample_frames():
    s = no_evs(num_sample_frames=3)
    fill(s, 7)
    assert s.sample().indices == [0, 3, 6]


def test_empty_buffer():
    s = Session("s")
    sample = s.sample()
    assert sample.frames == [] and sample.timestamps == [] and sample.indices == []
    assert sample.audio is None and sample.audio_start is None
    assert s.stats["drop_rate"] == 0.0 and s.stats["newest_frame_age_s"] is None


def test_latest_frames():
    s = no_evs()
    fill(s, 10)
    assert s.sample(k=4, strategy="latest_frames").indices == [6, 7, 8, 9]
    assert s.sample(k=20, strategy="latest_frames").indices == list(range(10))


def test_latest_seconds_window():
    s = no_evs(sampling="latest_seconds", sample_seconds=3.5)
    fill(s, 10)  # t = 0..9
    # Window 5.5..9 holds 6..9; frame 5 was on screen at 5.5.
    assert s.sample(k=16).indices == [5, 6, 7, 8, 9]
    assert s.sample(k=3).indices == [5, 7, 9]
    s.update_settings(sample_seconds=3.0)  # window starts exactly at frame 6
    assert s.sample(k=16).indices == [6, 7, 8, 9]


def test_latest_seconds_static_scene_still_has_its_picture():
    s = Session("s", SessionSettings(sampling="latest_seconds", sample_seconds=5.0))
    for i in range(30):
        s.add_frame(scene(1), t=float(i))
    assert s.frame_count == 1
    sample = s.sample()
    assert sample.indices == [0] and sample.timestamps == [0.0]


# -- storage ---------------------------------------------------------------------

@pytest.mark.parametrize("size,stored", [((480, 640), (240, 320)), ((720, 1280), (180, 320)),
                                         ((120, 160), (120, 160))])
def test_frames_stored_downscaled_read_only(size, stored):
    s = Session("s")
    src = synthetic.make_scene(*size, 7).astype(np.uint8)
    assert s.add_frame(src, t=0.0)
    out = s.sample().frames[0]
    assert out.shape == stored + (3,)
    assert out.dtype == np.uint8 and not out.flags.writeable
    assert abs(float(out.mean()) - float(src.mean())) < 2.0
    src[:] = 0  # the caller reuses its buffer
    assert s.sample().frames[0].mean() > 10


def test_full_size_storage_option():
    s = Session("s", store_max_pixels=None)
    s.add_frame(synthetic.make_scene(480, 640, 1).astype(np.uint8), t=0.0)
    assert s.sample().frames[0].shape == (480, 640, 3)


def test_jpeg_path_stores_decoded_frames():
    c = synthetic.cuts_clip(480, 640, cuts=4, hold=3)
    s = Session("s")
    keeps = [s.add_jpeg(j, t) for j, t in zip(c.jpegs(), c.times)]
    assert [i for i, k in enumerate(keeps) if k] == c.cuts
    sample = s.sample()
    assert [f.shape for f in sample.frames] == [(240, 320, 3)] * 4
    expect = np.asarray(Image.fromarray(c.frames[3]).reduce(2), np.float32)
    assert np.mean(np.abs(sample.frames[1].astype(np.float32) - expect)) < 6.0


def test_pil_frames_accepted():
    s = no_evs()
    assert s.add_frame(Image.fromarray(scene(1)), t=0.0)
    assert s.sample().frames[0].shape == (120, 160, 3)


def test_memory_bound_at_64_frames_640x480():
    s = no_evs()
    src = scene(1, 480, 640)
    for i in range(80):
        s.add_frame(src, t=float(i))
    s.add_audio(np.zeros(40 * AUDIO_RATE, np.float32), t=0.0)
    assert s.frame_count == 64
    assert s.memory_bytes == 64 * 240 * 320 * 3 + 30 * AUDIO_RATE * 2
    assert s.memory_bytes <= 16_000_000


def test_sample_is_not_changed_by_later_frames():
    s = no_evs(max_frames=3)
    fill(s, 3)
    sample = s.sample()
    fill(s, 5, start=3)
    assert sample.timestamps == [0.0, 1.0, 2.0]
    assert [int(f[0, 0, 0]) for f in sample.frames] == [0, 1, 2]
    with pytest.raises(ValueError):
        sample.frames[0][0, 0, 0] = 9


# -- errors ----------------------------------------------------------------------

@pytest.mark.parametrize("bad", [b"\x00garbage", np.zeros((0, 0, 3), np.uint8), np.zeros((10, 10), np.uint8),
                                 np.zeros((10, 10, 3), np.int16)])
@pytest.mark.parametrize("evs_on", [True, False])
def test_invalid_frame_raises_and_session_continues(bad, evs_on):
    s = Session("s", SessionSettings(evs_enabled=evs_on))
    assert s.add_frame(scene(1), t=0.0)
    before = s.stats
    with pytest.raises(FrameError):
        if isinstance(bad, bytes):
            s.add_jpeg(bad, t=1.0)
        else:
            s.add_frame(bad, t=1.0)
    after = s.stats
    assert {k: v for k, v in after.items() if k != "newest_frame_age_s"} == \
           {k: v for k, v in before.items() if k != "newest_frame_age_s"}
    assert s.add_frame(scene(2), t=2.0) is True
    assert s.sample().timestamps == [0.0, 2.0]


def test_oversized_jpeg_rejected():
    s = Session("s")
    with pytest.raises(FrameError, match="too large"):
        s.add_jpeg(b"\xff" * (10 * 1024 * 1024 + 1))
    assert s.stats["frames_received"] == 0


# -- audio -----------------------------------------------------------------------

def ramp_second(i: int) -> np.ndarray:
    """One second of audio whose value encodes its second (i / 100)."""
    return np.full(AUDIO_RATE, i / 100, np.float32)


def test_audio_follows_sampled_frames():
    s = no_evs()
    for i in range(5, 20):
        s.add_audio(ramp_second(i), t=float(i))
    for i in range(10, 20):
        s.add_frame(marked(i), t=float(i))
    sample = s.sample(k=4)
    assert sample.timestamps[0] == 10.0
    assert sample.audio_start == pytest.approx(10.0) and sample.audio_end == pytest.approx(20.0)
    assert sample.audio.dtype == np.float32 and sample.audio.size == 10 * AUDIO_RATE
    assert sample.audio[0] == pytest.approx(0.10, abs=1e-4)
    assert sample.audio[-1] == pytest.approx(0.19, abs=1e-4)
    # The window follows the frames actually sampled.
    assert s.sample(k=2, strategy="latest_frames").audio_start == pytest.approx(18.0)


def test_audio_last_mode_and_cap():
    s = no_evs(audio_seconds=5.0, audio_mode="last", audio_last_seconds=2.0)
    for i in range(12):
        s.add_audio(ramp_second(i), t=float(i))
    assert s.stats["audio_seconds"] == pytest.approx(5.0)
    fill(s, 3)
    sample = s.sample()
    assert (sample.audio_start, sample.audio_end) == (pytest.approx(10.0), pytest.approx(12.0))
    assert sample.audio.size == 2 * AUDIO_RATE and sample.audio[0] == pytest.approx(0.10, abs=1e-4)
    s.update_settings(audio_mode="frames")
    # Frames at t=0..2 are older than the 5 s kept (7..12 s): the audio that
    # is left, from the first boundary of its 2-s segments (the oldest samples
    # are trimmed with every chunk; vidchat.media.audio steady_start).
    sample = s.sample()
    assert sample.audio_start == pytest.approx(8.0) and [n for n, _ in sample.audio_parts] == [32000, 32000]
    s.add_audio(ramp_second(12), t=12.0)  # one more second: the trimmed front moves, the segments don't
    assert s.sample().audio_parts[:2] == sample.audio_parts
    s.update_settings(audio_seconds=1.0)
    assert s.stats["audio_seconds"] == pytest.approx(1.0)


def test_audio_gap_filled_with_silence_and_continuation():
    s = no_evs(audio_mode="last", audio_last_seconds=60.0)
    s.add_audio(ramp_second(50), t=0.0)
    s.add_audio(ramp_second(60), t=3.0)
    a = s.sample().audio
    assert a.size == 4 * AUDIO_RATE
    assert a[AUDIO_RATE + 10] == 0.0 and a[-1] == pytest.approx(0.6, abs=1e-4)
    # Chunks without a time continue the previous one.
    s2 = no_evs(audio_mode="last", audio_last_seconds=60.0)
    for _ in range(5):
        s2.add_audio(np.zeros(320, np.float32))
    assert s2.stats["audio_seconds"] == pytest.approx(5 * 320 / AUDIO_RATE)


def test_untimed_audio_burst_and_pause(monkeypatch):
    import vidchat.media.session as session_mod

    clock = [100.0]
    monkeypatch.setattr(session_mod.time, "monotonic", lambda: clock[0])
    s = no_evs(audio_mode="last", audio_last_seconds=60.0)
    chunk = np.full(AUDIO_RATE // 10, 0.25, np.float32)  # 0.1 s
    for _ in range(50):  # 5 s arriving at once after a stall: kept, contiguous
        s.add_audio(chunk)
    assert s.stats["audio_seconds"] == pytest.approx(5.0)
    end = s.sample().audio_end
    assert end == pytest.approx(100.0 - 0.1 + 5.0)
    clock[0] = end + 3.0  # the microphone paused for ~3 s
    s.add_audio(chunk)
    sample = s.sample()
    assert sample.audio_end == pytest.approx(clock[0])
    assert sample.audio.size == pytest.approx(8.0 * AUDIO_RATE, abs=2)
    gap = sample.audio[int(5.5 * AUDIO_RATE):int(7.5 * AUDIO_RATE)]
    assert not gap.any() and sample.audio[-1] == pytest.approx(0.25, abs=1e-4)


def test_pcm16_conversion():
    s = no_evs(audio_mode="last")
    s.add_pcm16(np.array([0, 16384, -32768, 32767], "<i2").tobytes(), t=0.0)
    np.testing.assert_allclose(s.sample().audio, [0.0, 0.5, -1.0, 32767 / 32768], atol=1e-6)
    with pytest.raises(ValueError):
        s.add_pcm16(b"\x00\x01\x02")


def test_audio_rejects_stereo_and_clips_float():
    s = no_evs(audio_mode="last")
    with pytest.raises(ValueError):
        s.add_audio(np.zeros((2, 100), np.float32))
    s.add_audio(np.array([2.0, -2.0, np.nan], np.float32), t=0.0)
    np.testing.assert_allclose(s.sample().audio, [32767 / 32768, -32767 / 32768, 0.0], atol=1e-6)


# -- settings --------------------------------------------------------------------

@pytest.mark.parametrize("change", [
    {"max_frames": 0}, {"max_frames": 2.5}, {"max_frames": True}, {"max_frames": 100_000},
    {"num_sample_frames": 0}, {"sampling": "random"}, {"sample_seconds": 0}, {"sample_seconds": float("inf")},
    {"evs_enabled": "yes"}, {"evs_threshold": 1.2}, {"evs_threshold": "0.9"}, {"keepalive_s": 0},
    {"keepalive_s": -1.0}, {"audio_seconds": 0}, {"audio_mode": "all"}, {"audio_last_seconds": -1},
])
def test_settings_validation(change):
    with pytest.raises(ValueError):
        SessionSettings(**change).validate()
    with pytest.raises(ValueError):
        Session("s", SessionSettings(**change))
    s = Session("s")
    with pytest.raises(ValueError):
        s.update_settings(**change)
    assert s.settings == SessionSettings()


def test_update_settings_unknown_key():
    with pytest.raises(ValueError, match="unknown"):
        Session("s").update_settings(colour="red")


def test_update_settings_resize_keeps_newest():
    s = no_evs(max_frames=10)
    fill(s, 10)
    s.update_settings(max_frames=4)
    assert s.sample(k=16).timestamps == [6.0, 7.0, 8.0, 9.0]
    s.update_settings(max_frames=8)
    fill(s, 6, start=10)
    assert s.sample(k=16).timestamps == [float(i) for i in range(8, 16)]
    assert s.stats["max_frames"] == 8


def test_update_threshold_keeps_buffer_and_toggle_evs():
    s = Session("s")
    s.add_frame(scene(1), t=0.0)
    s.add_frame(scene(2), t=1.0)
    s.update_settings(evs_threshold=0.5)
    assert s.frame_count == 2
    assert s.add_frame(scene(2), t=2.0) is False  # reference kept across the change
    s.update_settings(evs_enabled=False)
    assert s.add_frame(scene(2), t=3.0) is True
    assert s.stats["evs"] is None
    s.update_settings(evs_enabled=True, keepalive_s=1.0)
    assert s.add_frame(scene(2), t=4.0) is True  # fresh filter: first frame kept
    assert s.add_frame(scene(2), t=4.5) is False
    assert s.add_frame(scene(2), t=5.0) is True  # keep-alive


def test_reset():
    s = Session("s")
    s.add_frame(scene(1), t=0.0)
    s.add_audio(np.zeros(1600, np.float32), t=0.0)
    s.reset()
    assert s.frame_count == 0 and s.memory_bytes == 0
    assert s.stats["frames_received"] == 0 and s.stats["evs"]["total_count"] == 0
    assert s.add_frame(scene(1), t=1.0) is True


def test_settings_object_is_not_shared():
    shared = SessionSettings()
    s = Session("s", shared)
    s.update_settings(max_frames=8)
    assert shared.max_frames == 64


# -- threads ---------------------------------------------------------------------

def test_frames_added_from_a_thread_while_sampling():
    s = no_evs(max_frames=32)
    n = 2000
    errors: list[str] = []

    # The producer waits midway until the sampler has sampled twice, so the
    # two threads overlap by an event, not by how fast this machine is: on a
    # slow CI host the producer once finished before the first sample did.
    sampled_twice = threading.Event()

    def produce():
        for i in range(n):
            s.add_frame(marked(i, 8), t=float(i))
            if i == n // 2 and not sampled_twice.wait(timeout=60):
                errors.append("the sampler never sampled twice")

    thread = threading.Thread(target=produce)
    thread.start()
    samples = 0
    while thread.is_alive() or samples == 0:
        sample = s.sample(k=8)
        samples += 1
        if samples == 2:
            sampled_twice.set()
        if not (len(sample.frames) == len(sample.timestamps) == len(sample.indices)):
            errors.append("length mismatch")
        if sample.timestamps != sorted(sample.timestamps):
            errors.append(f"out of order {sample.timestamps}")
        for f, t in zip(sample.frames, sample.timestamps):
            if int(f[0, 0, 0]) != int(t) % 256:
                errors.append(f"frame/time mismatch at {t}")
    thread.join()
    assert not errors, errors[:5]
    assert samples > 1
    assert s.stats["frames_received"] == n and s.frame_count == 32
    assert s.sample(k=32).timestamps == [float(i) for i in range(n - 32, n)]


def test_luma_frames_render_rgb_only_when_kept():
    """The WebRTC door offers decoded frames by their luma plane; RGB is made
    only for kept frames, at the stored size."""
    from vidchat.devtools import synthetic

    clip = synthetic.static_clip(n=30)
    session = Session("luma", store_max_pixels=320 * 240)
    renders = []

    def render(frame):
        def rgb(w, h):
            renders.append((w, h))
            return np.asarray(Image.fromarray(frame).resize((w, h)))
        return rgb

    for frame in clip.frames:
        luma = (frame.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)).astype(np.uint8)
        session.add_luma_frame(luma[:, :], render(frame))
    assert session.stats["frames_received"] == 30
    assert len(renders) == session.stats["frames_kept"] <= 3
    assert renders[0] == (320, 240) and session.sample().frames[0].shape == (240, 320, 3)
    with pytest.raises(FrameError):
        session.add_luma_frame(np.zeros((0, 4), np.uint8), render(clip.frames[0]))
    with pytest.raises(FrameError, match="expected 320x240"):
        fresh = Session("x", store_max_pixels=320 * 240)
        fresh.add_luma_frame(np.zeros((480, 640), np.uint8), lambda w, h: np.zeros((10, 10, 3), np.uint8))


def test_scene_changes_are_counted_and_watch_is_rate_limited():
    from vidchat.conversation.modes import SceneWatch

    session = Session("watch", SessionSettings())
    colour = lambda c: np.full((120, 160, 3), c, np.uint8)  # noqa: E731
    rng = np.random.default_rng(0)
    for i in range(10):  # a still scene with sensor noise: no change
        session.add_frame(np.clip(colour(100) + rng.integers(-3, 4, (120, 160, 3)), 0, 255).astype(np.uint8),
                          t=float(i))
    watch = SceneWatch(session, every_s=5.0)
    assert session.scene_changes == 0 and not watch.due(now=0.0)
    session.add_frame(colour(220), t=10.0)  # a cut
    assert session.scene_changes == 1 and session.last_scene_change_t == 10.0
    assert watch.due(now=10.0) and not watch.due(now=10.5)  # fired once
    session.add_frame(colour(30), t=11.0)  # another cut, inside the pause
    assert not watch.due(now=12.0)
    assert watch.due(now=15.0)  # fires when the pause ends
    with pytest.raises(ValueError, match="positive"):
        SceneWatch(session, every_s=0)


def test_the_stats_say_what_a_frame_arrived_as_and_is_stored_at():
    session = Session("s", SessionSettings(evs_enabled=False), store_max_pixels=320 * 240)
    assert session.stats["received_size"] is None and session.stats["frame_size"] is None
    session.add_frame(np.zeros((480, 640, 3), dtype=np.uint8), t=1.0)
    stats = session.stats
    assert (stats["received_size"], stats["frame_size"]) == ("640x480", "320x240")
    session.add_frame(np.zeros((240, 320, 3), dtype=np.uint8), t=2.0)  # the browser lowered what it sends
    assert session.stats["received_size"] == "320x240"
