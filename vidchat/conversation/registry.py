"""The session registry: create, find, limit, expire and close sessions.

Both doors register their sessions here, so the session limit and the
"which session is this frame/question for" rule are the same for a browser
tab and a WebSocket client. Session ids are unguessable tokens: knowing one
is what entitles a caller to that session's frames.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from vidchat.conversation.answers import AnswerOptions, AnswerQueue
from vidchat.conversation.conversation import Conversation
from vidchat.conversation.events import Closed
from vidchat.conversation.host import AnswerMetrics, EngineRole, HostSettings
from vidchat.conversation.memory import MemoryOptions
from vidchat.conversation.warmup import Prewarmer
from vidchat.engine.interface import ENGINE_DEAD_MESSAGE, ChatEngine, EngineError
from vidchat.media.session import Session, SessionSettings

if TYPE_CHECKING:
    from vidchat.conversation.host import Host

log = logging.getLogger(__name__)

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
                 time_limit_s: float = 0.0, host: Host | None = None) -> None:
        self._host = host
        self.max_sessions = max_sessions
        self.max_per_client = max_per_client  # 0: no cap
        self._uncapped_client = uncapped_client or (lambda client: False)
        self.time_limit_s = time_limit_s  # 0: sessions may last forever
        self._default_settings = default_settings or SessionSettings
        self._entries: dict[str, Conversation] = {}
        self._pending: set[Reservation] = set()
        self._closed_reasons: dict[str, str] = {}
        self._closing: set[asyncio.Task[bool]] = set()  # closes started by close_soon, still running
        # A replica being drained (POST /api/drain) takes no new sessions;
        # open ones, and tabs re-attaching to them, carry on until they end.
        self.draining = False

    def default_settings(self) -> SessionSettings:
        """A new session's settings (the server's --frames-per-question, --sampling, ...)."""
        return self._default_settings()

    @property
    def host(self) -> Host | None:
        """What its conversations ask with (vidchat.app.state.AppState, or a
        tool's vidchat.conversation.conversation.Standalone)."""
        return self._host

    @host.setter
    def host(self, host: Host | None) -> None:
        # A host holds its registry, so it may come after the registry and
        # even after the first sessions (a tool's, a test's): they ask with it too.
        self._host = host
        for entry in self._entries.values():
            if entry.host is None:
                entry.host = host

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
               reservation: Reservation | None = None, owner: str | None = None,
               **session_kwargs: Any) -> Conversation:
        """A new session; ``session_kwargs`` go to :class:`Session` (storage size, frame cap)."""
        if reservation is not None:
            client = reservation.client
        self._check_room(client, reservation)
        if reservation is not None:
            reservation.release()
        sid = secrets.token_urlsafe(16)
        entry = Conversation(Session(sid, settings or self._default_settings(), **session_kwargs), kind,
                             host=self._host, client=client, owner=owner)
        if self.time_limit_s > 0:
            entry.deadline = time.monotonic() + self.time_limit_s
        self._entries[sid] = entry
        log.info("session %s… opened (%s), %d open", sid[:6], kind, len(self._entries))
        return entry

    def entries(self) -> list[Conversation]:
        return list(self._entries.values())

    def get(self, sid: str | None) -> Conversation | None:
        if not sid:
            return None
        return self._entries.get(sid)

    def owner_of(self, sid: str) -> str | None:
        entry = self._entries.get(sid) if isinstance(sid, str) else None
        return entry.owner if entry is not None else None

    def get_for(self, sid: object, login: str | None) -> Conversation | None:
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
        for slot in entry.slots():  # nobody is left to read their answers
            await _bounded(slot.cancel_answer(), f"aborting the {slot.kind} answer of", sid)
        for closer in list(entry.closers):  # a closer may unregister itself
            await _bounded(closer(), "a closer of", sid)
        entry.event_hub.publish(Closed(reason))  # the last event its listeners get
        # Its frames, audio and kept answers go now. The conversation refers
        # back to itself (its closers, modes and runs), so the rest of it is
        # freed only by the garbage collector's next full pass, which on a
        # server holding a million objects comes rarely: until then a closed
        # session held its whole frame buffer (the soak's memory growth).
        entry.release()
        log.info("session %s… %s, %d open", sid[:6], reason, len(self._entries))
        return True

    def close_soon(self, sid: str, reason: str) -> None:
        """Close a session in a task of its own, so the caller (the reaper)
        goes on to the next session whatever this one's closers do."""
        task = asyncio.create_task(self.close(sid, reason), name=f"close {sid[:6]}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def expire(self, max_idle_s: float, kind: str | None = None) -> list[str]:
        """Close sessions (of `kind`) with no frame, audio or question for
        `max_idle_s`. A session watching a stream is not idle while the stream
        is being read, even while it reconnects: its frames come back by
        themselves; nor is a paused one (a person who paused the camera comes
        back to the same chat): it ends when its tab goes, after the reload
        grace (vidchat.doors.webrtc_routes), or at the time limit; nor one
        whose tab went away and is loading again (the grace waits for it)."""
        now = time.monotonic()
        stale = [
            sid
            for sid, e in self._entries.items()
            if (kind is None or e.kind == kind) and now - e.session.last_activity > max_idle_s
            and e.stream is None and not e.paused and not (e.away and now < e.returning_until)
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


# A host for a tool without a server (the benchmarks, the tests): it keeps
# its sessions in a registry of its own.

@dataclass(frozen=True)
class StandaloneSettings:
    """A standalone host's settings: no model option to name, no recording, no suites."""

    model: str = ""
    compare_model: str = ""
    record_dir: str = ""
    suite_dir: str = ""
    suite_keep_runs: int = 0


@dataclass
class Standalone:
    """The host of a tool without a server (the benchmarks, tests): one
    engine, answering for every role, and optionally the answer queue and
    the options a question gets by default. Records nothing (no
    --record-dir) and counts nothing; warms nothing unless given a prewarmer."""

    engine: ChatEngine | None
    answer_gate: AnswerQueue | None = None
    defaults: AnswerOptions = field(default_factory=AnswerOptions)
    settings: HostSettings = field(default_factory=StandaloneSettings)
    registry: SessionRegistry = field(default_factory=lambda: SessionRegistry())
    metrics: AnswerMetrics | None = None
    prewarmer: Prewarmer | None = None
    memory: MemoryOptions | None = None  # None: its sessions remember nothing

    def __post_init__(self) -> None:
        self.registry.host = self

    def engine_now(self, role: EngineRole = "main") -> ChatEngine | None:
        return self.engine if self.engine is not None and not self.engine.is_dead else None

    async def engine_for(self, role: EngineRole = "main") -> ChatEngine:
        engine = self.engine_now(role)
        if engine is None:
            raise EngineError(self.readiness(role)[1])
        return engine

    def readiness(self, role: EngineRole = "main") -> tuple[bool, str]:
        if self.engine is None:
            return False, "No model engine."
        if self.engine.is_dead:
            return False, ENGINE_DEAD_MESSAGE
        return True, "ready"

    def answer_defaults(self) -> AnswerOptions:
        return self.defaults


if TYPE_CHECKING:
    def _is_a_host(standalone: Standalone) -> Host:  # the type checker holds Standalone to the protocol
        return standalone
