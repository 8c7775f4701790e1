"""Engine benchmark: start time, memory, time to first token and tokens/s,
through vidchat's adapter and, as the in-run baseline, through vLLM's
AsyncLLM.generate directly with the same prompt and frames.

    .venv/bin/python bench/engine.py [--questions 20] [--frames 16] [--model tiny]
    .venv/bin/python bench/engine.py --preset smolvlm2-256m --true-size [--frames 16]

With --preset the engine runs with that preset's settings on a model built
here with the preset's true configuration and random weights (no weights can
be downloaded on these machines): reduced depth by default, every layer with
--true-size; frames are 320×240, as vidchat stores them. Each question is
cold (new frames); a second question on the same frames shows the warm cost.

Last line: `engine: ttft_ms=… tok_s=… start_s=… raw_ttft_ms=… ttft_ratio=…`
(plus `warm_ttft_ms`, `mem_gb` and `preset` with --preset).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vidchat.app import models
from vidchat.app.server import engine_options  # noqa: E402
from vidchat.app.settings import Settings  # noqa: E402
from vidchat.devtools import tinymodel  # noqa: E402
from vidchat.engine import EngineOptions  # noqa: E402
from vidchat.engine.local import LocalEngine  # noqa: E402
from vidchat.media import AUDIO_RATE  # noqa: E402

FRAME_SIZE = (480, 640)


def test_frames(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 255, (*FRAME_SIZE, 3), dtype=np.uint8) for _ in range(n)]


def preset_model(name: str, true_size: bool) -> Path:
    """A random-weight folder with the preset's true configuration."""
    preset = models.preset_named(name)
    if preset is None:
        raise SystemExit(f"no preset {name!r}; see: python app.py --model list")
    cache = Settings().cache_dir
    if preset.family == "smolvlm":
        from vidchat.devtools import smolvlm_build

        variant = smolvlm_build.variant_of(name)
        layers = smolvlm_build._true_config(variant)["text_config"]["num_hidden_layers"]
        if true_size:
            return smolvlm_build.ensure(cache, variant, text_layers=layers, vision_layers=None)
        return smolvlm_build.ensure(cache, variant)
    from vidchat.devtools import qwen_build

    return qwen_build.ensure(cache, name, true_size=true_size)


def add_model_args(parser: argparse.ArgumentParser, kv_cache_gb: float = 0.5) -> None:
    """The model choice every engine benchmark takes (read by :func:`engine_for`)."""
    parser.add_argument("--model", default="tiny", help="tiny, tiny-vl, a folder or hub id (with --preset: "
                        "real weights to run with that preset's settings)")
    parser.add_argument("--preset", default="",
                        help="run with this preset's settings on its true architecture (random weights)")
    parser.add_argument("--true-size", action="store_true", help="with --preset: every layer, not a reduced depth")
    parser.add_argument("--kv-cache-gb", type=float, default=kv_cache_gb)
    parser.add_argument("--dtype", default="", help="the engine's dtype (default: the model's own choice, "
                        "vidchat.engine.local: float32 on a CPU without native bfloat16)")


def engine_for(args: argparse.Namespace) -> EngineOptions:
    if args.preset:
        global FRAME_SIZE
        FRAME_SIZE = (240, 320)  # as vidchat stores frames
        path = args.model if args.model != "tiny" else str(preset_model(args.preset, args.true_size))
        settings = models.apply_preset(Settings(kv_cache_gb=args.kv_cache_gb), models.preset_named(args.preset))
        options = engine_options(settings, str(path), tiny=False)
        options.max_images = max(options.max_images, args.frames)
        if args.dtype:
            options.dtype = args.dtype
        return options
    tiny = args.model.startswith("tiny")
    family = "vl" if args.model == "tiny-vl" else "omni"
    path = tinymodel.ensure(Settings().cache_dir, family) if tiny else args.model
    dtype = args.dtype or ("float32" if tiny else "auto")
    return EngineOptions(model=str(path), dtype=dtype, max_model_len=8192, kv_cache_gb=0.5,
                         max_images=max(16, args.frames), max_image_pixels=tinymodel.MAX_PIXELS if tiny else 320 * 240)


