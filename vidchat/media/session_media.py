"""What producers put on one viewer's timeline: kept frames (filtered and
bounded by :mod:`vidchat.media.frame_buffer`), audio
(:class:`vidchat.media.audio.AudioWindow`) and the played file's clock
(:class:`vidchat.media.clock.SourceTimeline`). :class:`vidchat.media.session.Session`
builds on it with the settings' rules and the questions' samples; the
threading rules are the session's (its module says them).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np
from PIL import Image

from vidchat.media import AUDIO_RATE
from vidchat.media.audio import AudioWindow, to_int16
from vidchat.media.clock import SourceTimeline
from vidchat.media.frame_buffer import FrameBuffer
from vidchat.media.session_settings import SessionSettings


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
