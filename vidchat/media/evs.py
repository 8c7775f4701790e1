"""EVS ("efficient video sampling", the seed protocol's name for this step):
drop webcam frames that show nothing new.

How a frame is judged
---------------------
Every frame is reduced to a 24×32 grid of cells (:mod:`vidchat.media.evs`);
each cell holds the mean brightness (luma, 0..255) and the mean colour
(chroma: Cb and Cr, the JPEG/BT.601 colour-difference axes) of a few pixels
sampled evenly inside it. The grid of a new frame is compared with the grid of the last *kept*
frame:

1. A global brightness change (auto-exposure, flickering light) is taken out
   first: the new luma grid is fitted as ``gain × old + shift`` over the cells
   that did not change, with the gain limited to 0.75..1.33 and the shift to
   ±40 grey levels, so that a real change such as a covered lens or the
   lights going off is not explained away as "lighting".
2. Exposure scales colour as it scales brightness (an added offset moves all
   of R, G and B alike and leaves chroma alone), so the chroma grid is fitted
   as ``gain × old`` with its own gain in the same 0.75..1.33. A colour that
   changes hue (red to blue), or appears or fades by more than that, is left
   over — even at equal brightness, which the luma grid alone cannot see.
3. A cell has *changed noticeably* when its luma still differs from its fit
   by more than ``noise_floor`` grey levels (default 8; between two frames,
   sensor noise of σ≈3 moves a cell's mean by about 1.4 (σ), so noise alone
   almost never crosses it), or its colour (the Cb/Cr distance) by more than
   the same ``noise_floor``.
4. ``similarity = 1 − (share of cells that changed noticeably)``.

A frame is **kept when its similarity is below the threshold**, i.e. with the
default threshold 0.95: *a frame is kept when more than 5 % of the picture
changed noticeably since the last kept frame*. A hand moving in front of the
camera (15 % of the picture, moving a tenth of its width per frame) changes
about 20 % and is kept; a still room with noise and flicker changes ~0 % and
is dropped; a scene cut changes most of it; a solid red picture turning blue
changes all of it.

Colour is compared only when both frames carry it: a frame offered by its
luma plane alone (a decoder's Y plane with no chroma planes) is judged on
brightness, as before. A grey image (PIL mode L, a greyscale JPEG or PNG) has
colour, namely none: its chroma is neutral.

Relation to the seed's setting
------------------------------
The seed (vllm-omni's ``FrameSimilarityFilter``) also takes a similarity in
[0, 1] with default 0.95 and also drops a frame when ``similarity >=
threshold``, but its similarity is ``1 − MSE/255²`` of a 64×64 thumbnail, so
0.95 only keeps frames whose RMS difference exceeds 57 grey levels — it drops
ordinary motion. vidchat reads the same ``evs_threshold`` field with the
meaning above: ``1 − threshold`` is the share of the picture that must change.
Clients that send the seed's 0.95 therefore get vidchat's default behaviour;
0.9 keeps fewer frames (10 % must change), 0.99 keeps more (1 %), 1.0 keeps
every frame with any noticeable change, 0.0 keeps only the first frame (and
keep-alive frames).

Other behaviour
---------------
* The first frame, and the first after :meth:`FrameFilter.reset`, is always kept.
* ``keepalive_s`` (off by default) keeps a frame whenever the last kept one is
  at least that many seconds older (by the timestamps passed in).
* Frames may be H×W×3 uint8 RGB arrays of any size (the size may change
  mid-stream: the grid is relative to the picture), PIL images, or encoded
  JPEG, PNG or WebP bytes (other formats, and images over ``max_pixels``
  by their header, are refused before decoding), or a decoder's planes
  (:func:`thumbnail_from_planes`: Y, and U/V at any subsampling). JPEG bytes
  are decoded at 1/8 scale straight to YCbCr (libjpeg's DCT scaling, no
  colour conversion): about 3× cheaper than the seed's full decode and
  resize, though entropy decoding still has to read the whole file. From
  arrays only ~3 k sampled bytes are read (≈0.05–0.1 ms per frame at any
  resolution).
* A frame that is not a usable image raises :class:`FrameError` and leaves the
  filter's state and statistics unchanged.

The filter itself is not thread-safe; the session serialises calls.
"""

