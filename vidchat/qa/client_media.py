"""What the protocol client (``python -m vidchat.client``) sends: a video
file's frames and audio, or a synthetic webcam-like clip with a tone, as
(time in seconds, "frame" | "audio", payload) events in time order, and the
JPEG each frame goes out as."""

from __future__ import annotations

import argparse
import base64
import io
import logging
from typing import Any, Iterator

import numpy as np
from PIL import Image

from vidchat.media import AUDIO_RATE

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
