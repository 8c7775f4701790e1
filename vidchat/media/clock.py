"""Media time: where a frame or audio chunk sits on its session's timeline.

Every producer (the WebRTC peer, the WebSocket door) stamps what it delivers
with a time on one clock, ``time.monotonic()`` seconds, so frames and audio of
one session line up whatever door they came through.

* A WebRTC track carries 32-bit RTP timestamps that start at a random value
  and wrap (every ~13 h at 90 kHz); a sender may also restart its clock.
  :class:`TrackClock` maps them to arrival time and re-anchors whenever media
  time and arrival disagree by more than ``REANCHOR_S`` either way, so a wrap
  or a jump never stamps frames hours in the past or future.
* A WebSocket client may send ``pts_ms`` (vllm-omni's newer field) and may send
  faster than real time (replays, ``vidchat.qa.client --fast``). Its timestamps
  are trusted going forward (so a fast replay keeps the clip's own spacing);
  only a jump backwards means a new stream and re-anchors. Without ``pts_ms``
  the arrival time is used.

A file played in the page has a second clock: its own position, which pause,
seek, loop and playback rate move independently of the timeline. The page
reports that position when it changes; :class:`SourceTimeline` keeps those
reports so any timeline time can be turned back into a position in the file.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from typing import Any, NamedTuple

from vidchat.media import is_number

log = logging.getLogger(__name__)

# Media time and arrival may drift apart by network jitter and decoder delay;
# beyond this they are not the same stream any more.
REANCHOR_S = 2.0


class TrackClock:
    """Maps one live track's media time (seconds) to monotonic time.

    The mapping is fixed at the first timestamp; a frame that would be stamped
    after its arrival (earlier than the clock predicts) re-anchors so lag is
    never negative; one that disagrees with arrival by more than ``REANCHOR_S``
    (a wrap, a sender restart) re-anchors too."""

    def __init__(self, reanchor_s: float = REANCHOR_S) -> None:
        self.reanchor_s = reanchor_s
        self._origin: float | None = None
        self.reanchors = 0  # after the first anchoring

    def place(self, media_t: float | None, arrived: float) -> float:
        if media_t is None:
            return arrived
        if self._origin is not None:
            lag = arrived - (self._origin + media_t)
            if -1e-6 <= lag <= self.reanchor_s:  # (float rounding is not "early")
                return self._origin + media_t
            self.reanchors += 1
        self._origin = arrived - media_t
        return arrived


class ClientClock:
    """Maps a client's ``pts_ms`` to monotonic time for the WebSocket door.

    Forward time is trusted as sent (replays may run faster than real time);
    a timestamp more than ``REANCHOR_S`` before the newest one seen of the
    same kind starts a new stream anchored at its arrival. Per kind, because
    frames and audio interleave out of step: an audio chunk is stamped at
    its start, seconds behind the newest frame when the chunk is long, and
    that is not a new stream."""

    def __init__(self, reanchor_s: float = REANCHOR_S) -> None:
        self.reanchor_s = reanchor_s
        self._origin: float | None = None
        self._newest: dict[str, float] = {}
        self.reanchors = 0  # after the first anchoring

    def place(self, pts_ms: float | None, arrived: float | None = None, kind: str = "video") -> float:
        if arrived is None:
            arrived = time.monotonic()
        if pts_ms is None:
            return arrived
        media_t = pts_ms / 1000.0
        newest = self._newest.get(kind)
        if self._origin is None or (newest is not None and media_t < newest - self.reanchor_s):
            if self._origin is not None:
                self.reanchors += 1
            self._origin = arrived - media_t
            self._newest = {}  # a new stream: every kind's times start again
        self._newest[kind] = max(self._newest.get(kind, media_t), media_t)
        return self._origin + media_t


# Seconds from the NTP epoch (1900) to the Unix epoch (1970).
NTP_TO_UNIX_S = 2_208_988_800
# A sender-clock placement further than this from the report's arrival is
# not trusted (a sender whose clocks disagree): the arrival time is used.
SENDER_PLACEMENT_MAX_S = 1.0


def ntp_to_unix(ntp: int) -> float:
    """A 64-bit NTP timestamp (RTCP sender report) as Unix seconds."""
    return (ntp >> 32) - NTP_TO_UNIX_S + (ntp & 0xFFFFFFFF) / 2**32


class SenderClock:
    """Maps a track's RTP timestamps to the sender's wall clock.

    A browser stamps each video frame's RTP time at capture, and its RTCP
    sender reports pair an RTP time with its own wall-clock (NTP) time. With
    the newest pair, any frame's capture moment is known on the browser's
    clock, the same clock the page reads ``Date.now()`` from. That lets an
    event the page reports (a seek) be placed among the frames by when it
    happened, not by when its HTTP request overtook the video."""

    def __init__(self, clock_rate: int = 90_000) -> None:
        self.clock_rate = clock_rate
        self._pair: tuple[float, int] | None = None  # (sender Unix seconds, RTP timestamp)

    def observe_report(self, ntp: int, rtp_timestamp: int) -> None:
        self._pair = (ntp_to_unix(ntp), rtp_timestamp & 0xFFFFFFFF)

    def sender_time(self, rtp_timestamp: int) -> float | None:
        """The sender's Unix time of the frame with ``rtp_timestamp``; None before a report."""
        if self._pair is None:
            return None
        wall, rtp = self._pair
        # 32-bit RTP time wraps: the signed difference to the report's.
        delta = ((rtp_timestamp - rtp + 2**31) & 0xFFFFFFFF) - 2**31
        return wall + delta / self.clock_rate


