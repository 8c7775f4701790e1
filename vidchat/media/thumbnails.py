"""The thumbnails the EVS filter (:mod:`vidchat.media.evs`) compares: a frame
reduced to a grid of GRID_ROWS × GRID_COLS cells, each the mean Y, Cb − 128
and Cr − 128 of a few pixels sampled evenly inside it, as float32
(3, GRID_ROWS, GRID_COLS); or (GRID_ROWS, GRID_COLS), luma only, where the
colour is unknown (a decoder's Y plane alone).

Every input lands in the one JFIF/BT.601 colour space: RGB arrays and PIL
images, encoded JPEG/PNG/WebP bytes (JPEGs decoded at up to 1/8 scale
straight to YCbCr), or a decoder's Y, U and V planes at any subsampling.
Only the sampled pixels are read, so an array costs the same at any size.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from PIL import Image

from vidchat.media import DEFAULT_MAX_FRAME_PIXELS
from vidchat.media.images import as_rgb_array, load_image, open_image, to_rgb

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
    flat = ((rows * width + cols) * channels + chans).reshape(GRID_ROWS * GRID_COLS, s * s * channels)
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