from __future__ import annotations

import math
import time
from functools import lru_cache

import numpy as np
from PIL import Image

from vidchat.media import DEFAULT_MAX_FRAME_PIXELS

# The image helpers are this module's names too (the frame buffer's, the
# session's and the doors'): "X as X" re-exports them.
from vidchat.media.images import FrameError as FrameError
from vidchat.media.images import as_rgb_array as as_rgb_array
from vidchat.media.images import load_image as load_image
from vidchat.media.images import open_image as open_image
from vidchat.media.images import to_rgb as to_rgb

# The thumbnails the EVS filter (:mod:`vidchat.media.evs`) compares: a frame
# reduced to a grid of GRID_ROWS × GRID_COLS cells, each the mean Y, Cb − 128
# and Cr − 128 of a few pixels sampled evenly inside it, as float32
# (3, GRID_ROWS, GRID_COLS); or (GRID_ROWS, GRID_COLS), luma only, where the
# colour is unknown (a decoder's Y plane alone).
#
# Every input lands in the one JFIF/BT.601 colour space: RGB arrays and PIL
# images, encoded JPEG/PNG/WebP bytes (JPEGs decoded at up to 1/8 scale
# straight to YCbCr), or a decoder's Y, U and V planes at any subsampling.
# Only the sampled pixels are read, so an array costs the same at any size.

GRID_ROWS = 24

GRID_COLS = 32

_SAMPLES = 2  # samples per cell along each axis: 4 pixels per cell

# JFIF's RGB -> (Y, Cb − 128, Cr − 128): the same axes JPEG and BT.601 video
# decoders hand out, so every input path lands in one colour space.
_RGB_TO_YCC = np.array([[0.299, 0.587, 0.114],
                        [-0.168736, -0.331264, 0.5],
                        [0.5, -0.418688, -0.081312]], dtype=np.float32)

_CHROMA_OFFSET = np.array([0.0, -128.0, -128.0], dtype=np.float32)

# Per-cell weights over its S×S×3 samples, one column per output channel: the
# cell's mean Y, Cb, Cr from RGB samples, or from YCbCr samples as they are.
_CELL_WEIGHTS_RGB = (np.tile(_RGB_TO_YCC.T, (_SAMPLES * _SAMPLES, 1)) / (_SAMPLES * _SAMPLES)).astype(np.float32)

_CELL_WEIGHTS_YCC = (np.tile(np.eye(3, dtype=np.float32), (_SAMPLES * _SAMPLES, 1))
                     / (_SAMPLES * _SAMPLES)).astype(np.float32)

_CELL_WEIGHTS_GRAY = np.full(_SAMPLES * _SAMPLES, 1.0 / (_SAMPLES * _SAMPLES), dtype=np.float32)


def _positions(n: int, count: int) -> np.ndarray:
    # Evenly spread sample positions, centred in their slots.
    return ((np.arange(count) + 0.5) * (n / count)).astype(np.intp)


@lru_cache(maxsize=16)
def _sample_index(height: int, width: int, channels: int) -> np.ndarray:
    """Flat indices into a C-contiguous H×W(×C) image, shaped (cells, S·S·C).

    Ordering samples cell by cell makes each cell's mean one dot product.
    """
    s = _SAMPLES
    rows = _positions(height, GRID_ROWS * s).reshape(GRID_ROWS, 1, s, 1, 1)
    cols = _positions(width, GRID_COLS * s).reshape(1, GRID_COLS, 1, s, 1)
    chans = np.arange(channels).reshape(1, 1, 1, 1, channels)
    flat: np.ndarray = ((rows * width + cols) * channels + chans).reshape(GRID_ROWS * GRID_COLS, s * s * channels)
    flat = flat.copy()  # own, compact buffer rather than a view
    flat.setflags(write=False)
    return flat


