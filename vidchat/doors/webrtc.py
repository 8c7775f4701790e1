"""WebRTC door: one aiortc peer per browser tab, feeding that tab's session.

The browser posts its offer to `/webrtc/offer` and gets the answer back in
the same response (aiortc gathers its ICE candidates before
`setLocalDescription` returns, so no trickle ICE is needed). Video is consumed
newest-frame-only: a reader drains the track continuously and a processor
takes whatever frame is newest when it is free, so a slow filter or a busy
CPU drops frames instead of building lag. Each track's RTP time is mapped to
the session's timeline by a :class:`~vidchat.media.clock.TrackClock`.

A peer that fails (a network blip) does not end its session: the answer to
the first offer carries a ``resume_token`` only that tab holds, and an offer
that presents it within ``--session-idle-timeout`` gets a new peer on the
same session (same buffer, same chat). A media consumer that fails for any
other reason ends the session with the cause, which the page shows.

A file played in the page reaches the server like a camera: its frames carry
no position in the file. The page therefore reports the file's position to
``/webrtc/source`` whenever it jumps or stops (play, pause, seek, loop, rate)
and once a second while playing; the session's
:class:`~vidchat.media.clock.SourceTimeline` turns that into each frame's position.
Video takes longer to arrive than the report (encoding, RTP, decoding), so
stamping the report on arrival dated the last frames before a seek at its
target (seen in CI, 2 s off). The report therefore carries the page's clock
(``at``, ms since the Unix epoch) and the server places it among the frames on
the browser's own clock: the browser's RTCP sender reports pair RTP time with
its wall clock, so each frame's capture moment is known on that clock too
(:class:`~vidchat.media.clock.SenderClock`). Before the first sender report, or if
the two clocks disagree by more than a second, the arrival time is used.

This module is the peer and its media; the page's HTTP routes (the offer,
source reports, Talk's state) are :mod:`vidchat.doors.webrtc_routes`.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from typing import Any, Callable

import av
import numpy as np
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from aiortc.rtp import RtcpSrPacket

from vidchat.conversation import events
from vidchat.conversation.conversation import Conversation, detach_stream
from vidchat.doors import Server
from vidchat.media import AUDIO_RATE
from vidchat.media.clock import SenderClock, TrackClock
from vidchat.media.evs import FrameError
from vidchat.media.session import offer_decoded
from vidchat.media.workers import run_media

log = logging.getLogger(__name__)

# What the page calls each track when it stops.
TRACK_NAMES = {"video": "camera", "audio": "microphone"}


def rtc_configuration(ice_servers: list[dict[str, Any]]) -> RTCConfiguration:
    servers = [
        RTCIceServer(urls=s["urls"], username=s.get("username"), credential=s.get("credential")) for s in ice_servers
    ]
    # An empty list, not None: None makes aiortc fall back to a public STUN
    # server, and a localhost deployment should contact nobody.
    return RTCConfiguration(iceServers=servers)


class MediaStats:
    """Counters the page's status line and the tests read."""

    def __init__(self) -> None:
        self.video_frames_seen = 0  # frames delivered by the track
        self.video_frames_skipped = 0  # replaced by a newer one before processing
        self.bad_frames = 0
        self.audio_chunks = 0
        self.lags_ms: collections.deque[float] = collections.deque(maxlen=600)
        self.tracks: list[str] = []

    def as_dict(self) -> dict[str, Any]:
        lags = sorted(self.lags_ms)
        pick = (lambda q: round(lags[min(len(lags) - 1, int(q * (len(lags) - 1)))], 1)) if lags else (lambda q: None)
        return {
            "tracks": list(self.tracks),
            "video_frames_seen": self.video_frames_seen,
            "video_frames_skipped": self.video_frames_skipped,
            "bad_frames": self.bad_frames,
            "audio_chunks": self.audio_chunks,
            "lag_ms_p50": pick(0.5),
            "lag_ms_p95": pick(0.95),
            "lag_ms_max": round(lags[-1], 1) if lags else None,
        }


