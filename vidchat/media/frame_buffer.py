"""A session's kept frames: the near-duplicate filter in front of a bounded
ring of stored arrays, each numbered, with the counts and scene changes the
page and watch mode read.

Storage. Kept frames are stored as read-only RGB uint8 arrays, box-downscaled
by a whole factor until they fit ``store_max_pixels`` (the rule is
:func:`vidchat.media.stored_size`; default 320×240, about what a VLM's
processor keeps of a webcam frame anyway). Measured on 640×480 input
(bench/evs.py): 64 frames take ~14.7 MB, and building a question's 16 frames
costs microseconds because the arrays are handed out as they are — no JPEG
decode, no base64. Storing JPEG instead would save memory but make every
question decode again (the seed's cost); storing full-size arrays would need
~59 MB per session. ``store_max_pixels=None`` keeps full size.

Threads. One lock serialises ingestion (filter decision, decode, append) so
the ring stays in arrival order; a second, short-held lock (the session's,
shared with its audio and settings) guards the ring and counters, so neither
sampling nor a settings change ever waits for a decode.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any, Callable, NamedTuple

import numpy as np
from PIL import Image

from vidchat.media import evs, is_int, reduce_factor, stored_size
from vidchat.media.evs import FrameError

# A kept frame is a scene change (Watch asks then) when at least
# ``scene_change_share`` of the picture either differs from the scene's
# first frame (a cut, the camera turned away, something that came and
# stayed) or was swept by motion within the last SWEEP_WINDOW_S: the cells
# that changed from one kept frame to the next, added up, so an object
# entering, leaving or moving across a good part of the frame counts though
# each step changes little. Cells within the filter's noise floor (sensor
# noise) and a change of the lighting as a whole do not count, so a still
# scene never is one. The default: a hand-sized object crossing about half a
# webcam's view (tests/test_scene_changes.py).
DEFAULT_SCENE_CHANGE_SHARE = 0.12
SWEEP_WINDOW_S = 4.0


class StoredFrame(NamedTuple):
    t: float
    pixels: np.ndarray  # read-only
    source_t: float | None = None  # position in the played file, when the source is one
    seq: int = 0  # the session's kept-frame number (1, 2, …, never reused): the frame's identity for the engine




def freeze(arr: np.ndarray) -> np.ndarray:
    arr.setflags(write=False)
    return arr


def store_array(frame: np.ndarray, max_pixels: int | None) -> np.ndarray:
    """A read-only copy of a valid RGB frame, box-downscaled to fit max_pixels."""
    h, w = frame.shape[:2]
    k = reduce_factor(w, h, max_pixels)
    if k == 1:
        return freeze(np.array(frame, dtype=np.uint8, order="C", copy=True))
    # PIL's reduce() is a box filter over k×k blocks: antialiased and ~4x cheaper than resize().
    return freeze(np.asarray(Image.fromarray(np.ascontiguousarray(frame)).reduce(k)))


def store_image(img: Image.Image, max_pixels: int | None) -> np.ndarray:
    """Decode (lazily opened) image into a stored array; JPEGs decode at reduced scale."""
    target = stored_size(*img.size, max_pixels)
    if target != img.size and img.format == "JPEG" and getattr(img, "tile", None):
        img.draft("RGB", target)  # libjpeg scales by 1/2, 1/4 or 1/8 while decoding
    evs.load_image(img)
    img = evs.to_rgb(img)
    if img.size != target:
        r = img.width // target[0]
        if r >= 2 and (math.ceil(img.width / r), math.ceil(img.height / r)) == target:
            img = img.reduce(r)
        else:
            img = img.resize(target, Image.Resampling.BILINEAR)
    return freeze(np.asarray(img))


def make_filter(enabled: bool, threshold: float, keepalive_s: float | None) -> evs.FrameFilter | None:
    return evs.FrameFilter(threshold, keepalive_s=keepalive_s) if enabled else None


class FrameBuffer:
    """Kept frames, oldest first, at most ``max_frames``.

    ``lock`` is the owner's short lock: :meth:`ingest` takes it itself; every
    other method expects the caller to hold it. ``on_media(t, now)`` runs
    under it for each frame received (kept or dropped); ``position_at(t)``
    gives a kept frame its position in the played file."""

    def __init__(self, lock: threading.Lock, max_frames: int, *, evs_enabled: bool, evs_threshold: float,
                 keepalive_s: float | None, store_max_pixels: int | None, max_frame_bytes: int,
                 max_frame_pixels: int, on_media: Callable[[float, float], None],
                 position_at: Callable[[float], float | None]) -> None:
        if store_max_pixels is not None and (not is_int(store_max_pixels) or store_max_pixels < 1):
            raise ValueError(f"store_max_pixels must be None or a positive integer, got {store_max_pixels!r}")
        if not is_int(max_frame_pixels) or max_frame_pixels < 1:
            raise ValueError(f"max_frame_pixels must be a positive integer, got {max_frame_pixels!r}")
        self.store_max_pixels = store_max_pixels
        self.max_frame_bytes = max_frame_bytes
        self.max_frame_pixels = max_frame_pixels
        self._lock = lock
        self._ingest_lock = threading.Lock()  # order: _ingest_lock, then _lock
        self.frames: deque[StoredFrame] = deque(maxlen=max_frames)
        self._filter_settings = (evs_enabled, evs_threshold, keepalive_s)
        self.filter = make_filter(*self._filter_settings)
        self._on_media = on_media
        self._position_at = position_at
        self.received = 0
        self.kept = 0
        self.on_judged: Callable[[bool], None] | None = None  # each frame judged (True: kept), for metrics
        # Each kept frame that begins a scene (the session's first one too),
        # under the lock: the session's scene log (vidchat.media.scene_log).
        self.on_scene: Callable[[StoredFrame], None] | None = None
        # Each kept frame's number, never reused in the session's life (not
        # even after clear): the engine caches its encoding under that name.
        self.seq = 0
        # Scene changes (watch mode): kept frames that differ from the
        # scene's first frame by scene_change_share of the picture.
        self.scene_changes = 0
        self.last_scene_change_t: float | None = None
        self.scene_change_share = DEFAULT_SCENE_CHANGE_SHARE
        self._scene_ref: evs.Reference | None = None  # the scene's first kept frame
        self._last_ref: evs.Reference | None = None  # the previous kept frame
        self._changed_at = np.full((evs.GRID_ROWS, evs.GRID_COLS), -np.inf)  # when each cell last moved
        self.newest_received_t: float | None = None
        self.newest_arrival: float | None = None
        self.received_size: tuple[int, int] | None = None  # (width, height) of the newest frame as it came

    def add_array(self, frame: np.ndarray | Image.Image, t: float | None) -> int | None:
        """Offer a decoded frame (any RGB-able array or image); its kept number, or None."""
        arr = evs.as_rgb_array(frame)
        self.received_size = (arr.shape[1], arr.shape[0])
        return self.ingest(lambda: evs.thumbnail_from_array(arr),
                           lambda: store_array(arr, self.store_max_pixels), t)

    def add_luma(self, luma: np.ndarray, render_rgb: Callable[[int, int], np.ndarray],
                 t: float | None, chroma: tuple[np.ndarray, np.ndarray] | None = None) -> int | None:
        """Offer a frame by its luma plane, and its U and V planes where the
        decoder has them (without them the filter cannot see colour);
        ``render_rgb(width, height)`` runs only for a kept frame, at the stored size."""
        for name, plane in (("luma", luma), *(zip(("U", "V"), chroma) if chroma is not None else ())):
            if not isinstance(plane, np.ndarray) or plane.ndim != 2 or plane.dtype != np.uint8 or 0 in plane.shape:
                raise FrameError(f"{name} plane must be a non-empty H×W uint8 array, "
                                 f"got {getattr(plane, 'shape', plane)!r}")
        h, w = luma.shape
        self.received_size = (w, h)
        size = stored_size(w, h, self.store_max_pixels)

        def stored() -> np.ndarray:
            rgb = evs.as_rgb_array(render_rgb(*size))
            if rgb.shape[:2] != (size[1], size[0]):
                raise FrameError(f"render_rgb returned {rgb.shape[1]}x{rgb.shape[0]}, expected {size[0]}x{size[1]}")
            return freeze(np.array(rgb, dtype=np.uint8, order="C", copy=True))

        if chroma is None:
            return self.ingest(lambda: evs.thumbnail_from_array(luma), stored, t)
        u, v = chroma
        return self.ingest(lambda: evs.thumbnail_from_planes(luma, u, v), stored, t)

    def add_encoded(self, data: bytes | bytearray | memoryview, t: float | None) -> int | None:
        """Offer an encoded frame (JPEG, PNG or WebP), refused with FrameError
        before any pixel is decoded when over the byte or pixel limits."""
        if isinstance(data, (bytes, bytearray, memoryview)) and len(data) > self.max_frame_bytes:
            raise FrameError(f"frame too large: {len(data)} bytes (limit {self.max_frame_bytes})")
        # draft() only works before decoding, so the thumbnail and the stored
        # copy each open their own lazy image.
        limit = self.max_frame_pixels
        return self.ingest(lambda: evs.thumbnail_from_bytes(data, limit),
                           lambda: store_image(evs.open_image(data, limit), self.store_max_pixels), t)

    def ingest(self, make_thumb: Callable[[], np.ndarray], make_stored: Callable[[], np.ndarray],
               t: float | None) -> int | None:
        """Offer one frame (its filter thumbnail and stored array, made on
        demand) captured at ``t`` (default: now); the kept number, or None
        when the filter dropped it."""
        # Anything that can raise FrameError (thumbnail, decode) runs before the
        # decision is recorded, so a bad frame leaves filter and ring unchanged.
        # Decoding holds only the ingest lock: settings changes and sampling
        # take the short lock and never wait for a decode.
        now = time.monotonic()
        if t is None:
            t = now
        seq = None
        with self._ingest_lock:
            with self._lock:
                filt = self.filter
            grid = None  # the filter's thumbnail of this frame, where there is a filter
            keep = True
            if filt is not None:
                grid = make_thumb()
                keep = filt.decide(grid, t)
            stored = make_stored() if keep else None
            with self._lock:
                if filt is not None and grid is not None:
                    filt.record(grid, t, keep)
                self.received += 1
                if stored is not None:  # kept
                    seq = self._keep(filt, stored, t, grid)
                self._on_media(t, now)
                self.newest_received_t = t
                self.newest_arrival = now
        if self.on_judged is not None:
            self.on_judged(seq is not None)
        return seq

    def _keep(self, filt: evs.FrameFilter | None, stored: np.ndarray, t: float, grid: np.ndarray | None) -> int:
        self.kept += 1
        self.seq += 1
        frame = StoredFrame(t, stored, self._position_at(t), self.seq)
        self.frames.append(frame)
        if filt is not None and grid is not None and self._judge_scene(grid, t, filt.noise_floor) \
                and self.on_scene is not None:
            self.on_scene(frame)
        return self.seq

    def _judge_scene(self, grid: np.ndarray, t: float, noise_floor: float) -> bool:
        """Whether the kept frame ``grid`` begins a new scene (the rule above;
        the first kept frame begins the first scene, but is no change)."""
        current = evs.Reference(grid)
        if self._scene_ref is None or self._last_ref is None:
            self._scene_ref = self._last_ref = current  # the first scene begins
            return True
        moved = evs.changed_cells(self._last_ref, grid, noise_floor)
        self._changed_at[moved] = t
        swept = float(np.mean(self._changed_at >= t - SWEEP_WINDOW_S))
        self._last_ref = current
        if swept >= self.scene_change_share or \
                evs.changed_share(self._scene_ref, grid, noise_floor) >= self.scene_change_share:
            self.scene_changes += 1
            self.last_scene_change_t = t
            self._scene_ref = current
            self._changed_at.fill(-np.inf)
            return True
        return False

    def configure(self, max_frames: int, evs_enabled: bool, evs_threshold: float,
                  keepalive_s: float | None, scene_change_share: float = DEFAULT_SCENE_CHANGE_SHARE) -> None:
        """New settings (caller holds the lock): the ring keeps its newest
        frames; a filter switched on or off is replaced, else retuned."""
        self.scene_change_share = scene_change_share
        if max_frames != self.frames.maxlen:
            self.frames = deque(self.frames, maxlen=max_frames)  # keeps the newest
        if evs_enabled != self._filter_settings[0]:
            self.filter = make_filter(evs_enabled, evs_threshold, keepalive_s)
        elif self.filter is not None:
            self.filter.threshold = evs_threshold
            self.filter.keepalive_s = keepalive_s
        self._filter_settings = (evs_enabled, evs_threshold, keepalive_s)

    def clear(self) -> None:
        """Drop every frame and count (caller holds the lock); the numbering and scene changes go on."""
        self.frames.clear()
        # A new filter rather than a reset one: a decode in flight records into the old.
        self.filter = make_filter(*self._filter_settings)
        self.received = self.kept = 0
        self._scene_ref = self._last_ref = None  # the next kept frame begins a scene
        self._changed_at.fill(-np.inf)
        self.newest_received_t = None
        self.newest_arrival = None

    def redate(self, t: float) -> None:
        """Frames captured from ``t`` on were given the old source's position
        if they were ingested before its report arrived: date them again."""
        frames = self.frames
        later = 0
        while later < len(frames) and frames[-1 - later].t >= t:
            later += 1
        for i in range(len(frames) - later, len(frames)):
            frames[i] = frames[i]._replace(source_t=self._position_at(frames[i].t))

    def stats(self, **session_keys: Any) -> dict[str, Any]:
        """The frame counts of the session's stats, with the session's own
        keys after scene_changes (caller holds the lock)."""
        received, kept = self.received, self.kept
        dropped = received - kept
        newest = self.frames[-1].pixels if self.frames else None
        return {
            "frames_received": received,
            "frames_kept": kept,
            "frames_dropped": dropped,
            "frames_in_buffer": len(self.frames),
            # What the newest kept frame is stored (and sent to the model) at: the
            # page shows it beside the rule, since cameras deliver what they like.
            "frame_size": f"{newest.shape[1]}x{newest.shape[0]}" if newest is not None else None,
            # ... and the newest frame as it arrived (the browser may send less than it was asked for).
            "received_size": "{}x{}".format(*self.received_size) if self.received_size else None,
            "scene_changes": self.scene_changes,
            **session_keys,
            "drop_rate": dropped / received if received else 0.0,
            "evs": self.filter.stats if self.filter is not None else None,
        }
