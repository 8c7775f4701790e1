"""The EngineCore process exits as soon as vLLM has torn it down.

vLLM runs each engine's core in a spawned process. When it is told to stop
it tears its resources down in about a second, then the interpreter's exit
runs a final cyclic garbage collection over everything vLLM unfroze (torch,
the model, the caches): on this project's 2-core machines that scan outlasts
vLLM's 5-second grace, so every shutdown waited 5 s and ended in a SIGKILL
and a "force killing" warning. vLLM already freezes the heap before exit on
ROCm for this reason; :func:`install` does the same on every platform, by
starting the core through :func:`run_engine_core`, which calls vLLM's own
and freezes what survives it.
"""

from __future__ import annotations

import gc
from typing import Any

from vllm.v1.engine.core import EngineCoreProc

# Captured at import, in the parent and in each spawned child alike; only the
# parent installs the wrapper, so this is always vLLM's own entry point.
_VLLM_RUN_ENGINE_CORE = EngineCoreProc.__dict__["run_engine_core"].__func__


def run_engine_core(*args: Any, **kwargs: Any) -> None:
    """vLLM's EngineCore entry point; what survives it is frozen, so the exit skips the final scan."""
    try:
        _VLLM_RUN_ENGINE_CORE(*args, **kwargs)
    finally:
        gc.freeze()


def install() -> None:
    """Start every later EngineCore of this process through :func:`run_engine_core` (idempotent)."""
    EngineCoreProc.run_engine_core = staticmethod(run_engine_core)
