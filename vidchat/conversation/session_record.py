"""What the registry and the doors know of a session, and the slots its
answers run in.

A session is one object, its :class:`vidchat.conversation.Conversation`,
which builds on :class:`SessionRecord`: the record holds what every door
reads (its media, who opened it, its limits, how to end its transport, its
kept answers); the conversation adds what the session does with the model.
An :class:`AnswerSlot` is where one answer at a time runs: the session's
chat is one, and its re-asks run in a :class:`SideSlot` beside it.
"""

from __future__ import annotations

import asyncio
import collections
import secrets
import time
from typing import Any, Awaitable, Callable

from vidchat.conversation.session_events import EventHub
from vidchat.media.session import Session

Closer = Callable[[], Awaitable[None]]


class AnswerSlot:
    """Where one answer at a time runs: a newer one replaces it."""

    def __init__(self) -> None:
        self.answer: Any = None  # the answer being generated here (vidchat.conversation.answer_path.Answer)
        # What the next question will most likely carry besides its frames
        # (vidchat.conversation.prewarm prepares for the same kind of question).
        self.warm_options: Any = None
        self.answer_ended = 0.0  # time.monotonic() when its last answer ended (the warm-ups wait a moment)
        # Held while an aborted answer winds down: an abort that reaches vLLM
        # while the request is still being registered only takes effect at its
        # first output, and a question arriving meanwhile must not start beside it.
        self._cancelling = asyncio.Lock()

    async def cancel_answer(self, why: str | None = None) -> None:
        """Abort the running answer (its vLLM request included), if any, and
        return only once no earlier answer here is still generating
        (``why``: see answer_path.Answer.cancel)."""
        async with self._cancelling:
            answer, self.answer = self.answer, None
            if answer is not None:
                await answer.cancel(why)


class SessionRecord(AnswerSlot):
    """A session as the registry keeps it; its own answer slot is the chat's."""

    def __init__(self, session: Session, kind: str, *, client: str | None = None,
                 owner: str | None = None) -> None:
        super().__init__()
        self.session = session
        self.kind = kind  # the door that opened it: "webrtc", "ws", "realtime", "replay", "bundle"
        # Whatever owns the session's transport (a peer connection, a socket)
        # registers how to end it, so expiry and shutdown can close it.
        self.closers: list[Closer] = []
        # Set by SessionRegistry.close: a question still being prepared then
        # never reaches vLLM (nobody is left to read its answer).
        self.closed = False
        self.media: Any = None  # the live media's counters (WebRTC), shown in the page's status line
        # Proves a reconnecting tab owns this session (WebRTC); never logged.
        self.resume_token = secrets.token_urlsafe(24)
        # Sent with every request of this session as vLLM's cache_salt, so prefix
        # cache hits never cross sessions (no timing channel between users).
        self.cache_salt = secrets.token_hex(16)
        self.bundles: dict = {}  # recorded answers' bundle folders, by answer id (--record-dir)
        # The last answers' inputs, by answer id (vidchat.doors.inputs).
        self.answers: collections.OrderedDict = collections.OrderedDict()
        self.client = client  # the client's network address (for --max-sessions-per-client)
        # The login that opened it (vidchat.app.access: a page user, a Hugging Face
        # user or the server token); only that login is served its frames,
        # answers and page calls. None: the server asks for no login.
        self.owner = owner
        self.deadline: float | None = None  # time.monotonic() at which --session-time-limit ends it
        self.talk: Any = None  # Talk mode's listener (vidchat.conversation.talk), while Talk is on
        # time.monotonic() when the page's last typed question arrived: an Enter
        # report arriving after it is that question's, late (vidchat.conversation.prewarm).
        self.typed_question_at = float("-inf")
        # What happens in the session, for every door that listens
        # (vidchat.conversation.session_events; Conversation.events() is its stream).
        self.event_hub = EventHub()
        self._side: SideSlot | None = None
        self._second: SideSlot | None = None
        # Both models (--compare-model): each chat question is asked of the
        # second model too (vidchat.conversation.second_model).
        self.both_models = False
        self.stream: Any = None  # the stream of --stream it watches (vidchat.conversation.stream_source)
        # Its tab went away and may come back for it (a reload, WebRTC's
        # grace): nobody asks meanwhile, so it gets no warm-ups.
        self.away = False

    def release(self) -> None:
        """The session has closed: let its frames, audio, kept answers and
        last answers go now, not at the garbage collector's next full pass
        (the conversation refers back to itself, see SessionRegistry.close)."""
        self.session.reset()
        self.answers.clear()
        self.closers.clear()
        self.answer = None
        self._side = self._second = None

    def side_slot(self) -> "SideSlot":
        """Where this session's re-asks run (made on first use)."""
        if self._side is None:
            self._side = SideSlot(self)
        return self._side

    def second_slot(self) -> "SideSlot":
        """Where the second model's answers to the chat's questions run (Both models)."""
        if self._second is None:
            self._second = SideSlot(self, second=True)
        return self._second

    def time_left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())


class SideSlot(AnswerSlot):
    """Where a session's re-asks run: beside the chat's answer, never in its
    slot, so a re-ask neither cancels the chat's answer nor is read aloud by
    Talk. Same session and cache salt (its prefix-cache hits are the
    session's own); a newer re-ask still replaces a running one. The second
    model's answers (``second``) run in a slot of their own, so a re-ask and
    they never replace each other."""

    def __init__(self, record: SessionRecord, second: bool = False) -> None:
        super().__init__()
        self.record = record
        self.second = second

    @property
    def session(self) -> Session:
        return self.record.session

    @property
    def cache_salt(self) -> str:
        return self.record.cache_salt

    @property
    def closed(self) -> bool:
        return self.record.closed
