"""A question's media as the in-process vLLM `AsyncLLM` takes them: which
kinds vLLM accepts for the model, and the prompt a question becomes (its
text, frames or video, audio clips, and the names their encodings are
cached under within the session's salt). Frames go as arrays/PIL images,
never through base64 or JSON."""

from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np
from PIL import Image

from vidchat.engine.families import Family
from vidchat.engine.payload import as_video, to_pil
from vidchat.media import AUDIO_RATE

log = logging.getLogger(__name__)


def accepted_media(llm: Any, processor: Any) -> tuple[bool, bool]:
    """(audio, video): whether vLLM itself accepts each for this model
    within our limits, or, where that can't be read, whether the processor
    has the part for it."""
    # Not the processor first: it may have a video processor that vLLM
    # never calls (SmolVLM).
    limits = allowed_mm_limits(llm)
    if limits is None:
        audio = getattr(processor, "feature_extractor", None) is not None
        video = getattr(processor, "video_processor", None) is not None
        return audio, video
    return limits.get("audio", 0) > 0, limits.get("video", 0) > 0


def allowed_mm_limits(llm: Any) -> dict[str, int] | None:
    """Items per prompt vLLM allows for each modality of this model (its own
    support within limit_mm_per_prompt), or None when it can't be read."""
    try:
        from vllm.multimodal import MULTIMODAL_REGISTRY

        return dict(MULTIMODAL_REGISTRY.get_processing_info(llm.model_config).allowed_mm_limits)
    except Exception:
        log.debug("could not read vLLM's multimodal limits", exc_info=True)
        return None


def vllm_prompt(family: Family, prompt_text: str, frames: Sequence[np.ndarray | Image.Image], frames_as: str,
                clips: Sequence[tuple[np.ndarray, str | None]], fps: float | None, cache_salt: str | None,
                frame_ids: Sequence[str] | None) -> dict[str, Any]:
    """The prompt as vLLM takes it: text, media, the media's cache names and the salt."""
    prompt: dict[str, Any] = {"prompt": prompt_text}
    if cache_salt:
        # vLLM mixes the salt into the first block's hash: prefix-cache
        # hits then only happen between requests with the same salt.
        prompt["cache_salt"] = cache_salt
    mm = multi_modal_data(family, frames, frames_as, [clip for clip, _ in clips], fps)
    if mm:
        prompt["multi_modal_data"] = mm
    uuids = media_uuids(cache_salt, len(frames), frame_ids, frames_as, clips)
    if uuids:
        prompt["multi_modal_uuids"] = uuids
    if fps is not None and family.fps_kwarg:
        prompt["mm_processor_kwargs"] = {"fps": fps}
    return prompt


def multi_modal_data(family: Family, frames: Sequence[np.ndarray | Image.Image], frames_as: str,
                     clips: Sequence[np.ndarray], fps: float | None) -> dict[str, Any]:
    """The frames (as images, or one video in the family's form) and the audio clips, as vLLM takes them."""
    mm: dict[str, Any] = {}
    if frames:
        if frames_as == "video":
            mm["video"] = family.video_item(as_video(frames), fps)
        else:
            mm["image"] = [to_pil(f) for f in frames]
    if clips:
        mm["audio"] = [(clip, AUDIO_RATE) for clip in clips]
    return mm


def media_uuids(cache_salt: str | None, n_frames: int, frame_ids: Sequence[str] | None, frames_as: str,
                clips: Sequence[tuple[Any, str | None]]) -> dict[str, list[str]]:
    """The names vLLM caches each frame's (or the video's) and each audio
    clip's encoding under, within the session's salt; none without a salt or names."""
    uuids: dict[str, list[str]] = {}
    if cache_salt and n_frames and frame_ids is not None and len(frame_ids) == n_frames:
        if frames_as == "video":
            uuids["video"] = [f"{cache_salt}/video/{','.join(map(str, frame_ids))}"]
        else:
            uuids["image"] = [f"{cache_salt}/{fid}" for fid in frame_ids]
    if cache_salt and clips and all(name is not None for _, name in clips):
        uuids["audio"] = [f"{cache_salt}/audio/{name}" for _, name in clips]
    return uuids
