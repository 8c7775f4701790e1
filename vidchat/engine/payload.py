"""What an engine is given besides the prompt: frames as images or as one
video, the audio as clips, the frames' rate, and the digest that names
exactly those inputs (the same for every engine, so records compare)."""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np
from PIL import Image


def inputs_digest(frames: Sequence[np.ndarray | Image.Image], audio: np.ndarray | None) -> str:
    """SHA-256 of exactly the pixels and samples handed to the engine, with
    their shapes and types, in order: two answers with the same digest saw the
    same input (the QA workbench compares runs by it)."""
    digest = hashlib.sha256()
    for frame in frames:
        array = np.ascontiguousarray(np.asarray(frame))
        digest.update(f"frame {array.shape} {array.dtype}\n".encode())
        digest.update(memoryview(array).cast("B"))
    if audio is not None:
        samples = np.ascontiguousarray(audio)
        digest.update(f"audio {samples.shape} {samples.dtype}\n".encode())
        digest.update(memoryview(samples).cast("B"))
    return digest.hexdigest()


def audio_clips(audio: np.ndarray, parts: Sequence[tuple[int, str | None]],
                max_clips: int) -> list[tuple[np.ndarray, str | None]]:
    """The audio as the engine's items: one per segment of ``parts``
    (vidchat.media.audio.AudioWindow.parts), the oldest merged so that there are at
    most ``max_clips``; one clip when the parts don't describe this audio. A
    merged clip's name joins its first and last segments' names (segments
    are contiguous, so the pair names exactly those samples)."""
    sizes = [size for size, _ in parts]
    if len(parts) < 2 or max_clips < 2 or sum(sizes) != audio.size or min(sizes) <= 0:
        return [(audio, None)]
    spans = [[size, name, name] for size, name in parts]
    while len(spans) > max_clips:
        first, second = spans.pop(0), spans[0]
        second[0] += first[0]
        second[1] = first[1]
    clips, offset = [], 0
    for size, first_name, last_name in spans:
        name = None if first_name is None or last_name is None else (
            first_name if first_name == last_name else f"{first_name}~{last_name}")
        clips.append((audio[offset:offset + size], name))
        offset += size
    return clips


def to_pil(frame: np.ndarray | Image.Image) -> Image.Image:
    if isinstance(frame, Image.Image):
        return frame.convert("RGB") if frame.mode != "RGB" else frame
    return Image.fromarray(np.ascontiguousarray(frame), "RGB")


def as_video(frames: Sequence[np.ndarray | Image.Image]) -> np.ndarray:
    """Stack frames into a (T, H, W, 3) video; a resolution change mid-buffer
    (browsers drop resolution under load) is resized to the newest frame's size."""
    arrays = [np.asarray(f.convert("RGB")) if isinstance(f, Image.Image) else f for f in frames]
    h, w = arrays[-1].shape[:2]
    same = [
        a if a.shape[:2] == (h, w) else np.asarray(Image.fromarray(a).resize((w, h), Image.BILINEAR)) for a in arrays
    ]
    return np.stack(same)


def video_fps(frame_times: Sequence[float] | None, n_frames: int) -> float | None:
    """The frames' real rate for the model's processor: frames per second of
    media time between the first and the last. The filter makes spacing
    irregular; Qwen-family processors take one rate per video (their temporal
    positions advance by ``temporal_patch_size / fps`` seconds per step), so the
    mean rate is what can be expressed. None when it cannot be known."""
    if frame_times is None or n_frames < 2 or len(frame_times) != n_frames:
        return None
    span = frame_times[-1] - frame_times[0]
    if not span > 0:
        return None
    # Bounded so a burst (or a still scene held for minutes) stays a sane rate.
    return min(max((n_frames - 1) / span, 0.1), 240.0)
