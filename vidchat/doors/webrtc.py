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
"""

from __future__ import annotations

import asyncio
import collections
import functools
import hmac
import json
import logging
import math
import posixpath
import time
from typing import Any, AsyncIterator, Callable

import av
import numpy as np
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from aiortc.rtp import RtcpSrPacket
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import StreamingResponse

from vidchat.app.access import login_of
from vidchat.app.turn import TurnError
from vidchat.conversation.sessions import Entry, TooManySessions
from vidchat.media import AUDIO_RATE
from vidchat.media.clock import SenderClock, SOURCE_KINDS, TrackClock
from vidchat.media.evs import FrameError
from vidchat.media.workers import run_media

log = logging.getLogger(__name__)
# Tasks started by a request and outliving it (held so they are not collected).
_background: set[asyncio.Task] = set()

# Decoder outputs whose first plane is 8-bit luma at full size.
LUMA_FIRST_FORMATS = frozenset({"yuv420p", "yuvj420p", "nv12", "yuv422p", "yuv444p"})
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


async def consume_video(track, entry: Entry, stats: MediaStats,
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

    def render_rgb(frame: av.VideoFrame, width: int, height: int) -> np.ndarray:
        if (width, height) == (frame.width, frame.height):
            return frame.to_ndarray(format="rgb24")
        # Area averaging: the downscale stays free of aliasing for the model.
        return frame.reformat(width=width, height=height, format="rgb24", interpolation="AREA").to_ndarray()

    def process(frame: av.VideoFrame, due: float) -> None:
        try:
            if frame.format.name in LUMA_FIRST_FORMATS:
                # The filter needs only luma: the Y plane, read in place. Most
                # frames are dropped and never pay for conversion to RGB.
                plane = frame.planes[0]
                luma = np.frombuffer(plane, np.uint8).reshape(frame.height, plane.line_size)[:, : frame.width]
                session.add_luma_frame(luma, lambda w, h: render_rgb(frame, w, h), t=due)
            else:
                session.add_frame(frame.to_ndarray(format="rgb24"), t=due)
        except FrameError as exc:
            stats.bad_frames += 1
            log.warning("session %s…: dropped a bad video frame: %s", session.id[:6], exc)
        stats.lags_ms.append((time.monotonic() - due) * 1000)

    reading = asyncio.create_task(reader())
    try:
        while True:
            await ready.wait()
            ready.clear()
            item, newest[0] = newest[0], None
            if item is not None:
                # Off the event loop: pixel conversion and the filter must not
                # stall signalling, other sessions or streamed answers.
                await run_media(process, *item)
            elif ended:
                break
    finally:
        reading.cancel()
    await reading  # the track's end (MediaStreamError) or its failure, raised here


async def consume_audio(track, entry: Entry, stats: MediaStats) -> None:
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


async def run_consumer(consume, track, entry: Entry, stats: MediaStats, on_failure) -> None:
    """Run one track's consumer; the track ending is normal, anything else
    ends the session with the cause (never a frozen picture with live audio)."""
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


async def _read_json(request: Request) -> dict[str, Any]:
    # sendBeacon posts text/plain, so parse the body whatever its type says.
    try:
        body = json.loads(await request.body() or b"{}")
    except json.JSONDecodeError:
        raise HTTPException(400, "body must be JSON")
    if not isinstance(body, dict):
        raise HTTPException(400, "body must be a JSON object")
    return body


class Peer:
    """One aiortc peer feeding one session; a resumed session gets a new Peer."""

    def __init__(self, state, entry: Entry, peers: dict[str, "Peer"],
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
        if self.close in self.entry.closers:
            self.entry.closers.remove(self.close)
        if self.peers.get(self.sid) is self:
            del self.peers[self.sid]
        for task in self.consumers:
            task.cancel()
        if self._connect_watch is not None and self._connect_watch is not asyncio.current_task():
            self._connect_watch.cancel()
        await self.pc.close()


async def _read_offer(request: Request) -> dict[str, Any]:
    body = await _read_json(request)
    if body.get("type") != "offer" or not isinstance(body.get("sdp"), str):
        raise HTTPException(400, "expected {type: 'offer', sdp: '...'}")
    sections = [line.split(None, 1)[0][2:] for line in body["sdp"].splitlines() if line.startswith("m=") and " " in line]
    counts = collections.Counter(sections)
    if not counts["video"] and not counts["audio"]:
        raise HTTPException(400, "the offer carries no audio or video track")
    if counts["video"] > 1 or counts["audio"] > 1 or len(sections) > counts["video"] + counts["audio"]:
        raise HTTPException(400, f"an offer may carry one video and one audio track; this one has "
                                 f"{', '.join(f'{n} {kind}' for kind, n in counts.items())}")
    return body


SOURCE_NAME_MAX = 200
SOURCE_RATE_MAX = 16.0  # browsers refuse playbackRate above 16


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse_source_report(body: dict[str, Any]) -> dict[str, Any]:
    """A page's /webrtc/source report as :meth:`vidchat.conversation.session.Session.set_source`
    arguments; raises ValueError naming the first bad field."""
    sid = body.get("session_id")
    if not isinstance(sid, str) or not sid:
        raise ValueError("session_id must be the session's id (text)")
    kind = body.get("kind")
    if kind not in SOURCE_KINDS:
        raise ValueError(f"kind must be one of {', '.join(SOURCE_KINDS)}, got {kind!r}")
    out: dict[str, Any] = {"session_id": sid, "kind": kind}
    at = body.get("at")
    if at is not None:
        if not _finite(at) or at <= 0:
            raise ValueError(f"at must be the page's time in ms since the Unix epoch, or null, got {at!r}")
        out["at_sender_s"] = float(at) / 1000.0
    if kind != "file":
        return out
    name = body.get("name")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"name must be the file's name (text) or null, got {type(name).__name__}")
    if name:
        # Only the base name: a path would say more about the viewer's disk than the record needs.
        name = posixpath.basename(name.replace("\\", "/")).strip()[:SOURCE_NAME_MAX] or None
    position = body.get("position")
    if not _finite(position) or position < 0:
        raise ValueError(f"position must be a number of seconds >= 0, got {position!r}")
    playing = body.get("playing", True)
    if not isinstance(playing, bool):
        raise ValueError(f"playing must be true or false, got {playing!r}")
    rate = body.get("rate", 1.0)
    if not _finite(rate) or not 0 < rate <= SOURCE_RATE_MAX:
        raise ValueError(f"rate must be a number in (0, {SOURCE_RATE_MAX:g}], got {rate!r}")
    duration = body.get("duration")
    if duration is not None and (not _finite(duration) or duration <= 0):
        raise ValueError(f"duration must be a positive number of seconds or null, got {duration!r}")
    loop = body.get("loop", False)
    if not isinstance(loop, bool):
        raise ValueError(f"loop must be true or false, got {loop!r}")
    out.update(name=name, position_s=float(position), playing=playing, rate=float(rate),
               duration_s=None if duration is None else float(duration), loop=loop)
    return out


def _resumable(state, body: dict[str, Any], login: str | None) -> Entry | None:
    """The session a reconnecting tab proves it owns, or None."""
    resume = body.get("resume")
    if not isinstance(resume, dict):
        return None
    sid, token = resume.get("session_id"), resume.get("token")
    if not isinstance(sid, str) or not isinstance(token, str):
        return None
    entry = state.registry.get_for(sid, login)
    if entry is None or entry.kind != "webrtc":
        return None
    return entry if hmac.compare_digest(token.encode(), entry.resume_token.encode()) else None


def talk_answer(entry: Entry) -> dict[str, Any] | None:
    """The session's answer being generated, else its last one, as the page
    reads it aloud: its question number, its text so far, and whether it is done."""
    answer = entry.answer
    done = answer is None
    if answer is None and entry.answers:
        answer = next(reversed(entry.answers.values()))
    if answer is None:
        return None
    stats = answer.reply.stats
    return {"n": answer.ticket, "text": answer.reply.text, "done": done or stats.finish_reason is not None,
            "cancelled": bool(stats.cancelled), "spoken": answer.spoken is not None}


# How often the Talk stream looks at the state (a dict read, no I/O) and
# how long it stays silent at most (a proxy may close an idle stream).
TALK_STREAM_CHECK_S = 0.05
TALK_KEEPALIVE_S = 15.0


def talk_state_of(entry: Entry) -> dict[str, Any]:
    """Talk mode's state for the page: whether speech is under way, counters
    whose change means a turn began (the page stops reading aloud:
    barge-in) or ended, and the answer being read aloud."""
    listener = entry.talk
    out: dict[str, Any] = {"listening": False, "hearing": False, "speech_starts": 0, "utterances": 0,
                           "barge_ins": 0, "answer": talk_answer(entry)}
    if listener is not None and listener.running:
        out.update(listening=True, hearing=listener.hearing, speech_starts=listener.speech_starts,
                   utterances=listener.stats.utterances, barge_ins=listener.stats.barge_ins,
                   playback=listener.playback)
    return out


def router(state) -> APIRouter:
    api = APIRouter()
    peers: dict[str, Peer] = {}  # session id -> its current peer

    def mine(request: Request, sid: Any) -> Entry:
        """The session a request names, if its login opened it: else 403 (another's) or 404."""
        entry = state.registry.get(sid) if isinstance(sid, str) else None
        if entry is None:
            raise HTTPException(404, "no such session (stopped or expired)")
        if state.registry.get_for(sid, login_of(request.headers)) is None:
            raise HTTPException(403, "this session belongs to another login")
        return entry

    @api.post("/webrtc/offer")
    async def offer(request: Request) -> dict[str, Any]:
        body = await _read_offer(request)
        try:
            # Before any session exists: a relay that can't be had leaves nothing behind.
            ice_servers = await state.ice_config()
        except TurnError as exc:
            raise HTTPException(503, f"Cannot connect from behind NAT now: {exc}.")
        entry = _resumable(state, body, login_of(request.headers))
        resumed = entry is not None
        if resumed:
            old = peers.get(entry.session.id)
            if old is not None:
                await old.close()
        else:
            try:
                entry = state.new_session("webrtc", client=request.client.host if request.client else None,
                                          owner=login_of(request.headers))
            except TooManySessions as exc:
                raise HTTPException(503, str(exc))
        sid = entry.session.id
        peer = Peer(state, entry, peers, ice_servers)
        try:
            local = await peer.answer(body["sdp"])
        except Exception as exc:
            await state.registry.close(sid, "bad offer")
            raise HTTPException(400, f"could not use this offer: {exc}")
        entry.session.last_activity = time.monotonic()
        peer.watch_connect(state.settings.connect_timeout)
        log.info("session %s… %s", sid[:6], "resumed by its tab" if resumed else "peer created")
        return {"sdp": local.sdp, "type": local.type, "session_id": sid,
                "resume_token": entry.resume_token, "resumed": resumed}

    @api.post("/webrtc/close")
    async def close(request: Request) -> dict[str, Any]:
        body = await _read_json(request)
        sid = str(body.get("session_id", ""))
        if state.registry.get(sid) is not None:
            mine(request, sid)
        closed = await state.registry.close(sid, "stopped by the page")
        return {"closed": closed}

    @api.post("/webrtc/source")
    async def source(request: Request) -> dict[str, Any]:
        """Where the page's video source is: a file's position, or a switch to camera or screen."""
        body = await _read_json(request)
        try:
            report = parse_source_report(body)
        except ValueError as exc:
            raise HTTPException(400, str(exc))
        entry = mine(request, report.pop("session_id"))
        # Placed by the page's clock when the session knows how it maps onto
        # the frames' (see the module's docstring), else by arrival.
        arrival = time.monotonic()
        placed, by_sender = entry.session.set_source(**report)
        # Where the report landed relative to its arrival: the video path's lead.
        return {"ok": True, "placed_by": "sender clock" if by_sender else "arrival",
                "placed_ms": round((placed - arrival) * 1000, 1)}

    @api.post("/webrtc/typing")
    async def typing(request: Request) -> dict[str, Any]:
        """The page's user is typing a question: warm this session's prompt now
        (vidchat.conversation.prewarm). ``"enter": true``: the question was just sent; its
        sample is taken now, as the user pressed Enter, and warmed."""
        body = await _read_json(request)
        entry = mine(request, str(body.get("session_id", "")))
        if state.prewarmer is not None:
            state.prewarmer.question_coming(entry.session.id)
            if body.get("enter") is True:
                # Answered at once: the page's few connections are for its question.
                task = asyncio.ensure_future(state.prewarmer.question_now(entry.session.id))
                _background.add(task)
                task.add_done_callback(_background.discard)
        return {"ok": True, "prewarm": state.prewarmer.mode if state.prewarmer else "off"}

    @api.get("/webrtc/talk")
    async def talk_state(request: Request, session_id: str) -> dict[str, Any]:
        """Talk mode's state once (the page follows /webrtc/talk/stream)."""
        return talk_state_of(mine(request, session_id))

    @api.get("/webrtc/talk/stream")
    async def talk_stream(request: Request, session_id: str) -> StreamingResponse:
        """Talk mode's state pushed to the page while Talk is on, one JSON
        line each time it changes (a line every TALK_KEEPALIVE_S at the
        least), until the session ends or the page stops reading: one
        request for the whole of Talk, not seven a second."""
        entry = mine(request, session_id)

        async def lines() -> AsyncIterator[bytes]:
            last, last_sent = None, 0.0
            while state.registry.get(session_id) is entry:
                now = time.monotonic()
                current = talk_state_of(entry)
                if current != last or now - last_sent >= TALK_KEEPALIVE_S:
                    last, last_sent = current, now
                    yield (json.dumps(current) + "\n").encode()
                await asyncio.sleep(TALK_STREAM_CHECK_S)

        return StreamingResponse(lines(), media_type="application/x-ndjson",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    @api.post("/webrtc/talk")
    async def talk_playback(request: Request) -> dict[str, Any]:
        """The page started or stopped reading an answer aloud: its own voice,
        coming back through the microphone, must not be taken for a question."""
        body = await _read_json(request)
        entry = mine(request, str(body.get("session_id", "")))
        speaking = body.get("speaking")
        if not isinstance(speaking, bool):
            raise HTTPException(400, "'speaking' must be true or false")
        if entry.talk is not None:
            entry.talk.set_playback(speaking)
        return {"ok": True, "listening": entry.talk is not None and entry.talk.running}

    @api.get("/webrtc/live")
    async def live(request: Request, session_id: str) -> dict[str, Any]:
        """The live view's strip of kept frames and answer timings (polled every few seconds)."""
        from vidchat.doors.inputs import live_view

        entry = mine(request, session_id)
        return await asyncio.to_thread(live_view, entry)

    @api.get("/webrtc/stats")
    async def session_stats(request: Request, session_id: str) -> dict[str, Any]:
        entry = state.registry.get(session_id)
        if entry is not None:
            mine(request, session_id)
        else:
            reason = state.registry.closed_reason(session_id)
            raise HTTPException(404, f"session ended: {reason}" if reason else "no such session (stopped or expired)")
        out = dict(entry.session.stats)
        left = entry.time_left()
        out["time_left_s"] = None if left is None else round(left, 1)
        out["watching"] = entry.watching
        if entry.media is not None:
            out["media"] = entry.media.as_dict()
        return out

    return api
