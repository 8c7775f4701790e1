"""The model's own processor and chat template as the engines call them:
the keyword arguments transformers wants, and what one webcam frame costs
in prompt tokens.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
from PIL import Image

# The frame the page sends from a webcam before any pixel cap.
TYPICAL_FRAME = (640, 480)


def chat_template_kwargs(processor_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The processor's kwargs as transformers 5 wants them at apply_chat_template:
    in ``processor_kwargs``. SmolVLM's processor otherwise puts its video
    defaults (num_frames, fps) in ``**kwargs``, and transformers then warns
    "Kwargs passed to processor.__call__ have to be in processor_kwargs
    dict" at every prompt built: once per question and warm-up. A copy each
    time: SmolVLM's processor adds those defaults to the dict it is given."""
    return {"processor_kwargs": dict(processor_kwargs)} if processor_kwargs else {}


def tokens_per_frame(processor: Any, max_image_pixels: int = 0,
                     processor_kwargs: dict[str, Any] | None = None) -> int:
    """Prompt tokens one webcam frame costs with this processor: a 640x480
    frame as sent, and as sessions store it (scaled down to
    ``max_image_pixels``), run through the model's own processor, minus the
    same prompt without it; the larger of the two (the processor's rounding
    to its patch grid can make the smaller frame cost more)."""
    sizes = [TYPICAL_FRAME]
    width, height = TYPICAL_FRAME
    if max_image_pixels and width * height > max_image_pixels:
        scale = (max_image_pixels / (width * height)) ** 0.5
        sizes.append((max(1, int(width * scale)), max(1, int(height * scale))))
    question = {"type": "text", "text": "?"}
    with_frame = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}, question]}],
                                               tokenize=False, add_generation_prompt=True,
                                               **chat_template_kwargs(processor_kwargs))
    without = processor.apply_chat_template([{"role": "user", "content": [question]}],
                                            tokenize=False, add_generation_prompt=True,
                                            **chat_template_kwargs(processor_kwargs))
    base = len(processor.tokenizer(without)["input_ids"])
    costs = []
    for size in sizes:
        ids = processor(text=[with_frame], images=[Image.new("RGB", size, (90, 90, 90))],
                        return_tensors="np", **(processor_kwargs or {}))["input_ids"]
        costs.append(int(len(ids[0]) - base))
    return max(costs)


# What an engine is given besides the prompt: frames as images or as one
# video, the audio as clips, the frames' rate, and the digest that names
# exactly those inputs (the same for every engine, so records compare).

def inputs_digest(frames: Iterable[np.ndarray | Image.Image], audio: np.ndarray | None) -> str:
    """SHA-256 of exactly the pixels and samples handed to the engine, with
    their shapes and types, in order: two answers with the same digest saw the
    same input (the QA workbench compares runs by it)."""
    digest = hashlib.sha256()
    for frame in frames:
        array = np.ascontiguousarray(np.asarray(frame))
        digest.update(f"frame {array.shape} {array.dtype}\n".encode())
        digest.update(array.data.cast("B"))  # the array's own buffer, no copy
    if audio is not None:
        samples = np.ascontiguousarray(audio)
        digest.update(f"audio {samples.shape} {samples.dtype}\n".encode())
        digest.update(samples.data.cast("B"))
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
    # (samples, first segment's name, last segment's name) per clip
    spans = [(size, name, name) for size, name in parts]
    while len(spans) > max_clips:
        first, second = spans.pop(0), spans[0]
        spans[0] = (first[0] + second[0], first[1], second[2])
    clips: list[tuple[np.ndarray, str | None]] = []
    offset = 0
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
        a if a.shape[:2] == (h, w) else np.asarray(Image.fromarray(a).resize((w, h), Image.Resampling.BILINEAR)) for a in arrays
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


# How each model family takes frames: the differences vLLM 0.32 and the
# families' processors impose, kept in one table so the engine adapter stays
# family-agnostic.
#
# * Qwen2.5-Omni (thinker) and Qwen2-VL take a video as a bare (T, H, W, 3)
#   array; the frame rate reaches Qwen2.5-Omni's processor as ``fps``.
# * Qwen2.5-VL and Qwen3-VL refuse a bare array ("Video metadata is required"):
#   a video is ``(frames, metadata)`` with the rate and frame indices.
# * SmolVLM (Idefics3) takes no video at all in vLLM; frames go as images, and
#   its processor must not split each frame into tiles (a 320×240 frame would
#   cost ~860 tokens instead of 67).
# * The per-frame pixel cap means pixels (H·W) to the Qwen processors, but
#   SmolVLM reads ``size.longest_edge`` as an edge length, so it is not passed
#   there (its frames are squared to the model's own tile size).

DEFAULT_VIDEO_FPS = 2.0  # what Qwen processors assume when told nothing