def watch_sender_reports(receiver) -> Callable[[av.VideoFrame], float | None] | None:
    """A function giving each decoded frame's capture time on the sender's
    clock (None until its first RTCP sender report), or None where this
    aiortc does not expose what it needs.

    aiortc keeps sender reports and the RTP time origin of decoded frames to
    itself, so both are read from its internals (aiortc is pinned below 2);
    without them the page's reports are placed by arrival, as before."""
    mapper = getattr(receiver, "_RTCRtpReceiver__timestamp_mapper", None)
    handle = getattr(receiver, "_handle_rtcp_packet", None)
    if mapper is None or not hasattr(mapper, "_origin") or handle is None:
        log.warning("this aiortc hides RTCP sender reports: file positions are placed by arrival time")
        return None
    clock = SenderClock()

    async def handle_rtcp(packet) -> None:
        if isinstance(packet, RtcpSrPacket):
            clock.observe_report(packet.sender_info.ntp_timestamp, packet.sender_info.rtp_timestamp)
        await handle(packet)

    receiver._handle_rtcp_packet = handle_rtcp

    def capture_time(frame: av.VideoFrame) -> float | None:
        origin = mapper._origin
        if frame.pts is None or origin is None:
            return None
        return clock.sender_time((frame.pts + origin) & 0xFFFFFFFF)

    return capture_time


async def consume_video(track, entry: Conversation, stats: MediaStats,
                        capture_time: Callable[[av.VideoFrame], float | None] | None = None) -> None:
    session = entry.session
    newest: list[tuple[av.VideoFrame, float] | None] = [None]
    ready = asyncio.Event()
    clock = TrackClock()
    ended = False

    async def reader() -> None:
        nonlocal ended
        try:
            while True:
                frame = await track.recv()
                now = time.monotonic()
                stats.video_frames_seen += 1
                if newest[0] is not None:
                    stats.video_frames_skipped += 1
                t = clock.place(media_time(frame), now)
                captured = capture_time(frame) if capture_time is not None else None
                if captured is not None:
                    session.note_sender_clock(t - captured)
                newest[0] = (frame, t)
                ready.set()
        finally:
            ended = True
            ready.set()

    def process(frame: av.VideoFrame, due: float) -> None:
        _take_frame(session, stats, frame, due)

    reading = asyncio.create_task(reader())
    try:
        while True:
            await ready.wait()
            ready.clear()
            item, newest[0] = newest[0], None
            if item is not None:
                # Off the event loop: pixel conversion and the filter must not
                # stall signalling, other sessions or streamed answers.
                await run_media(process, *item, share=session.id)
            elif ended:
                break
    finally:
        reading.cancel()
    await reading  # the track's end (MediaStreamError) or its failure, raised here


def _take_frame(session: Any, stats: MediaStats, frame: av.VideoFrame, due: float) -> None:
    """One decoded frame into the session's filter and buffer (in a media worker thread)."""
    try:
        offer_decoded(session, frame, due)
    except FrameError as exc:
        stats.bad_frames += 1
        log.warning("session %s…: dropped a bad video frame: %s", session.id[:6], exc)
    stats.lags_ms.append((time.monotonic() - due) * 1000)


async def consume_audio(track, entry: Conversation, stats: MediaStats) -> None:
    session = entry.session
    resampler = av.AudioResampler(format="flt", layout="mono", rate=AUDIO_RATE)
    clock = TrackClock()
    while True:
        frame = await track.recv()
        stats.audio_chunks += 1
        t = clock.place(media_time(frame), time.monotonic())
        for out in resampler.resample(frame):
            samples = out.to_ndarray().reshape(-1).astype(np.float32, copy=False)
            session.add_audio(samples, t)
            t = None  # a second output continues the first


def media_time(frame: av.frame.Frame) -> float | None:
    """A decoded frame's presentation time in seconds (RTP time: may wrap)."""
    if frame.pts is None or frame.time_base is None:
        return None
    return float(frame.pts * frame.time_base)