# What a sender (the page) may say its source is; a stream of --stream is the server's own.
SENT_SOURCE_KINDS = ("camera", "screen", "file")
SOURCE_KINDS = (*SENT_SOURCE_KINDS, "stream")
# Sources whose frames have a position on their own clock: a file's seconds, a stream's time.
POSITIONED_KINDS = ("file", "stream")



# About four minutes of once-a-second reports: more than the frame ring spans
# while a file plays; frames keep the position they were given at ingest.
SOURCE_HISTORY = 256
# A report that puts the file more than this away from where the previous one
# had it by now is a jump (a seek, or a loop the page saw late), not drift.
JUMP_MIN_S = 0.25
# How far a frame's capture can stray from the moment its picture was shown,
# either way, in a busy browser tab (tests/test_page.py measured 30-60 ms
# both ways on 2 busy cores). A frame captured this close to a jump may have
# been shown on either side of it: its position is a best guess, and records
# say so (frame_source_at_jump).
JUMP_WINDOW_S = 0.15


class SourceSegment(NamedTuple):
    t: float  # session-timeline time of the report
    kind: str
    name: str | None
    position: float | None  # seconds into the file; None for live sources
    playing: bool
    rate: float
    duration: float | None
    loop: bool
    jumped: bool = False  # the position jumped here (JUMP_MIN_S or more from the previous report's)


def _extrapolate(seg: SourceSegment, t: float) -> float | None:
    """Where ``seg`` puts the file at timeline time ``t`` (None: not a file)."""
    if seg.position is None or not seg.playing:
        return seg.position
    pos = seg.position + (t - seg.t) * seg.rate
    if seg.duration:
        # A looping file wraps before the page's next report says so;
        # one that does not loop stops at its end.
        pos = math.fmod(pos, seg.duration) if seg.loop else min(pos, seg.duration)
    return pos


def _apart(a: float | None, b: float | None, seg: SourceSegment) -> float:
    """Seconds between two positions in ``seg``'s file (on the circle where
    it loops: its extrapolation wrapped at the end)."""
    if a is None or b is None:
        return 0.0
    off = abs(a - b)
    return min(off, seg.duration - off) if seg.loop and seg.duration else off


