"""EVS frame filter: seed behaviours, labelled synthetic clips, errors."""

from __future__ import annotations

import io
from functools import lru_cache

import numpy as np
import pytest
from PIL import Image

from vidchat.devtools import synthetic
from vidchat.media import evs
from vidchat.media.evs import FrameError, FrameFilter

pytestmark = pytest.mark.unit

SIZES = [(480, 640), (720, 1280)]


@lru_cache(maxsize=None)
def clip(kind: str, height: int, width: int) -> synthetic.Clip:
    if kind == "static":
        return synthetic.static_clip(height, width, n=40)
    if kind == "motion":
        return synthetic.motion_clip(height, width, n=24)
    return synthetic.cuts_clip(height, width, cuts=12, hold=4)


@lru_cache(maxsize=None)
def clip_jpegs(kind: str, height: int, width: int) -> tuple[bytes, ...]:
    return tuple(clip(kind, height, width).jpegs())


def frame(seed: int = 0, height: int = 120, width: int = 160) -> np.ndarray:
    return synthetic.make_scene(height, width, seed).astype(np.uint8)


def decisions(kind: str, size: tuple[int, int], path: str, **kw) -> tuple[list[bool], FrameFilter]:
    c = clip(kind, *size)
    frames = clip_jpegs(kind, *size) if path == "jpeg" else c.frames
    f = FrameFilter(**kw)
    return [f.check(x, t) for x, t in zip(frames, c.times)], f


# -- seed behaviours -----------------------------------------------------------

def test_first_frame_kept_identical_dropped_different_kept():
    f = FrameFilter()
    a, b = frame(1), frame(2)
    assert f.check(a, 0.0) is True
    assert f.check(a.copy(), 0.1) is False
    assert f.check(b, 0.2) is True
    assert f.check(b, 0.3) is False
    assert f.stats == {"retained_count": 2, "dropped_count": 2, "total_count": 4, "drop_rate": 0.5}


def test_black_to_white_is_not_mistaken_for_lighting():
    f = FrameFilter()
    black = np.zeros((48, 64, 3), np.uint8)
    assert f.check(black, 0.0)
    assert f.check(np.full_like(black, 255), 0.1)
    assert f.check(black, 0.2)


def test_stats_empty_and_reset():
    f = FrameFilter()
    assert f.stats == {"retained_count": 0, "dropped_count": 0, "total_count": 0, "drop_rate": 0.0}
    a = frame(1)
    f.check(a, 0.0)
    f.check(a, 0.1)
    f.reset()
    assert f.stats["total_count"] == 0
    assert f.check(a, 0.2) is True  # first after reset


def test_threshold_meaning_extremes():
    a = frame(3)
    moved = a.copy()
    moved[40:80, 50:100] = 255 - moved[40:80, 50:100]  # ~10 % of the picture changes
    share = 40 * 50 / (120 * 160)
    for threshold, expect in [(0.0, False), (1.0 - share - 0.03, False), (1.0 - share + 0.03, True), (1.0, True)]:
        f = FrameFilter(threshold)
        f.check(a, 0.0)
        assert f.check(moved, 0.1) is expect, threshold
        assert f.last_similarity == pytest.approx(1.0 - share, abs=0.03)


@pytest.mark.parametrize("delta,expect", [(4, False), (20, True)])
def test_noticeable_means_beyond_the_noise_floor(delta, expect):
    # A sixth of the picture gets brighter by `delta` grey levels while the rest
    # stays: 4 levels is within sensor noise, 20 is a visible local change.
    a = frame(3)
    b = a.astype(np.int16)
    b[:40, :80] += delta
    f = FrameFilter()
    f.check(a, 0.0)
    assert f.check(np.clip(b, 0, 255).astype(np.uint8), 0.1) is expect


@pytest.mark.parametrize("bad", [-0.1, 1.5, "0.9", True, float("nan")])
def test_bad_threshold(bad):
    with pytest.raises(ValueError):
        FrameFilter(bad)


# -- labelled clips --------------------------------------------------------------

@pytest.mark.parametrize("path", ["array", "jpeg"])
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[1]}x{s[0]}")
def test_static_noise_and_flicker_dropped(size, path):
    keeps, f = decisions("static", size, path)
    assert keeps[0]
    assert f.stats["drop_rate"] >= 0.90, f.stats


@pytest.mark.parametrize("path", ["array", "jpeg"])
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[1]}x{s[0]}")
def test_hand_motion_kept(size, path):
    keeps, _ = decisions("motion", size, path)
    assert sum(keeps) >= len(keeps) / 3, keeps


