"""Which model to load: the --model option resolved to a folder or hub id.

'auto' picks a real default for the hardware and falls back to the tiny
random-weight model (with a banner saying so) when the default can't be had;
'tiny' / 'tiny-vl' build the test models once into the cache folder.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from vidchat.app import presets
from vidchat.devtools import tinymodel
from vidchat.engine import EngineError, on_gpu

log = logging.getLogger(__name__)

DEFAULT_GPU_MODEL = presets.PRESETS[presets.DEFAULT_GPU_PRESET].model
DEFAULT_CPU_MODEL = presets.PRESETS[presets.DEFAULT_CPU_PRESET].model
TINY_BANNER = "Replies come from a tiny model with RANDOM weights (gibberish, for testing the pipeline)."


def tiny_banner() -> str:
    """The tiny model's banner, with a real model that fits this machine:
    the GPU default on a GPU, the CPU default (small enough for a laptop)
    on a CPU, where the GPU default would not run."""
    preset = presets.DEFAULT_GPU_PRESET if on_gpu() else presets.DEFAULT_CPU_PRESET
    return (f"{TINY_BANNER} Start with --model <preset, hub id or folder> for real answers, e.g. "
            f"--model {preset} ({presets.PRESETS[preset].model}).")


def resolve_preset(name: str) -> presets.Preset | None:
    """The preset --model names ('auto' names the hardware's default), if any."""
    if name == "auto":
        return presets.get(presets.DEFAULT_GPU_PRESET if on_gpu() else presets.DEFAULT_CPU_PRESET)
    return presets.get(name)


def resolve_model(name: str, cache_dir: str) -> tuple[str, str | None]:
    """Map the --model option to a local folder or hub id.

    Returns (model, banner): banner is a warning to show users, or None."""
    preset = presets.get(name)
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
    if settings.preset and preset is None:
        raise ValueError(f"--preset {settings.preset}: no such preset (python app.py --model list shows them)")
    if preset is not None and banner is None:  # not when 'auto' fell back to the tiny model
        settings = presets.apply(settings, preset)
        log.info("preset %s: %s", preset.name, preset.model)
    return settings, model_path, banner