def _samples(frame: np.ndarray) -> np.ndarray:
    """The sampled pixels of an H×W(×C) uint8 array, (cells, S·S·C) float32."""
    h, w = frame.shape[:2]
    index = _sample_index(h, w, frame.shape[2] if frame.ndim == 3 else 1)
    # take() on the flat buffer reads only the ~3 k sampled bytes. A strided
    # (non-contiguous) frame would be copied whole by reshape(), so it is
    # indexed per axis instead.
    if frame.flags.c_contiguous:
        samples = frame.reshape(-1).take(index)
    else:
        samples = frame[np.unravel_index(index, frame.shape)]
    return samples.astype(np.float32)


def _plane_grid(plane: np.ndarray) -> np.ndarray:
    return (_samples(plane) @ _CELL_WEIGHTS_GRAY).reshape(GRID_ROWS, GRID_COLS)


def _colour_grid(frame: np.ndarray, weights: np.ndarray) -> np.ndarray:
    cells = _samples(frame) @ weights  # (cells, 3)
    if weights is _CELL_WEIGHTS_YCC:
        cells += _CHROMA_OFFSET
    return np.ascontiguousarray(cells.T).reshape(3, GRID_ROWS, GRID_COLS)


def _neutral_chroma(luma: np.ndarray) -> np.ndarray:
    grid = np.zeros((3, GRID_ROWS, GRID_COLS), np.float32)
    grid[0] = luma
    return grid


def thumbnail_from_array(frame: np.ndarray) -> np.ndarray:
    """Grid of a valid H×W×3 RGB uint8 array (Y, Cb, Cr), or of an H×W
    plane of luma alone (luma only: its colour is unknown)."""
    if frame.ndim == 3:
        return _colour_grid(frame, _CELL_WEIGHTS_RGB)
    return _plane_grid(frame)


def thumbnail_from_planes(luma: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Grid of a decoder's Y, U and V planes (H×W uint8 each, may be strided;
    U and V at any subsampling: the grid is relative to each plane)."""
    grid = np.empty((3, GRID_ROWS, GRID_COLS), np.float32)
    grid[0] = _plane_grid(luma)
    grid[1] = _plane_grid(u)
    grid[2] = _plane_grid(v)
    grid[1:] -= 128.0
    return grid


def thumbnail_from_bytes(data: bytes | bytearray | memoryview,
                         max_pixels: int = DEFAULT_MAX_FRAME_PIXELS) -> np.ndarray:
    """Grid of encoded image bytes; JPEGs are decoded at reduced size."""
    img = open_image(data, max_pixels)
    if img.format == "JPEG":
        # Let libjpeg scale down by up to 8 while decoding and hand out its
        # YCbCr as it is (no colour conversion); a greyscale JPEG stays L.
        # Entropy decoding still reads every byte.
        img.draft("YCbCr", (GRID_COLS * _SAMPLES, GRID_ROWS * _SAMPLES))
    load_image(img)
    if img.mode not in ("L", "RGB", "YCbCr"):
        img = to_rgb(img)
    arr = np.asarray(img)
    if img.mode == "L":
        return _neutral_chroma(_plane_grid(arr))
    return _colour_grid(arr, _CELL_WEIGHTS_YCC if img.mode == "YCbCr" else _CELL_WEIGHTS_RGB)


def thumbnail(frame: np.ndarray | Image.Image | bytes | bytearray | memoryview) -> np.ndarray:
    """Grid (Y, Cb, Cr cell means) for any accepted frame type; FrameError if unusable."""
    if isinstance(frame, (bytes, bytearray, memoryview)):
        return thumbnail_from_bytes(frame)
    return thumbnail_from_array(as_rgb_array(frame))


DEFAULT_THRESHOLD = 0.95

DEFAULT_NOISE_FLOOR = 8.0

_GAIN_MIN, _GAIN_MAX = 0.75, 1.33

_MAX_SHIFT = 40.0  # grey levels of global brightness shift still treated as lighting


_CELLS = GRID_ROWS * GRID_COLS

_MOMENTS_TEMPLATE = np.zeros((5, _CELLS), dtype=np.float32)

_MOMENTS_TEMPLATE[2] = 1.0

_MOMENTS_TEMPLATE[4] = 1.0 / _CELLS


class Reference:
    """The last kept grid, with what the lighting fits need precomputed once.

    Each comparison then costs a handful of vector operations on 768 cells
    (and on their 2 × 768 chroma values).
    """

    __slots__ = ("cells", "centred", "chroma", "css", "mean", "moments", "sxx")

    def __init__(self, grid: np.ndarray) -> None:
        luma, chroma = _split(grid)
        # Rows: (x, x², 1) for the weighted refit; (centred x, 1/n) for the plain fit.
        m = _MOMENTS_TEMPLATE.copy()
        m[0] = luma
        np.multiply(m[0], m[0], out=m[1])
        self.mean = float(m[0].sum()) / m.shape[1]
        np.subtract(m[0], self.mean, out=m[3])
        self.moments = m
        self.cells = m[0]
        self.centred = m[3]
        self.sxx = float(m[3] @ m[3])
        self.chroma = None if chroma is None else chroma.copy()
        self.css = 0.0 if chroma is None else float(chroma.reshape(-1) @ chroma.reshape(-1))


def _split(grid: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(luma cells (n,), chroma cells (2, n) or None) of a grid."""
    if grid.ndim == 3:
        return grid[0].reshape(-1), grid[1:].reshape(2, -1)
    return grid.reshape(-1), None


