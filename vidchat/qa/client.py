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
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
from PIL import Image

from vidchat.media import AUDIO_RATE

# What the protocol client (``python -m vidchat.client``) sends: a video
# file's frames and audio, or a synthetic webcam-like clip with a tone, as
# (time in seconds, "frame" | "audio", payload) events in time order, and the
# JPEG each frame goes out as.

log = logging.getLogger("vidchat.qa.client")


Event = tuple[float, str, Any]  # frame: RGB uint8 array; audio: int16 mono 16 kHz array


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
            if frame.time is None:
                continue
            if start is None:
                start = frame.time
            t = frame.time - start
            if isinstance(frame, av.AudioFrame):
                for out in resampler.resample(frame):
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


def media_of(args: argparse.Namespace) -> Iterator[Event]:
    """What this client sends: a synthetic clip, or a file's frames and audio."""
    with_audio = args.audio != "none"
    if args.synthetic:
        return synthetic_events(args.duration, args.fps, args.max_width, with_audio)
    if args.audio == "tone":
        log.warning("--audio tone is only for --synthetic; sending the file's own audio")
    return file_events(args.video, args.fps, args.max_width, with_audio)


log = logging.getLogger("vidchat.qa.client")

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


class Printer:
    """Shows the server's messages: streamed answers on stdout, errors on stderr."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.errors = 0
        self.finished = False  # session.done received
        self.answering = False
        self.idle = asyncio.Event()  # no question waiting for its answer
        self.idle.set()
        self.answers: list[dict[str, Any]] = []
        self.evs_stats: dict[str, Any] | None = None

    def asked(self, q: Question) -> None:
        self.idle.clear()
        if not self.as_json:
            print(f"\nQ [{q.at:.1f}s]: {q.text}", flush=True)

    def handle(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if self.as_json:
            print(json.dumps(msg, ensure_ascii=False), flush=True)
        if kind == "response.start":
            self.answering = True
            if not self.as_json:
                print("A: ", end="", flush=True)
        elif kind == "response.text.delta":
            if not self.as_json:
                print(msg.get("delta", ""), end="", flush=True)
        elif kind == "response.text.done":
            self.answering = False
            self.answers.append(msg)
            self.idle.set()
            if not self.as_json:
                print()
                print(f"   ({_describe_stats(msg.get('stats') or {})})", flush=True)
        elif kind == "response.evs_stats":
            self.evs_stats = msg
            if not self.as_json:
                total = msg.get("total_count", 0)
                print(f"\nEVS filter: kept {msg.get('retained_count')} of {total} frames, dropped "
                      f"{msg.get('dropped_count')} (drop rate {100 * msg.get('drop_rate', 0.0):.1f} %)", flush=True)
        elif kind == "session.done":
            self.finished = True
        elif kind == "error":
            self.errors += 1
            if not self.answering:
                self.idle.set()  # the question was refused (or unrelated): nothing to wait for
            if not self.as_json:
                print(f"server error: {msg.get('message')}", file=sys.stderr, flush=True)


def _count(n: Any, noun: str) -> str:
    return f"? {noun}s" if n is None else f"{n} {noun}{'' if n == 1 else 's'}"


def _describe_stats(stats: dict[str, Any]) -> str:
    parts = [_count(stats.get("completion_tokens"), "token"), _count(stats.get("frames"), "frame")]
    if stats.get("audio_seconds"):
        parts.append(f"{stats['audio_seconds']:.1f} s audio")
    if stats.get("ttft_s") is not None:
        parts.append(f"first token {1000 * stats['ttft_s']:.0f} ms")
    if stats.get("cancelled"):
        parts.append("interrupted")
    return ", ".join(parts)


async def send_json(ws: Any, msg: dict[str, Any]) -> None:
    await ws.send(json.dumps(msg))


async def stream(ws: Any, events: Iterator[Event], questions: list[Question], printer: Printer,
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
            await printer.idle.wait()
        printer.asked(q)
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
        await asyncio.sleep(0)  # let the reader print what has arrived
    for q in pending:  # questions after the end of the video
        await ask(q, wait=True)
    await printer.idle.wait()
    return frames


def session_config(args: argparse.Namespace) -> dict[str, Any]:
    """The session.config this client opens with, from its flags."""
    config: dict[str, Any] = {
        "type": "session.config",
        "model": args.model,
        "modalities": ["text"],
        "max_frames": args.max_frames,
        "num_sample_frames": args.num_frames,
        "evs_enabled": not args.no_evs,
        "evs_threshold": args.evs_threshold,
        "max_tokens": args.max_tokens,
    }
    for key in ("temperature", "frames_as", "sampling", "system_prompt"):
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    return config


async def run(args: argparse.Namespace) -> int:
    import websockets

    events = media_of(args)
    config = session_config(args)
    printer = Printer(args.json)
    try:
        ws = await websockets.connect(args.url, open_timeout=args.connect_timeout, max_size=None)
    except (OSError, asyncio.TimeoutError, websockets.InvalidHandshake, websockets.InvalidURI) as exc:
        print(f"cannot connect to {args.url}: {exc}", file=sys.stderr)
        return 1
    log.info("connected to %s", args.url)
    started = time.monotonic()
    try:
        async with ws:
            await send_json(ws, config)

            async def read() -> None:
                async for raw in ws:
                    printer.handle(json.loads(raw))
                    if printer.finished:
                        return

            reader = asyncio.create_task(read())
            sender = asyncio.create_task(stream(ws, events, args.ask, printer, args.fast, args.jpeg_quality,
                                                   send_pts=not args.no_pts, fast_fps=args.fast_fps))
            # Whichever ends first: the sender (all sent and answered) or the reader (server closed).
            await asyncio.wait({reader, sender}, return_when=asyncio.FIRST_COMPLETED)
            if sender.done():
                if sender.exception() is not None and not isinstance(sender.exception(), websockets.ConnectionClosed):
                    reader.cancel()
                    print(f"streaming failed: {sender.exception()!r}", file=sys.stderr)
                    return 1
                frames = sender.result()
                await send_json(ws, {"type": "video.done"})
                await asyncio.wait_for(reader, timeout=args.done_timeout)
                log.info("sent %d frames in %.1f s", frames, time.monotonic() - started)
            else:  # the server ended the session
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
                if reader.exception() is not None:
                    raise reader.exception()
    except websockets.ConnectionClosed as exc:
        log.debug("connection closed: %r", exc)
    except asyncio.TimeoutError:
        print("the server did not end the session in time", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"connection to {args.url} failed: {exc}", file=sys.stderr)
        return 1
    if not printer.finished:
        print("the connection ended before session.done", file=sys.stderr)
        return 1
    return 3 if printer.errors else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m vidchat.client",
        description="Stream a video file (or synthetic webcam frames) to a vidchat server over the "
        "seed WebSocket protocol, ask questions at given times and print the streamed answers "
        "and the frame filter's statistics.",
        epilog="Exit status: 0 ok, 1 connection failed or ended early, 2 bad arguments, "
        "3 the server reported errors. Example: python -m vidchat.client clip.mp4 "
        "--ask '2:What is happening?' --ask '5:And now?'",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    src = parser.add_argument_group("what to stream")
    src.add_argument("video", nargs="?", help="video file to stream (anything PyAV/FFmpeg reads)")
    src.add_argument("--synthetic", action="store_true", help="stream generated webcam-like frames instead of a file")
    src.add_argument("--duration", type=float, default=5.0, help="seconds of synthetic video")
    src.add_argument("--fps", type=float, default=5.0, help="frames per second to send (a file is subsampled)")
    src.add_argument("--max-width", type=int, default=640, help="downscale wider frames to this width")
    src.add_argument("--jpeg-quality", type=int, default=85, help="JPEG quality of the frames sent (1-95)")
    src.add_argument("--audio", choices=("auto", "tone", "none"), default="auto",
                     help="auto: the file's audio track (a 440 Hz tone with --synthetic); tone; none")
    src.add_argument("--fast", action="store_true",
                     help="send as fast as possible instead of in real time; each question then waits "
                     "for the previous answer")
    src.add_argument("--fast-fps", type=float, default=FAST_FPS,
                     help="with --fast: most frames sent a second (keep it under the server's --ws-max-fps, "
                     "which drops frames above it)")
    src.add_argument("--no-pts", action="store_true",
                     help="send no pts_ms with frames and audio (as a seed-protocol client does); the server "
                     "then stamps them on arrival, so --fast compresses the clip's timeline")
    ask = parser.add_argument_group("questions")
    ask.add_argument("--ask", action="append", type=parse_ask, default=[], metavar="SECONDS:QUESTION",
                     help="ask QUESTION when the video reaches SECONDS (repeatable)")
    ask.add_argument("--max-tokens", type=int, default=128, help="longest answer in tokens")
    ask.add_argument("--temperature", type=float, default=None, help="sampling temperature (server default if unset)")
    ask.add_argument("--system-prompt", default=None, help="system prompt (server default if unset)")
    ask.add_argument("--frames-as", choices=("images", "video"), default=None,
                     help="give the model the frames as images or as one video (server default if unset)")
    sess = parser.add_argument_group("session.config")
    sess.add_argument("--model", default="", help="model name sent in session.config (vidchat ignores it)")
    sess.add_argument("--max-frames", type=int, default=64, help="frames the server keeps for this session")
    sess.add_argument("--num-frames", type=int, default=16, help="frames sampled for each question")
    sess.add_argument("--sampling", choices=("uniform", "stable", "latest_frames", "latest_seconds"), default=None,
                      help="how frames are picked for a question (server default if unset)")
    sess.add_argument("--no-evs", action="store_true", help="turn the near-duplicate frame filter off")
    sess.add_argument("--evs-threshold", type=float, default=0.95, help="filter threshold (0..1)")
    conn = parser.add_argument_group("connection and output")
    conn.add_argument("--url", default=DEFAULT_URL, help="the server's WebSocket URL")
    conn.add_argument("--connect-timeout", type=float, default=10.0, help="seconds to wait for the connection")
    conn.add_argument("--done-timeout", type=float, default=120.0,
                      help="seconds to wait for the server to finish after the last frame")
    conn.add_argument("--json", action="store_true", help="print every server message as one JSON line")
    conn.add_argument("-v", "--verbose", action="store_true", help="log progress and debug details")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if bool(args.video) == args.synthetic:
        parser.error("give a video file or --synthetic (not both)")
    if args.fps <= 0 or args.fast_fps <= 0 or args.duration <= 0 or args.max_width < 16 or not 1 <= args.jpeg_quality <= 95:
        parser.error("--fps, --fast-fps and --duration must be positive, --max-width >= 16, --jpeg-quality 1..95")
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if not args.verbose:
        logging.getLogger("websockets").setLevel(logging.WARNING)
    if args.video:
        import os

        if not os.path.isfile(args.video):
            parser.error(f"no such file: {args.video}")
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