@pytest.mark.parametrize("path", ["array", "jpeg"])
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[1]}x{s[0]}")
def test_every_scene_cut_kept_and_holds_dropped(size, path):
    keeps, _ = decisions("cuts", size, path)
    cuts = clip("cuts", *size).cuts
    assert len(cuts) == 12
    assert all(keeps[i] for i in cuts), [i for i in cuts if not keeps[i]]
    assert sum(keeps) <= 1.5 * len(cuts)


def test_seed_measure_would_drop_the_motion_clip():
    # Why the seed's measure is replaced: 1 - MSE/255² on a 64x64 thumbnail
    # stays above 0.95 for a hand moving across the picture.
    c = clip("motion", 480, 640)
    thumbs = [np.asarray(Image.fromarray(x).resize((64, 64), Image.Resampling.BILINEAR), np.float32)
              for x in c.frames[:6]]
    sims = [1 - np.mean((thumbs[0] - t) ** 2) / 255**2 for t in thumbs[1:]]
    assert min(sims) >= 0.95
    keeps, _ = decisions("motion", (480, 640), "array")
    assert all(keeps[:6])


def test_slow_motion_accumulates_against_last_kept():
    c = synthetic.motion_clip(240, 320, n=30, step=0.01)
    f = FrameFilter()
    keeps = [f.check(x, t) for x, t in zip(c.frames, c.times)]
    # 1 % of the width per frame is below the bar for one frame, but the
    # comparison is with the last kept frame, so the change adds up.
    assert 3 <= sum(keeps) < 30


def test_keepalive_keeps_one_frame_per_period():
    c = clip("static", 480, 640)  # 40 frames at 30 fps = 1.33 s
    keeps, f = decisions("static", (480, 640), "array", keepalive_s=0.5)
    kept_times = [t for t, k in zip(c.times, keeps) if k]
    assert kept_times == pytest.approx([0.0, 0.5, 1.0], abs=1 / 30 + 1e-9)
    off, _ = decisions("static", (480, 640), "array")
    assert sum(off) == 1


def test_frame_size_change_mid_stream():
    big = synthetic.make_scene(480, 640, 5)
    small = np.asarray(Image.fromarray(big.astype(np.uint8)).resize((320, 240), Image.Resampling.BOX))
    f = FrameFilter()
    assert f.check(big.astype(np.uint8), 0.0)
    assert f.check(small, 0.1) is False  # same picture, fewer pixels
    assert f.check(synthetic.make_scene(240, 320, 6).astype(np.uint8), 0.2) is True


# -- inputs ---------------------------------------------------------------------

def test_jpeg_and_array_thumbnails_agree():
    x = clip("static", 480, 640).frames[0]
    a = evs.thumbnail(x)
    j = evs.thumbnail(synthetic.encode_jpeg(x))
    assert a.shape == j.shape == (evs.GRID_ROWS, evs.GRID_COLS)
    assert np.mean(np.abs(a - j)) < 4.0


def test_non_contiguous_and_pil_inputs():
    x = clip("static", 480, 640).frames[0]
    flipped = x[:, ::-1]
    assert not flipped.flags.c_contiguous
    np.testing.assert_allclose(evs.thumbnail(flipped), evs.thumbnail(np.ascontiguousarray(flipped)))
    np.testing.assert_allclose(evs.thumbnail(Image.fromarray(x)), evs.thumbnail(x))
    f = FrameFilter()
    assert f.check(Image.fromarray(x).convert("L"), 0.0)
    assert f.check(x, 0.1) is False


def _truncated_jpeg() -> bytes:
    data = synthetic.encode_jpeg(frame(4))
    return data[: len(data) // 2]


@pytest.mark.parametrize("bad", [
    b"not an image",
    b"",
    np.zeros((0, 0, 3), np.uint8),
    np.zeros((0, 640, 3), np.uint8),
    np.zeros((480, 640), np.uint8),
    np.zeros((480, 640, 4), np.uint8),
    np.zeros((480, 640, 3), np.float32),
    np.zeros((2, 480, 640, 3), np.uint8),
    "frame.jpg",
    None,
    _truncated_jpeg(),
], ids=["text", "empty-bytes", "0x0", "0xW", "2d", "rgba", "float", "4d", "str", "none", "truncated"])
def test_bad_frames_raise_frame_error_and_leave_state(bad):
    f = FrameFilter()
    a = frame(1)
    assert f.check(a, 0.0)
    before = f.stats
    with pytest.raises(FrameError):
        f.check(bad, 0.1)
    assert issubclass(FrameError, ValueError)
    assert f.stats == before
    assert f.check(a, 0.2) is False  # reference unchanged
    assert f.check(frame(2), 0.3) is True


def test_png_bytes_accepted():
    buf = io.BytesIO()
    Image.fromarray(frame(1)).save(buf, format="PNG")
    f = FrameFilter()
    assert f.check(buf.getvalue(), 0.0)
    assert f.check(frame(1), 0.1) is False
