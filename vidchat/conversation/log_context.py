"""Which session, door and answer a log line is about, for logs a machine
reads (``--log-format json``): context variables set where a session's
work runs (a door's task, an answer's run), read by the log formatter, so
no log call has to pass them. A session and an answer are named by a short
hash of their ids, never the ids (credentials: an answer's id is all that
guards its /inputs/<id>/ routes when no login is configured)."""

from __future__ import annotations

import contextvars
import hashlib

# The registry's session kinds as the doors operators know them (metrics, logs,
# and the door a recorded bundle's manifest names).
DOORS = {"webrtc": "page", "ws": "socket", "realtime": "realtime"}

_session: contextvars.ContextVar[str | None] = contextvars.ContextVar("vidchat_session", default=None)
_door: contextvars.ContextVar[str | None] = contextvars.ContextVar("vidchat_door", default=None)
_answer: contextvars.ContextVar[str | None] = contextvars.ContextVar("vidchat_answer", default=None)


def session_hash(session_id: str) -> str:
    """A session's (or an answer's) name in logs: 8 hex digits of a hash of its id."""
    return hashlib.blake2b(session_id.encode(), digest_size=4).hexdigest()


def door_name(kind: str) -> str:
    """A session kind as operators know its door (a kind no door names: itself)."""
    return DOORS.get(kind, kind)


def bind(session_id: str, kind: str) -> None:
    """From here on in this task (and the tasks it starts), log lines are this session's."""
    _session.set(session_hash(session_id))
    _door.set(door_name(kind))


def bind_answer(answer_id: str | None) -> None:
    _answer.set(None if answer_id is None else session_hash(answer_id))


def current() -> dict[str, str]:
    """The fields known here: session, door, answer_id."""
    out = {}
    for key, var in (("session", _session), ("door", _door), ("answer_id", _answer)):
        value = var.get()
        if value:
            out[key] = value
    return out