def _clamp_gain(gain: float) -> float:
    return min(max(gain, _GAIN_MIN), _GAIN_MAX)


def _clamp_shift(shift: float) -> float:
    return min(max(shift, -_MAX_SHIFT), _MAX_SHIFT)


def _luma_changed(ref: Reference, cur: np.ndarray, noise_floor: float) -> np.ndarray:
    """Cells whose luma changed by more than ``noise_floor`` after the lighting fit.

    Lighting model: ``new ≈ gain × old + shift`` with gain in 0.75..1.33 and
    shift within ±40 grey levels; what it cannot explain is change.
    """
    sxy, mean_y = ref.moments[3:] @ cur
    gain = _clamp_gain(float(sxy) / ref.sxx) if ref.sxx > 1e-3 else 1.0
    shift = _clamp_shift(float(mean_y) - gain * ref.mean)
    resid: np.ndarray = np.abs(cur - gain * ref.cells - shift)
    n_out = int(np.count_nonzero(resid > 2.0 * noise_floor))
    if 0 < n_out < cur.size // 2:
        # Something moved: refit the lighting on the cells that did not change,
        # so the moving object does not bias gain and shift.
        w = (resid <= 2.0 * noise_floor).astype(np.float32)
        sx, sxx, sw = ref.moments[:3] @ w
        wy = w * cur
        swxy, sy = ref.moments[0] @ wy, float(wy.sum())
        var = sxx - sx * sx / sw
        gain = _clamp_gain(float((swxy - sx * sy / sw) / var)) if var > 1e-3 else 1.0
        shift = _clamp_shift(float((sy - gain * sx) / sw))
        resid = np.abs(cur - gain * ref.cells - shift)
    return resid > noise_floor


def _chroma_changed(ref_c: np.ndarray, css: float, cur: np.ndarray, noise_floor: float) -> np.ndarray:
    """Cells whose colour (Cb/Cr distance) changed by more than ``noise_floor``
    after the exposure fit ``new ≈ gain × old``, gain in 0.75..1.33.

    No shift: a uniform colour shift is what a red picture turning blue is.
    """
    gain = _clamp_gain(float(ref_c.reshape(-1) @ cur.reshape(-1)) / css) if css > 1e-3 else 1.0
    d = cur - gain * ref_c
    dist2: np.ndarray = np.einsum("ij,ij->j", d, d)
    floor2 = noise_floor * noise_floor
    out = dist2 > 4.0 * floor2
    n_out = int(np.count_nonzero(out))
    if 0 < n_out < dist2.size // 2:
        # A coloured object moved: fit the exposure on the cells it left alone.
        kept = np.where(out, 0.0, ref_c)
        kss = float(kept.reshape(-1) @ kept.reshape(-1))
        gain = _clamp_gain(float(kept.reshape(-1) @ cur.reshape(-1)) / kss) if kss > 1e-3 else 1.0
        d = cur - gain * ref_c
        dist2 = np.einsum("ij,ij->j", d, d)
    return dist2 > floor2


