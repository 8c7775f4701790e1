"""One viewer's state: the frame filter, a ring of kept frames, an audio window.

Producers (the WebRTC peer, the WebSocket door) put timestamped frames and
audio on the session's one timeline; a question takes a :class:`Sample` of
frames (and the audio that goes with them) out of the ring.

Storage. Kept frames are read-only RGB arrays at no more than
``store_max_pixels`` (vidchat.media.frame_buffer, which says what that costs
and saves); which ones a question takes is vidchat.media.sampling.

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
question is being answered. The frame buffer serialises ingestion with a
lock of its own; the session's short-held lock guards the ring, counters,
audio and settings together, so a sample sees frames and audio at one moment
and neither ``sample()`` nor a settings change ever waits for a decode. A Sample holds references to
read-only arrays and its own audio copy: frames that arrive later go to the
next question and never change this one's input.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
from PIL import Image

from vidchat.media import evs
from vidchat.media.audio import AudioWindow, segment_samples, to_int16
from vidchat.media.clock import SourceTimeline
from vidchat.media.evs import FrameError
from vidchat.media.frame_buffer import FrameBuffer, StoredFrame
from vidchat.media.sampling import Sample, pick, within_encode_budget
from vidchat.media import (AUDIO_RATE, DEFAULT_MAX_FRAME_BYTES, DEFAULT_MAX_FRAME_PIXELS, DEFAULT_STORE_MAX_PIXELS,
                           MIN_AUDIO_SAMPLES)
from vidchat.media.numbers import is_int, is_number
from vidchat.media.session_settings import (  # noqa: F401 (the session's settings, as its users name them)
    AUDIO_MODES, MAX_AUDIO_SECONDS, MAX_FRAMES_LIMIT, SAMPLING_STRATEGIES, SessionSettings,
)

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
    if budget_bytes is None or store_max_pixels is None or not is_int(max_frames):
        return
    need = max_frames * store_max_pixels * BYTES_PER_PIXEL
    if need > budget_bytes:
        most = budget_bytes // (store_max_pixels * BYTES_PER_PIXEL)
        raise ValueError(f"max_frames {max_frames} needs {need / 2**20:.1f} MB at the stored frame size "
                         f"({store_max_pixels:,} pixels); this server's budget is {budget_bytes / 2**20:.1f} MB "
                         f"per session (--max-session-mb), at most {most} frames")


__all__ = ["FrameError", "Session", "SessionMedia", "SessionSettings", "Sample"]


def _question_audio(window: AudioWindow, frames: list[StoredFrame], picked: list[int],
                    window_start: float | None, span: tuple[float, float] | None,
                    s: SessionSettings, audio_after: float | None = None,
                    ) -> tuple[tuple[np.ndarray, float, float] | None, tuple]:
    """The audio that goes with a question's frames, and its segments (see Session.sample)."""
    if span is not None:
        return window.window(span[0], span[1]), ()  # a spoken question: one clip
    if audio_after is not None:
        if window.end is None:
            return None, ()
        start = max(audio_after, window.start)  # all of it since then, as much as is kept
        return window.window(start), window.parts(start, min_samples=MIN_AUDIO_SAMPLES)
    if s.audio_mode == "frames" and picked:
        start = frames[picked[0]].t
        if window_start is not None:
            start = max(start, window_start)
    elif window.end is not None:
        start = window.end - s.audio_last_seconds
    else:
        return None, ()
    start = window.steady_start(start)
    return window.window(start), window.parts(start, min_samples=MIN_AUDIO_SAMPLES)


def _sample_of(frames: list[StoredFrame], picked: list[int], audio: tuple[np.ndarray, float, float] | None,
               sources: SourceTimeline, **fields: Any) -> Sample:
    """The Sample of the picked frames and their audio, dated in the played file where it is one."""
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
        source_times=[frames[i].source_t for i in picked],
        source_at_jump=[frames[i].source_t is not None and sources.at_jump(frames[i].t) for i in picked],
        audio_source_span=audio_span,
        source=sources.source_at(frames[picked[-1]].t if picked else None),
        seqs=[frames[i].seq for i in picked],
        **fields,
    )


