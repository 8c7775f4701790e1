"""What an engine raises when a question cannot be answered, and the words
the user is told: a refusal to change the question, or the engine's death."""

from __future__ import annotations


class EngineError(RuntimeError):
    """A question could not be answered; the message tells the user what to change."""


class EngineDead(EngineError):
    """The engine process is gone (vidchat.app.engine_keeper starts a new one)."""


ENGINE_DEAD_MESSAGE = "The model engine has stopped (see the server log for the cause)."


def engine_dead_message(cause: str | None) -> str:
    """What an answer in flight says when the engine dies: one failure naming the cause."""
    return f"The model engine has stopped: {cause}." if cause else ENGINE_DEAD_MESSAGE


# What a page or client asking by voice is told when the model hears nothing.
NO_SPOKEN_QUESTIONS = (
    "This model does not take audio, so it can't be asked by voice. For Talk mode run a model "
    "that hears: --preset qwen2.5-omni-3b on a GPU (or --model tiny-omni to try the pipeline "
    "with random weights)."
)
