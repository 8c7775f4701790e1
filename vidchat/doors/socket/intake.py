"""The seed protocol's media, as a socket session takes it in: video.frame
(base64 images with the client's frame_id, pts_ms and capture_ts_ms, acked)
and audio.chunk (base64 PCM16), placed on the session's timeline by the
client's clock, the audio of a spoken video.query, and the client's names for
the frames a question consumed.

Kept apart from the connection (vidchat.doors.socket.seed), which owns the transport
and the conversation: this is only what turns a message's media into the
session's frames and audio, and says so to the client.
"""

from __future__ import annotations

import binascii
import logging
import time
from typing import Any, Protocol

import numpy as np

from vidchat.conversation.conversation import refuse_own_frames
from vidchat.doors import DoorSettings
from vidchat.doors.socket import transport
from vidchat.media import AUDIO_RATE, is_int, is_number
from vidchat.media.audio import Pcm16Resampler
from vidchat.media.clock import ClientClock
from vidchat.media.evs import FrameError
from vidchat.media.session import Sample
from vidchat.media.workers import run_media

log = logging.getLogger(__name__)



# Longest client frame_id (a string) echoed back in acks.
MAX_FRAME_ID_CHARS = 256

# The reason a frame over --ws-max-fps is refused with (an ack's, a Realtime error's code).
RATE = "rate"


def is_millis(value: Any) -> bool:
    return is_number(value) and -1e15 < value < 1e15


def is_frame_id(value: Any) -> bool:
    if isinstance(value, str):
        return 0 < len(value) <= MAX_FRAME_ID_CHARS
    return is_int(value) and -(1 << 63) <= value < (1 << 63)


class FrameRate:
    """A session's frame intake, at most ``fps`` frames a second on average
    (--ws-max-fps), in bursts of up to a second's worth: a token bucket. It
    is checked before a frame is decoded, so a client that sends thousands
    of frames a second costs the server their parsing, not their decoding."""

    def __init__(self, fps: float) -> None:
        self.fps = fps
        self.burst = max(1.0, fps)
        self._tokens = self.burst
        self._at: float | None = None

    def admit(self, now: float) -> bool:
        """Whether a frame arriving at ``now`` (monotonic seconds) is taken."""
        if self._at is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.fps)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class Refused(Exception):
    """A message's media could not be used: ``message`` for the client's
    error, ``reason`` for a video.frame.ack."""

    def __init__(self, reason: str, message: str, size: int | None = None) -> None:
        super().__init__(message)
        self.reason, self.message, self.size = reason, message, size  # size: bytes, when too large


async def decode_b64(msg: dict[str, Any], kind: str, limit: int | None, key: str = "data") -> bytes:
    """Decode msg[key] (base64, optionally a data: URL); raises Refused
    with the error for the client."""
    text = msg.get(key, "")
    if not isinstance(text, (str, transport.BigText)):
        raise Refused("invalid_data", f"{kind} requires '{key}' as a base64 string, got {type(text).__name__}")
    head = text.head(200) if isinstance(text, transport.BigText) else text[:200]
    if head.startswith("data:") and "," in head:
        comma = head.index(",") + 1
        text = text.skip(comma) if isinstance(text, transport.BigText) else text[comma:]
    if not text:
        raise Refused("invalid_data", f"{kind} has no data")
    if limit is not None and len(text) > (limit + 2) // 3 * 4 + 64:  # too large even before decoding
        estimate = len(text) * 3 // 4
        raise Refused("too_large", f"Frame too large: about {estimate} bytes (limit {limit})", estimate)
    try:
        if len(text) > transport.INLINE_PARSE_CHARS:
            data = await run_media(transport.b64decode, text)
        else:
            data = transport.b64decode(text)
    except (binascii.Error, ValueError):
        raise Refused("invalid_data", f"Invalid base64 in {kind}" + ("" if key == "data" else f" '{key}'")) \
            from None
    if limit is not None and len(data) > limit:
        raise Refused("too_large", f"Frame too large: {len(data)} bytes (limit {limit})", len(data))
    return data


