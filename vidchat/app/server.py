"""The FastAPI app: engine lifecycle, routes, and the Gradio page mounted last."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
from pathlib import Path
from typing import Any, AsyncContextManager, AsyncIterator, Callable

import uvicorn
from fastapi import FastAPI, WebSocket
from fastapi.staticfiles import StaticFiles

from vidchat.app import metrics as app_metrics
from vidchat.app import routes
from vidchat.app.access import default_allowed_hosts, split_list
from vidchat.app.engine_keeper import EngineKeeper, engine_options, open_engine, start_local_engine
from vidchat.app.guard import Guard
from vidchat.app.metrics import LoopWatch
from vidchat.app.state import AppState, memory_choice
from vidchat.conversation import warmup
from vidchat.conversation.memory import Captioner
from vidchat.conversation.warmup import Prewarmer
from vidchat.doors.webrtc_routes import ReturningTabs
from vidchat.engine import ChatEngine, EngineError, native_heap

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parents[2] / "static"
# Below Gradio's own /static/ (its fonts, icons and scripts), not over it:
# mounted at /static, vidchat's files answered 404 for every Gradio asset.
STATIC_URL = "/static/vidchat"


def parse_ice_servers(raw: str) -> list[dict[str, Any]]:
    if not raw.strip():
        return []
    servers = json.loads(raw)
    if not isinstance(servers, list) or not all(isinstance(s, dict) and "urls" in s for s in servers):
        raise ValueError("--ice-servers must be a JSON list of objects with a 'urls' key")
    return servers


# Ctrl-C: open HTTP streams (a tab's Gradio queue) get this long to end
# before uvicorn cuts them, so the server exits in a few seconds with a tab open.
SHUTDOWN_GRACE_S = 1.5


class ClosingServer(uvicorn.Server):
    """uvicorn's server, which on Ctrl-C first ends every session with a
    reason (peers and sockets are told "closed at shutdown" and close), so
    its wait for open connections is short."""

    def __init__(self, config: uvicorn.Config, state: AppState) -> None:
        super().__init__(config)
        self.vidchat_state = state

    async def shutdown(self, sockets: Any = None) -> None:
        state = self.vidchat_state
        log.info("shutting down: closing %d session(s)", len(state.registry))
        try:
            if state.suite_runs is not None:
                await state.suite_runs.close()  # first: it would open sessions and ask the engine as they stop
            if state.prewarmer is not None:
                await state.prewarmer.stop()
            if state.captioner is not None:
                await state.captioner.stop()
            await state.registry.close_all(timeout=SHUTDOWN_GRACE_S)
        except Exception:  # noqa: BLE001 - shutting down regardless
            log.warning("closing the sessions at shutdown failed", exc_info=True)
        # An open tab's Gradio heartbeat stream ends when Gradio's stop event
        # is set (Gradio's own close sets it; this server's shutdown is
        # uvicorn's): left open, uvicorn cancelled it at the end of its grace
        # and printed an ERROR and a traceback at every Ctrl-C.
        if state.page_app is not None:
            state.page_app.stop_event.set()
        # Nothing can ask the model now: its engine winds down (seconds of
        # vLLM teardown) while open HTTP streams get their grace.
        engines = asyncio.create_task(asyncio.to_thread(_shut_down_own_engines, state))
        await super().shutdown(sockets)
        await engines


def _shut_down_own_engines(state: AppState) -> None:
    """The engines the app started itself (not one a caller handed it)."""
    if state.owns_engines:
        for engine in (state.engine, state.compare_engine):
            if engine is not None:
                engine.shutdown()


def create_app(state: AppState) -> FastAPI:
    """The app: the engine loads in its lifespan while the port already
    answers; then the status routes, the doors' routes, vidchat's static
    files, the access guard in front of every route, and the page mounted last."""
    from vidchat.doors import answer_routes, memory_routes, webrtc_routes
    from vidchat.doors import page as ui
    from vidchat.doors.socket import realtime, seed

    state.metrics = app_metrics.attach(state)
    loop_watch = LoopWatch(observe=state.metrics.loop_lag.observe)
    app = FastAPI(title="vidchat", lifespan=_lifespan(state, loop_watch), docs_url=None, redoc_url=None)
    app.state.vidchat = state
    routes.replica_routes(app, state)
    routes.running_routes(app, state, loop_watch)
    routes.client_config_route(app, state)
    app.include_router(webrtc_routes.router(state))
    app.include_router(answer_routes.router(state))
    app.include_router(memory_routes.router(state))
    app.include_router(answer_routes.suite_router(state))
    app.include_router(routes.router(state))
    app.include_router(webrtc_routes.media_dir_router(state))

    @app.websocket("/v1/video/chat/stream")
    async def video_chat_stream(websocket: WebSocket) -> None:
        await seed.Connection.serve(state, websocket)

    @app.websocket("/v1/realtime")
    async def realtime_api(websocket: WebSocket) -> None:
        """The OpenAI Realtime API (vidchat.doors.socket.realtime), for the official SDK."""
        await realtime.RealtimeConnection.serve(state, websocket)

    # StaticFiles refuses paths that resolve outside its directory.
    app.mount(STATIC_URL, StaticFiles(directory=STATIC_DIR), name="static")
    _guard(app, state)
    return ui.mount(app, state)


def _lifespan(state: AppState, loop_watch: LoopWatch) -> Callable[[FastAPI], AsyncContextManager[None]]:
    """What runs while the app serves: the engine's load (unless one was
    handed in), the idle reaper, warm-ups, the loop-lag watch, and the
    rounds that give memory back (native heaps, the page state Gradio keeps per tab)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owns_engine = state.owns_engines = state.engine is None
        if owns_engine:
            state.engine_options = engine_options(state.settings, state.model_path, state.tiny)
            loading = asyncio.create_task(_load_engine(state))
        else:
            loading = None
            state.engine_settled(state.engine)
        if state.banner:
            log.warning(state.banner)
        reaper = asyncio.create_task(_reap_idle_sessions(state))
        trimming = asyncio.create_task(native_heap.keep_trimming(lambda: (state.engine, state.compare_engine)))
        state.prewarmer = Prewarmer(state, state.settings.prewarm)
        state.prewarmer.start()
        state.captioner = Captioner(state, state.memory)
        state.captioner.start()
        if not owns_engine:
            await warmup.settle(state, measure=False)
        loop_watch.start()
        log.info("vidchat listening on http://%s:%d%s", state.settings.host, state.settings.port,
                 " (loading the model)" if owns_engine else "")
        try:
            yield
        finally:
            reaper.cancel()
            trimming.cancel()
            if state.suite_runs is not None:
                await state.suite_runs.close()
            await state.prewarmer.stop()
            await state.captioner.stop()
            loop_watch.stop()
            # Empty after ClosingServer.shutdown; not when the app is served another way (tests, ASGI servers).
            await state.registry.close_all(timeout=SHUTDOWN_GRACE_S)
            if loading is not None:
                await asyncio.gather(loading, return_exceptions=True)  # a start in progress finishes first
            if state.keeping is not None:
                state.keeping.cancel()  # a restart in progress finishes, and its engine is shut down
                await asyncio.gather(state.keeping, return_exceptions=True)
            await asyncio.to_thread(state.streams.close)  # their reader threads end
            if owns_engine:
                _shut_down_own_engines(state)

    return lifespan


