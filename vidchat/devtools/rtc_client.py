"""A scripted WebRTC client: aiortc standing in for a browser tab.

Used by the tests and `bench/ingest.py`, and handy for driving a server
without a camera: it sends synthetic (or given) video and audio tracks through
the same `/webrtc/offer` endpoint the page uses.
"""

from __future__ import annotations

import asyncio
import fractions
import json
import time
import urllib.request
from typing import Callable

import aioice.ice
import av
import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription

VIDEO_CLOCK = 90_000


class SyntheticVideo(MediaStreamTrack):
    """A camera that films a solid background with a bright square moving
    across it, at a fixed frame rate and size."""

    kind = "video"

    def __init__(self, width: int = 640, height: int = 480, fps: float = 15.0,
                 colour: tuple[int, int, int] = (40, 90, 160), make_frame: Callable[[int], np.ndarray] | None = None):
        super().__init__()
        self.width, self.height, self.fps = width, height, fps
        self.colour = colour
        self.make_frame = make_frame or self._moving_square
        self.sent = 0
        self._start: float | None = None

    def _moving_square(self, i: int) -> np.ndarray:
        frame = np.empty((self.height, self.width, 3), np.uint8)
        frame[:] = self.colour
        side = self.height // 3
        x = int((i * self.width * 0.08) % max(1, self.width - side))
        y = (self.height - side) // 2
        frame[y : y + side, x : x + side] = (235, 235, 235)
        return frame

    async def recv(self) -> av.VideoFrame:
        if self._start is None:
            self._start = time.monotonic()
        due = self._start + self.sent / self.fps
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        frame = av.VideoFrame.from_ndarray(self.make_frame(self.sent), format="rgb24")
        frame.pts = int(self.sent * VIDEO_CLOCK / self.fps)
        frame.time_base = fractions.Fraction(1, VIDEO_CLOCK)
        self.sent += 1
        return frame


class SyntheticAudio(MediaStreamTrack):
    """A microphone hearing a steady tone: 20 ms frames of 48 kHz mono PCM16."""

    kind = "audio"
    RATE = 48_000
    SAMPLES = 960

    def __init__(self, freq: float = 440.0):
        super().__init__()
        self.freq = freq
        self.sent = 0
        self._start: float | None = None

    async def recv(self) -> av.AudioFrame:
        if self._start is None:
            self._start = time.monotonic()
        due = self._start + self.sent * self.SAMPLES / self.RATE
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        t = (np.arange(self.SAMPLES) + self.sent * self.SAMPLES) / self.RATE
        pcm = (np.sin(2 * np.pi * self.freq * t) * 8000).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.RATE
        frame.pts = self.sent * self.SAMPLES
        frame.time_base = fractions.Fraction(1, self.RATE)
        self.sent += 1
        return frame


def _post_json(url: str, body: dict, timeout: float = 30, token: str | None = None) -> dict:
    headers = {"Content-Type": "application/json", **_auth(token)}
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def _auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def offer_loopback_only() -> None:
    """Make this process's aiortc peers offer only 127.0.0.1 (aioice skips
    loopback by default), so a scripted client's media stays on loopback."""
    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"] if use_ipv4 else []


class RtcClient:
    """One peer connection to a vidchat server, like one browser tab. It
    offers loopback candidates only and asks no STUN server."""

    def __init__(self, base_url: str, *tracks: MediaStreamTrack, token: str | None = None,
                 configuration: RTCConfiguration | None = None):
        self.base_url = base_url.rstrip("/")
        self.token = token  # the server's --token, if it has one
        self.tracks = tracks
        # ICE servers and policy (a TURN relay, relay-only); default: none.
        self.configuration = configuration or RTCConfiguration(iceServers=[])
        offer_loopback_only()
        self.pc = RTCPeerConnection(self.configuration)
        self.session_id: str | None = None
        self.resume_token: str | None = None
        self.resumed: bool | None = None

    async def connect(self, resume: bool = False) -> str:
        """Offer our tracks; with ``resume``, ask for the session we held
        before (the server checks our resume token)."""
        for track in self.tracks:
            self.pc.addTrack(track)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        offer = {"sdp": self.pc.localDescription.sdp, "type": "offer"}
        if resume:
            offer["resume"] = {"session_id": self.session_id, "token": self.resume_token}
        answer = await asyncio.to_thread(_post_json, self.base_url + "/webrtc/offer", offer, 30, self.token)
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        self.session_id = answer["session_id"]
        self.resume_token = answer["resume_token"]
        self.resumed = answer["resumed"]
        return self.session_id

    async def drop(self) -> None:
        """Lose the connection without telling the server (a network blip)."""
        await self.pc.close()

    async def reconnect(self, *tracks: MediaStreamTrack) -> str:
        """A new peer for the same session, as the page does after a blip."""
        if tracks:
            self.tracks = tracks
        self.pc = RTCPeerConnection(self.configuration)
        return await self.connect(resume=True)

    def selected_pair(self) -> tuple[str, str] | None:
        """(local, remote) candidate types of the pair ICE chose for the
        media, e.g. ("relay", "host") through a TURN server; None before."""
        for transceiver in self.pc.getTransceivers():
            ice = (transceiver.sender.transport or transceiver.receiver.transport).transport
            # aiortc keeps the nominated pair in its aioice connection only.
            pair = ice._connection._nominated.get(1)
            if pair is not None:
                return pair.local_candidate.type, pair.remote_candidate.type
        return None

    async def stats(self) -> dict:
        def get() -> dict:
            url = f"{self.base_url}/webrtc/stats?session_id={self.session_id}"
            with urllib.request.urlopen(urllib.request.Request(url, headers=_auth(self.token)), timeout=10) as resp:
                return json.loads(resp.read())

        return await asyncio.to_thread(get)

    async def close(self, tell_server: bool = True) -> None:
        if tell_server and self.session_id:
            try:
                await asyncio.to_thread(_post_json, self.base_url + "/webrtc/close", {"session_id": self.session_id},
                                        30, self.token)
            except OSError:
                pass
        await self.pc.close()