def memory_gb() -> float:
    """Resident memory of this process and its children (vLLM's engine core)."""
    import psutil

    me = psutil.Process()
    return sum(p.memory_info().rss for p in [me, *me.children(recursive=True)]) / 1e9


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


async def run(args: argparse.Namespace) -> None:
    from vllm import SamplingParams

    options = engine_for(args)
    t0 = time.perf_counter()
    engine = LocalEngine.start(options)
    start_s = time.perf_counter() - t0
    ours, raw, rates, prompt_tokens, warm = [], [], [], [], []
    try:
        for i in range(args.questions + 1):  # the first of each is warm-up
            frames = test_frames(args.frames, i)
            audio = (np.sin(np.arange(int(args.audio_seconds * AUDIO_RATE)) * 0.05) * 0.2).astype(np.float32)
            reply = engine.ask("What is happening?", frames=frames, audio=audio if args.audio_seconds else None,
                               max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
            async for _ in reply:
                pass
            if i:
                ours.append(reply.stats.ttft_s * 1000)
                rates.append(reply.stats.tokens_per_s)
                prompt_tokens.append(reply.stats.prompt_tokens)
                # The same frames again with a new question: what vLLM's caches save.
                again = engine.ask("And what else?", frames=frames, audio=audio if args.audio_seconds else None,
                                   max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
                async for _ in again:
                    pass
                warm.append(again.stats.ttft_s * 1000)

            # Baseline: the same request handed to vLLM with no adapter at all.
            frames = test_frames(args.frames, 10_000 + i)
            from PIL import Image

            prompt = {"prompt": engine.build_prompt("What is happening?", n_frames=len(frames),
                                                    with_audio=bool(args.audio_seconds)),
                      "multi_modal_data": {"image": [Image.fromarray(f) for f in frames]}}
            if args.audio_seconds:
                prompt["multi_modal_data"]["audio"] = [(audio * 0.9, AUDIO_RATE)]
            params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
            t = time.perf_counter()
            first = None
            async for out in engine._llm.generate(prompt, params, f"raw-{i}"):
                if first is None and out.outputs[0].text:
                    first = time.perf_counter() - t
            if i:
                raw.append(first * 1000)
        mem = memory_gb()
    finally:
        engine.shutdown()

    print(f"{'':24}{'median':>10}{'p95':>10}")
    print(f"{'ttft vidchat (ms)':24}{statistics.median(ours):10.1f}{pct(ours, .95):10.1f}")
    print(f"{'ttft raw vLLM (ms)':24}{statistics.median(raw):10.1f}{pct(raw, .95):10.1f}")
    print(f"{'tokens/s vidchat':24}{statistics.median(rates):10.1f}{pct(rates, .05):10.1f} (p5)")
    print(f"{'ttft same frames (ms)':24}{statistics.median(warm):10.1f}{pct(warm, .95):10.1f}")
    print(f"prompt tokens per question: {prompt_tokens[0]} ({args.frames} frames {FRAME_SIZE[1]}x{FRAME_SIZE[0]})")
    print(f"engine start: {start_s:.1f} s; memory (this process + engine core): {mem:.1f} GB")
    ratio = statistics.median(ours) / statistics.median(raw)
    extra = f" preset={args.preset} true_size={int(args.true_size)}" if args.preset else ""
    print(f"engine: ttft_ms={statistics.median(ours):.1f} tok_s={statistics.median(rates):.1f} "
          f"start_s={start_s:.1f} raw_ttft_ms={statistics.median(raw):.1f} ttft_ratio={ratio:.2f} "
          f"warm_ttft_ms={statistics.median(warm):.1f} mem_gb={mem:.1f} "
          f"frames={args.frames} audio_s={args.audio_seconds:g} prompt_tokens={prompt_tokens[0]}{extra}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--audio-seconds", type=float, default=0.0, help="audio sent with each question")
    add_model_args(parser)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
