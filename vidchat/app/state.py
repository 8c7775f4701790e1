"""What the whole application shares: settings, the engine, the session
registry. Its own module so the doors (protocol, webrtc, ui) and the server
that assembles them all import it, and imports run one way."""

from __future__ import annotations

import asyncio
import collections
import functools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from vidchat.app.access import Access, PageLogins
from vidchat.app.models import TINY_BANNER
from vidchat.app.settings import Settings
from vidchat.conversation.answers import AnswerOptions, AnswerQueue
from vidchat.conversation.conversation import Conversation
from vidchat.conversation.host import EngineRole, Host
from vidchat.conversation.memory import Captioner, MemoryOptions, memory_default
from vidchat.conversation.registry import SessionRegistry
from vidchat.conversation.warmup import Prewarmer
from vidchat.doors import Server
from vidchat.engine import on_gpu
from vidchat.engine.interface import ENGINE_DEAD_MESSAGE, ChatEngine, EngineError, EngineOptions
from vidchat.media import DEFAULT_STORE_MAX_PIXELS, describe_store_limit
from vidchat.media.session import BYTES_PER_PIXEL, SessionSettings, check_frame_budget, session_budget_bytes
from vidchat.media.streams import Streams

if TYPE_CHECKING:
    from vidchat.app.ice_servers import TurnMinter
    from vidchat.app.metrics import Metrics


# How far back an engine's restarts are counted against --engine-restarts.
RESTART_WINDOW_S = 3600.0


@dataclass
class EngineLife:
    """What the app says of one engine while it is not up: since when it
    restarts, why it stopped, and why it stays down (past the cap)."""

    name: str  # "main" or "compare": the metrics' label
    restarting_since: float | None = None
    stopped_because: str | None = None
    down_because: str | None = None
    restarts: int = 0
    _recent: collections.deque[float] = field(default_factory=collections.deque, repr=False)

    def may_restart(self, limit_per_hour: int, now: float) -> bool:
        while self._recent and self._recent[0] < now - RESTART_WINDOW_S:
            self._recent.popleft()
        return len(self._recent) < limit_per_hour

    def note_restart(self, now: float) -> None:
        self._recent.append(now)

    def status(self) -> str | None:
        """The reason the engine is not up, as /readyz and the page say it (None: nothing to say)."""
        if self.down_because:
            return f"The model engine stopped ({self.stopped_because}) and stays down: {self.down_because}"
        if self.restarting_since is not None:
            return (f"Restarting the model… {time.monotonic() - self.restarting_since:.0f} s "
                    f"(the engine stopped: {self.stopped_because})")
        return None


class ClosedAtShutdown(Protocol):
    """Work the server cancels and awaits as it stops (the Suites panel's
    runs, vidchat.qa.suite.SuiteRuns): named by what the app does with
    it, so the app's state imports nothing of qa, which imports the app."""

    async def close(self) -> None: ...