async def pcm16_audio(msg: dict[str, Any], kind: str, key: str, max_s: float,
                      stream: Pcm16Resampler | None = None) -> np.ndarray:
    """msg[key], base64 PCM16 mono at the stream's rate (16 kHz without
    one) and at most ``max_s`` long, as 16 kHz float samples: a spoken
    question (video.query's audio_data, a Realtime input_audio item) or the
    Realtime input buffer's next chunk (its stream: the resampler's state
    carries from chunk to chunk). Raises Refused (invalid_data, too_large,
    invalid_audio), for every socket door alike."""
    rate = AUDIO_RATE if stream is None else stream.rate
    try:
        data = await decode_b64(msg, kind, int(max_s * rate) * 2, key=key)
    except Refused as refused:
        if refused.size is None:
            raise
        raise Refused("too_large", f"{kind} '{key}' is too long: about {refused.size / (2 * rate):.1f} s of audio "
                      f"(at most {max_s:g} s of PCM16 mono {rate / 1000:g} kHz)", refused.size) from None
    if len(data) % 2:
        raise Refused("invalid_audio", f"{kind} '{key}' must be PCM16 (2 bytes a sample), got {len(data)} bytes")
    return (stream or Pcm16Resampler(rate)).feed(data)


class Client(Protocol):
    """What the intake needs of its connection (vidchat.doors.socket.seed.Connection)."""

    entry: Any  # vidchat.conversation.Conversation, None before the session opens
    settings: DoorSettings

    async def send(self, msg: dict[str, Any], droppable: bool = False) -> bool: ...

    async def error(self, message: str) -> bool: ...


