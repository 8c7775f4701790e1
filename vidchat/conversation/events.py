"""A session's one event stream: what happens in it, typed, for every door
to say in its own wire format (pipecat's frames at session scope, LiveKit's
session events). Speech starting and stopping, an utterance heard, a scene
change, each question asked (and refused), each answer's
Queued/Started/Delta/Done, the chat cleared, a notice for the chat, a
settings change, the source's state, and Closed last. Doors listen with
``Conversation.events()``; nothing has to poll the session's state.

A listener that falls behind loses its oldest events, never the producer's
time: a session's media and answers never wait for a slow reader.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import hashlib
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Union

from vidchat.media.vad import SpeechStarted, Utterance  # the detector's own events, as they are

# Events a listener may fall behind by before its oldest are dropped: an
# answer's deltas at vLLM's pace for a few seconds.
MAX_BEHIND = 512


@dataclass(frozen=True)
class SpeechStopped:
    """The speaker paused long enough to end a turn (its Utterance follows); ``t`` on the media clock."""

    t: float


@dataclass(frozen=True)
class SoundLevel:
    """How loud the session's microphone is (dBFS of its last moment), while
    Talk listens: said a few times a second, so a person sees they are heard."""

    dbfs: float
    t: float


@dataclass(frozen=True)
class SceneChanged:
    t: float


# Why a question was asked (QuestionAsked.cause): typed (or sent by a
# client), a scene change in Watch mode, or spoken in Talk mode.
TYPED, SCENE, SPOKEN = "typed", "scene", "spoken"

# Why a question asked never got an answer (QuestionRefused.why).
REPLACED, STOPPED, NO_FRAMES, ERROR = "replaced", "stopped", "no_frames", "error"


@dataclass(frozen=True)
class QuestionAsked:
    """A question joined the chat (before its answer is prepared): ``ticket``
    names it in its answer's events; ``at``: the scene change it is about
    (media clock); ``spoken_seconds``: the length of a spoken question."""

    ticket: int
    question: str
    cause: str = TYPED
    at: float | None = None
    spoken_seconds: float | None = None


@dataclass(frozen=True)
class QuestionRefused:
    """The question got no answer: a newer question or Stop came first, no
    frame yet, or the engine refused it (``reason`` says what, as a fact;
    doors add their own words)."""

    ticket: int
    why: str
    reason: str = ""


@dataclass(frozen=True)
class AnswerEvent:
    """One of an answer run's events (vidchat.conversation.runs: Queued,
    Started, Delta, Done) for question ``ticket``; ``side``: not the chat's
    own answer (a re-ask beside the chat, or the second model's); ``second``:
    the second model's answer to the chat's question ``ticket`` (Both models)."""

    event: object  # the run's event (vidchat.conversation.runs.RunEvent: Queued, Started, Delta, Done)
    answer_id: str | None = None
    side: bool = False
    ticket: int = 0
    second: bool = False

    @property
    def is_text(self) -> bool:
        """A piece of the answer's text (a Delta): what a reader can best do
        without, since the answer's whole text so far is on the answer itself."""
        return getattr(self.event, "is_text", False) is True


@dataclass(frozen=True)
class ChatCleared:
    """Clear chat: what was said before is no longer the chat."""

    chat: int = 0  # the new chat's number (Conversation.chat_began)


@dataclass(frozen=True)
class Notice:
    """A line for the session's chat that is no exchange (a mode refused, a setting not accepted)."""

    text: str


@dataclass(frozen=True)
class SettingsChanged:
    values: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SourceState:
    state: str  # "live" | "reconnecting" | ...
    why: str | None = None


@dataclass(frozen=True)
class MemoryCaption:
    """A keyframe of the session's scene log got its caption
    (vidchat.conversation.memory): ``time_ms`` from the session's start."""

    seq: int
    time_ms: int
    caption: str


@dataclass(frozen=True)
class Closed:
    reason: str


SessionEvent = Union[SpeechStarted, SpeechStopped, Utterance, SoundLevel, SceneChanged, QuestionAsked,
                     QuestionRefused, AnswerEvent, ChatCleared, Notice, SettingsChanged, SourceState,
                     MemoryCaption, Closed]


class EventHub:
    """The session's events to any number of listeners, each from the moment it subscribes."""

    def __init__(self) -> None:
        self._listeners: list[Subscription] = []
        self.closed: Closed | None = None

    def publish(self, event: SessionEvent) -> None:
        """From the event loop's thread; never waits."""
        if self.closed is not None:
            return
        if isinstance(event, Closed):
            self.closed = event
        for listener in list(self._listeners):
            listener.put(event)

    @property
    def listeners(self) -> int:
        return len(self._listeners)

    def subscribe(self) -> "Subscription":
        """A listener from now on (Closed at once if the session has closed); close it when done."""
        listener = Subscription(self)
        if self.closed is not None:
            listener.put(self.closed)
        else:
            self._listeners.append(listener)
        return listener

    async def events(self) -> AsyncIterator[SessionEvent]:
        """The session's events from now on, Closed last."""
        with self.subscribe() as listener:
            while True:
                event = await listener.get()
                if event is None:
                    continue  # only a get with a timeout comes back empty
                yield event
                if isinstance(event, Closed):
                    return


class Subscription:
    """One listener's events, in order; ``get`` may time out without losing any."""

    def __init__(self, hub: EventHub) -> None:
        self._hub = hub
        self._queue: collections.deque[SessionEvent] = collections.deque()
        self._more = asyncio.Event()
        self.dropped = 0

    def put(self, event: SessionEvent) -> None:
        if len(self._queue) >= MAX_BEHIND and not isinstance(event, Closed):
            self._drop_one()  # a reader this far behind loses some news, not the session's time
        self._queue.append(event)
        self._more.set()

    def _drop_one(self) -> None:
        # A piece of an answer's text first: readers draw an answer's text from
        # the answer itself, so a lost delta costs them nothing, where a lost
        # question, start or end would leave a bubble that never says its fate.
        queue = self._queue
        index = next((i for i, queued in enumerate(queue) if isinstance(queued, AnswerEvent) and queued.is_text), 0)
        del queue[index]
        self.dropped += 1

    async def get(self, timeout: float | None = None) -> SessionEvent | None:
        """The next event; None when ``timeout`` seconds pass without one."""
        while not self._queue:
            self._more.clear()
            try:
                await asyncio.wait_for(self._more.wait(), timeout)
            except asyncio.TimeoutError:
                return None
        return self._queue.popleft()

    def pending(self) -> list[SessionEvent]:
        """Every event already waiting, taken at once (a reader that redraws once for a burst)."""
        taken = list(self._queue)
        self._queue.clear()
        return taken

    def close(self) -> None:
        if self in self._hub._listeners:
            self._hub._listeners.remove(self)

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Which session, door and answer a log line is about, for logs a machine
# reads (``--log-format json``): context variables set where a session's
# work runs (a door's task, an answer's run), read by the log formatter, so
# no log call has to pass them. A session and an answer are named by a short
# hash of their ids, never the ids (credentials: an answer's id is all that
# guards its /inputs/<id>/ routes when no login is configured).

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
