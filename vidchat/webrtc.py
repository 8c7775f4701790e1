"""WebRTC door: one aiortc peer per browser tab, feeding that tab's session.

The browser posts its offer to `/webrtc/offer` and gets the answer back in
the same response (aiortc gathers its ICE candidates before
`setLocalDescription` returns, so no trickle ICE is needed). Video is consumed
newest-frame-only: a reader drains the track continuously and a processor
takes whatever frame is newest when it is free, so a slow filter or a busy
CPU drops frames instead of building lag.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from typing import Any

import av
import numpy as np
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from fastapi import APIRouter, HTTPException, Request

from vidchat.evs import FrameError
from vidchat.sessions import Entry, TooManySessions

log = logging.getLogger(__name__)

AUDIO_RATE = 16_000
# Decoder outputs whose first plane is 8-bit luma at full size.
LUMA_FIRST_FORMATS = frozenset({"yuv420p", "yuvj420p", "nv12", "yuv422p", "yuv444p"})


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


class _StreamClock:
    """Maps a track's presentation timestamps to local monotonic time, so lag
    is measured from when a frame was due, not from when we happened to read it."""

    def __init__(self) -> None:
        self._origin: float | None = None

    def due(self, frame: av.frame.Frame, arrived: float) -> float:
        if frame.pts is None or frame.time_base is None:
            return arrived
        media_t = float(frame.pts * frame.time_base)
        if self._origin is None or arrived - (self._origin + media_t) < 0:
            # First frame, or one that came earlier than the clock predicts:
            # re-anchor so lag is never negative.
            self._origin = arrived - media_t
        return self._origin + media_t


async def consume_video(track, entry: Entry, stats: MediaStats) -> None:
    session = entry.session
    newest: list[tuple[av.VideoFrame, float] | None] = [None]
    ready = asyncio.Event()
    clock = _StreamClock()
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
                newest[0] = (frame, clock.due(frame, now))
                ready.set()
        except MediaStreamError:
            pass
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
                await asyncio.to_thread(process, *item)
            elif ended:
                return
    finally:
        reading.cancel()


async def consume_audio(track, entry: Entry, stats: MediaStats) -> None:
    session = entry.session
    resampler = av.AudioResampler(format="flt", layout="mono", rate=AUDIO_RATE)
    try:
        while True:
            frame = await track.recv()
            stats.audio_chunks += 1
            for out in resampler.resample(frame):
                samples = out.to_ndarray().reshape(-1).astype(np.float32, copy=False)
                session.add_audio(samples)
    except MediaStreamError:
        pass


async def _read_json(request: Request) -> dict[str, Any]:
    # sendBeacon posts text/plain, so parse the body whatever its type says.
    try:
        body = json.loads(await request.body() or b"{}")
    except json.JSONDecodeError:
        raise HTTPException(400, "body must be JSON")
    if not isinstance(body, dict):
        raise HTTPException(400, "body must be a JSON object")
    return body


def router(state) -> APIRouter:
    api = APIRouter()

    @api.post("/webrtc/offer")
    async def offer(request: Request) -> dict[str, Any]:
        body = await _read_json(request)
        if body.get("type") != "offer" or not isinstance(body.get("sdp"), str):
            raise HTTPException(400, "expected {type: 'offer', sdp: '...'}")
        if "\nm=video" not in body["sdp"] and "\nm=audio" not in body["sdp"]:
            raise HTTPException(400, "the offer carries no audio or video track")
        # A tab that restarts its camera replaces its old peer and session.
        old = body.get("session_id")
        if isinstance(old, str) and state.registry.get(old):
            await state.registry.close(old, "replaced by a new connection")
        try:
            entry = state.registry.create("webrtc", store_max_pixels=state.store_max_pixels())
        except TooManySessions as exc:
            raise HTTPException(503, str(exc))
        sid = entry.session.id
        pc = RTCPeerConnection(rtc_configuration(state.ice_servers))
        stats = MediaStats()
        entry.info["media"] = stats
        consumers: list[asyncio.Task] = []

        async def close_peer() -> None:
            for task in consumers:
                task.cancel()
            await pc.close()

        entry.closers.append(close_peer)

        @pc.on("track")
        def on_track(track) -> None:
            stats.tracks.append(track.kind)
            consume = consume_video if track.kind == "video" else consume_audio if track.kind == "audio" else None
            if consume is not None:
                consumers.append(asyncio.create_task(consume(track, entry, stats)))

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            log.info("session %s… peer %s", sid[:6], pc.connectionState)
            if pc.connectionState in ("failed", "closed"):
                await state.registry.close(sid, f"peer {pc.connectionState}")

        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=body["sdp"], type="offer"))
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as exc:
            await state.registry.close(sid, "bad offer")
            raise HTTPException(400, f"could not use this offer: {exc}")
        return {"sdp": pc.localDescription.sdp, "type": pc.localDescription.type, "session_id": sid}

    @api.post("/webrtc/close")
    async def close(request: Request) -> dict[str, Any]:
        body = await _read_json(request)
        closed = await state.registry.close(str(body.get("session_id", "")), "stopped by the page")
        return {"closed": closed}

    @api.get("/webrtc/stats")
    async def session_stats(session_id: str) -> dict[str, Any]:
        entry = state.registry.get(session_id)
        if entry is None:
            raise HTTPException(404, "no such session (stopped or expired)")
        out = dict(entry.session.stats)
        media = entry.info.get("media")
        if media is not None:
            out["media"] = media.as_dict()
        return out

    return api
