"""Which model to load: the --model option resolved to a folder or hub id.

'auto' picks a real default for the hardware and falls back to the tiny
random-weight model (with a banner saying so) when the default can't be had;
'tiny' / 'tiny-vl' build the test models once into the cache folder.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vidchat.app.settings import Settings
from vidchat.devtools import tinymodel
from vidchat.engine import EngineError, on_gpu

log = logging.getLogger(__name__)


# One-word model presets: the models people actually run, with their limits set.
#
# ``--model NAME`` takes a preset name, a hub id or a folder. A preset fills in
# the engine and answer settings that the user left at their defaults (a flag
# or ``VIDCHAT_*`` variable always wins). ``python app.py --model list`` prints
# this table.
#
# Figures: weights are bf16 sizes from the published configurations;
# "needs" is weights plus a working KV cache and vision activations. The
# families' input rules (video form, pixel cap, tiling) live in
# :mod:`vidchat.engine.prompts`.

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


def preset_named(name: str) -> Preset | None:
    return PRESETS.get(name.lower())


def apply_preset(settings: Settings, preset: Preset) -> Settings:
    """The preset's values for every setting still at its default."""
    defaults = Settings()
    changes = {k: v for k, v in preset.as_settings().items() if getattr(settings, k) == getattr(defaults, k)}
    return dataclasses.replace(settings, **changes)


def preset_table() -> str:
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


DEFAULT_GPU_MODEL = PRESETS[DEFAULT_GPU_PRESET].model

DEFAULT_CPU_MODEL = PRESETS[DEFAULT_CPU_PRESET].model

TINY_BANNER = "Replies come from a tiny model with RANDOM weights (gibberish, for testing the pipeline)."


def tiny_banner() -> str:
    """The tiny model's banner, with a real model that fits this machine:
    the GPU default on a GPU, the CPU default (small enough for a laptop)
    on a CPU, where the GPU default would not run."""
    preset = DEFAULT_GPU_PRESET if on_gpu() else DEFAULT_CPU_PRESET
    return (f"{TINY_BANNER} Start with --model <preset, hub id or folder> for real answers, e.g. "
            f"--model {preset} ({PRESETS[preset].model}).")


def resolve_preset(name: str) -> Preset | None:
    """The preset --model names ('auto' names the hardware's default), if any."""
    if name == "auto":
        return preset_named(DEFAULT_GPU_PRESET if on_gpu() else DEFAULT_CPU_PRESET)
    return preset_named(name)


def resolve_model(name: str, cache_dir: str) -> tuple[str, str | None]:
    """Map the --model option to a local folder or hub id.

    Returns (model, banner): banner is a warning to show users, or None."""
    preset = preset_named(name)
    if preset is not None:
        return preset.model, None
    if name in ("tiny", "tiny-omni"):
        return str(tinymodel.ensure(cache_dir, "omni")), tiny_banner()
    if name == "tiny-vl":
        return str(tinymodel.ensure(cache_dir, "vl")), tiny_banner()
    if name == "auto":
        default = DEFAULT_GPU_MODEL if on_gpu() else DEFAULT_CPU_MODEL
        if _hub_model_available(default):
            return default, None
        log.warning("default model %s cannot be loaded (offline, not cached): using the tiny test model", default)
        return str(tinymodel.ensure(cache_dir, "omni")), tiny_banner() + f" ({default} could not be downloaded.)"
    path = Path(name).expanduser()
    if path.exists() or name.startswith((".", "/", "~")):
        if not (path / "config.json").is_file():
            raise EngineError(f"--model {name}: no such model folder (expected a config.json in it)")
        return str(path), None
    return name, None  # a hub id: vLLM downloads it (or fails with its own message)


def _hub_model_available(repo: str) -> bool:
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(repo, local_files_only=True)
        return True
    except Exception:
        pass
    try:
        from huggingface_hub import HfApi

        HfApi().model_info(repo, timeout=5)
        return True
    except Exception:
        return False


def resolve_settings(settings: Any) -> tuple[Any, str, str | None]:
    """(settings with its preset applied, model path, banner) for
    settings.model, as app.py, replay and suites resolve it: the remote
    server's model with --engine-url and no --model (path ""); raises
    EngineError or ValueError naming what is wrong."""
    if settings.engine_url and settings.model == "auto":
        model_path, banner = "", None  # the remote server's model (vidchat.engine.remote)
    else:
        model_path, banner = resolve_model(settings.model, settings.cache_dir)
    preset = resolve_preset(settings.preset or settings.model)
    if settings.model == "auto" and not settings.engine_url:
        # Resolved before anything is written: a record, a bundle or a
        # suite's baseline names the model 'auto' chose, never 'auto' (on
        # another machine 'auto' is another model).
        chosen = "tiny" if banner is not None or preset is None else preset.name
        log.info("--model auto: %s", chosen)
        settings = dataclasses.replace(settings, model=chosen)
    if settings.preset and preset is None:
        raise ValueError(f"--preset {settings.preset}: no such preset (python app.py --model list shows them)")
    if preset is not None and banner is None:  # not when 'auto' fell back to the tiny model
        settings = apply_preset(settings, preset)
        log.info("preset %s: %s", preset.name, preset.model)
    return settings, model_path, banner



