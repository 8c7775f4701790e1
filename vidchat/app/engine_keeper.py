"""The in-process engines' lives: loaded after the port opens, watched, and
started again when they die (an OOM, a CUDA error, the EngineCore killed).

While an engine restarts, the app is as it is while the model first loads:
``/readyz`` says 503 with the reason, questions wait and are answered once
it is back, sessions keep their buffers, chats and settings. Answers in
flight when it died end at once with one failure naming the cause (the
engine's reply raises EngineDead). Restarts back off (2 s, 4 s, 8 s, …) and
are capped per hour (``--engine-restarts``); past the cap the engine stays
down and ``/readyz``, the page and the log say why. A remote engine
(``--engine-url``) is its model server's to restart, not vidchat's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Callable

from vidchat.app.settings import Settings
from vidchat.devtools import tinymodel
from vidchat.engine.interface import ChatEngine, EngineError, EngineOptions
from vidchat.engine.weights import model_name

if TYPE_CHECKING:
    from vidchat.app.state import AppState, EngineLife

log = logging.getLogger(__name__)


WATCH_INTERVAL_S = 0.5  # how often the engines' health is read (an attribute read)

FIRST_BACKOFF_S = 2.0

MAX_BACKOFF_S = 60.0

SHUTDOWN_TIMEOUT_S = 15.0  # a dead engine's tear-down; past it the restart goes on anyway


def death_cause(engine: ChatEngine) -> str:
    """Why an engine died, in words (its process's exit, where known: an
    in-process engine says; the interface does not ask it of every engine)."""
    cause = getattr(engine, "death_cause", None)
    return str(cause()) if callable(cause) else "the engine process ended"


class EngineKeeper:
    """Watches one in-process engine and starts it again when it dies.

    ``get``/``put`` read and replace the app's engine; ``start`` builds a new
    one from ``options`` (blocking: it runs in a worker thread)."""

    def __init__(self, state: AppState, life: EngineLife, get: Callable[[], ChatEngine | None],
                 put: Callable[[ChatEngine | None], None], options: Callable[[], EngineOptions],
                 start: Callable[[EngineOptions], ChatEngine], limit_per_hour: int,
                 stays_down: Callable[[], None] | None = None) -> None:
        self.state, self.life = state, life
        self._get, self._put, self._options, self._start = get, put, options, start
        self.limit_per_hour = limit_per_hour
        self._stays_down = stays_down

    async def run(self) -> None:
        """Until cancelled (the app's shutdown) or the engine stays down."""
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            engine = self._get()
            if engine is None or not engine.is_dead:
                continue
            if getattr(engine, "closed", False):
                return  # shut down on purpose (the app is stopping): nothing to heal
            if not await self._restart(engine):
                return

    async def _restart(self, dead: ChatEngine) -> bool:
        life = self.life
        life.stopped_because = death_cause(dead)
        log.error("the %s model engine stopped: %s", life.name, life.stopped_because)
        delay = FIRST_BACKOFF_S
        shut = asyncio.ensure_future(asyncio.to_thread(_shut_down, dead))
        while True:
            now = time.monotonic()
            if not life.may_restart(self.limit_per_hour, now):
                life.restarting_since = None
                life.down_because = (
                    "--engine-restarts is 0 (never restarted)" if self.limit_per_hour == 0 else
                    f"it was restarted {self.limit_per_hour} times within the hour (--engine-restarts); "
                    "restart vidchat once the cause is fixed")
                log.error("the %s model engine stays down: %s", life.name, life.down_because)
                if self._stays_down is not None:
                    self._stays_down()
                return False
            life.note_restart(now)
            if life.restarting_since is None:
                life.restarting_since = now
                self._put(None)  # questions now wait for the new engine, as while the model first loads
            log.warning("restarting the %s model engine in %.0f s", life.name, delay)
            await asyncio.sleep(delay)
            await asyncio.wait({shut}, timeout=SHUTDOWN_TIMEOUT_S)  # the dead one's memory first
            starting = asyncio.ensure_future(asyncio.to_thread(self._start, self._options()))
            try:
                engine = await asyncio.shield(starting)
            except asyncio.CancelledError:
                # Shutting down mid-start: the start finishes (a thread cannot
                # be stopped), and the engine it made is shut down, not leaked.
                started = await asyncio.gather(starting, return_exceptions=True)
                if not isinstance(started[0], BaseException):
                    await asyncio.to_thread(_shut_down, started[0])
                raise
            except Exception as exc:  # noqa: BLE001 - an EngineError carries vLLM's own reason
                log.error("the %s model engine did not start again: %s", life.name, exc,
                          exc_info=not isinstance(exc, EngineError))
                delay = min(delay * 2, MAX_BACKOFF_S)
                continue
            life.restarts += 1
            life.restarting_since = None
            life.stopped_because = None
            metrics = self.state.metrics
            if metrics is not None:
                metrics.engine_restarts.labels(life.name).inc()
            self._put(engine)
            log.warning("the %s model engine is back (restart %d)", life.name, life.restarts)
            return True


def _shut_down(engine: ChatEngine) -> None:
    try:
        engine.shutdown()
    except Exception:  # noqa: BLE001 - it is dead already; what is left is its memory
        log.debug("shutting the dead engine down failed", exc_info=True)


# How the app opens its engine, as the server and the tools without one
# (replay, QA suites: vidchat.qa.replay) do: the engine's options from
# the settings, and the engine they name (vLLM in this process, or the model
# served at --engine-url). Apart from the server, so a tool opens an engine
# without importing the app's routes and doors.

# With --audio-segments on: room for 30 s of audio in 2-s clips (the oldest
# are merged beyond this; vidchat.engine.audio_clips).
SEGMENTED_MAX_AUDIOS = 16


def engine_options(settings: Settings, model_path: str, tiny: bool, main: bool = True) -> EngineOptions:
    """The engine's options (``main``: the main engine, whose vLLM stats feed /metrics)."""
    option = settings.model if main else settings.compare_model
    return EngineOptions(
        model=model_path,
        name="" if option == "auto" else model_name(option),
        dtype="float32" if tiny and settings.dtype == "auto" else settings.dtype,
        max_model_len=settings.max_model_len,
        kv_cache_gb=settings.kv_cache_gb,
        mm_cache_gb=settings.mm_cache_gb,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        max_images=settings.max_images,
        max_videos=settings.max_videos,
        max_audios=max(settings.max_audios, SEGMENTED_MAX_AUDIOS) if settings.audio_segments == "on"
        else settings.max_audios,
        split_audio=settings.audio_segments == "on",
        max_image_pixels=settings.max_image_pixels or (tinymodel.MAX_PIXELS if tiny else 0),
        # Warm-ups and captions run behind answers (vidchat.conversation.warmup, .memory).
        priority_scheduling=settings.prewarm != "off" or settings.memory != "off",
        encoder_cache_frames=settings.max_sessions * settings.frames_per_question,
        tensor_parallel_size=settings.tensor_parallel_size,
        data_parallel_size=settings.data_parallel_size,
        prometheus_stats=main,
        role="main" if main else "compare",
    )


def start_local_engine(options: EngineOptions) -> ChatEngine:
    """vLLM in this process (blocking: call it in a worker thread). Imported
    here, not at the top: vLLM's engine core costs 6 s of a CPU to import, which
    a server whose engine is at --engine-url never needs."""
    from vidchat.engine.local import LocalEngine

    return LocalEngine.start(options)


async def open_engine(state: AppState) -> ChatEngine:
    """The engine ``state.settings`` names, started in a worker thread: vLLM
    in this process, or the model served at --engine-url (whose model path
    then becomes the state's). Raises EngineError with vLLM's own reason."""
    settings, options = state.settings, state.engine_options
    if options is None:  # whoever opens the engine sets them first (engine_options)
        raise EngineError("the engine's options were not set")
    if not settings.engine_url:
        return await asyncio.to_thread(start_local_engine, options)
    from vidchat.engine.remote import RemoteEngine

    engine = await asyncio.to_thread(
        RemoteEngine.start, options, settings.engine_url,
        session_header=settings.engine_session_header, connect_timeout=settings.engine_connect_timeout,
        first_byte_timeout=settings.engine_first_byte_timeout)
    state.model_path = engine.model_path
    return engine
