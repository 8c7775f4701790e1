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
    assert a.shape == j.shape == (3, evs.GRID_ROWS, evs.GRID_COLS)
    assert np.mean(np.abs(a - j)) < 4.0
    # Video planes come in limited ("TV") range, 16..235: close, not equal.
    # The filter only compares frames of one stream with each other.
    p = evs.thumbnail_from_planes(*yuv420p(x))
    assert np.mean(np.abs(a - p)) < 8.0


def test_non_contiguous_and_pil_inputs():
    x = clip("static", 480, 640).frames[0]
    flipped = x[:, ::-1]
    assert not flipped.flags.c_contiguous
    np.testing.assert_allclose(evs.thumbnail(flipped), evs.thumbnail(np.ascontiguousarray(flipped)))
    np.testing.assert_allclose(evs.thumbnail(Image.fromarray(x)), evs.thumbnail(x))
    f = FrameFilter()
    assert f.check(Image.fromarray(x).convert("L"), 0.0)
    assert f.check(np.asarray(Image.fromarray(x).convert("L").convert("RGB")), 0.1) is False
    assert f.check(x, 0.2) is True  # the same picture in colour: its colour changed


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


# -- colour ---------------------------------------------------------------------

def yuv420p(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The Y, U and V planes a WebRTC decoder hands out for this picture."""
    av = pytest.importorskip("av")
    from vidchat.media.session import yuv_planes

    luma, (u, v) = yuv_planes(av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
                              .reformat(format="yuv420p"))
    return luma, u, v


def seed_client_frame(i: int) -> bytes:
    # vllm-omni's streaming video client sends these when given no video.
    buf = io.BytesIO()
    Image.new("RGB", (320, 240), ((i * 37) % 256, (i * 73) % 256, (i * 113) % 256)).save(buf, "JPEG", quality=80)
    return buf.getvalue()


def equal_luma_colour(k: int, n: int = 10, y: float = 120.0, c: float = 50.0) -> tuple[int, int, int]:
    # n hues around the colour wheel, all at the same luma and saturation.
    angle = 2 * np.pi * k / n
    cb, cr = c * np.cos(angle), c * np.sin(angle)
    rgb = (y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb)
    assert all(0 <= ch <= 255 for ch in rgb)
    return tuple(round(ch) for ch in rgb)


def solid(rgb: tuple[int, int, int], height: int = 240, width: int = 320) -> np.ndarray:
    return np.full((height, width, 3), rgb, np.uint8)


def offer(path: str, rgb: np.ndarray):
    """A filter input for ``rgb`` as each door delivers it."""
    if path == "array":
        return rgb
    if path == "jpeg":
        return synthetic.encode_jpeg(rgb)
    return yuv420p(rgb)


def check(f: FrameFilter, path: str, rgb: np.ndarray, t: float) -> bool:
    x = offer(path, rgb)
    return f.check_thumbnail(evs.thumbnail_from_planes(*x), t) if path == "planes" else f.check(x, t)


PATHS = ["array", "jpeg", "planes"]


def test_seed_client_colour_frames_all_kept():
    # The count: vidchat kept 6 of these 10, the seed keeps all.
    f = FrameFilter()
    assert [f.check(seed_client_frame(i), i / 10) for i in range(10)] == [True] * 10
    f = FrameFilter()
    frames = [np.asarray(Image.open(io.BytesIO(seed_client_frame(i))).convert("RGB")) for i in range(10)]
    assert [check(f, "planes", x, i / 10) for i, x in enumerate(frames)] == [True] * 10


@pytest.mark.parametrize("path", PATHS)
def test_equal_luma_colours_all_kept(path):
    colours = [equal_luma_colour(k) for k in range(10)]
    lumas = [0.299 * r + 0.587 * g + 0.114 * b for r, g, b in colours]
    assert max(lumas) - min(lumas) < 1.5  # brightness alone cannot tell them apart
    f = FrameFilter()
    assert [check(f, path, solid(c), i / 10) for i, c in enumerate(colours)] == [True] * 10
    assert check(f, path, solid(colours[-1]), 1.0) is False


def test_screen_share_theme_switch_kept():
    # Light theme to another light theme of the same brightness: only the colour changes.
    page = np.full((240, 320, 3), equal_luma_colour(0, y=200, c=25), np.uint8)
    page[20:220:20, 20:300] = 30  # lines of text, the same in both
    themed = page.copy()
    themed[page[..., 0] != 30] = equal_luma_colour(5, y=200, c=25)
    f = FrameFilter()
    assert f.check(page, 0.0)
    assert f.check(themed, 0.1) is True
    assert f.last_similarity < 0.5


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("change", ["shift+30", "shift-30", "gain1.25", "gain0.8"])
def test_uniform_brightness_changes_still_dropped(path, change):
    # Auto-exposure and lighting, on a colourful scene and on a saturated solid colour.
    kind, amount = change[:-3].rstrip("+-"), float(change[len(change.rstrip("0123456789.")):])
    for picture in (frame(7, 240, 320), solid(equal_luma_colour(2, y=110, c=60))):
        base = picture.astype(np.float32)
        lit = base + (amount if "+" in change else -amount) if kind == "shift" else base * amount
        f = FrameFilter()
        assert check(f, path, picture, 0.0)
        assert check(f, path, np.clip(lit, 0, 255).astype(np.uint8), 0.1) is False, f.last_similarity


@pytest.mark.parametrize("path", PATHS)
def test_colourful_static_clip_with_flicker_dropped(path):
    c = clip("static", 480, 640)
    f = FrameFilter()
    keeps = [check(f, path, x, t) for x, t in zip(c.frames, c.times)]
    assert keeps[0] and f.stats["drop_rate"] >= 0.90, f.stats


@pytest.mark.parametrize("path", PATHS)
def test_colour_change_over_a_small_share_dropped_over_a_large_share_kept(path):
    # An equal-luma hue change over one row of grid cells (1/24, 4 % of the
    # picture) stays under the default threshold's 5 %; over three rows (12.5 %)
    # it is kept.
    before = frame(3, 240, 320)
    for share, expect in [(1 / 24, False), (3 / 24, True)]:
        after = before.copy()
        rows = round(240 * share)
        after[:rows, :] = equal_luma_colour(3, y=120, c=60)
        before_patch = before.copy()
        before_patch[:rows, :] = equal_luma_colour(8, y=120, c=60)
        f = FrameFilter()
        assert check(f, path, before_patch, 0.0)
        assert check(f, path, after, 0.1) is expect, (share, f.last_similarity)
        assert 1.0 - f.last_similarity == pytest.approx(share, abs=0.02)


def test_luma_plane_alone_is_judged_on_brightness():
    # A producer without chroma planes keeps the old, luma-only judgement.
    red, blue = solid(equal_luma_colour(0)), solid(equal_luma_colour(5))
    f = FrameFilter()
    assert f.check_thumbnail(evs.thumbnail_from_array(yuv420p(red)[0]), 0.0)
    assert f.check_thumbnail(evs.thumbnail_from_array(yuv420p(blue)[0]), 0.1) is False
    assert f.check_thumbnail(evs.thumbnail_from_planes(*yuv420p(blue)), 0.2) is False  # no colour to compare with
    assert f.check_thumbnail(evs.thumbnail_from_planes(*yuv420p(red)), 0.3) is False
    assert f.check_thumbnail(evs.thumbnail_from_planes(*yuv420p(blue)), 0.4) is False  # the reference is still luma-only


def test_session_luma_frames_with_chroma_planes_keep_colour_changes():
    from vidchat.media.session import Session

    session = Session("colour", store_max_pixels=320 * 240)
    colours = [equal_luma_colour(k) for k in range(10)]
    for i, c in enumerate(colours + colours[-1:]):
        luma, u, v = yuv420p(solid(c))
        session.add_luma_frame(luma, lambda w, h, c=c: solid(c, h, w), t=i / 10, chroma=(u, v))
    assert session.stats["frames_kept"] == 10 and session.stats["frames_dropped"] == 1
    with pytest.raises(FrameError, match="U plane"):
        session.add_luma_frame(luma, lambda w, h: solid(c, h, w), t=2.0, chroma=(np.zeros((0, 4), np.uint8), v))


def test_nv12_planes_are_split():
    av = pytest.importorskip("av")
    from vidchat.media.session import yuv_planes

    rgb = np.ascontiguousarray(frame(5, 48, 64))
    planar = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
    luma, (u, v) = yuv_planes(av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="nv12"))
    ref_luma, (ref_u, ref_v) = yuv_planes(planar)
    assert u.shape == ref_u.shape == (24, 32)
    np.testing.assert_array_equal(luma, ref_luma)
    assert np.abs(u.astype(int) - ref_u).max() <= 1 and np.abs(v.astype(int) - ref_v).max() <= 1
