"""The host: exactly what a conversation, a suite run, a replay and a re-ask
may use of whoever serves them.

The server's state (vidchat.app.state.AppState) is one host; a tool without
a server (replay, the benchmarks) brings a small one of its own
(vidchat.conversation.registry.Standalone). Nothing below the doors
reaches for the app: what it needs comes in as a :class:`Host`, and a type
checker holds both sides to this one list.

An engine is looked up by its role when an answer is asked
(:meth:`Host.engine_for`, or :meth:`Host.engine_now` where nothing may wait),
never held across a restart: a keeper may have replaced a dead engine since
the last question.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol, Sequence

if TYPE_CHECKING:
    from vidchat.conversation.answers import AnswerOptions, AnswerQueue, SessionRecord
    from vidchat.engine.interface import ChatEngine

# Which of the server's engines answers: its model, or the second model
# beside it (--compare-model).
EngineRole = Literal["main", "compare"]


class HostSettings(Protocol):
    """The settings a conversation, a suite run and a replay read (a subset
    of the server's options, vidchat.app.settings.Settings)."""

    @property
    def model(self) -> str: ...  # --model: what a recording names as the answering model

    @property
    def compare_model(self) -> str: ...  # --compare-model ("": none)

    @property
    def record_dir(self) -> str: ...  # "": recording is off

    @property
    def suite_dir(self) -> str: ...

    @property
    def suite_keep_runs(self) -> int: ...


class AnswerMetrics(Protocol):
    """How an answer ended, for the server's /metrics (vidchat.app.metrics)."""

    def answer_done(self, kind: str, status: str, first_token_s: float | None, tokens: int, *,
                    engine: str, run_kind: str) -> None:
        """At each answer's Done: ``kind`` the session's (its door), ``engine``
        the role that answered, ``run_kind`` what it answered (AnswerRun.kind)."""
        ...


class Sessions(Protocol):
    """The sessions a host keeps (vidchat.conversation.registry.SessionRegistry),
    as what asks through the host may use them: find, list, count, close."""

    def entries(self) -> Sequence[SessionRecord]: ...

    def get(self, sid: str | None) -> SessionRecord | None: ...

    def count_by_kind(self) -> dict[str, int]: ...

    async def close(self, sid: str, reason: str = "closed") -> bool: ...

    async def close_all(self, timeout: float = ...) -> None: ...


class Warmups(Protocol):
    """The host's warm-ups (vidchat.conversation.warmup.Prewarmer), as a
    conversation tells them a question is coming."""

    def question_coming(self, session_id: str) -> None: ...


class MemorySettings(Protocol):
    """How sessions remember (vidchat.conversation.memory.MemoryOptions: --memory-prompt,
    --memory-caption-tokens, --memory-tokens, --memory-frames)."""

    @property
    def prompt(self) -> str: ...

    @property
    def caption_tokens(self) -> int: ...

    @property
    def tokens(self) -> int: ...

    @property
    def frames(self) -> int: ...


class Host(Protocol):
    """What serves a conversation (see the module's docstring)."""

    @property
    def settings(self) -> HostSettings: ...

    @property
    def registry(self) -> Sessions: ...

    @property
    def answer_gate(self) -> AnswerQueue | None: ...  # the fair queue in front of the engines (None: no cap)

    @property
    def metrics(self) -> AnswerMetrics | None: ...  # None: nobody counts answers

    @property
    def prewarmer(self) -> Warmups | None: ...  # None: no warm-ups

    @property
    def memory(self) -> MemorySettings | None: ...  # how sessions remember; None: never

    def engine_now(self, role: EngineRole = "main") -> ChatEngine | None:
        """The engine answering for ``role`` at this moment, without waiting
        (None while it loads, restarts or is down)."""
        ...

    async def engine_for(self, role: EngineRole = "main") -> ChatEngine:
        """The engine that answers for ``role`` now, waiting while it loads or
        restarts; raises vidchat.engine.EngineError when it is down for good."""
        ...

    def readiness(self, role: EngineRole = "main") -> tuple[bool, str]:
        """Whether ``role``'s engine answers now, and if not, why (in words for the user)."""
        ...

    def answer_defaults(self) -> AnswerOptions:
        """The options a question gets when its door names none."""
        ...


def answering(host: Host, engine: ChatEngine) -> bool:
    """Whether a person's answer has the engine now: one of any session's is
    generating, waiting for its place in the fair queue, or being prepared.
    What runs only while the engine is idle (warm-ups in idle mode, memory's
    captions) waits while this holds."""
    gate = host.answer_gate
    return (engine.running_requests > 0 or (gate is not None and gate.snapshot().get("waiting", 0) > 0)
            or any(slot.answer is not None for entry in host.registry.entries() for slot in entry.slots()))
