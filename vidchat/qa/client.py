"""Stream a video to a vidchat server and ask questions about it.

Speaks the seed WebSocket protocol (``/v1/video/chat/stream``), exactly as a
client of vllm-omni's streaming video endpoint would, so it doubles as an
example of that protocol. Frames are JPEG-encoded, audio is sent as PCM16
mono 16 kHz (:mod:`vidchat.qa.client`).

Examples::

    python -m vidchat.client clip.mp4 --ask "2:What is happening?" --ask "5:And now?"
    python -m vidchat.client --synthetic --duration 6 --fast --ask "3:Describe the scene."
    python -m vidchat.client clip.mp4 --url ws://gpu-box:7860/v1/video/chat/stream --json

Exit status: 0 when the session ended normally, 1 when the server could not
be reached or the connection ended early, 2 for bad arguments, 3 when the
server reported errors.

This module is the library: :func:`run` has one session and returns how it
went (:class:`ClientResult`), telling a :class:`Listener` each message as it
comes, and raises :class:`ClientError` when the session could not be had to
its end. The command line (its flags, what it prints, its exit status) is
the app's ``qa_cli`` module.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Protocol

import numpy as np
from PIL import Image

from vidchat.media import AUDIO_RATE

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

# What the protocol client (``python -m vidchat.client``) sends: a video
# file's frames and audio, or a synthetic webcam-like clip with a tone, as
# (time in seconds, "frame" | "audio", payload) events in time order, and the
# JPEG each frame goes out as.


log = logging.getLogger("vidchat.qa.client")

Event = tuple[float, str, np.ndarray]  # frame: RGB uint8 array; audio: int16 mono 16 kHz array


def _fit(width: int, height: int, max_width: int) -> tuple[int, int]:
    if width <= max_width:
        return width, height
    return max_width, max(2, round(height * max_width / width / 2) * 2)


def file_events(path: str, fps: float, max_width: int, with_audio: bool) -> Iterator[Event]:
    """Decode a video file with PyAV: frames at up to ``fps``, audio resampled to 16 kHz mono PCM16."""
    import av

    with av.open(path) as container:
        if not container.streams.video:
            raise ValueError(f"{path} has no video stream")
        streams = {"video": 0}
        resampler = None
        if with_audio and container.streams.audio:
            streams["audio"] = 0
            resampler = av.AudioResampler(format="s16", layout="mono", rate=AUDIO_RATE)
        elif with_audio:
            log.info("%s has no audio track; sending video only", path)
        start: float | None = None
        next_frame_t = 0.0
        for frame in container.decode(**streams):
            # Only the video and audio streams are decoded; a frame without a time has no place.
            if not isinstance(frame, (av.VideoFrame, av.AudioFrame)) or frame.time is None:
                continue
            if start is None:
                start = frame.time
            t = frame.time - start
            if isinstance(frame, av.AudioFrame):
                for out in resampler.resample(frame) if resampler is not None else ():
                    yield max(t, 0.0), "audio", out.to_ndarray().reshape(-1).astype(np.int16)
            elif t + 1e-6 >= next_frame_t:
                next_frame_t = max(next_frame_t + 1.0 / fps, t)
                w, h = _fit(frame.width, frame.height, max_width)
                yield t, "frame", frame.reformat(width=w, height=h, format="rgb24").to_ndarray()


def synthetic_events(duration: float, fps: float, max_width: int, with_audio: bool) -> Iterator[Event]:
    """Webcam-like synthetic frames (alternating still and moving scenes, 2 s each) and a 440 Hz tone."""
    from vidchat.devtools import synthetic

    width = min(640, max_width)
    height = max(2, width * 3 // 4 // 2 * 2)
    per_scene = max(1, round(2.0 * fps))
    n = max(1, round(duration * fps))
    frames: list[np.ndarray] = []
    audio_sent = 0  # samples
    for i in range(n):
        if not frames:
            scene = i // per_scene
            make = synthetic.motion_clip if scene % 2 else synthetic.static_clip
            frames = make(height, width, n=per_scene, seed=scene + 1).frames
        t = i / fps
        if with_audio:  # the tone up to this frame's time
            upto = int(round((t + 1.0 / fps) * AUDIO_RATE))
            k = np.arange(audio_sent, upto)
            tone = 0.3 * np.sin(2 * np.pi * 440.0 * k / AUDIO_RATE)
            yield t, "audio", (tone * 32767).astype(np.int16)
            audio_sent = upto
        yield t, "frame", frames.pop(0)


def jpeg_b64(frame: np.ndarray, quality: int) -> str:
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="JPEG", quality=quality)
    return base64.b64encode(buf.getvalue()).decode("ascii")


DEFAULT_URL = "ws://127.0.0.1:7860/v1/video/chat/stream"

# --fast's pace: under the server's default --ws-max-fps (60), whose excess it drops.
FAST_FPS = 50.0


@dataclass(order=True)
class Question:
    at: float  # seconds into the video
    text: str = field(compare=False)


def parse_ask(value: str) -> Question:
    """``"SECONDS:question"`` → Question (for argparse)."""
    when, sep, text = value.partition(":")
    try:
        at = float(when)
    except ValueError:
        at = -1.0
    if not sep or at < 0 or not text.strip():
        raise argparse.ArgumentTypeError(f"expected SECONDS:QUESTION, e.g. '2:What is happening?', got {value!r}")
    return Question(at, text.strip())


class ClientError(Exception):
    """The session could not be had to its end: the server could not be
    reached, the connection failed or ended before session.done, or the
    media could not be sent. The message says which, for the user."""


class Listener(Protocol):
    """Who is told what happens, as it happens (the command line prints it)."""

    def asked(self, q: Question) -> None:
        """``q`` is about to be sent."""

    def message(self, msg: dict[str, Any]) -> None:
        """The server sent ``msg`` (a parsed JSON message)."""


class _Quiet:
    def asked(self, q: Question) -> None:
        pass

    def message(self, msg: dict[str, Any]) -> None:
        pass


@dataclass
class ClientResult:
    """How the session went: its answers (response.text.done messages), the
    frame filter's statistics, the server's error messages, frames sent."""

    answers: list[dict[str, Any]] = field(default_factory=list)
    evs_stats: dict[str, Any] | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    frames: int = 0


class Tracker:
    """What the client knows of the session from the server's messages:
    whether a question waits for its answer, whether the session is done;
    each message also goes to the listener."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.result = ClientResult()
        self.finished = False  # session.done received
        self.answering = False
        self.idle = asyncio.Event()  # no question waiting for its answer
        self.idle.set()

    def asked(self, q: Question) -> None:
        self.idle.clear()
        self.listener.asked(q)

    def handle(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind == "response.start":
            self.answering = True
        elif kind == "response.text.done":
            self.answering = False
            self.result.answers.append(msg)
            self.idle.set()
        elif kind == "response.evs_stats":
            self.result.evs_stats = msg
        elif kind == "session.done":
            self.finished = True
        elif kind == "error":
            self.result.errors.append(msg)
            if not self.answering:
                self.idle.set()  # the question was refused (or unrelated): nothing to wait for
        self.listener.message(msg)


async def send_json(ws: ClientConnection, msg: dict[str, Any]) -> None:
    await ws.send(json.dumps(msg))


async def stream(ws: ClientConnection, events: Iterator[Event], questions: list[Question], tracker: Tracker,
                 fast: bool, quality: int, send_pts: bool = True, fast_fps: float = FAST_FPS) -> int:
    """Send frames/audio paced by their timestamps and the questions at theirs; returns frames sent.

    Real time: a question goes out at its time even if the previous answer is
    still streaming (the server then interrupts that answer). --fast: the
    stream pauses until the previous answer is complete, so each question
    sees exactly the frames up to its time, and frames go at most ``fast_fps``
    a second (the server drops those above its --ws-max-fps, 60 by default,
    before decoding them: a clip sent faster would lose frames). Each frame and audio chunk carries
    its time in the clip as ``pts_ms``, so the server places it on the
    session's timeline where it belongs whatever the sending speed.
    """
    pending = sorted(questions)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    frames = 0
    last_frame_at = -math.inf

    async def ask(q: Question, wait: bool) -> None:
        if wait:
            await tracker.idle.wait()
        tracker.asked(q)
        await send_json(ws, {"type": "video.query", "text": q.text})

    for t, kind, payload in events:
        while pending and pending[0].at <= t:
            await ask(pending.pop(0), wait=fast)
        if not fast:
            delay = t0 + t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        timing = {"pts_ms": round(t * 1000.0, 3)} if send_pts else {}
        if kind == "frame":
            if fast:
                delay = last_frame_at + 1.0 / fast_fps - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                last_frame_at = loop.time()
            await send_json(ws, {"type": "video.frame", "data": jpeg_b64(payload, quality), **timing})
            frames += 1
            if frames % 50 == 0:
                log.info("sent %d frames (%.1f s of video)", frames, t)
        else:
            await send_json(ws, {"type": "audio.chunk", "data": base64.b64encode(payload.tobytes()).decode(),
                                 **timing})
        await asyncio.sleep(0)  # let the reader take what has arrived
    for q in pending:  # questions after the end of the video
        await ask(q, wait=True)
    await tracker.idle.wait()
    return frames


@dataclass(frozen=True)
class Connection:
    """Where the client connects and how long it waits."""

    url: str = DEFAULT_URL
    connect_timeout: float = 10.0  # seconds to wait for the connection
    done_timeout: float = 120.0  # seconds to wait for the server to finish after the last frame


@dataclass(frozen=True)
class Pacing:
    """How the media goes out (see :func:`stream`)."""

    fast: bool = False
    jpeg_quality: int = 85
    send_pts: bool = True
    fast_fps: float = FAST_FPS


async def run(connection: Connection, config: dict[str, Any], events: Iterator[Event], questions: list[Question],
              pacing: Pacing = Pacing(), listener: Listener | None = None) -> ClientResult:
    """One session: open it with ``config`` (its session.config), stream
    ``events`` asking ``questions`` at their times, end it with video.done
    and wait for session.done. Each message goes to ``listener`` as it comes.
    Raises ClientError when the session could not be had to its end; the
    server's error messages are in the result."""
    import websockets

    tracker = Tracker(listener or _Quiet())
    url = connection.url
    try:
        ws = await websockets.connect(url, open_timeout=connection.connect_timeout, max_size=None)
    except (OSError, asyncio.TimeoutError, websockets.InvalidHandshake, websockets.InvalidURI) as exc:
        raise ClientError(f"cannot connect to {url}: {exc}") from exc
    log.info("connected to %s", url)
    started = time.monotonic()
    tasks: tuple[asyncio.Task[Any], ...] = ()
    try:
        async with ws:
            await send_json(ws, config)

            async def read() -> None:
                async for raw in ws:
                    tracker.handle(json.loads(raw))
                    if tracker.finished:
                        return

            reader = asyncio.create_task(read())
            sender = asyncio.create_task(stream(ws, events, questions, tracker, pacing.fast, pacing.jpeg_quality,
                                                send_pts=pacing.send_pts, fast_fps=pacing.fast_fps))
            tasks = (reader, sender)
            # Whichever ends first: the sender (all sent and answered) or the reader (server closed).
            await asyncio.wait({reader, sender}, return_when=asyncio.FIRST_COMPLETED)
            if sender.done():
                failure = sender.exception()
                if failure is not None and not isinstance(failure, websockets.ConnectionClosed):
                    reader.cancel()
                    raise ClientError(f"streaming failed: {failure!r}") from failure
                tracker.result.frames = sender.result()
                await send_json(ws, {"type": "video.done"})
                await asyncio.wait_for(reader, timeout=connection.done_timeout)
                log.info("sent %d frames in %.1f s", tracker.result.frames, time.monotonic() - started)
            else:  # the server ended the session
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
                ended = reader.exception()
                if ended is not None:
                    raise ended
    except websockets.ConnectionClosed as exc:
        log.debug("connection closed: %r", exc)
    except asyncio.TimeoutError as exc:
        raise ClientError("the server did not end the session in time") from exc
    except OSError as exc:
        raise ClientError(f"connection to {url} failed: {exc}") from exc
    finally:
        # Neither task outlives the session, and what ended one (the server
        # closing the connection) is read here, not printed by asyncio later.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if not tracker.finished:
        raise ClientError("the connection ended before session.done")
    return tracker.result
