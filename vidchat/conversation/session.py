"""One viewer's state: the frame filter, a ring of kept frames, an audio window.

Producers (the WebRTC peer, the WebSocket door) put timestamped frames and
audio on the session's one timeline; a question takes a :class:`Sample` of
frames (and the audio that goes with them) out of the ring.

Storage. Kept frames are stored as read-only RGB uint8 arrays, box-downscaled
by a whole factor until they fit ``store_max_pixels`` (the rule is
:func:`vidchat.media.stored_size`; default 320×240, about what a VLM's
processor keeps of a webcam frame anyway). Measured on 640×480 input
(bench/evs.py): 64 frames take ~14.7 MB, and building a question's 16 frames
costs microseconds because the arrays are handed out as they are — no JPEG
decode, no base64. Storing JPEG instead would save memory but make every
question decode again (the seed's cost); storing full-size arrays would need
~59 MB per session. ``store_max_pixels=None`` keeps full size.

Timeline. Timestamps are seconds on ``time.monotonic()`` as placed by the
producer's clock (:mod:`vidchat.media.clock`); ``timeline_start`` is the first media
time the session saw, and answer records report times relative to it, so the
same clip replayed at any speed yields the same times.

Source position. A file played in the page (or by ``vidchat.qa.replay``) also has
its own clock, which pause, seek and loop move; :meth:`Session.set_source`
records it (:class:`vidchat.media.clock.SourceTimeline`) and every frame is given
its position in the file as it is ingested, so a question's record can say
where in the file each frame and its audio came from.

Threads. Frames may arrive from an asyncio task and a worker thread while a
question is being answered. One lock serialises ingestion (filter decision,
decode, append) so the ring stays in arrival order; a second, short-held lock
guards the ring, counters and settings, so neither ``sample()`` nor a
settings change ever waits for a decode. A Sample holds references to
read-only arrays and its own audio copy: frames that arrive later go to the
next question and never change this one's input.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
from PIL import Image

from vidchat.conversation.settings_table import AUDIO_MODES, MAX_FRAMES_LIMIT, SAMPLING_STRATEGIES, check_all  # noqa: F401
from vidchat.media import evs
from vidchat.media.audio import AudioWindow, segment_samples, to_int16
from vidchat.media.clock import SENDER_PLACEMENT_MAX_S, SourceTimeline
from vidchat.media.evs import FrameError
from vidchat.media import (AUDIO_RATE, DEFAULT_MAX_FRAME_BYTES, DEFAULT_MAX_FRAME_PIXELS, DEFAULT_STORE_MAX_PIXELS,
                           MIN_AUDIO_SAMPLES, reduce_factor, stored_size)

logger = logging.getLogger(__name__)

# A stored frame is RGB, one byte a channel; the server's default per-session
# budget (--max-session-mb 0) is what this many frames at the stored size need.
BYTES_PER_PIXEL = 3
BUDGET_FRAMES = 64


def session_budget_bytes(budget_mb: float, store_max_pixels: int) -> int:
    """--max-session-mb in bytes (0: BUDGET_FRAMES frames at the stored size, rounded up to a whole MB)."""
    if budget_mb > 0:
        return int(budget_mb * 2**20)
    return math.ceil(BUDGET_FRAMES * store_max_pixels * BYTES_PER_PIXEL / 2**20) * 2**20


def check_frame_budget(max_frames: Any, store_max_pixels: int | None, budget_bytes: int | None) -> None:
    """Raise ValueError naming max_frames and the budget when a full buffer
    of ``max_frames`` stored frames would not fit the session's budget."""
    if budget_bytes is None or store_max_pixels is None or not _is_int(max_frames):
        return
    need = max_frames * store_max_pixels * BYTES_PER_PIXEL
    if need > budget_bytes:
        most = budget_bytes // (store_max_pixels * BYTES_PER_PIXEL)
        raise ValueError(f"max_frames {max_frames} needs {need / 2**20:.1f} MB at the stored frame size "
                         f"({store_max_pixels:,} pixels); this server's budget is {budget_bytes / 2**20:.1f} MB "
                         f"per session (--max-session-mb), at most {most} frames")
