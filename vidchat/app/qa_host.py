"""The host the QA tools bring when no server runs (``vidchat replay``,
``vidchat suite run``): the app's state with an engine of its own (vLLM in
this process, or a model served elsewhere with --engine-url), made as the
server makes them, the model resolved as app.py resolves it
(vidchat.app.models.resolve_settings). vidchat.qa is handed this host and
never builds one: only the app opens engines and resolves models.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING, AsyncIterator, Callable

from vidchat.app.models import resolve_settings
from vidchat.app.settings import Settings
from vidchat.conversation.answers import AnswerOptions
from vidchat.conversation.registry import SessionRegistry

if TYPE_CHECKING:
    from vidchat.app.state import AppState

log = logging.getLogger("vidchat.qa")


async def start_host(settings: Settings, model_option: str, model_path: str, banner: str | None) -> AppState:
    """An app state (its session registry) with a started engine, from
    resolved ``settings``; raises EngineError. Close it with :func:`close_host`."""
    # Here, not at the top: they import vLLM, which a command refused for bad usage never needs.
    from vidchat.app.engine_keeper import engine_options, open_engine
    from vidchat.app.state import AppState, default_session_settings

    state = AppState(settings=settings, model_path=model_path, banner=banner,
                     registry=SessionRegistry(settings.max_sessions, lambda: default_session_settings(settings)))
    state.engine_options = engine_options(settings, model_path, state.tiny)
    if banner:
        # Asked for by name it is no surprise; a fallback from 'auto' is.
        (log.info if model_option.startswith("tiny") else log.warning)(banner)
    engine = await open_engine(state)  # in-process, or a model served elsewhere (--engine-url)
    state.engine_settled(engine)
    log.info("engine ready in %.1f s", engine.start_s)
    return state


async def close_host(state: AppState) -> None:
    """Every session the host still holds closed, then its engine stopped."""
    try:
        await state.registry.close_all()
    finally:
        if state.engine is not None:
            state.engine.shutdown()


@contextlib.asynccontextmanager
async def standalone_host(settings: Settings, model_option: str, model_path: str,
                          banner: str | None) -> AsyncIterator[AppState]:
    """:func:`start_host`'s host for the block, closed when it ends however it ends."""
    state = await start_host(settings, model_option, model_path, banner)
    try:
        yield state
    finally:
        await close_host(state)


def is_url(model: str) -> bool:
    """A suite's --engine-url model, named by its URL."""
    return model.startswith(("http://", "https://"))


def model_hosts(settings: Settings) -> Callable[[str], contextlib.AbstractAsyncContextManager[AppState]]:
    """The suite runner's host for each model (vidchat.qa.suite.OpenHost): a
    model name or an --engine-url, resolved from ``settings`` as app.py
    would resolve it; raises EngineError or ValueError as it opens."""

    @contextlib.asynccontextmanager
    async def open_for(model: str) -> AsyncIterator[AppState]:
        named = (dataclasses.replace(settings, engine_url=model, model="auto") if is_url(model)
                 else dataclasses.replace(settings, model=model, engine_url=""))
        resolved, model_path, banner = resolve_settings(named)
        async with standalone_host(resolved, model, model_path, banner) as host:
            yield host

    return open_for


def flag_defaults() -> AnswerOptions:
    """The answer options a host gives when none of the app's answer flags
    is given (vidchat.qa.replay.ReplayPlan.flag_defaults): AppState's
    answer_defaults() for the default settings."""
    s = Settings()
    return AnswerOptions(frames_as=s.frames_as, max_tokens=s.max_tokens, temperature=s.temperature,
                         system_prompt=s.system_prompt or None)
