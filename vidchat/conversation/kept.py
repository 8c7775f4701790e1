"""What the model got, kept: each answered question's inputs stay with its
session (the last few, under an unguessable id) for the page's "what the
model got" view and its downloads, and a finished answer is saved as a
bundle when recording is on. The one recording rule of every door; the view
and the routes that serve it are vidchat.doors.inputs."""

from __future__ import annotations

import asyncio
import collections
import logging
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vidchat.conversation.recording import write_bundle

if TYPE_CHECKING:
    from vidchat.conversation.answer_path import Answer

log = logging.getLogger(__name__)

# ``entry`` below is a session's vidchat.conversation.Conversation, typed Any:
# the conversation imports this module, and an import back would be a cycle.

KEEP_PER_SESSION = 8
# Recorded bundles a session keeps track of (their folders stay on disk; the
# oldest is only forgotten by the session's download links).
KEEP_BUNDLES_PER_SESSION = 64


def remember(entry: Any, answer: "Answer") -> str:
    """Keep an answer's inputs for its session's page; returns its id (the
    same id when the answer is already kept, e.g. a spoken question's
    player shown before its answer)."""
    kept: collections.OrderedDict = entry.answers
    for known_id, known in kept.items():
        if known is answer:
            return known_id
    answer_id = secrets.token_urlsafe(16)
    kept[answer_id] = answer
    while len(kept) > KEEP_PER_SESSION:
        kept.popitem(last=False)
    return answer_id


def chat_answers(entry: Any) -> list[tuple[str, "Answer"]]:
    """The kept answers of the chat as it is now, newest first, as (id,
    answer): those of a cleared chat are left out (their inputs stay served
    while kept, and the live view's timings still count them)."""
    chat = entry.generation
    return [(answer_id, answer) for answer_id, answer in reversed(entry.answers.items())
            if getattr(answer, "chat", 0) == chat]


async def save_bundle(state: Any, entry: Any, answer: "Answer", answer_id: str, source: str) -> Path:
    """Save a finished answer as a bundle under --record-dir, in its
    session's folder, and keep it for the session's download links: the one
    recording rule of the page and the socket. Raises RecordingOff without
    --record-dir (nothing is written unless the server was told where), and
    OSError when the folder can't be written."""
    root = state.settings.record_dir
    if not root:
        raise RecordingOff("the server was started without --record-dir")
    folder = Path(root) / f"session-{time.strftime('%Y%m%d')}-{entry.session.id[:8]}"
    engine = answer.reply.engine  # the engine that answered: the second model's answers are its own
    path = await asyncio.to_thread(write_bundle, folder, answer, source=source,
                                   model_option=model_option(state.settings, answer),
                                   engine_options=engine.options)
    keep_bundle(entry, answer_id, path)
    log.info("session %s… answer recorded in %s", entry.session.id[:6], path)
    return path


def model_option(settings: Any, answer: "Answer") -> str:
    """The option the answering engine's model was chosen by (--model, or
    --compare-model for the second model): what a replay or a baseline of the
    answer names, so neither is credited to the other model."""
    return settings.compare_model if answer.engine_role == "compare" else settings.model


class RecordingOff(Exception):
    pass


def keep_bundle(entry: Any, answer_id: str, path: Any) -> None:
    """Remember a recorded answer's bundle folder for the session's download links."""
    entry.bundles[answer_id] = path
    while len(entry.bundles) > KEEP_BUNDLES_PER_SESSION:
        entry.bundles.pop(next(iter(entry.bundles)))


def find(registry: Any, answer_id: str) -> "tuple[Any, Answer] | tuple[None, None]":
    for entry in registry.entries():
        answer = entry.answers.get(answer_id)
        if answer is not None:
            return entry, answer
    return None, None


def record(answer: "Answer", answer_id: str | None = None) -> dict[str, Any]:
    """The answer record: question, answer text and everything the model was given (frames by time and index)."""
    out = {"id": answer_id, "question": answer.question, "answer": answer.reply.text}
    out.update(answer.summary())
    return out