# ---------------------------------------------------------------------------
# The session
# ---------------------------------------------------------------------------

class SessionMedia:
    """What producers put on one viewer's timeline: kept frames (filtered
    and bounded), audio, and the played file's clock. :class:`Session`
    adds the settings' rules and the questions' samples.

    ``settings`` is read-only from outside: change it with :meth:`Session.update_settings`.
    """

    def __init__(self, session_id: str, settings: SessionSettings, *, store_max_pixels: int | None,
                 max_frame_bytes: int, max_frame_pixels: int, max_bytes: int | None) -> None:
        self.id = session_id
        self.settings = settings
        self.store_max_pixels = store_max_pixels
        self.max_frame_bytes = max_frame_bytes
        self.max_frame_pixels = max_frame_pixels
        self.max_bytes = max_bytes  # the frame buffer's budget (None: none)
        self.last_activity = time.monotonic()
        self._lock = threading.Lock()
        self.source_timeline = SourceTimeline()
        self._buffer = FrameBuffer(self._lock, settings.max_frames, evs_enabled=settings.evs_enabled,
                                   evs_threshold=settings.evs_threshold, keepalive_s=settings.keepalive_s,
                                   store_max_pixels=store_max_pixels, max_frame_bytes=max_frame_bytes,
                                   max_frame_pixels=max_frame_pixels, on_media=self._on_media,
                                   position_at=self.source_timeline.position_at)
        self._audio = AudioWindow(settings.audio_seconds)
        self._audio_arrived: float | None = None  # time.monotonic() of the newest audio
        self.timeline_start: float | None = None

    @property
    def on_frame(self) -> Callable[[bool], None] | None:
        """Told of each frame the filter judged (True: kept): the app's metrics."""
        return self._buffer.on_judged

    @on_frame.setter
    def on_frame(self, hook: Callable[[bool], None] | None) -> None:
        self._buffer.on_judged = hook

    def _on_media(self, t: float | None, now: float) -> None:
        # Media captured at t (None: not placed) arrived now; the caller holds _lock.
        if t is not None and (self.timeline_start is None or t < self.timeline_start):
            self.timeline_start = t
        self.last_activity = now

    # -- frames ------------------------------------------------------------

    def add_frame(self, frame: np.ndarray | Image.Image, t: float | None = None) -> bool:
        """Offer a frame captured at ``t`` (default: now); True if it was kept.

        Raises FrameError for an unusable frame; the session is unchanged.
        """
        if isinstance(frame, (bytes, bytearray, memoryview)):
            return self.add_jpeg(frame, t)
        return self._buffer.add_array(frame, t) is not None

    def add_luma_frame(self, luma: np.ndarray, render_rgb: Callable[[int, int], np.ndarray],
                       t: float | None = None, chroma: tuple[np.ndarray, np.ndarray] | None = None) -> bool:
        """Offer a decoded video frame by its luma plane (H×W uint8, may be
        strided) and, so that the filter sees colour, its U and V planes
        (``chroma``, any subsampling); ``render_rgb(width, height)`` is called
        only if the frame is kept, at the stored size. For decoders that hold
        YUV: the filter reads the planes in place, so most frames (the dropped
        ones) never pay for RGB."""
        return self._buffer.add_luma(luma, render_rgb, t, chroma) is not None

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
        return self._buffer.add_encoded(data, t)

    # -- audio -------------------------------------------------------------

    def add_audio(self, samples: np.ndarray, t: float | None = None) -> None:
        """Place mono 16 kHz samples (float -1..1 or int16); ``t`` = capture time of the first."""
        pcm = to_int16(samples)
        now = time.monotonic()
        with self._lock:
            self._audio_arrived = now
            self._audio.add(pcm, t, now)
            end = self._audio.end
            self._on_media(None if end is None else (t if t is not None else end - pcm.size / AUDIO_RATE), now)

    def add_pcm16(self, data: bytes | bytearray | memoryview, t: float | None = None) -> None:
        """Place PCM16 little-endian mono 16 kHz bytes."""
        if len(data) % 2:
            raise ValueError(f"PCM16 data must have an even number of bytes, got {len(data)}")
        self.add_audio(np.frombuffer(data, dtype="<i2").astype(np.int16), t)

    def audio_age_s(self) -> float | None:
        """Seconds since audio last arrived (None: none ever has)."""
        arrived = self._audio_arrived
        return None if arrived is None else round(time.monotonic() - arrived, 2)

    def audio_since(self, t: float | None) -> tuple[np.ndarray, float, float] | None:
        """The audio received after timeline time ``t`` (float32, start, end),
        for a listener that follows the stream (Talk mode); None when there
        is none yet. ``t`` None: nothing before now counts."""
        with self._lock:
            return self._audio.since(t)

    # -- source ------------------------------------------------------------

    def note_sender_clock(self, offset_s: float) -> None:
        """Timeline time minus the sender's clock, for the newest video frame
        (the WebRTC door measures it from the browser's sender reports)."""
        self.source_timeline.sender_offset = offset_s

    def set_source(self, kind: str, name: str | None = None, position_s: float | None = None,
                   playing: bool = True, rate: float = 1.0, t: float | None = None, *,
                   duration_s: float | None = None, loop: bool = False,
                   at_sender_s: float | None = None) -> tuple[float, bool]:
        """Say what the video source is from timeline time ``t`` on, placed
        as :meth:`SourceTimeline.place_report` says (the time used and
        whether the sender's clock placed it are returned). Frames stamped
        from then on carry their position in the file, including frames
        that arrived before the report but were captured after it. Not
        media activity: it keeps no session alive."""
        t, by_sender = self.source_timeline.place_report(kind, name, position_s, playing, rate, t,
                                                         duration=duration_s, loop=loop, at_sender_s=at_sender_s,
                                                         now=time.monotonic(), who=self.id)
        with self._lock:
            self._buffer.redate(t)
        return t, by_sender