def _guard(app: FastAPI, state: AppState) -> None:
    """Access in front of every route, Gradio's included (vidchat.app.access);
    behind it, a reloading tab's session told that its tab is loading again."""
    settings = state.settings
    app.add_middleware(ReturningTabs, registry=state.registry)
    app.add_middleware(
        Guard,
        access=state.access,
        allowed_hosts=split_list(settings.allowed_hosts) or default_allowed_hosts(settings.host),
        allowed_origins=split_list(settings.allowed_origins),
        max_body_bytes=settings.max_body_bytes,
        page=state.page_logins,
        owner_of=state.registry.owner_of,
    )


async def _load_engine(state: AppState) -> None:
    """Start vLLM in a worker thread while the port already answers."""
    try:
        engine = await open_engine(state)
    except Exception as exc:  # EngineError carries vLLM's own reason
        log.error("the model failed to load: %s", exc, exc_info=not isinstance(exc, EngineError))
        state.engine_settled(None, str(exc))
        return
    await warmup.settle(state, engine)  # --prewarm auto times a frame here, before the server is ready
    log.info("memory: %s", memory_choice(state.settings)[1])
    _freeze_startup_objects()
    state.engine_settled(engine)
    log.info("vidchat ready on http://%s:%d", state.settings.host, state.settings.port)
    keepers = [] if state.settings.engine_url else [_keeper(state, main=True)]
    if state.compare_model_path:
        # After the first: the page works meanwhile, and two loads at once
        # would only compete for the same cores and memory.
        options = engine_options(state.settings, state.compare_model_path, state.compare_tiny, main=False)
        try:
            state.compare_engine = await asyncio.to_thread(start_local_engine, options)
        except Exception as exc:
            log.error("the comparison model failed to load: %s", exc, exc_info=not isinstance(exc, EngineError))
            state.compare_error = str(exc)
        else:
            keepers.append(_keeper(state, main=False))
    # Until the app shuts down (the lifespan cancels it) or every engine stays down.
    state.keeping = asyncio.create_task(_keep(keepers), name="engine-keepers")


def _freeze_startup_objects() -> None:
    """Set the start-up's objects (the libraries and the model's, about
    800,000) aside from the garbage collector. Python runs its full pass only
    once a quarter as many new objects have survived as it already holds, so
    with them counted it almost never ran: cycles that closed sessions left
    (aiortc's peer objects, an answer's last frames) piled up for hours (the
    soak, docs/operations.md). Set aside, they are never scanned again, and
    the full pass comes as often as the sessions' own objects call for it."""
    gc.collect()
    gc.freeze()
    gc.collect()  # a full pass over what is left resets the count the next one waits for


async def _keep(keepers: list[EngineKeeper]) -> None:
    await asyncio.gather(*(keeper.run() for keeper in keepers))


def _keeper(state: AppState, main: bool) -> EngineKeeper:
    """The watch over an in-process engine: started again when it dies."""
    if main:
        return EngineKeeper(state, state.engine_life, lambda: state.engine, state.put_engine,
                            lambda: state.engine_options, start_local_engine, state.settings.engine_restarts,
                            stays_down=state.engine_stays_down)

    def put_compare(engine: ChatEngine | None) -> None:
        state.compare_engine = engine

    options = engine_options(state.settings, state.compare_model_path, state.compare_tiny, main=False)
    return EngineKeeper(state, state.compare_life, lambda: state.compare_engine, put_compare, lambda: options,
                        start_local_engine, state.settings.engine_restarts)


async def _reap_idle_sessions(state: AppState) -> None:
    """End WebRTC sessions whose media stopped: a stopped track on a live
    connection sends nothing, and a killed browser is noticed late by ICE."""
    while True:
        await asyncio.sleep(2.0)
        try:
            await state.registry.expire(state.settings.session_idle_timeout, kind="webrtc")
            await state.registry.end_overdue()
        except Exception:
            log.exception("session expiry failed")
