"""The session registry: create, find, limit, expire and close sessions.

Both doors register their sessions here, so the session limit and the
"which session is this frame/question for" rule are the same for a browser
tab and a WebSocket client. Session ids are unguessable tokens: knowing one
is what entitles a caller to that session's frames.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from vidchat.conversation.session_events import Closed, EventHub
from vidchat.media.session import Session, SessionSettings

log = logging.getLogger(__name__)

Closer = Callable[[], Awaitable[None]]

# The most one step of a session's close may take (aborting its answer, each
# closer): a socket closer itself gives up on a client that reads nothing
# after --ws-send-timeout plus its flush, so this is only the last resort.
CLOSE_STEP_S = 15.0


async def _bounded(step: Awaitable[None], what: str, sid: str) -> None:
    try:
        await asyncio.wait_for(step, CLOSE_STEP_S)
    except asyncio.TimeoutError:
        log.warning("%s session %s… took over %g s; going on without it", what, sid[:6], CLOSE_STEP_S)
    except Exception:
        log.debug("%s session %s… failed", what, sid[:6], exc_info=True)


class TooManySessions(RuntimeError):
    pass


@dataclass
class Entry:
    session: Session
    kind: str  # "webrtc" | "ws"
    # Whatever owns the session's transport (a peer connection, a socket)
    # registers how to end it, so expiry and shutdown can close it.
    closers: list[Closer] = field(default_factory=list)
    # The one answer being generated for this session, whichever door asked.
    answer: Any = None
    # Set by SessionRegistry.close: a question still being prepared then
    # never reaches vLLM (nobody is left to read its answer).
    closed: bool = False
    # The live media's counters (WebRTC), shown in the page's status line.
    media: Any = None
    # Proves a reconnecting tab owns this session (WebRTC); never logged.
    resume_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    # Held while an aborted answer winds down: an abort that reaches vLLM
    # while the request is still being registered only takes effect at its
    # first output, and a question arriving meanwhile must not start beside it.
    _cancelling: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    # Sent with every request of this session as vLLM's cache_salt, so prefix
    # cache hits never cross sessions (no timing channel between users).
    cache_salt: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)
    # Recorded answers' bundle folders, by answer id (--record-dir).
    bundles: dict = field(default_factory=dict, repr=False)
    # The last answers' inputs, by answer id (vidchat.doors.inputs).
    answers: collections.OrderedDict = field(default_factory=collections.OrderedDict, repr=False)
    # The client's network address (for --max-sessions-per-client).
    client: str | None = None
    # The login that opened it (vidchat.app.access: a page user, a Hugging Face
    # user or the server token); only that login is served its frames,
    # answers and page calls. None: the server asks for no login.
    owner: str | None = None
    # time.monotonic() at which --session-time-limit ends the session (None: never).
    deadline: float | None = None
    # What the next question will most likely carry besides its frames: the
    # last question's options and the conversation so far (vidchat.conversation.prewarm).
    warm_options: Any = None
    answer_ended: float = 0.0  # time.monotonic() when its last answer ended (vidchat.conversation.prewarm waits a moment)
    # Talk mode's listener (vidchat.conversation.talk), while Talk is on.
    talk: Any = None
    # time.monotonic() when the page's last typed question arrived: an Enter
    # report arriving after it is that question's, late (vidchat.conversation.prewarm).
    typed_question_at: float = float("-inf")
    _side: "Entry | None" = field(default=None, repr=False)
    # What happens in the session, for every door that listens (vidchat.conversation.session_events).
    events: EventHub = field(default_factory=EventHub, repr=False)

    @property
    def warm_history(self) -> tuple:
        """The chat the next question will carry: its conversation's, kept on
        the server (vidchat.conversation.history), so its warm-up starts as the question will."""
        conversation = getattr(self, "conversation", None)
        return conversation.history.turns() if conversation is not None else ()

    @property
    def turn(self) -> int:
        """The chat's turn (vidchat.conversation.Conversation.turn): it moves
        on with each question, Stop and Clear."""
        conversation = getattr(self, "conversation", None)
        return conversation.turn if conversation is not None else 0

    def side_slot(self) -> "Entry":
        """Where this session's re-asks run: beside the chat's answer, never
        in its slot, so a re-ask neither cancels the chat's answer nor is read
        aloud by Talk. Same session and cache salt (its prefix-cache hits are
        the session's own); a newer re-ask still replaces a running one."""
        if self._side is None:
            self._side = Entry(self.session, self.kind, cache_salt=self.cache_salt, client=self.client,
                               owner=self.owner)
        return self._side

    def time_left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    async def cancel_answer(self, why: str | None = None) -> None:
        """Abort the running answer (its vLLM request included), if any, and
        return only once no earlier answer of this session is still generating
        (``why``: see answer_path.Answer.cancel)."""
        async with self._cancelling:
            answer, self.answer = self.answer, None
            if answer is not None:
                await answer.cancel(why)


class Reservation:
    """A place held for a session from the moment a client connects (a
    WebSocket handshake), so clients that never configure still count
    against the limits. Release it, or pass it to SessionRegistry.create."""

    def __init__(self, registry: "SessionRegistry", client: str | None) -> None:
        self.registry = registry
        self.client = client

    def release(self) -> None:
        self.registry._pending.discard(self)


class SessionRegistry:
    def __init__(self, max_sessions: int = 16, default_settings: Callable[[], SessionSettings] | None = None,
                 max_per_client: int = 0, uncapped_client: Callable[[str], bool] | None = None,
                 time_limit_s: float = 0.0):
        self.max_sessions = max_sessions
        self.max_per_client = max_per_client  # 0: no cap
        self._uncapped_client = uncapped_client or (lambda client: False)
        self.time_limit_s = time_limit_s  # 0: sessions may last forever
        self._default_settings = default_settings or SessionSettings
        self._entries: dict[str, Entry] = {}
        self._pending: set[Reservation] = set()
        self._closed_reasons: dict[str, str] = {}
        self._closing: set[asyncio.Task] = set()  # closes started by close_soon, still running
        # A replica being drained (POST /api/drain) takes no new sessions;
        # open ones, and tabs re-attaching to them, carry on until they end.
        self.draining = False

    def __len__(self) -> int:
        return len(self._entries)

    def reserve(self, client: str | None = None) -> Reservation:
        """Hold a place for a session about to be configured (raises TooManySessions)."""
        self._check_room(client)
        reservation = Reservation(self, client)
        self._pending.add(reservation)
        return reservation

    def _check_room(self, client: str | None, held: Reservation | None = None) -> None:
        if self.draining and held is None:
            raise TooManySessions("This server is being drained and takes no new sessions; connect again "
                                  "to reach another replica.")
        pending = [r for r in self._pending if r is not held]
        if len(self._entries) + len(pending) >= self.max_sessions:
            raise TooManySessions(
                f"The server is full: {self.max_sessions} sessions are open (its --max-sessions). "
                "Try again in a minute."
            )
        if client and self.max_per_client > 0 and not self._uncapped_client(client):
            mine = sum(e.client == client for e in self._entries.values()) + sum(r.client == client for r in pending)
            if mine >= self.max_per_client:
                raise TooManySessions(
                    f"This address already has {self.max_per_client} sessions open (the server's "
                    "--max-sessions-per-client); stop one and try again."
                )

    def create(self, kind: str, settings: SessionSettings | None = None, *, client: str | None = None,
               reservation: Reservation | None = None, owner: str | None = None, **session_kwargs: Any) -> Entry:
        """A new session; ``session_kwargs`` go to :class:`Session` (storage size, frame cap)."""
        if reservation is not None:
            client = reservation.client
        self._check_room(client, reservation)
        if reservation is not None:
            reservation.release()
        sid = secrets.token_urlsafe(16)
        entry = Entry(Session(sid, settings or self._default_settings(), **session_kwargs), kind, client=client,
                      owner=owner)
        if self.time_limit_s > 0:
            entry.deadline = time.monotonic() + self.time_limit_s
        self._entries[sid] = entry
        log.info("session %s… opened (%s), %d open", sid[:6], kind, len(self._entries))
        return entry

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def get(self, sid: str | None) -> Entry | None:
        if not sid:
            return None
        return self._entries.get(sid)

    def owner_of(self, sid: str) -> str | None:
        entry = self._entries.get(sid) if isinstance(sid, str) else None
        return entry.owner if entry is not None else None

    def get_for(self, sid: Any, login: str | None) -> Entry | None:
        """The session ``sid`` when ``login`` may use it: the one that opened
        it (any caller, for a session opened without a login); else None, as
        for an id that does not exist, so a guessed id tells nothing."""
        entry = self.get(sid) if isinstance(sid, str) else None
        if entry is None or (entry.owner is not None and entry.owner != login):
            return None
        return entry

    def closed_reason(self, sid: str) -> str | None:
        """Why a recently closed session ended (for the page's status line)."""
        return self._closed_reasons.get(sid)

    def count_by_kind(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for entry in self._entries.values():
            counts[entry.kind] = counts.get(entry.kind, 0) + 1
        return counts

    async def close(self, sid: str, reason: str = "closed") -> bool:
        entry = self._entries.pop(sid, None)
        if entry is None:
            return False
        entry.closed = True
        self._closed_reasons[sid] = reason
        while len(self._closed_reasons) > 256:  # a recent-history hint, not a log
            self._closed_reasons.pop(next(iter(self._closed_reasons)))
        # Each step is bounded: a closer that hangs (a client that reads
        # nothing, a peer that never answers) delays this session's end by at
        # most CLOSE_STEP_S, and no other session's.
        await _bounded(entry.cancel_answer(), "aborting the answer of", sid)  # nobody is left to read it
        if entry._side is not None:
            entry._side.closed = True
            await _bounded(entry._side.cancel_answer(), "aborting the re-ask of", sid)
        for closer in list(entry.closers):  # a closer may unregister itself
            await _bounded(closer(), "a closer of", sid)
        entry.events.publish(Closed(reason))  # the last event its listeners get
        log.info("session %s… %s, %d open", sid[:6], reason, len(self._entries))
        return True

    def close_soon(self, sid: str, reason: str) -> None:
        """Close a session in a task of its own, so the caller (the reaper)
        goes on to the next session whatever this one's closers do."""
        task = asyncio.create_task(self.close(sid, reason), name=f"close {sid[:6]}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def expire(self, max_idle_s: float, kind: str | None = None) -> list[str]:
        """Close sessions (of `kind`) with no frame, audio or question for `max_idle_s`."""
        now = time.monotonic()
        stale = [
            sid
            for sid, e in self._entries.items()
            if (kind is None or e.kind == kind) and now - e.session.last_activity > max_idle_s
        ]
        for sid in stale:
            self.close_soon(sid, f"expired after {max_idle_s:.0f} s without input")
        return stale

    async def end_overdue(self) -> list[str]:
        """Close sessions past their --session-time-limit."""
        now = time.monotonic()
        overdue = [sid for sid, e in self._entries.items() if e.deadline is not None and now >= e.deadline]
        for sid in overdue:
            limit = self.time_limit_s
            self.close_soon(sid, "reached the session time limit "
                            + (f"({limit:g} s)" if limit < 120 else f"({limit / 60:g} min)"))
        return overdue

    async def close_all(self, timeout: float = CLOSE_STEP_S) -> None:
        """Close every session at once (shutdown), and wait at most ``timeout``
        for them and for closes already under way."""
        closing = [asyncio.ensure_future(self.close(sid, "closed at shutdown")) for sid in list(self._entries)]
        closing += list(self._closing)
        if closing:
            _, late = await asyncio.wait(closing, timeout=timeout)
            for task in late:
                task.cancel()
            if late:
                log.warning("%d session(s) did not close within %g s at shutdown", len(late), timeout)
