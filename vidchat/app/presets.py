"""One-word model presets: the models people actually run, with their limits set.

``--model NAME`` takes a preset name, a hub id or a folder. A preset fills in
the engine and answer settings that the user left at their defaults (a flag
or ``VIDCHAT_*`` variable always wins). ``python app.py --model list`` prints
this table.

Figures: weights are bf16 sizes from the published configurations;
"needs" is weights plus a working KV cache and vision activations. The
families' input rules (video form, pixel cap, tiling) live in
:mod:`vidchat.engine.families`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from vidchat.app.settings import Settings


@dataclass(frozen=True)
class Preset:
    name: str
    model: str  # hub id
    family: str
    where: str  # "GPU", "CPU" or "CPU or GPU"
    needs: str  # memory, in words
    audio: bool
    video: str  # how frames go as a video: "yes", "no (frames as images)"
    frames_per_question: int
    # Settings this preset fills in (when the user left them at their defaults).
    settings: tuple[tuple[str, Any], ...] = ()
    note: str = ""

    def as_settings(self) -> dict[str, Any]:
        return dict(self.settings, frames_per_question=self.frames_per_question)


# 320×240 frames: what vidchat stores anyway; 88 tokens a frame for Qwen2.5.
QWEN_PIXELS = 320 * 240

PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("qwen2.5-omni-3b", "Qwen/Qwen2.5-Omni-3B", "qwen2.5-omni", "GPU", "≥ 16 GB GPU (8.8 GB weights)",
           audio=True, video="yes", frames_per_question=16,
           settings=(("max_model_len", 16384), ("max_images", 32), ("max_image_pixels", QWEN_PIXELS))),
    Preset("qwen2.5-omni-7b", "Qwen/Qwen2.5-Omni-7B", "qwen2.5-omni", "GPU", "24 GB GPU, tight (17.9 GB weights)",
           audio=True, video="yes", frames_per_question=16,
           settings=(("max_model_len", 8192), ("max_images", 24), ("max_image_pixels", QWEN_PIXELS),
                     ("gpu_memory_utilization", 0.92))),
    Preset("qwen2.5-vl-3b", "Qwen/Qwen2.5-VL-3B-Instruct", "qwen2.5-vl", "GPU", "≥ 12 GB GPU (7.5 GB weights)",
           audio=False, video="yes (frames with their metadata)", frames_per_question=16,
           settings=(("max_model_len", 16384), ("max_images", 32), ("max_image_pixels", QWEN_PIXELS),
                     ("max_audios", 0))),
    Preset("qwen2.5-vl-7b", "Qwen/Qwen2.5-VL-7B-Instruct", "qwen2.5-vl", "GPU", "24 GB GPU (16.6 GB weights)",
           audio=False, video="yes (frames with their metadata)", frames_per_question=16,
           settings=(("max_model_len", 8192), ("max_images", 24), ("max_image_pixels", QWEN_PIXELS),
                     ("max_audios", 0), ("gpu_memory_utilization", 0.92))),
    Preset("qwen3-vl-4b", "Qwen/Qwen3-VL-4B-Instruct", "qwen3-vl", "GPU", "≥ 16 GB GPU (8.9 GB weights)",
           audio=False, video="yes (frames with their metadata)", frames_per_question=16,
           settings=(("max_model_len", 16384), ("max_images", 32), ("max_audios", 0)),
           note="the largest Qwen3-VL that leaves a 24 GB GPU room for a long KV cache (8B: 17.5 GB weights)"),
    Preset("smolvlm2-256m", "HuggingFaceTB/SmolVLM2-256M-Video-Instruct", "smolvlm", "CPU or GPU",
           "~4 GB RAM (0.5 GB weights)", audio=False, video="no (frames as images)", frames_per_question=4,
           settings=(("max_model_len", 8192), ("max_images", 16), ("max_videos", 0), ("max_audios", 0),
                     ("frames_as", "images"), ("sampling", "stable")),
           note="67 tokens a frame (tiling off); on 2 CPU cores each new frame costs 0.5-2 s of vision "
                "encoding: 'stable' sampling and encoding ahead keep it to one new frame a question"),
    Preset("smolvlm2-2.2b", "HuggingFaceTB/SmolVLM2-2.2B-Instruct", "smolvlm", "CPU or GPU",
           "~10 GB RAM (4.5 GB weights)", audio=False, video="no (frames as images)", frames_per_question=4,
           settings=(("max_model_len", 8192), ("max_images", 16), ("max_videos", 0), ("max_audios", 0),
                     ("frames_as", "images"), ("sampling", "stable")),
           note="84 tokens a frame (tiling off); slow on a small CPU"),
)}

DEFAULT_GPU_PRESET = "qwen2.5-omni-3b"
DEFAULT_CPU_PRESET = "smolvlm2-256m"


def get(name: str) -> Preset | None:
    return PRESETS.get(name.lower())


def apply(settings: Settings, preset: Preset) -> Settings:
    """The preset's values for every setting still at its default."""
    defaults = Settings()
    changes = {k: v for k, v in preset.as_settings().items() if getattr(settings, k) == getattr(defaults, k)}
    return dataclasses.replace(settings, **changes)


def table() -> str:
    """The presets as a table for `--model list`."""
    rows = [("preset", "model", "runs on", "needs", "audio", "video", "frames/question")]
    for p in PRESETS.values():
        rows.append((p.name, p.model, p.where, p.needs, "yes" if p.audio else "no", p.video,
                     str(p.frames_per_question)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"  {p.name}: {p.note}" for p in PRESETS.values() if p.note]
    return "\n".join(lines + ["", "Notes:", *notes,
                              "", "Also: --model tiny / tiny-vl (random-weight test models), any hub id or folder."])