@dataclass
class AppState:
    settings: Settings
    model_path: str
    banner: str | None = None
    engine: ChatEngine | None = None
    registry: SessionRegistry = field(default_factory=SessionRegistry)
    ice_servers: list[dict[str, Any]] = field(default_factory=list)
    turn: TurnMinter | None = None  # with --turn cloudflare
    access: Access = field(default_factory=Access)
    page_logins: PageLogins = field(default_factory=PageLogins)  # filled in by vidchat.doors.page.mount
    page_app: Any = None  # the page's Gradio app, once mounted (its streams end at shutdown)
    answer_gate: AnswerQueue = field(default_factory=AnswerQueue)
    session_time_limit: float = 0.0  # seconds, 0: none (settings.session_time_limit resolved)
    engine_options: EngineOptions | None = None  # what the engine is (being) started with
    # The engine loads after the port opens: until then the page says so and questions wait.
    engine_error: str | None = None
    loading_since: float = field(default_factory=time.monotonic)
    # --compare-model: a second engine, loaded after the first, for Re-ask only.
    prewarmer: Prewarmer | None = None  # started with the server
    owns_engines: bool = False  # the app started its engines (and shuts them down), none was handed to it
    compare_model_path: str = ""
    compare_tiny: bool = False
    compare_engine: ChatEngine | None = None
    compare_error: str | None = None
    _engine_settled: asyncio.Event | None = field(default=None, repr=False)
    # While an engine restarts or stays down after dying (vidchat.app.engine_keeper).
    engine_life: EngineLife = field(default_factory=lambda: EngineLife("main"))
    compare_life: EngineLife = field(default_factory=lambda: EngineLife("compare"))
    metrics: Metrics | None = None  # once the app serves /metrics
    keeping: asyncio.Task[None] | None = None  # the engine keepers' task (vidchat.app.engine_keeper)
    streams: Streams = field(default_factory=lambda: Streams({}))  # --stream: live streams as sources
    suite_runs: ClosedAtShutdown | None = None  # the Suites panel's runs (vidchat.app.routes), closed at shutdown
    captioner: Captioner | None = None  # the memory's captions (vidchat.conversation.memory), started with the server

    def __post_init__(self) -> None:
        self.registry.host = self  # every session's conversation asks with this app's engines and settings

    @property
    def ready(self) -> bool:
        return self.engine is not None and not self.engine.is_dead

    async def ice_config(self) -> list[dict[str, Any]]:
        """ICE servers for a new peer: the static ones, then freshly minted
        TURN (raises vidchat.app.ice_servers.TurnError when it cannot be minted)."""
        minted = await self.turn.ice_servers() if self.turn is not None else []
        return [*self.ice_servers, *minted]

    def readiness(self, role: EngineRole = "main") -> tuple[bool, str]:
        """(ready, reason) of ``role``'s engine, for /readyz, the page and
        whoever asks (the reason in words for the user)."""
        if role == "compare":
            return self.compare_readiness()
        if self.ready:
            return True, "ready"
        life = self.engine_life.status()
        if life:
            return False, life
        if self.engine_error:
            return False, f"The model failed to load: {self.engine_error}"
        if self.engine is not None:
            return False, ENGINE_DEAD_MESSAGE
        return False, f"Loading the model… {time.monotonic() - self.loading_since:.0f} s"

    def _settled(self) -> asyncio.Event:
        if self._engine_settled is None:
            self._engine_settled = asyncio.Event()
            if self.engine is not None or self.engine_error:
                self._engine_settled.set()
        return self._engine_settled

    def engine_settled(self, engine: ChatEngine | None, error: str | None = None) -> None:
        """The load finished, with an engine or an error."""
        self.engine, self.engine_error = engine, error
        self._settled().set()

    def put_engine(self, engine: ChatEngine | None) -> None:
        """The engine keeper's: None while a dead engine restarts (questions
        wait, as while the model first loads), then the new engine."""
        if engine is not None:
            self.engine_settled(engine)
            return
        self.engine = None
        if self._engine_settled is not None and self._engine_settled.is_set():
            self._engine_settled = asyncio.Event()

    def engine_stays_down(self) -> None:
        """The keeper gave up: whoever waits for the engine is told why."""
        self._settled().set()

    @property
    def engine_down(self) -> bool:
        """The engine failed to load or died for good: no point waiting for
        it. A dead engine that its keeper restarts is not down (questions wait)."""
        if self.engine_error or self.engine_life.down_because:
            return True
        kept = self.keeping is not None and not self.keeping.done()
        return self.engine is not None and self.engine.is_dead and not kept

    async def wait_engine(self, timeout: float | None = None) -> ChatEngine:
        """The running engine, waiting while it loads or restarts (raises
        EngineError when it failed, stays down or is not up after `timeout`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.ready and not self.engine_down:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            if self.engine is None:
                settled = self._settled()
                if settled.is_set():
                    break  # settled without an engine: readiness says why
                try:
                    await asyncio.wait_for(settled.wait(), left)
                except asyncio.TimeoutError:
                    break
            else:  # it just died: its keeper takes it within WATCH_INTERVAL_S
                await asyncio.sleep(0.05 if left is None else min(0.05, left))
        ready, reason = self.readiness()
        if not ready or self.engine is None:
            raise EngineError(reason)
        return self.engine

    def compare_readiness(self) -> tuple[bool, str]:
        """(ready, reason) of the --compare-model engine."""
        if not self.compare_model_path:
            return False, "No second model: start vidchat with --compare-model to compare two models."
        if self.compare_engine is not None and not self.compare_engine.is_dead:
            return True, "ready"
        life = self.compare_life.status()
        if life:
            return False, life.replace("The model engine", "The second model's engine").replace(
                "Restarting the model", "Restarting the second model")
        if self.compare_error:
            return False, f"The second model failed to load: {self.compare_error}"
        if self.compare_engine is not None:
            return False, "The second model's engine has stopped (see the server log for the cause)."
        return False, "The second model is still loading (it starts after the first)."

    def engine_now(self, role: EngineRole = "main") -> ChatEngine | None:
        """The engine answering for ``role`` at this moment, without waiting
        (None while it loads, restarts or is down)."""
        engine = self.compare_engine if role == "compare" else self.engine
        return engine if engine is not None and not engine.is_dead else None

    async def engine_for(self, role: EngineRole = "main") -> ChatEngine:
        """The engine that answers for ``role`` now, waiting while it loads or
        its keeper restarts it. Whatever asks looks its engine up here at each
        ask: one it held on to would be the dead one after a restart. Raises
        EngineError when it is down for good."""
        if role != "compare":
            return await self.wait_engine()
        while True:
            ready, reason = self.compare_readiness()
            if ready and self.compare_engine is not None:
                return self.compare_engine
            kept = self.keeping is not None and not self.keeping.done()
            dying = self.compare_engine is not None and self.compare_engine.is_dead
            if not kept or self.compare_life.down_because or not (dying or self.compare_life.restarting_since):
                raise EngineError(reason)
            await asyncio.sleep(0.05)  # its keeper notices within WATCH_INTERVAL_S, then restarts it

    @property
    def tiny(self) -> bool:
        """Running on the random-weight test model (resolve_model's banner says so)."""
        return self.banner is not None and self.banner.startswith(TINY_BANNER)

    def gpu_figures(self) -> list[dict[str, Any]]:
        """Each GPU's memory and utilisation now (NVML), for the page's live figures; empty without a GPU."""
        from vidchat.app.metrics import gpu_snapshot

        return gpu_snapshot()

    def answer_defaults(self) -> AnswerOptions:
        s = self.settings
        return AnswerOptions(
            frames_as=s.frames_as,
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            system_prompt=s.system_prompt or None,
        )

    def store_max_pixels(self) -> int:
        """Frames are kept at no more pixels than the model will look at (and
        at most 320x240 unless --max-image-pixels asks for more), which bounds
        a session's memory and the cost of preparing a question."""
        options = self.engine.options if self.engine else self.engine_options
        engine_cap = options.max_image_pixels if options else 0
        return self.settings.max_image_pixels or engine_cap or DEFAULT_STORE_MAX_PIXELS

    def store_limit_text(self) -> str:
        return describe_store_limit(self.store_max_pixels())

    def session_budget_bytes(self) -> int:
        return session_budget_bytes(self.settings.max_session_mb, self.store_max_pixels())

    def frames_kept_limit(self) -> int:
        """The most frames a session may keep: what --max-session-mb holds at
        the stored size (the page's slider goes no further; check_frame_budget
        refuses beyond it at every door)."""
        return max(1, self.session_budget_bytes() // (self.store_max_pixels() * BYTES_PER_PIXEL))

    def check_frame_budget(self, max_frames: int) -> None:
        """Raise ValueError when ``max_frames`` stored frames would not fit --max-session-mb."""
        check_frame_budget(max_frames, self.store_max_pixels(), self.session_budget_bytes())

    def new_session(self, kind: str, **kwargs: Any) -> Conversation:
        """Register a session with the server's storage size, frame cap and
        memory budget (raises TooManySessions, or ValueError for settings over the budget)."""
        entry = self.registry.create(kind, store_max_pixels=self.store_max_pixels(),
                                     max_frame_bytes=self.settings.ws_max_frame_bytes,
                                     max_frame_pixels=self.settings.max_frame_pixels,
                                     max_bytes=self.session_budget_bytes(), **kwargs)
        if self.metrics is not None:
            entry.session.on_frame = self.metrics.frame_counter(kind)
        entry.session.scene_log.limit = self.settings.memory_keyframes
        return entry

    @property
    def memory(self) -> MemoryOptions:
        """How sessions remember (--memory-prompt, --memory-caption-tokens, --memory-tokens, --memory-frames)."""
        return memory_options(self.settings)


_gpu_here = functools.cache(on_gpu)  # torch is imported once, by the first session


def memory_options(settings: Settings) -> MemoryOptions:
    return MemoryOptions(settings.memory_prompt, settings.memory_caption_tokens, settings.memory_tokens,
                         settings.memory_frames)


def memory_choice(settings: Settings) -> tuple[bool, str]:
    """Whether new sessions remember (--memory; auto: on where the engine is on a GPU, or at --engine-url) and why."""
    return memory_default(settings.memory, gpu=not settings.engine_url and _gpu_here(),
                          remote=bool(settings.engine_url))


def default_session_settings(settings: Settings) -> SessionSettings:
    """A new session's settings from the server's options."""
    remembers = memory_choice(settings)[0]
    return SessionSettings(audio_seconds=settings.ws_max_audio_seconds, num_sample_frames=settings.frames_per_question,
                           sampling=settings.sampling, memory=remembers)


if TYPE_CHECKING:
    # The type checker holds AppState to the protocols it serves: Host (what
    # the conversations, suite runs and replays may use of the server) and
    # the doors' Server (a Host, and what only a door needs besides).
    def _serves_conversations(state: AppState) -> Host:
        return state

    def _serves_doors(state: AppState) -> Server:
        return state
