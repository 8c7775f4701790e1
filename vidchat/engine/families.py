"""How each model family takes frames: the differences vLLM 0.32 and the
families' processors impose, kept in one table so the engine adapter stays
family-agnostic.

* Qwen2.5-Omni (thinker) and Qwen2-VL take a video as a bare (T, H, W, 3)
  array; the frame rate reaches Qwen2.5-Omni's processor as ``fps``.
* Qwen2.5-VL and Qwen3-VL refuse a bare array ("Video metadata is required"):
  a video is ``(frames, metadata)`` with the rate and frame indices.
* SmolVLM (Idefics3) takes no video at all in vLLM; frames go as images, and
  its processor must not split each frame into tiles (a 320×240 frame would
  cost ~860 tokens instead of 67).
* The per-frame pixel cap means pixels (H·W) to the Qwen processors, but
  SmolVLM reads ``size.longest_edge`` as an edge length, so it is not passed
  there (its frames are squared to the model's own tile size).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

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

        return AutoConfig.from_pretrained(model).model_type
    except Exception:
        return None
