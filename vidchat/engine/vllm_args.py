"""vLLM's engine arguments for vidchat's options on this machine: the
dtype, the processor and its tokens per frame, the per-prompt limits, the
caches' sizes, the scheduling policy and the stat loggers."""

from __future__ import annotations

import logging
from typing import Any

from vidchat.engine import EngineError, EngineOptions, cpu_has_native_bf16, tokens_per_frame
from vidchat.engine.families import Family
from vidchat.engine.native_memory import WORKER_EXTENSION

log = logging.getLogger(__name__)

# vLLM's encoder cache is as large as its per-step token budget
# (max_num_batched_tokens; 2,048 on CPU, at least 8,192 on a GPU), which
# cannot be set apart. Raised only when a sample per session needs more, and
# never past this: a step that large is as long as the budget allows.
ENCODER_CACHE_FLOOR_TOKENS = {"cpu": 2048, "gpu": 8192}
ENCODER_CACHE_MAX_TOKENS = 65536


def dtype_for(dtype: str, gpu: bool) -> str:
    """The dtype vLLM runs the model in: ``auto`` means float32 on a CPU without native bfloat16."""
    if dtype == "auto" and not gpu and not cpu_has_native_bf16():
        # vLLM's "auto" runs a bfloat16 checkpoint in bfloat16 on a CPU
        # too; without native bf16 instructions every matmul is emulated,
        # about 100x slower than float32 here (AVX2: 2.7 s against 21 ms).
        log.info("this CPU has no native bfloat16 (avx512_bf16, amx_bf16 or Arm bf16): running the model in "
                 "float32, which is many times faster here; --dtype bfloat16 overrides")
        return "float32"
    return dtype


def vllm_engine_kwargs(options: EngineOptions, dtype: str, gpu: bool, processor_kwargs: dict[str, Any],
                       per_frame: int | None) -> dict[str, Any]:
    """vLLM's engine arguments for these options on this machine (``per_frame``:
    the processor's tokens per frame, which sizes the encoder cache when asked)."""
    limits = {"image": options.max_images, "video": options.max_videos, "audio": options.max_audios}
    kwargs: dict[str, Any] = dict(
        model=options.model,
        dtype=dtype,
        max_model_len=options.max_model_len,
        limit_mm_per_prompt=limits,
        enforce_eager=options.enforce_eager,
        disable_log_stats=True,
        seed=options.seed,
    )
    # vLLM keeps processed frames for reuse (4 GiB by default): bounded
    # here, since live video makes every frame new and the cache only grows.
    kwargs["mm_processor_cache_gb"] = options.mm_cache_gb
    # No "Loading safetensors checkpoint shards" progress bar on the console:
    # the model loads in seconds and "engine ready" says when it has.
    kwargs["use_tqdm_on_load"] = False
    # The engine core gives its free native memory back now and then (vidchat.engine.native_memory).
    kwargs["worker_extension_cls"] = WORKER_EXTENSION
    # Warm-ups (vidchat.conversation.prewarm) run at a lower priority than answers, so
    # a question never waits behind a queued warm-up. Only when warm-ups
    # are on from the start: otherwise vLLM schedules first come, first
    # served, exactly as before warm-ups existed.
    if options.priority_scheduling:
        kwargs["scheduling_policy"] = "priority"
    if processor_kwargs:
        kwargs["mm_processor_kwargs"] = processor_kwargs
    if options.encoder_cache_frames > 0:
        if per_frame:
            budget = encoder_cache_budget(per_frame, options.encoder_cache_frames, gpu)
            if budget is not None:
                kwargs["max_num_batched_tokens"] = budget
    if gpu:
        kwargs["gpu_memory_utilization"] = options.gpu_memory_utilization
    if options.video_pruning_rate > 0:
        kwargs["video_pruning_rate"] = options.video_pruning_rate
    if options.tensor_parallel_size > 1:
        kwargs["tensor_parallel_size"] = options.tensor_parallel_size
    if options.data_parallel_size > 1:
        kwargs["data_parallel_size"] = options.data_parallel_size
    else:
        # Unset, vLLM on CPU reserves most of the RAM and starts slowly.
        kwargs["kv_cache_memory_bytes"] = int(options.kv_cache_gb * (1 << 30))
        kwargs["distributed_executor_backend"] = "uni"
    return kwargs


def load_processor(options: EngineOptions, family: Family) -> tuple[Any, dict[str, Any], int | None]:
    """The model's processor, the kwargs vLLM's processor gets, and its tokens per frame (None: not measurable)."""
    from transformers import AutoProcessor

    processor_kwargs = family.processor_kwargs(options.max_image_pixels)
    if options.max_image_pixels and family.pixel_cap is None:
        log.info("%s: the per-frame pixel cap is not passed to this model family's processor "
                 "(frames are still stored at no more than %d pixels)", family.name, options.max_image_pixels)
    try:
        processor = AutoProcessor.from_pretrained(options.model)
    except ImportError as exc:  # e.g. SmolVLM's processor needs num2words
        raise EngineError(f"the processor of {options.model!r} needs a package that is missing: {exc}") from exc
    # Measured always: the history budget (fit_history) reserves each
    # frame's tokens; the encoder cache is sized by it when asked.
    per_frame = None
    try:
        per_frame = tokens_per_frame(processor, options.max_image_pixels, processor_kwargs)
    except Exception as exc:  # a processor with other call conventions: vLLM's size stays
        log.warning("could not measure tokens per frame for %s (%s); vLLM's encoder cache keeps "
                    "its default size", options.model, exc)
    return processor, processor_kwargs, per_frame


def stat_loggers(options: EngineOptions) -> list[Any] | None:
    """vLLM's stat loggers: its Prometheus one alone where asked (its vllm:
    families for /metrics; vLLM's default logger would print a stats line
    every few seconds), none otherwise."""
    if not options.prometheus_stats:
        return None
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    return [PrometheusStatLogger]


def encoder_cache_budget(per_frame: int, frames: int, gpu: bool) -> int | None:
    """vLLM's ``max_num_batched_tokens`` that makes its encoder cache hold
    ``frames`` frames of ``per_frame`` tokens; None where its default does."""
    floor = ENCODER_CACHE_FLOOR_TOKENS["gpu" if gpu else "cpu"]
    need = per_frame * frames
    if need <= floor:
        return None
    if need > ENCODER_CACHE_MAX_TOKENS:
        log.warning("vLLM's encoder cache would need %d tokens for %d frames of %d tokens; capped at %d "
                    "(%d frames): lower --max-sessions or frames per question to keep every session's "
                    "frames encoded", need, frames, per_frame, ENCODER_CACHE_MAX_TOKENS,
                    ENCODER_CACHE_MAX_TOKENS // per_frame)
        return ENCODER_CACHE_MAX_TOKENS
    return need