MAX_AUDIO_SECONDS = 600.0
__all__ = ["FrameError", "Session", "SessionSettings", "Sample"]


# ---------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------

def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# A kept frame counts as a scene change when at least this share of the
# picture changed since the previous kept frame (a cut, a new shot, the
# camera turned away); a hand moving in view changes about 20 %.
SCENE_CHANGE_SHARE = 0.4

@dataclass
class SessionSettings:
    """Per-session options; may be changed between questions."""

    max_frames: int = 64
    num_sample_frames: int = 16
    sampling: str = "uniform"  # "uniform" | "stable" | "latest_frames" | "latest_seconds"
    sample_seconds: float = 10.0  # window for "latest_seconds"
    evs_enabled: bool = True
    evs_threshold: float = evs.DEFAULT_THRESHOLD  # keep a frame when > (1 - x) of the picture changed
    keepalive_s: float | None = None  # keep >= 1 frame every N seconds even if nothing changes
    audio_seconds: float = 30.0  # audio window cap
    audio_mode: str = "frames"  # "frames": from the first sampled frame on; "last": last audio_last_seconds
    audio_last_seconds: float = 10.0

    def validate(self) -> None:
        """Raise ValueError naming the first bad field (vidchat.conversation.settings_table's rules)."""
        check_all("session", self)
        if not _is_number(self.audio_seconds) or not 0 < self.audio_seconds <= MAX_AUDIO_SECONDS:
            raise ValueError(f"audio_seconds must be a number in (0, {MAX_AUDIO_SECONDS:g}], "
                             f"got {self.audio_seconds!r}")


@dataclass
class Sample:
    """What one question sends to the model. Times are on the session's
    timeline (monotonic seconds); ``origin`` is the timeline's start, so
    ``relative()`` gives times a replay reproduces."""

    frames: list[np.ndarray] = field(default_factory=list)  # RGB uint8 H×W×3 (read-only), oldest first
    timestamps: list[float] = field(default_factory=list)  # capture time per frame
    indices: list[int] = field(default_factory=list)  # indices into the ring at sampling time
    audio: np.ndarray | None = None  # float32 mono 16 kHz
    audio_start: float | None = None
    audio_end: float | None = None
    origin: float = 0.0
    # Where in the played file each frame was (seconds; None for a live
    # source), parallel to timestamps; empty when nobody knew (an old bundle).
    source_times: list[float | None] = field(default_factory=list)
    audio_source_span: tuple[float | None, float | None] | None = None
    source: dict[str, Any] | None = None  # {"kind", "name"} of the newest frame's source
    seqs: list[int] = field(default_factory=list)  # the frames' kept numbers
    substituted: int = 0  # frames swapped for already-encoded ones (the encoder budget)
    # How the audio splits into the engine's items: (samples, name) per
    # segment (vidchat.media.audio.AudioWindow.parts); the names are unique within
    # the session and never reused for other samples. Empty: one clip.
    audio_parts: tuple[tuple[int, str | None], ...] = ()
    audio_tail_open: bool = True  # the newest segment is still growing (not cut on the grid)

    def without_audio(self) -> "Sample":
        """The sample's frames alone."""
        return dataclasses.replace(self, audio=None, audio_start=None, audio_end=None, audio_parts=())

    def without_audio_tail(self) -> "Sample":
        """The sample minus its newest audio segment if that one is still
        growing: what a warm-up prefills, since the question's will be longer."""
        if self.audio is not None and self.audio_parts and not self.audio_tail_open:
            return self
        if self.audio is None or len(self.audio_parts) < 2:
            return self.without_audio()
        keep = self.audio_parts[:-1]
        n = sum(size for size, _ in keep)
        return dataclasses.replace(self, audio=self.audio[:n], audio_end=self.audio_start + n / AUDIO_RATE,
                                   audio_parts=keep)

    def relative(self, t: float | None) -> float | None:
        """A time on this sample's timeline as seconds since the session's first media, in ms precision."""
        return None if t is None else round(t - self.origin, 3)

    def images(self) -> list[Image.Image]:
        """The frames as PIL images (copies)."""
        return [Image.fromarray(f) for f in self.frames]

    def frame_source_times(self) -> list[float | None]:
        """``source_times`` parallel to ``timestamps`` (all None when unknown)."""
        if len(self.source_times) != len(self.timestamps):
            return [None] * len(self.timestamps)
        return list(self.source_times)


