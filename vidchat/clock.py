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
  faster than real time (replays, ``vidchat.client --fast``). Its timestamps
  are trusted going forward (so a fast replay keeps the clip's own spacing);
  only a jump backwards means a new stream and re-anchors. Without ``pts_ms``
  the arrival time is used.
"""

from __future__ import annotations

import time

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
    a timestamp more than ``REANCHOR_S`` before the newest one seen starts a new
    stream anchored at its arrival."""

    def __init__(self, reanchor_s: float = REANCHOR_S) -> None:
        self.reanchor_s = reanchor_s
        self._origin: float | None = None
        self._newest: float | None = None

    def place(self, pts_ms: float | None, arrived: float | None = None) -> float:
        if arrived is None:
            arrived = time.monotonic()
        if pts_ms is None:
            return arrived
        media_t = pts_ms / 1000.0
        if self._origin is None or (self._newest is not None and media_t < self._newest - self.reanchor_s):
            self._origin = arrived - media_t
            self._newest = media_t
        self._newest = max(self._newest, media_t)
        return self._origin + media_t
