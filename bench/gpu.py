"""GPU benchmark: vidchat's answer path on real-size models, through real vLLM.

    .venv/bin/python bench/gpu.py                 # on a GPU: the default presets at true size
    .venv/bin/python bench/gpu.py --presets qwen2.5-vl-3b --repeats 5
    .venv/bin/python bench/gpu.py --cpu-smoke     # the same rows on the tiny model, on CPU (as the suite does)

No weights are downloaded: each preset is built here with its true
configuration and random weights (bench/engine.py's preset_model), so the
numbers are the architecture's costs, not answers. Frames are 448x448 (the
sessions here store them at that size too). For each model, the median over
--repeats of:

* time to first token (from the question, vidchat's own work included) and
  decode tokens/s, for 1, 8 and 16 new frames;
* re-ask: a second question on the same 16 frames (prefix and encoder caches);
* the 16 frames as one video instead of images, and, where the family
  supports it (Qwen2.5-VL, Qwen3-VL), as a video with vLLM's
  ``video_pruning_rate`` 0.5 (a second engine start);
* with 5 s of audio, for a model that hears (Omni);
* warm-ups (bench/warm.py's rows, frames of this size): 16 frames cold, warm
  (after a warm-up of the same sample), slid by 1 and by 4 new frames, and a
  text-only question of the same prompt length;
* overhead: vidchat's own time from question to engine call (sampling the
  session, building the prompt).

Prints a table and ends with `gpu: device=… ttft16_ms=… reask_ttft16_ms=…
overhead_ms=… tok_s16=… model=… warm_cold_ms=… warm_warm_ms=… warm_slid1_ms=…
warm_slid4_ms=… warm_text_ms=…` for the first model. On one H200 the default run is sized to
finish in under 8 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import preset_model  # noqa: E402  (bench/engine.py: random-weight true-size presets)
from warm import rows as warm_rows  # noqa: E402  (bench/warm.py: the cold/warm/slid rows)

from vidchat.app import models
from vidchat.app.server import engine_options  # noqa: E402
from vidchat.app.settings import Settings  # noqa: E402
from vidchat.conversation import runs
from vidchat.conversation.answers import AnswerOptions
from vidchat.conversation.registry import (
    SessionRegistry,  # noqa: E402
    Standalone,
)
from vidchat.devtools import tinymodel  # noqa: E402
from vidchat.engine import EngineOptions  # noqa: E402
from vidchat.engine.local import LocalEngine  # noqa: E402
from vidchat.media import AUDIO_RATE  # noqa: E402
from vidchat.media.session import SessionSettings  # noqa: E402

log = logging.getLogger("bench.gpu")
SIDE = 448
PIXELS = SIDE * SIDE
DEFAULT_PRESETS = ("qwen2.5-vl-3b", "qwen2.5-omni-3b")
PRUNING_FAMILIES = ("qwen2.5-vl", "qwen3-vl")
PRUNING_RATE = 0.5


def device_name() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0).replace(" ", "_")
    except ImportError:
        pass
    return "cpu"


def options_for(name: str, true_size: bool) -> EngineOptions:
    if name == "tiny":
        path = tinymodel.ensure(Settings().cache_dir, "omni")
        return EngineOptions(model=str(path), dtype="float32", max_model_len=8192, kv_cache_gb=0.5, max_images=16,
                             max_image_pixels=PIXELS, encoder_cache_frames=2 * 16)
    preset = models.preset_named(name)
    if preset is None:
        raise SystemExit(f"no preset {name!r}; see: python app.py --model list")
    settings = models.apply_preset(Settings(), preset)
    options = engine_options(settings, str(preset_model(name, true_size)), tiny=False)
    options.max_image_pixels = PIXELS
    options.max_images = max(options.max_images, 16)
    options.encoder_cache_frames = 2 * 16
    return options


class Scene:
    """Distinct 448x448 frames (every one new to the engine) and a tone."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.t = 0.0

    def feed(self, entry, frames: int, audio_s: float = 0.0) -> None:
        for _ in range(frames):
            self.t += 0.1
            entry.session.add_frame(self.rng.integers(0, 255, (SIDE, SIDE, 3), dtype=np.uint8), t=self.t)
        if audio_s:
            t = np.arange(int(audio_s * AUDIO_RATE)) / AUDIO_RATE
            entry.session.add_audio((0.2 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), self.t - audio_s)


async def question(engine: LocalEngine, entry, options: AnswerOptions, text: str) -> dict[str, float]:
    """Time to first token from the question, decode rate, and vidchat's own share."""
    t0 = time.perf_counter()
    run = await entry.ask(text, options, engine=engine, continues_chat=False)
    first = None
    async for event in run.events():
        if isinstance(event, runs.Delta) and first is None:
            first = time.perf_counter() - t0
    answer = run.answer
    stats = answer.reply.stats
    return {"ttft": (first if first is not None else time.perf_counter() - t0) * 1000,
            "tok_s": stats.tokens_per_s or 0.0, "overhead": answer.prep_ms, "prompt": stats.prompt_tokens,
            "cached": stats.cached_tokens}