class _Frame(NamedTuple):
    t: float
    pixels: np.ndarray  # read-only
    source_t: float | None = None  # position in the played file, when the source is one
    seq: int = 0  # the session's kept-frame number (1, 2, …, never reused): the frame's identity for the engine


# ---------------------------------------------------------------------------
# Frame sampling and storage helpers
# ---------------------------------------------------------------------------

def _trivial_pick(n: int, k: int) -> list[int] | None:
    """The picks every strategy agrees on: none, the newest alone, or all."""
    if n <= 0 or k <= 0:
        return []
    if k == 1:
        return [n - 1]
    if k >= n:
        return list(range(n))
    return None


def stable_indices(seqs: Sequence[int], k: int) -> list[int]:
    """k frames spread evenly over a window of consecutive kept numbers, on a
    grid anchored to the numbers themselves (every stride-th kept frame),
    plus the newest. As the window slides, a new frame replaces only the
    newest pick, and the grid moves one place every `stride` frames: the
    frames before stay the same, in the same order, so a later question
    shares their prompt prefix and their encodings (vidchat.conversation.prewarm)."""
    n = len(seqs)
    trivial = _trivial_pick(n, k)
    if trivial is not None:
        return trivial
    # At most (n-1)/(k-1): any n consecutive numbers then hold k-1 multiples.
    stride = max(1, (n - 1) // (k - 1))
    grid = [i for i, q in enumerate(seqs[:-1]) if q % stride == 0]
    return grid[-(k - 1):] + [n - 1]


def uniform_indices(n: int, k: int) -> list[int]:
    """The seed's uniform pick of k out of n (k=1: the newest; k >= n: all)."""
    trivial = _trivial_pick(n, k)
    if trivial is not None:
        return trivial
    return [int(i * (n - 1) / (k - 1)) for i in range(k)]


def _freeze(arr: np.ndarray) -> np.ndarray:
    arr.setflags(write=False)
    return arr


def store_array(frame: np.ndarray, max_pixels: int | None) -> np.ndarray:
    """A read-only copy of a valid RGB frame, box-downscaled to fit max_pixels."""
    h, w = frame.shape[:2]
    k = reduce_factor(w, h, max_pixels)
    if k == 1:
        return _freeze(np.array(frame, dtype=np.uint8, order="C", copy=True))
    # PIL's reduce() is a box filter over k×k blocks: antialiased and ~4x cheaper than resize().
    return _freeze(np.asarray(Image.fromarray(np.ascontiguousarray(frame)).reduce(k)))


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
    return _freeze(np.asarray(img))


# ---------------------------------------------------------------------------
# The session
# ---------------------------------------------------------------------------

class Session:
    """Frames and audio of one viewer, filtered, bounded and sampled for questions.

    ``settings`` is read-only from outside: change it with :meth:`update_settings`.
    """

    def __init__(self, session_id: str, settings: SessionSettings | None = None, *,
                 store_max_pixels: int | None = DEFAULT_STORE_MAX_PIXELS,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 max_frame_pixels: int = DEFAULT_MAX_FRAME_PIXELS, max_bytes: int | None = None) -> None:
        settings = dataclasses.replace(settings) if settings is not None else SessionSettings()
        settings.validate()
        check_frame_budget(settings.max_frames, store_max_pixels, max_bytes)
        if store_max_pixels is not None and (not _is_int(store_max_pixels) or store_max_pixels < 1):
            raise ValueError(f"store_max_pixels must be None or a positive integer, got {store_max_pixels!r}")
        if not _is_int(max_frame_pixels) or max_frame_pixels < 1:
            raise ValueError(f"max_frame_pixels must be a positive integer, got {max_frame_pixels!r}")
        self.id = session_id
        self.settings = settings
        self.store_max_pixels = store_max_pixels
        self.max_frame_bytes = max_frame_bytes
        self.max_frame_pixels = max_frame_pixels
        self.max_bytes = max_bytes  # the frame buffer's budget (None: none)
        self.last_activity = time.monotonic()
        self._ingest_lock = threading.Lock()  # order: _ingest_lock, then _lock
        self._lock = threading.Lock()
        self._frames: deque[_Frame] = deque(maxlen=settings.max_frames)
        self._audio = AudioWindow(settings.audio_seconds)
        self._filter = self._make_filter(settings)
        self._received = 0
        self._kept = 0
        # Each kept frame's number, never reused in the session's life (not
        # even after reset): the engine caches its encoding under that name.
        self._seq = 0
        # Kept frames where most of the picture changed at once (watch mode).
        self.scene_changes = 0
        self.last_scene_change_t: float | None = None
        self._newest_received_t: float | None = None
        self._newest_arrival: float | None = None
        self.timeline_start: float | None = None
        # Kept frames a warm-up has put in the engine's caches, and how many
        # new ones a question may carry (None: no limit; vidchat.conversation.prewarm sets it).
        self._encoded: set[int] = set()
        self.encode_budget: int | None = None
        self.source_timeline = SourceTimeline()
        # Timeline time minus the browser's clock for the newest video frame
        # (vidchat.media.clock.SenderClock); None until the browser's first sender report.
        self._sender_offset: float | None = None

    @staticmethod
    def _make_filter(settings: SessionSettings) -> evs.FrameFilter | None:
        if not settings.evs_enabled:
            return None
        return evs.FrameFilter(settings.evs_threshold, keepalive_s=settings.keepalive_s)

    def _on_timeline(self, t: float) -> None:
        # Caller holds _lock.
        if self.timeline_start is None or t < self.timeline_start:
            self.timeline_start = t

    # -- frames ------------------------------------------------------------

    def add_frame(self, frame: np.ndarray | Image.Image, t: float | None = None) -> bool:
        """Offer a frame captured at ``t`` (default: now); True if it was kept.

        Raises FrameError for an unusable frame; the session is unchanged.
        """
        if isinstance(frame, (bytes, bytearray, memoryview)):
            return self.add_jpeg(frame, t)
        arr = evs.as_rgb_array(frame)
        return self._ingest(lambda: evs.thumbnail_from_array(arr),
                            lambda: store_array(arr, self.store_max_pixels), t) is not None

    def add_luma_frame(self, luma: np.ndarray, render_rgb: Callable[[int, int], np.ndarray],
                       t: float | None = None) -> bool:
        """Offer a decoded video frame by its luma plane (H×W uint8, may be
        strided); ``render_rgb(width, height)`` is called only if the frame is
        kept, at the stored size. For decoders that hold YUV: the filter needs
        only luma, so most frames (the dropped ones) never pay for RGB."""
        if not isinstance(luma, np.ndarray) or luma.ndim != 2 or luma.dtype != np.uint8 or 0 in luma.shape:
            raise FrameError(f"luma plane must be a non-empty H×W uint8 array, got {getattr(luma, 'shape', luma)!r}")
        h, w = luma.shape
        size = stored_size(w, h, self.store_max_pixels)

        def stored() -> np.ndarray:
            rgb = evs.as_rgb_array(render_rgb(*size))
            if rgb.shape[:2] != (size[1], size[0]):
                raise FrameError(f"render_rgb returned {rgb.shape[1]}x{rgb.shape[0]}, expected {size[0]}x{size[1]}")
            return _freeze(np.array(rgb, dtype=np.uint8, order="C", copy=True))

        return self._ingest(lambda: evs.thumbnail_from_array(luma), stored, t) is not None

    def add_jpeg(self, data: bytes | bytearray | memoryview, t: float | None = None) -> bool:
        """Offer an encoded frame (JPEG, PNG or WebP); decoded in full only if kept.

        Refused with FrameError, before any pixel is decoded, when it is over
        ``max_frame_bytes``, in another format, or over ``max_frame_pixels``."""
        return self.offer_jpeg(data, t) is not None

    def offer_jpeg(self, data: bytes | bytearray | memoryview, t: float | None = None) -> int | None:
        """:meth:`add_jpeg`, answering with the kept frame's number (its
        ``seq``: what :attr:`Sample.seqs` lists once it is sampled), or None
        when the filter dropped it. For a producer that names its frames
        (the WebSocket door's ``frame_id``) and must learn which kept frame
        is which even while other threads feed the session."""
        if isinstance(data, (bytes, bytearray, memoryview)) and len(data) > self.max_frame_bytes:
            raise FrameError(f"frame too large: {len(data)} bytes (limit {self.max_frame_bytes})")
        # draft() only works before decoding, so the thumbnail and the stored
        # copy each open their own lazy image.
        limit = self.max_frame_pixels
        return self._ingest(lambda: evs.thumbnail_from_bytes(data, limit),
                            lambda: store_image(evs.open_image(data, limit), self.store_max_pixels), t)

    def _ingest(self, make_thumb: Callable[[], np.ndarray], make_stored: Callable[[], np.ndarray],
                t: float | None) -> int | None:
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
                filt = self._filter
            grid = make_thumb() if filt is not None else None
            keep = filt.decide(grid, t) if filt is not None else True
            stored = make_stored() if keep else None
            with self._lock:
                if filt is not None:
                    filt.record(grid, t, keep)
                self._received += 1
                if keep:
                    self._kept += 1
                    self._seq += 1
                    seq = self._seq
                    self._frames.append(_Frame(t, stored, self.source_timeline.position_at(t), seq))
                    if filt is not None and filt.last_similarity is not None \
                            and 1.0 - filt.last_similarity >= SCENE_CHANGE_SHARE:
                        self.scene_changes += 1
                        self.last_scene_change_t = t
                self._on_timeline(t)
                self._newest_received_t = t
                self._newest_arrival = now
                self.last_activity = now
        return seq

    # -- audio -------------------------------------------------------------

    def add_audio(self, samples: np.ndarray, t: float | None = None) -> None:
        """Place mono 16 kHz samples (float -1..1 or int16); ``t`` = capture time of the first."""
        pcm = to_int16(samples)
        now = time.monotonic()
        with self._lock:
            self._audio.add(pcm, t, now)
            if self._audio.end is not None:
                self._on_timeline(t if t is not None else self._audio.end - pcm.size / AUDIO_RATE)
            self.last_activity = now

    def add_pcm16(self, data: bytes | bytearray | memoryview, t: float | None = None) -> None:
        """Place PCM16 little-endian mono 16 kHz bytes."""
        if len(data) % 2:
            raise ValueError(f"PCM16 data must have an even number of bytes, got {len(data)}")
        self.add_audio(np.frombuffer(data, dtype="<i2").astype(np.int16), t)

    def audio_since(self, t: float | None) -> tuple[np.ndarray, float, float] | None:
        """The audio received after timeline time ``t`` (float32, start, end),
        for a listener that follows the stream (Talk mode); None when there
        is none yet. ``t`` None: nothing before now counts."""
        with self._lock:
            window = self._audio
            if window.end is None:
                return None
            if t is None or t > window.end + 0.05:  # first call, or the stream restarted earlier
                return np.zeros(0, np.float32), window.end, window.end
            return window.window(max(t, window.start))

    # -- questions ---------------------------------------------------------

    def sample(self, k: int | None = None, strategy: str | None = None,
               span: tuple[float, float] | None = None) -> Sample:
        """Frames (and audio) for one question; defaults come from the settings.

        * ``uniform``: k frames spread over the whole ring (the seed's indices).
        * ``stable``: k frames spread over the whole ring on a grid of kept
          numbers, plus the newest: a new frame changes only the newest pick
          (and every stride-th, the oldest), so questions and warm-ups share
          a prompt prefix (:func:`stable_indices`).
        * ``latest_frames``: the k newest frames.
        * ``latest_seconds``: k frames spread over the last ``sample_seconds``
          before the newest *received* frame, plus the kept frame that was on
          screen when that window began (the filter drops its repeats), so a
          static scene still yields its picture.

        Audio: ``audio_mode="frames"`` sends the audio from the first sampled
        frame's time (for ``latest_seconds``, from the window's start) to the
        end of the audio received; ``"last"`` (and "frames" with no frames)
        the last ``audio_last_seconds``. Where that start is older than the
        audio kept, from the first 2-s segment boundary of what is kept
        (AudioWindow.steady_start), and ``audio_parts`` gives the segments.

        ``span`` (timeline start, end; a spoken question, vidchat.conversation.talk):
        k frames spread over the span, plus the kept frame on screen when
        it began, and exactly the span's audio; the strategy is not used.
        """
        with self._lock:
            s = self.settings
            k = s.num_sample_frames if k is None else k
            strategy = s.sampling if strategy is None else strategy
            if not _is_int(k) or k < 1:
                raise ValueError(f"k must be a positive integer, got {k!r}")
            if strategy not in SAMPLING_STRATEGIES:
                raise ValueError(f"strategy must be one of {', '.join(SAMPLING_STRATEGIES)}, got {strategy!r}")
            frames = list(self._frames)
            if span is not None:
                candidates = self._span_candidates(frames, span)
                window_start = span[0]
            else:
                candidates, window_start = self._candidates(frames, strategy, s)
            if span is not None:
                picked = [candidates[i] for i in uniform_indices(len(candidates), k)]
            elif strategy == "latest_frames":
                picked = candidates[-k:]
            elif strategy == "stable":
                picked = [candidates[i] for i in stable_indices([frames[c].seq for c in candidates], k)]
            else:
                picked = [candidates[i] for i in uniform_indices(len(candidates), k)]
            picked, substituted = self._within_encode_budget(frames, candidates, picked)
            audio, audio_parts = None, ()
            if span is not None:
                audio = self._audio.window(span[0], span[1])  # a spoken question: one clip
            elif s.audio_mode == "frames" and picked:
                start = frames[picked[0]].t
                if window_start is not None:
                    start = max(start, window_start)
                start = self._audio.steady_start(start)
                audio = self._audio.window(start)
                audio_parts = self._audio.parts(start, min_samples=MIN_AUDIO_SAMPLES)
            elif self._audio.end is not None:
                start = self._audio.steady_start(self._audio.end - s.audio_last_seconds)
                audio = self._audio.window(start)
                audio_parts = self._audio.parts(start, min_samples=MIN_AUDIO_SAMPLES)
            origin = self.timeline_start if self.timeline_start is not None else 0.0
            self.last_activity = time.monotonic()
        sources = self.source_timeline
        audio_span = None
        if audio:
            audio_span = (sources.position_at(audio[1]), sources.position_at(audio[2]))
            if audio_span == (None, None):
                audio_span = None
        return Sample(
            frames=[frames[i].pixels for i in picked],
            timestamps=[frames[i].t for i in picked],
            indices=picked,
            audio=audio[0] if audio else None,
            audio_start=audio[1] if audio else None,
            audio_end=audio[2] if audio else None,
            origin=origin,
            source_times=[frames[i].source_t for i in picked],
            audio_source_span=audio_span,
            source=sources.source_at(frames[picked[-1]].t if picked else None),
            seqs=[frames[i].seq for i in picked],
            substituted=substituted,
            audio_parts=audio_parts if audio else (),
            audio_tail_open=not self._audio.ends_segment,
        )

    def _within_encode_budget(self, frames: list[_Frame], candidates: list[int],
                              picked: list[int]) -> tuple[list[int], int]:
        """Caller holds _lock. With an encoder budget (a CPU where encoding a
        frame costs most of a second), at most ``encode_budget`` picked frames
        may be new to the engine: the newest new ones stay, and each other new
        one is swapped for the nearest frame already encoded (by a warm-up),
        so a question never waits for a backlog of encodings."""
        budget = self.encode_budget
        if budget is None:
            return picked, 0
        new = [p for p in picked if frames[p].seq not in self._encoded]
        if len(new) <= budget:
            return picked, 0
        swap = set(new[: len(new) - budget])  # the oldest new frames
        chosen = set(picked)
        encoded = [c for c in candidates if frames[c].seq in self._encoded]
        out, substituted = [], 0
        for p in picked:
            if p in swap:
                near = [c for c in encoded if c not in chosen]
                if near:
                    best = min(near, key=lambda c: (abs(c - p), c))
                    chosen.discard(p)
                    chosen.add(best)
                    out.append(best)
                    substituted += 1
                    continue
            out.append(p)
        return sorted(out), substituted

    def mark_encoded(self, seqs: Sequence[int]) -> None:
        """These kept frames are in the engine's caches (a warm-up carried them)."""
        with self._lock:
            live = {f.seq for f in self._frames}
            self._encoded = {q for q in self._encoded if q in live} | {q for q in seqs if q in live}

    def encoded_count(self, seqs: Sequence[int]) -> int:
        with self._lock:
            return sum(q in self._encoded for q in seqs)

    def _candidates(self, frames: list[_Frame], strategy: str,
                    s: SessionSettings) -> tuple[list[int], float | None]:
        """Ring indices a strategy picks from, and (latest_seconds) the window's start."""
        n = len(frames)
        if strategy != "latest_seconds" or n == 0:
            return list(range(n)), None
        newest = self._newest_received_t if self._newest_received_t is not None else frames[-1].t
        since = newest - s.sample_seconds
        first = n  # first frame captured inside the window
        while first > 0 and frames[first - 1].t >= since:
            first -= 1
        if first == n or frames[first].t > since:
            # The frame kept before the window was still on screen when it began.
            first = max(first - 1, 0)
        return list(range(first, n)), since

    @staticmethod
    def _span_candidates(frames: list[_Frame], span: tuple[float, float]) -> list[int]:
        """Ring indices of the frames captured within ``span``, led by the
        one on screen when it began (a still scene keeps no frame in it)."""
        start, end = span
        inside = [i for i, f in enumerate(frames) if start <= f.t <= end]
        before = [i for i, f in enumerate(frames) if f.t < start]
        if before:
            inside.insert(0, before[-1])
        elif not inside and frames:
            inside = [0]  # every kept frame came after the span: the nearest one
        return inside

    # -- source ------------------------------------------------------------

    def note_sender_clock(self, offset_s: float) -> None:
        """Timeline time minus the sender's clock, for the newest video frame
        (the WebRTC door measures it from the browser's sender reports)."""
        self._sender_offset = offset_s

    def set_source(self, kind: str, name: str | None = None, position_s: float | None = None,
                   playing: bool = True, rate: float = 1.0, t: float | None = None, *,
                   duration_s: float | None = None, loop: bool = False,
                   at_sender_s: float | None = None) -> tuple[float, bool]:
        """Say what the video source is from timeline time ``t`` on:
        ``"camera"``, ``"screen"``, or a ``"file"`` named ``name`` at
        ``position_s`` seconds, playing at ``rate`` or paused. Without ``t``,
        the report is placed at ``at_sender_s`` (the sender's clock, where
        the session knows how that maps onto the timeline and the result is
        within a second of now), else now. Frames stamped from then on carry
        their position in the file, including frames that arrived before the
        report but were captured after it. Returns the timeline time used
        and whether the sender's clock placed it. Not media activity: it keeps no session alive."""
        if kind == "file" and (position_s is None or not _is_number(position_s) or position_s < 0):
            raise ValueError(f"a file source needs a position in seconds >= 0, got {position_s!r}")
        if not _is_number(rate) or rate <= 0:
            raise ValueError(f"rate must be a positive number, got {rate!r}")
        by_sender = False
        if t is None:
            t = time.monotonic()
            offset = self._sender_offset
            if at_sender_s is not None and offset is not None:
                placed = at_sender_s + offset
                if abs(placed - t) <= SENDER_PLACEMENT_MAX_S:
                    t, by_sender = placed, True
                else:
                    logger.debug("session %s: sender clock is %.3f s off arrival; report placed on arrival",
                                 self.id, placed - t)
        timeline = self.source_timeline
        timeline.report(t, kind, name, position_s, playing, rate, duration_s, loop)
        with self._lock:
            # Frames captured after the report's moment but ingested before it
            # arrived were given the old segment's position: date them again.
            frames = self._frames
            later = 0
            while later < len(frames) and frames[-1 - later].t >= t:
                later += 1
            for i in range(len(frames) - later, len(frames)):
                frames[i] = frames[i]._replace(source_t=timeline.position_at(frames[i].t))
        return t, by_sender

    # -- settings and lifecycle --------------------------------------------

    def update_settings(self, **changes: Any) -> None:
        """Change settings (validated as a whole); the ring keeps its newest frames."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(SessionSettings)})
        if unknown:
            raise ValueError(f"unknown setting(s): {', '.join(unknown)}")
        with self._lock:
            new = dataclasses.replace(self.settings, **changes)
            new.validate()
            check_frame_budget(new.max_frames, self.store_max_pixels, self.max_bytes)
            old = self.settings
            if new.max_frames != old.max_frames:
                self._frames = deque(self._frames, maxlen=new.max_frames)  # keeps the newest
            if new.evs_enabled != old.evs_enabled:
                self._filter = self._make_filter(new)
            elif self._filter is not None:
                self._filter.threshold = new.evs_threshold
                self._filter.keepalive_s = new.keepalive_s
            if new.audio_seconds != old.audio_seconds:
                self._audio.set_cap(new.audio_seconds)
            self.settings = new
        logger.debug("session %s: settings changed %s", self.id, changes)

    def reset(self) -> None:
        """Drop all frames, audio and counts; settings and the source stay."""
        with self._lock:
            self._frames.clear()
            self._audio.clear()
            # A new filter rather than a reset one: a decode in flight records into the old.
            self._filter = self._make_filter(self.settings)
            self._received = self._kept = 0
            self._encoded = set()
            self._newest_received_t = None
            self._newest_arrival = None
            self.timeline_start = None
            self.last_activity = time.monotonic()

    # -- introspection -----------------------------------------------------

    @property
    def frame_count(self) -> int:
        return len(self._frames)

    @property
    def kept_count(self) -> int:
        """Frames kept so far: changes exactly when the buffer gains a frame."""
        return self._kept

    @property
    def audio_segments(self) -> tuple[int, int]:
        """(stream, finished audio segments): changes when a segment is
        complete, which is when a warm-up can take it (vidchat.conversation.prewarm)."""
        window = self._audio
        return window.stream, window.total // segment_samples()

    @property
    def oldest_seq(self) -> int | None:
        """The number of the oldest frame still in the buffer (None when it
        is empty): kept frames numbered below it have been pushed out."""
        with self._lock:
            return self._frames[0].seq if self._frames else None

    @property
    def newest_frame_time(self) -> float | None:
        """Capture time of the newest frame received (kept or dropped): shows the stream is alive."""
        return self._newest_received_t

    @property
    def memory_bytes(self) -> int:
        """Bytes held by stored frames and audio."""
        with self._lock:
            return sum(f.pixels.nbytes for f in self._frames) + self._audio.nbytes

    def recent_kept(self, n: int) -> list[tuple[int, float, np.ndarray]]:
        """The n newest kept frames as (ring index, time, pixels), oldest first."""
        with self._lock:
            frames = list(self._frames)
        start = max(0, len(frames) - n)
        return [(i, f.t, f.pixels) for i, f in enumerate(frames[start:], start)]

    @property
    def stats(self) -> dict[str, Any]:
        with self._lock:
            received, kept = self._received, self._kept
            dropped = received - kept
            newest = self._frames[-1].pixels if self._frames else None
            return {
                "frames_received": received,
                "frames_kept": kept,
                "frames_dropped": dropped,
                "frames_in_buffer": len(self._frames),
                # What the newest kept frame is stored (and sent to the model) at: the
                # page shows it beside the rule, since cameras deliver what they like.
                "frame_size": f"{newest.shape[1]}x{newest.shape[0]}" if newest is not None else None,
                "scene_changes": self.scene_changes,
                "max_frames": self.settings.max_frames,
                "audio_seconds": self._audio.seconds,
                "drop_rate": dropped / received if received else 0.0,
                "evs": self._filter.stats if self._filter is not None else None,
                # By arrival on this process's clock, so it works whatever clock t uses.
                "newest_frame_age_s": (time.monotonic() - self._newest_arrival
                                       if self._newest_arrival is not None else None),
            }
