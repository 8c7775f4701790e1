"""What the machine can do for the model: a GPU, or a CPU that computes
bfloat16 natively (vidchat.engine.vllm_args picks the dtype from it)."""

from __future__ import annotations

from pathlib import Path


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes bfloat16 natively (x86 avx512_bf16 or
    amx_bf16, Arm's bf16 feature). Unknown platforms count as yes, so vLLM's
    own choice stands there."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return True
    flags = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    if not flags:
        return True
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def on_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # a CPU-only torch may not even have the CUDA module
        return False