class SocketMedia:
    """One connection's media intake."""

    def __init__(self, conn: Client) -> None:
        self.conn = conn
        self.clock = ClientClock()
        self.rate = FrameRate(conn.settings.ws_max_fps)
        # Kept frames by the session's kept-frame number (seq): the client's
        # frame_id, pts_ms and capture_ts_ms, while the frame is in the buffer.
        self.frame_meta: dict[int, dict[str, Any]] = {}
        self.names_frames = False  # the client has sent a frame_id: acks and frames.consumed
        # The client has dated an audio.chunk (pts_ms): its audio is placed
        # by its clock and goes with the frames it was captured with. Until
        # then a question gets all the audio since the previous one, as the
        # seed does (vllm-omni's client sends its audio in a burst, undated).
        self.audio_dated = False

    async def media_time(self, msg: dict[str, Any], kind: str, arrived: float) -> tuple[bool, float | None]:
        """(ok, time on the session's timeline) from the message's optional pts_ms."""
        pts = msg.get("pts_ms")
        if pts is not None and not is_millis(pts):
            await self.conn.error(f"{kind} 'pts_ms' must be a number of milliseconds, got {pts!r}")
            return False, None
        return True, self.place(pts, arrived, "audio" if kind == "audio.chunk" else "video")

    def place(self, pts_ms: Any, arrived: float, kind: str = "video") -> float | None:
        """A client's pts_ms (checked by :func:`is_millis`) on the session's
        timeline, by the client's clock; None without one."""
        return None if pts_ms is None else self.clock.place(float(pts_ms), arrived, kind)

    async def on_frame(self, msg: dict[str, Any], arrived: float) -> None:
        frame_id = msg.get("frame_id")
        if frame_id is not None:
            if not is_frame_id(frame_id):
                await self.conn.error(f"video.frame 'frame_id' must be a non-empty string (at most {MAX_FRAME_ID_CHARS} "
                                 f"characters) or an integer, got {type(frame_id).__name__}")
                return
            self.names_frames = True
        ok, t = await self.media_time(msg, "video.frame", arrived)
        if not ok:
            await self.ack(msg, arrived, False, "invalid_pts")
            return
        capture = msg.get("capture_ts_ms")
        if capture is not None and not is_millis(capture):
            await self.conn.error(f"video.frame 'capture_ts_ms' must be a number of milliseconds, got {capture!r}")
            await self.ack(msg, arrived, False, "invalid_capture_ts")
            return
        session = self.conn.entry.session
        try:
            seq = await self.take_image(msg, "video.frame", t, arrived=arrived)
        except Refused as refused:
            if refused.reason != RATE:  # one error per frame would flood a client that sends too many
                await self.conn.error(refused.message)
            await self.ack(msg, arrived, False, refused.reason)
            return
        if seq is None:  # a near-duplicate of the frame before (EVS)
            await self.ack(msg, arrived, False, "filtered")
            return
        self.frame_meta[seq] = {"frame_id": frame_id, "pts_ms": msg.get("pts_ms"), "capture_ts_ms": capture}
        pushed_out = self.forget_evicted(session.oldest_seq)
        await self.ack(msg, arrived, True, dropped_frame_id=pushed_out)

    async def take_image(self, msg: dict[str, Any], kind: str, t: float | None, key: str = "data",
                         arrived: float | None = None) -> int | None:
        """The image in ``msg[key]`` (base64, or a data URL) onto the session's
        timeline at ``t``, through its filter: the kept frame's number, None
        for a near-duplicate (dropped). Raises Refused (over --ws-max-fps,
        counted in the session's stats; bad base64, too large, not an image;
        or the session watches a stream), for every socket door alike."""
        if not self.rate.admit(time.monotonic() if arrived is None else arrived):
            session = self.conn.entry.session
            if not session.frames_rate_dropped:
                log.info("session %s…: frames over --ws-max-fps (%g a second) are dropped", session.id[:6],
                         self.rate.fps)
            session.frames_rate_dropped += 1
            raise Refused(RATE, f"{kind} dropped: more than {self.rate.fps:g} frames a second (--ws-max-fps)")
        watching = refuse_own_frames(self.conn.entry)
        if watching is not None:
            raise Refused("stream_source", f"{kind} refused: {watching}")
        data = await decode_b64(msg, kind, self.conn.settings.ws_max_frame_bytes, key=key)
        try:
            # Even a 640×480 JPEG takes milliseconds to filter and store: never on the loop.
            session = self.conn.entry.session
            return await run_media(session.offer_jpeg, data, t, share=session.id)
        except FrameError as exc:
            raise Refused("invalid_image", f"Invalid image in {kind}: {exc}") from None

    def forget_evicted(self, oldest: int | None) -> Any:
        """Drop the metadata of frames no longer in the buffer; the client's
        id of the newest such frame that had one (None if none)."""
        meta = self.frame_meta
        pushed_out = None
        while meta:
            seq = next(iter(meta))  # insertion order is seq order
            if oldest is not None and seq >= oldest:
                break
            gone = meta.pop(seq)
            if gone["frame_id"] is not None:
                pushed_out = gone["frame_id"]
        return pushed_out

    async def ack(self, msg: dict[str, Any], arrived: float, accepted: bool, reason: str | None = None,
                   dropped_frame_id: Any = None) -> None:
        """video.frame.ack, for a frame that carries a (valid) frame_id."""
        frame_id = msg.get("frame_id")
        if frame_id is None or not is_frame_id(frame_id) or self.conn.entry is None:
            return
        ack: dict[str, Any] = {
            "type": "video.frame.ack",
            "frame_id": frame_id,
            **self.outcome(accepted, reason),
            "pts_ms": msg.get("pts_ms") if is_millis(msg.get("pts_ms")) else None,
            "capture_ts_ms": msg.get("capture_ts_ms") if is_millis(msg.get("capture_ts_ms")) else None,
            "server_receive_ts_ms": round(arrived * 1000, 1),
        }
        if dropped_frame_id is not None:
            ack["dropped_frame_id"] = dropped_frame_id
        # The first thing a client that reads too slowly goes without (vidchat.doors.socket.transport).
        await self.conn.send(ack, droppable=True)

    def outcome(self, accepted: bool, reason: str | None = None) -> dict[str, Any]:
        """What became of a frame, as every socket door reports it (the seed's
        video.frame.ack, the Realtime door's conversation.item.added extra)."""
        said: dict[str, Any] = {"accepted": accepted, "buffered_frames": self.conn.entry.session.frame_count}
        if reason is not None:
            said["reason"] = reason
        return said

    async def on_audio(self, msg: dict[str, Any], arrived: float) -> None:
        ok, t = await self.media_time(msg, "audio.chunk", arrived)
        if not ok:
            return
        self.audio_dated = self.audio_dated or t is not None
        try:
            data = await decode_b64(msg, "audio.chunk", None)
        except Refused as refused:
            await self.conn.error(refused.message)
            return
        try:
            self.conn.entry.session.add_pcm16(data, t)
        except ValueError as exc:
            await self.conn.error(f"Invalid audio in audio.chunk: {exc}")

    async def question_audio(self, msg: dict[str, Any]) -> np.ndarray | None:
        """video.query's audio_data as float32 samples; None (error sent) when unusable."""
        max_s = self.conn.settings.ws_max_audio_seconds
        try:
            return await pcm16_audio(msg, "video.query", "audio_data", max_s)
        except Refused as refused:
            await self.conn.error(refused.message)
            return None

    def consumed(self, sample: Sample) -> dict[str, Any]:
        """video.frames.consumed for a question's sampled frames: the
        client's ids of those that had one (in order), and the pts_ms of the
        newest sampled frame (null when unknown)."""
        metas = [self.frame_meta.get(seq) for seq in sample.seqs]
        named = [m for m in metas if m is not None and m["frame_id"] is not None]
        newest = metas[-1] if metas else None
        pts = newest.get("pts_ms") if newest is not None else None
        return {
            "type": "video.frames.consumed",
            "frame_ids": [m["frame_id"] for m in named],
            "frames": [{"frame_id": m["frame_id"], "pts_ms": m["pts_ms"], "capture_ts_ms": m["capture_ts_ms"]}
                       for m in named],
            "latest_pts_ms": pts,
        }