async def case(engine: LocalEngine, repeats: int, frames: int, *, tokens: int, frames_as: str = "images",
               audio_s: float = 0.0, reask: bool = False) -> dict[str, float]:
    """One row: the median over `repeats` sessions, each with new frames."""
    registry = Standalone(engine, registry=SessionRegistry(repeats + 1)).registry
    options = AnswerOptions(max_tokens=tokens, temperature=0.0, include_audio=audio_s > 0, frames_as=frames_as)
    results = []
    for r in range(repeats):
        entry = registry.create("webrtc", SessionSettings(evs_enabled=False, num_sample_frames=frames),
                                store_max_pixels=PIXELS)
        Scene(1000 * r + frames).feed(entry, frames, audio_s)
        result = await question(engine, entry, options, "What happens in this video?")
        if reask:
            result = await question(engine, entry, options, "And what colour is it?")
        results.append(result)
        await registry.close(entry.session.id)
    return {k: statistics.median(r[k] for r in results) for k in results[0]}


async def measure(options: EngineOptions, label: str, repeats: int, tokens: int) -> dict[str, dict[str, float]]:
    engine = await asyncio.to_thread(LocalEngine.start, options)
    try:
        return await engine_rows(engine, label, repeats, tokens)
    finally:
        engine.shutdown()


async def engine_rows(engine: LocalEngine, label: str, repeats: int, tokens: int) -> dict[str, dict[str, float]]:
    """The rows on a running engine (the suite runs them on its shared tiny engine)."""
    rows: dict[str, dict[str, float]] = {}
    print(f"\n{label}: {engine.model_path} ({engine.model_revision}), started in {engine.start_s:.1f} s, "
          f"{SIDE}x{SIDE} frames, median of {repeats}", flush=True)
    await case(engine, 1, 1, tokens=2)  # first-request costs (kernels, allocator) out of the rows
    for n in (1, 8, 16):
        rows[f"{n} frames"] = await case(engine, repeats, n, tokens=tokens)
    rows["16 frames, re-ask"] = await case(engine, repeats, 16, tokens=tokens, reask=True)
    if engine.accepts_video:
        rows["16 frames as video"] = await case(engine, repeats, 16, tokens=tokens, frames_as="video")
    if engine.accepts_audio:
        rows["16 frames + 5 s audio"] = await case(engine, repeats, 16, tokens=tokens, audio_s=5.0)
    warm = await warm_rows(engine, 16, repeats, "images", "stable", frame=(SIDE, SIDE))
    rows["warm-ups"] = {f"warm_{k}": v for k, v in warm.items()}
    return rows


async def pruned_video(options: EngineOptions, repeats: int, tokens: int) -> dict[str, float]:
    engine = await asyncio.to_thread(LocalEngine.start, dataclasses.replace(options, video_pruning_rate=PRUNING_RATE))
    try:
        await case(engine, 1, 1, tokens=2)
        return await case(engine, repeats, 16, tokens=tokens, frames_as="video")
    finally:
        engine.shutdown()


def table(rows: dict[str, dict[str, float]]) -> None:
    print(f"{'case':32s} {'ttft ms':>9s} {'tok/s':>8s} {'prompt':>7s} {'cached':>7s} {'vidchat ms':>11s}")
    for name, r in rows.items():
        if name == "warm-ups":
            continue  # printed as its own line by bench/warm.py
        print(f"{name:32s} {r['ttft']:9.1f} {r['tok_s']:8.1f} {r['prompt']:7.0f} {r['cached']:7.0f} "
              f"{r['overhead']:11.2f}", flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default=",".join(DEFAULT_PRESETS),
                        help="comma-separated presets (python app.py --model list)")
    parser.add_argument("--reduced", action="store_true", help="reduced-depth builds instead of true size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64, help="answer length (tokens/s is measured on it)")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="the tiny model on CPU, one repeat, short answers: checks the script, not a GPU")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.cpu_smoke:
        models, repeats, tokens = ["tiny"], 1, 8
    else:
        models, repeats, tokens = [m.strip() for m in args.presets.split(",") if m.strip()], args.repeats, args.tokens
    device = device_name()
    print(f"device {device}", flush=True)
    first: dict[str, dict[str, float]] | None = None
    for name in models:
        options = options_for(name, true_size=not args.reduced)
        rows = await measure(options, name, repeats, tokens)
        family = models.preset_named(name).family if models.preset_named(name) else "tiny"
        if family in PRUNING_FAMILIES:
            rows[f"16 frames as video, pruned {PRUNING_RATE:g}"] = await pruned_video(options, repeats, tokens)
        else:
            print(f"(video_pruning_rate: not supported by the {family} family)")
        table(rows)
        first = first or rows
    assert first is not None
    print(summary(device, models[0], first))


def summary(device: str, model: str, rows: dict[str, dict[str, float]]) -> str:
    """The last line: the first model's 16-frame and warm-up figures."""
    return (f"gpu: device={device} ttft16_ms={rows['16 frames']['ttft']:.1f} "
            f"reask_ttft16_ms={rows['16 frames, re-ask']['ttft']:.1f} "
            f"overhead_ms={rows['16 frames']['overhead']:.2f} tok_s16={rows['16 frames']['tok_s']:.1f} "
            f"model={model} " + " ".join(f"{k}_ms={v:.1f}" for k, v in rows["warm-ups"].items()))


if __name__ == "__main__":
    asyncio.run(main())
