"""One viewer's state: the frame filter, a ring of kept frames, an audio window.

Producers (the WebRTC peer, the WebSocket door) put timestamped frames and
audio on the session's one timeline (:mod:`vidchat.media.session_media`); a
question takes a :class:`Sample` of frames (and the audio that goes with
them) out of the ring.

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
import time
from typing import Any, Sequence

import numpy as np

from vidchat.media.audio import AudioWindow, segment_samples
from vidchat.media.clock import SourceTimeline
from vidchat.media.evs import FrameError
from vidchat.media.frame_buffer import StoredFrame
from vidchat.media.sampling import Sample, pick, within_encode_budget
from vidchat.media.session_media import SessionMedia
from vidchat.media import DEFAULT_MAX_FRAME_BYTES, DEFAULT_MAX_FRAME_PIXELS, DEFAULT_STORE_MAX_PIXELS, MIN_AUDIO_SAMPLES
from vidchat.media.numbers import is_int
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


__all__ = ["FrameError", "Session", "SessionSettings", "Sample"]


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
        self._in_flight: set[int] = set()  # being encoded by a warm-up now
        self.encode_budget: int | None = None
        # Frames a socket door dropped over --ws-max-fps, before decoding: they
        # never reach the buffer, so frames_received does not count them.
        self.frames_rate_dropped = 0

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
            picked, substituted, left_out = within_encode_budget(frames, candidates, picked, self._encoded, budget,
                                                                 self._in_flight)
            new_frames = sum(frames[i].seq not in self._encoded for i in picked)
            audio, audio_parts = _question_audio(self._audio, frames, picked, window_start, span, s, audio_after)
            origin = self.timeline_start if self.timeline_start is not None else 0.0
            tail_open = not self._audio.ends_segment
            self.last_activity = time.monotonic()
        return _sample_of(frames, picked, audio, self.source_timeline, origin=origin, substituted=substituted,
                          left_out=left_out, new_frames=new_frames, audio_parts=audio_parts if audio else (),
                          audio_tail_open=tail_open)

    def mark_encoded(self, seqs: Sequence[int]) -> None:
        """These kept frames are in the engine's caches (a warm-up or a question carried them)."""
        with self._lock:
            live = {f.seq for f in self._buffer.frames}
            self._encoded = {q for q in self._encoded if q in live} | {q for q in seqs if q in live}

    def encoding(self, seqs: Sequence[int]) -> None:
        """A warm-up is encoding these frames now (empty: it ended); a
        question counts them against its budget instead of encoding others."""
        with self._lock:
            self._in_flight = set(seqs) - self._encoded

    def being_encoded(self, seqs: Sequence[int]) -> bool:
        """Whether a warm-up is encoding any of these frames now."""
        with self._lock:
            return any(q in self._in_flight for q in seqs)

    def encoded_in_buffer(self) -> int:
        """How many of the kept frames the engine has encoded."""
        with self._lock:
            return sum(f.seq in self._encoded for f in self._buffer.frames)

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
            self._in_flight = set()
            self.timeline_start = None
            self.frames_rate_dropped = 0
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
                **self._buffer.stats(max_frames=self.settings.max_frames, audio_seconds=self._audio.seconds,
                                     frames_rate_dropped=self.frames_rate_dropped),
                # By arrival on this process's clock, so it works whatever clock t uses.
                "newest_frame_age_s": time.monotonic() - arrival if arrival is not None else None,
            }