class Session(SessionMedia):
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
        super().__init__(session_id, settings, store_max_pixels=store_max_pixels, max_frame_bytes=max_frame_bytes,
                         max_frame_pixels=max_frame_pixels, max_bytes=max_bytes)
        # Kept frames a warm-up has put in the engine's caches, and how many
        # new ones a question may carry (None: no limit; vidchat.conversation.prewarm sets it).
        self._encoded: set[int] = set()
        self.encode_budget: int | None = None

    # -- questions ---------------------------------------------------------

    def sample(self, k: int | None = None, strategy: str | None = None,
               span: tuple[float, float] | None = None, new_frames: int | None = -1,
               audio_after: float | None = None) -> Sample:
        """Frames (and audio) for one question; defaults come from the settings.

        Which frames: ``strategy`` (or, for a spoken question, ``span``:
        timeline start and end, vidchat.conversation.talk), as
        :func:`vidchat.media.sampling.pick` explains.

        Audio: ``audio_mode="frames"`` sends the audio from the first sampled
        frame's time (for ``latest_seconds``, from the window's start) to the
        end of the audio received; ``"last"`` (and "frames" with no frames)
        the last ``audio_last_seconds``. Where that start is older than the
        audio kept, from the first 2-s segment boundary of what is kept
        (AudioWindow.steady_start), and ``audio_parts`` gives the segments.
        A spoken question gets exactly its span's audio. ``audio_after``: all
        the audio after that timeline time instead, as much as is kept (the
        seed protocol's rule for clients that send no timestamps: what
        arrived since the previous question).

        ``new_frames``: at most this many frames new to the engine (None: no
        limit); -1, the default: the session's ``encode_budget`` (a warm-up
        that encodes ahead asks for more than a question may carry).
        """
        with self._lock:
            s = self.settings
            k = s.num_sample_frames if k is None else k
            strategy = s.sampling if strategy is None else strategy
            if not is_int(k) or k < 1:
                raise ValueError(f"k must be a positive integer, got {k!r}")
            if strategy not in SAMPLING_STRATEGIES:
                raise ValueError(f"strategy must be one of {', '.join(SAMPLING_STRATEGIES)}, got {strategy!r}")
            frames = list(self._buffer.frames)
            candidates, picked, window_start = pick(frames, k, strategy, span=span, sample_seconds=s.sample_seconds,
                                                    newest_received_t=self._buffer.newest_received_t)
            budget = self.encode_budget if new_frames == -1 else new_frames
            picked, substituted = within_encode_budget(frames, candidates, picked, self._encoded, budget)
            audio, audio_parts = _question_audio(self._audio, frames, picked, window_start, span, s, audio_after)
            origin = self.timeline_start if self.timeline_start is not None else 0.0
            tail_open = not self._audio.ends_segment
            self.last_activity = time.monotonic()
        return _sample_of(frames, picked, audio, self.source_timeline, origin=origin, substituted=substituted,
                          audio_parts=audio_parts if audio else (), audio_tail_open=tail_open)

    def mark_encoded(self, seqs: Sequence[int]) -> None:
        """These kept frames are in the engine's caches (a warm-up carried them)."""
        with self._lock:
            live = {f.seq for f in self._buffer.frames}
            self._encoded = {q for q in self._encoded if q in live} | {q for q in seqs if q in live}

    def encoded_count(self, seqs: Sequence[int]) -> int:
        with self._lock:
            return sum(q in self._encoded for q in seqs)

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
            self._buffer.configure(new.max_frames, new.evs_enabled, new.evs_threshold, new.keepalive_s)
            if new.audio_seconds != self.settings.audio_seconds:
                self._audio.set_cap(new.audio_seconds)
            self.settings = new
        logger.debug("session %s: settings changed %s", self.id, changes)

    def reset(self) -> None:
        """Drop all frames, audio and counts; settings and the source stay."""
        with self._lock:
            self._buffer.clear()
            self._audio.clear()
            self._encoded = set()
            self.timeline_start = None
            self.last_activity = time.monotonic()

    # -- introspection -----------------------------------------------------

    frame_count = property(lambda self: len(self._buffer.frames), doc="Frames in the buffer now.")
    kept_count = property(lambda self: self._buffer.kept,
                          doc="Frames kept so far: changes exactly when the buffer gains a frame.")
    scene_changes = property(lambda self: self._buffer.scene_changes,
                             doc="Kept frames where most of the picture changed at once (watch mode).")
    last_scene_change_t = property(lambda self: self._buffer.last_scene_change_t)
    newest_frame_time = property(lambda self: self._buffer.newest_received_t, doc=(
        "Capture time of the newest frame received (kept or dropped): shows the stream is alive."))

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
            frames = self._buffer.frames
            return frames[0].seq if frames else None

    @property
    def memory_bytes(self) -> int:
        """Bytes held by stored frames and audio."""
        with self._lock:
            return sum(f.pixels.nbytes for f in self._buffer.frames) + self._audio.nbytes

    def recent_kept(self, n: int) -> list[tuple[int, float, np.ndarray]]:
        """The n newest kept frames as (ring index, time, pixels), oldest first."""
        with self._lock:
            frames = list(self._buffer.frames)
        start = max(0, len(frames) - n)
        return [(i, f.t, f.pixels) for i, f in enumerate(frames[start:], start)]

    @property
    def stats(self) -> dict[str, Any]:
        with self._lock:
            arrival = self._buffer.newest_arrival
            return {
                **self._buffer.stats(max_frames=self.settings.max_frames, audio_seconds=self._audio.seconds),
                # By arrival on this process's clock, so it works whatever clock t uses.
                "newest_frame_age_s": time.monotonic() - arrival if arrival is not None else None,
            }
