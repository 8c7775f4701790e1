"""The session's events (vidchat.conversation.session_events) as the page
reads them: server-sent events, one per event, named by what happened, with
a JSON body. The door only translates; what happens is the conversation's."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from vidchat.conversation import Delta, Done, Queued, Started
from vidchat.conversation.session_events import (
    AnswerEvent, ChatCleared, Closed, Notice, QuestionAsked, QuestionRefused, SceneChanged, SessionEvent, SettingsChanged, SoundLevel, SourceState, SpeechStarted,
    SpeechStopped, Subscription, Utterance,
)

# A comment line this often keeps a proxy from closing a quiet stream.
KEEPALIVE_S = 15.0


def wire(event: SessionEvent) -> tuple[str, dict[str, Any]]:
    """(event name, body) of one session event."""
    if isinstance(event, QuestionAsked):
        return "question.asked", {"ticket": event.ticket, "question": event.question, "cause": event.cause,
                                  "at": event.at, "spoken_seconds": event.spoken_seconds}
    if isinstance(event, QuestionRefused):
        return "question.refused", {"ticket": event.ticket, "why": event.why, "reason": event.reason}
    if isinstance(event, ChatCleared):
        return "chat.cleared", {}
    if isinstance(event, Notice):
        return "notice", {"text": event.text}
    if isinstance(event, AnswerEvent):
        side = {"side": True} if event.side else {"ticket": event.ticket}
        inner = event.event
        if isinstance(inner, Queued):
            return "answer.queued", {"ahead": inner.ahead, **side}
        if isinstance(inner, Started):
            return "answer.started", {"question": inner.answer.question, **side}
        if isinstance(inner, Delta):
            return "answer.delta", {"text": inner.text, **side}
        if isinstance(inner, Done):
            return "answer.done", {"answer_id": event.answer_id, "status": inner.status, "error": inner.error,
                                   "text": inner.text, **side}
    if isinstance(event, SpeechStarted):
        return "speech.started", {"t": event.start}
    if isinstance(event, SpeechStopped):
        return "speech.stopped", {"t": event.t}
    if isinstance(event, Utterance):
        return "utterance", {"start": event.start, "end": event.end}
    if isinstance(event, SoundLevel):
        return "sound.level", {"dbfs": event.dbfs, "t": event.t}
    if isinstance(event, SceneChanged):
        return "scene.changed", {"t": event.t}
    if isinstance(event, SettingsChanged):
        return "settings.changed", dict(event.values)
    if isinstance(event, SourceState):
        return "source.state", {"state": event.state, "why": event.why}
    if isinstance(event, Closed):
        return "closed", {"reason": event.reason}
    return "unknown", {}


async def server_sent(events: Subscription) -> AsyncIterator[bytes]:
    """The stream, until the session closes (``closed`` is its last event)."""
    yield b": vidchat session events\n\n"  # at once: the page knows it is subscribed
    while True:
        event = await events.get(timeout=KEEPALIVE_S)
        if event is None:
            yield b": keepalive\n\n"
            continue
        name, body = wire(event)
        yield f"event: {name}\ndata: {json.dumps(body, default=str)}\n\n".encode()
        if isinstance(event, Closed):
            return