def changed_cells(ref: Reference, grid: np.ndarray, noise_floor: float) -> np.ndarray:
    """The cells (GRID_ROWS × GRID_COLS booleans) whose brightness or colour
    changed by more than ``noise_floor`` after the lighting fits (colour only
    where both grids have it)."""
    luma, chroma = _split(grid)
    changed = _luma_changed(ref, luma, noise_floor)
    if chroma is not None and ref.chroma is not None:
        changed |= _chroma_changed(ref.chroma, ref.css, chroma, noise_floor)
    return changed.reshape(GRID_ROWS, GRID_COLS)


def changed_share(ref: Reference, grid: np.ndarray, noise_floor: float) -> float:
    """Share of cells that changed (:func:`changed_cells`)."""
    changed = changed_cells(ref, grid, noise_floor)
    return int(np.count_nonzero(changed)) / changed.size


class FrameFilter:
    """Keep/drop decisions against the last kept frame, with seed-compatible stats."""

    def __init__(self, threshold: float = DEFAULT_THRESHOLD, *, noise_floor: float = DEFAULT_NOISE_FLOOR,
                 keepalive_s: float | None = None) -> None:
        self.threshold = threshold
        self.keepalive_s = keepalive_s
        if not (math.isfinite(noise_floor) and noise_floor > 0):
            raise ValueError(f"noise_floor must be a positive number of grey levels, got {noise_floor!r}")
        self.noise_floor = float(noise_floor)
        self._ref: Reference | None = None
        self._ref_time: float | None = None
        self._retained = 0
        self._dropped = 0
        self.last_similarity: float | None = None  # of the latest compared frame, for diagnostics

    @property
    def threshold(self) -> float:
        return self._threshold

    @threshold.setter
    def threshold(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            raise ValueError(f"EVS threshold must be a similarity in [0, 1], got {value!r}")
        self._threshold = float(value)

    @property
    def keepalive_s(self) -> float | None:
        return self._keepalive_s

    @keepalive_s.setter
    def keepalive_s(self, value: float | None) -> None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value <= 0):
            raise ValueError(f"keepalive_s must be None or a positive number of seconds, got {value!r}")
        self._keepalive_s = None if value is None else float(value)

    def check(self, frame: np.ndarray | Image.Image | bytes, t: float | None = None) -> bool:
        """Decide whether ``frame`` (captured at ``t``, default now) is kept."""
        return self.check_thumbnail(thumbnail(frame), t)

    def check_thumbnail(self, grid: np.ndarray, t: float | None = None) -> bool:
        """Decide from a grid made by :func:`thumbnail` and record the decision."""
        if t is None:
            t = time.monotonic()
        keep = self.decide(grid, t)
        self.record(grid, t, keep)
        return keep

    def decide(self, grid: np.ndarray, t: float) -> bool:
        """Whether a frame with this grid, captured at ``t``, would be kept (no state change).

        Together with :meth:`record` this lets a caller do work between the
        decision and committing it (e.g. decode the kept frame, which may fail).
        """
        if self._ref is None:
            self.last_similarity = None
            return True
        self.last_similarity = 1.0 - changed_share(self._ref, grid, self.noise_floor)
        if self.last_similarity < self._threshold:
            return True
        return (self._keepalive_s is not None and self._ref_time is not None
                and t - self._ref_time >= self._keepalive_s)

    def record(self, grid: np.ndarray, t: float, keep: bool) -> None:
        """Commit a decision: a kept grid becomes the new reference."""
        if keep:
            self._ref = Reference(grid)
            self._ref_time = t
            self._retained += 1
        else:
            self._dropped += 1

    def reset(self) -> None:
        """Forget the reference and the statistics; the next frame is kept."""
        self._ref = None
        self._ref_time = None
        self._retained = 0
        self._dropped = 0
        self.last_similarity = None

    @property
    def stats(self) -> dict[str, int | float]:
        total = self._retained + self._dropped
        return {
            "retained_count": self._retained,
            "dropped_count": self._dropped,
            "total_count": total,
            "drop_rate": self._dropped / total if total else 0.0,
        }