async def run_consumer(consume, track, entry: Conversation, stats: MediaStats, on_failure) -> None:
    """Run one track's consumer; the track ending is normal, anything else
    ends the session with the cause (never a frozen picture with live audio)."""
    events.bind(entry.session.id, entry.kind)  # this consumer task's log lines
    try:
        await consume(track, entry, stats)
    except MediaStreamError:
        return  # the track ended: the peer closed or was replaced
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        name = TRACK_NAMES.get(track.kind, track.kind)
        reason = f"{name} stream stopped: {type(exc).__name__}: {exc}"[:300]
        log.error("session %s…: %s", entry.session.id[:6], reason, exc_info=True)
        await on_failure(reason)


class Peer:
    """One aiortc peer feeding one session; a resumed session gets a new Peer."""

    def __init__(self, state: Server, entry: Conversation, peers: dict[str, "Peer"],
                 ice_servers: list[dict[str, Any]] | None = None) -> None:
        self.state = state
        self.entry = entry
        self.peers = peers  # the router's map of each session's current peer
        peers[entry.session.id] = self
        self.pc = RTCPeerConnection(rtc_configuration(state.ice_servers if ice_servers is None else ice_servers))
        self.consumers: list[asyncio.Task] = []
        self._connect_watch: asyncio.Task | None = None
        self.connected_once = False
        self.closed = False
        if entry.media is None:
            entry.media = MediaStats()
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_state)
        entry.closers.append(self.close)

    @property
    def sid(self) -> str:
        return self.entry.session.id

    def _on_track(self, track) -> None:
        stats = self.entry.media
        stats.tracks.append(track.kind)
        consume = {"video": consume_video, "audio": consume_audio}.get(track.kind)
        if track.kind == "video":
            receiver = next((r for r in self.pc.getReceivers() if r.track is track), None)
            capture_time = watch_sender_reports(receiver) if receiver is not None else None
            consume = functools.partial(consume_video, capture_time=capture_time)
        if consume is not None:
            task = asyncio.create_task(run_consumer(consume, track, self.entry, stats, self._media_failed))
            self.consumers.append(task)

    async def _media_failed(self, reason: str) -> None:
        await self.state.registry.close(self.sid, reason)

    async def _on_state(self) -> None:
        state = self.pc.connectionState
        log.info("session %s… peer %s", self.sid[:6], state)
        if state == "connected":
            self.connected_once = True
        if self.peers.get(self.sid) is self:
            # Not connected (still connecting, or the tab dropped and may
            # come back): no media, no question soon, so no warm-ups.
            self.entry.away = state != "connected"
        if state == "failed":
            # Not the session's end: the tab may come back with its resume
            # token; if it doesn't, the idle reaper ends the session.
            await self.close()

    def watch_connect(self, timeout_s: float) -> None:
        """End the session if this peer has not connected within `timeout_s`:
        an offer whose ICE never completes must not hold a place for long."""

        async def watch() -> None:
            await asyncio.sleep(timeout_s)
            # Only a peer that never connected: one that connected and then
            # dropped is the resume window's and the idle reaper's business.
            if not self.closed and not self.connected_once and self.peers.get(self.sid) is self:
                await self.state.registry.close(self.sid, f"the connection was not established within {timeout_s:g} s")

        if timeout_s > 0:
            self._connect_watch = asyncio.create_task(watch())

    async def answer(self, sdp: str) -> RTCSessionDescription:
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        return self.pc.localDescription

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        # A tab watching a stream (--stream) watches it through its peer: without
        # one it is idle like any tab (a resume attaches it again).
        detach_stream(self.entry, self.state.streams)
        if self.close in self.entry.closers:
            self.entry.closers.remove(self.close)
        if self.peers.get(self.sid) is self:
            del self.peers[self.sid]
            self.entry.away = True  # until a resume brings a new peer
        for task in self.consumers:
            task.cancel()
        if self._connect_watch is not None and self._connect_watch is not asyncio.current_task():
            self._connect_watch.cancel()
        await self.pc.close()


