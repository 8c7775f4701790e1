"""An engine for a tool without a server (replay, QA suites): an app state
with a started engine (in-process, or a model served elsewhere with
--engine-url), made as the server makes them. The model is resolved as
app.py resolves it (vidchat.app.models.resolve_settings)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from vidchat.app.models import resolve_settings as resolve  # noqa: F401 (replay's and suites' name for it)

log = logging.getLogger("vidchat.qa")


async def start_engine(settings: Any, model_option: str, model_path: str, banner: str | None) -> tuple[Any, Any]:
    """An app state (its session registry) and a started engine (in-process,
    or --engine-url's), as the server makes them from ``settings``; raises EngineError."""
    from vidchat.app.engine_open import engine_options, open_engine
    from vidchat.conversation.registry import SessionRegistry
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
    return state, engine
