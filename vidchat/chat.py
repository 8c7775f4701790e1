"""A question's way through the pipeline, shared by both doors:
sample the session's buffer, hand frames (and audio) to the engine, and keep
one answer per session running at a time."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Sequence

from vidchat.engine import Engine, EngineError, Reply, Turn
from vidchat.session import Sample, Session

log = logging.getLogger(__name__)


class NoFrames(EngineError):
    """A question arrived before the session had any frame."""


@dataclass
class AnswerOptions:
    frames_as: str = "images"
    max_tokens: int = 256
    temperature: float = 0.7
    include_audio: bool = True
    system_prompt: str | None = None
    seed: int | None = None

    def updated(self, **changes: Any) -> "AnswerOptions":
        return replace(self, **changes)


@dataclass
class Answer:
    """One question with exactly what the model was given."""

    question: str
    reply: Reply
    sample: Sample
    options: AnswerOptions
    prep_ms: float = 0.0

    def summary(self) -> dict[str, Any]:
        stats = self.reply.stats.as_dict()
        stats.update(
            frame_indices=list(self.sample.indices),
            frame_times=[round(t, 3) for t in self.sample.timestamps],
            frame_sizes=[f"{f.shape[1]}x{f.shape[0]}" for f in self.sample.frames],
            prep_ms=round(self.prep_ms, 2),
        )
        return stats


def start_answer(
    engine: Engine,
    session: Session,
    question: str,
    options: AnswerOptions,
    history: Sequence[Turn] = (),
) -> Answer:
    """Sample the buffer now and start the engine on it. Frames that arrive
    after this call count for the next question."""
    t0 = time.perf_counter()
    sample = session.sample()
    if not sample.frames:
        raise NoFrames("No frames yet: start the camera (or send video.frame) before asking.")
    audio = sample.audio if options.include_audio else None
    reply = engine.ask(
        question,
        frames=sample.frames,
        audio=audio,
        history=history,
        system_prompt=options.system_prompt,
        frames_as=options.frames_as,
        max_tokens=options.max_tokens,
        temperature=options.temperature,
        seed=options.seed,
    )
    prep_ms = (time.perf_counter() - t0) * 1000
    log.info(
        "session %s… question: %d frames %s, %.1f s audio, prepared in %.1f ms",
        session.id[:6],
        len(sample.frames),
        options.frames_as,
        reply.stats.audio_seconds,
        prep_ms,
    )
    return Answer(question, reply, sample, options, prep_ms=prep_ms)


async def cancel_task(task: asyncio.Task | None) -> None:
    """Cancel an answer task and wait until its vLLM request is aborted."""
    if task is None or task.done():
        return
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass
