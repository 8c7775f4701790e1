"""What vLLM's failures mean, in the words a user reads: an exception
reworded as what to change, and a dead engine's cause (its process's exit)."""

from __future__ import annotations

import logging
import signal
from typing import Any

from vidchat.engine import EngineDead, EngineError, engine_dead_message

log = logging.getLogger(__name__)


def core_exit_codes(llm: Any) -> list[int | None] | None:
    """How vLLM's EngineCore processes ended (0: by themselves; -9: killed
    after vLLM's grace), or None when this vLLM does not say."""
    try:
        return [proc.exitcode for proc in llm.engine_core.resources.engine_manager.processes]
    except AttributeError:
        return None


def death_cause(codes: list[int | None] | None) -> str:
    """Why an engine whose EngineCore processes ended so died, in words."""
    for code in codes or ():
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"its process was killed ({name})"
        if code:
            return f"its process exited with code {code}"
    return "its process stopped"


def reworded_error(exc: BaseException, request_id: str, max_model_len: int, dead: Any,
                   why_dead: Any = lambda: None) -> EngineError:
    """vLLM's exception as the error a user reads: what to change, where
    something can be changed. ``dead()``: whether the engine has died;
    ``why_dead()``: why, in words."""
    from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

    cause = exc.__cause__ if isinstance(exc, EngineGenerateError) and exc.__cause__ else exc
    text = str(cause)
    if isinstance(exc, EngineDeadError) or dead():
        return EngineDead(engine_dead_message(why_dead()))
    if "longer than the maximum model length" in text or "maximum context length" in text:
        return EngineError(
            f"The question with its frames and chat history is too long for the model "
            f"(limit {max_model_len} tokens): send fewer frames, clear the "
            f"chat, or restart with a larger --max-model-len. ({text.splitlines()[0]})"
        )
    if "may be provided in one prompt" in text:
        return EngineError(f"{text.splitlines()[0]} Lower 'frames per question' or raise --max-images.")
    log.exception("request %s failed", request_id, exc_info=exc)
    return EngineError(f"The model failed to answer: {text.splitlines()[0] if text else type(cause).__name__}")
