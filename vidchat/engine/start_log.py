"""The record of every vLLM engine a run starts, kept for the test suite:
it counts them in its own process and in the servers, replays and
benchmarks it launches (vidchat.devtools.tiers)."""

from __future__ import annotations

import os

# Each start appends a line to this file when the variable names one.
ENGINE_START_LOG_ENV = "VIDCHAT_ENGINE_START_LOG"


def note_engine_start(model: str, start_s: float) -> None:
    """Append this start (process, seconds it took, model) to the file
    ``ENGINE_START_LOG_ENV`` names, if it names one."""
    path = os.environ.get(ENGINE_START_LOG_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {start_s:.1f} {model}\n")