@dataclass(frozen=True)
class Family:
    name: str
    video: str | None  # "array", "metadata" or None (no video input in vLLM)
    pixel_cap: str | None  # "pixels": size {shortest_edge, longest_edge} in pixels; None: not applicable
    fixed_processor_kwargs: tuple[tuple[str, Any], ...] = ()
    fps_kwarg: bool = False  # the processor takes the video's rate as mm_processor_kwargs["fps"]

    def processor_kwargs(self, max_pixels: int) -> dict[str, Any]:
        """Engine-wide mm_processor_kwargs for this family and pixel cap (0: the model's own)."""
        kwargs: dict[str, Any] = dict(self.fixed_processor_kwargs)
        if max_pixels and self.pixel_cap == "pixels":
            # One `size` covers the image and the video processor (the Omni
            # processor otherwise forces a large minimum size on video frames).
            kwargs["size"] = {"shortest_edge": min(56 * 56, max_pixels), "longest_edge": max_pixels}
        return kwargs

    def video_item(self, video: np.ndarray, fps: float | None) -> Any:
        """A (T, H, W, 3) video as this family's vLLM input."""
        if self.video != "metadata":
            return video
        rate = fps or DEFAULT_VIDEO_FPS
        n = int(video.shape[0])
        meta = {"fps": rate, "duration": n / rate, "total_num_frames": n, "frames_indices": list(range(n)),
                "do_sample_frames": False}
        return video, meta


QWEN_OMNI = Family("qwen2.5-omni", video="array", pixel_cap="pixels", fps_kwarg=True)

QWEN2_VL = Family("qwen2-vl", video="array", pixel_cap="pixels", fps_kwarg=True)  # ignored by its processor

QWEN25_VL = Family("qwen2.5-vl", video="metadata", pixel_cap="pixels")

QWEN3_VL = Family("qwen3-vl", video="metadata", pixel_cap=None)

SMOLVLM = Family("smolvlm", video=None, pixel_cap=None, fixed_processor_kwargs=(("do_image_splitting", False),))

OTHER = Family("other", video="array", pixel_cap="pixels")

BY_MODEL_TYPE = {
    "qwen2_5_omni": QWEN_OMNI,
    "qwen2_5_omni_thinker": QWEN_OMNI,
    "qwen2_vl": QWEN2_VL,
    "qwen2_5_vl": QWEN25_VL,
    "qwen3_vl": QWEN3_VL,
    "qwen3_vl_moe": QWEN3_VL,
    "smolvlm": SMOLVLM,
    "idefics3": SMOLVLM,
}


def family_of(model_type: str | None) -> Family:
    return BY_MODEL_TYPE.get(model_type or "", OTHER)


def model_type_of(model: str) -> str | None:
    """The model's config ``model_type`` (local folder or hub id), or None."""
    try:
        from transformers import AutoConfig

        model_type: str | None = AutoConfig.from_pretrained(model).model_type
        return model_type
    except Exception:
        return None


# Which turns of a long chat go with a question, once the whole chat no
# longer fits the model's context.
#
# The oldest question-and-answer pairs are left out, and the cut is placed on
# a coarse grid of the chat's running token count rather than as late as it
# could be. While the chat grows, the cut then stays where it is: the turns
# sent are the same prefix question after question (history comes before the
# frames in the prompt), and vLLM serves that prefix from its cache. Cutting
# one pair per question instead, as soon as the chat filled the context,
# changed the prefix every time, and every later question prefilled its whole
# history again (seconds a question on a CPU at full context).

# The grid's step, as a share of --max-model-len: the cut moves by about this
# much at a time, and leaves out at most this much more than it must.
CUT_STEP_SHARE = 1 / 8


def cut_step(max_model_len: int) -> int:
    """The grid's step in tokens: fixed per engine, so that a question whose
    own needs differ (frames, audio, its length) cuts on the same grid."""
    return max(1, int(max_model_len * CUT_STEP_SHARE))


def history_start(costs: Sequence[int], is_question: Sequence[bool], budget: int, step: int) -> int:
    """The index of the first turn to send: whole pairs (a kept answer keeps
    its question) whose ``costs`` (tokens each) fit ``budget``, cut where the
    chat's running count enters a new ``step``. 0 when the whole chat fits,
    ``len(costs)`` when not even the newest pair does. With ``step`` 1 it is
    the latest cut that fits, one pair at a time."""
    n = len(costs)
    start, remaining = 0, sum(costs)
    while start < n and remaining > budget:  # the latest cut that fits
        remaining -= costs[start]
        start += 1
        while start < n and not is_question[start]:
            remaining -= costs[start]
            start += 1
    if start in (0, n):
        return start
    running, step_before = 0, []
    for cost in costs:
        step_before.append(running // step)
        running += cost
    questions = [i for i in range(n) if is_question[i]]
    for previous, question in zip(questions, questions[1:]):
        if question >= start and step_before[question] != step_before[previous]:
            return question
    return start  # no step begins after it (a budget smaller than a step): the latest cut