class SourceTimeline:
    """What a session's video source was, and for a file where it was in the
    file, at any time on the session's timeline.

    Each report starts a segment; between reports a playing file is assumed
    to advance at its rate, so reports are needed only when that assumption
    breaks (pause, seek, rate change, a new source) plus now and then to
    absorb drift. The history is bounded: positions are meant to be looked up
    as frames arrive, not long after. Thread-safe: reports come from the event
    loop while frames are ingested in worker threads."""

    def __init__(self, max_segments: int = SOURCE_HISTORY) -> None:
        self._segments: list[SourceSegment] = []
        self._max = max_segments
        self._lock = threading.Lock()
        # Timeline time minus the browser's clock for the newest video frame
        # (SenderClock); None until the browser's first sender report.
        self.sender_offset: float | None = None

    def place_report(self, kind: str, name: str | None = None, position: float | None = None,
                     playing: bool = True, rate: float = 1.0, t: float | None = None, *,
                     duration: float | None = None, loop: bool = False, at_sender_s: float | None = None,
                     now: float | None = None, who: str = "") -> tuple[float, bool]:
        """Record a source report that comes from the sender: the source is
        ``"camera"``, ``"screen"``, or a ``"file"`` named ``name`` at
        ``position`` seconds, playing at ``rate`` or paused, from timeline
        time ``t`` on. Without ``t``, the report is placed at ``at_sender_s``
        (the sender's clock, where :attr:`sender_offset` says how that maps
        onto the timeline and the result is within SENDER_PLACEMENT_MAX_S of
        ``now``), else at ``now`` (default: the monotonic clock's now).
        Returns the timeline time used and whether the sender's clock placed it."""
        if kind == "file" and (position is None or not is_number(position) or position < 0):
            raise ValueError(f"a file source needs a position in seconds >= 0, got {position!r}")
        if not is_number(rate) or rate <= 0:
            raise ValueError(f"rate must be a positive number, got {rate!r}")
        by_sender = False
        if t is None:
            t = time.monotonic() if now is None else now
            offset = self.sender_offset
            if at_sender_s is not None and offset is not None:
                placed = at_sender_s + offset
                if abs(placed - t) <= SENDER_PLACEMENT_MAX_S:
                    t, by_sender = placed, True
                else:
                    log.debug("session %s: sender clock is %.3f s off arrival; report placed on arrival",
                              who, placed - t)
        self.report(t, kind, name, position, playing, rate, duration, loop)
        return t, by_sender

    def report(self, t: float, kind: str, name: str | None = None, position: float | None = None,
               playing: bool = True, rate: float = 1.0, duration: float | None = None,
               loop: bool = False) -> None:
        """Record that from timeline time ``t`` on the source is ``kind``
        (for a file: at ``position`` seconds, playing or not, at ``rate``)."""
        if kind not in SOURCE_KINDS:
            raise ValueError(f"kind must be one of {', '.join(SOURCE_KINDS)}, got {kind!r}")
        if kind not in POSITIONED_KINDS:
            position, playing, duration, loop = None, False, None, False
        seg = SourceSegment(float(t), kind, name, None if position is None else float(position), bool(playing),
                            float(rate), duration, bool(loop))
        with self._lock:
            before = self._segment_at_locked(seg.t)
            if before is not None and before.kind == kind == "file" and before.name == name:
                seg = seg._replace(jumped=_apart(_extrapolate(before, seg.t), seg.position, before) >= JUMP_MIN_S)
            # Reports normally arrive in time order; one that does not (a
            # caller-given t) still lands where its time says.
            bisect.insort(self._segments, seg, key=lambda s: s.t)
            if len(self._segments) > self._max:
                del self._segments[: len(self._segments) - self._max]

    def _segment_at_locked(self, t: float) -> SourceSegment | None:
        i = bisect.bisect_right(self._segments, t, key=lambda s: s.t)
        return self._segments[i - 1] if i else None

    def _segment_at(self, t: float) -> SourceSegment | None:
        with self._lock:
            return self._segment_at_locked(t)

    def at_jump(self, t: float | None) -> bool:
        """Whether timeline time ``t`` is within JUMP_WINDOW_S of a jump in
        the file's position: a frame captured then may show either side."""
        if t is None:
            return False
        with self._lock:
            lo = bisect.bisect_left(self._segments, t - JUMP_WINDOW_S, key=lambda s: s.t)
            hi = bisect.bisect_right(self._segments, t + JUMP_WINDOW_S, key=lambda s: s.t)
            return any(seg.jumped for seg in self._segments[lo:hi])

    def position_at(self, t: float | None) -> float | None:
        """Seconds into the file at timeline time ``t``; None for a live
        source, before the first report, or for ``t`` None."""
        if t is None:
            return None
        seg = self._segment_at(t)
        return None if seg is None else _extrapolate(seg, t)

    def source_at(self, t: float | None) -> dict[str, Any] | None:
        """``{"kind", "name"}`` of the source at ``t`` (the newest if ``t`` is None); None before any report."""
        if t is None:
            with self._lock:
                seg = self._segments[-1] if self._segments else None
        else:
            seg = self._segment_at(t)
        return None if seg is None else {"kind": seg.kind, "name": seg.name}
