"""An engine for a tool without a server (replay, QA suites): the model
resolved as app.py resolves it, and an app state with a started in-process
engine, made as the server makes them."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("vidchat.qa")


async def start_engine(settings: Any, model_option: str, model_path: str, banner: str | None) -> tuple[Any, Any]:
    """An app state (its session registry) and a started in-process engine,
    as the server makes them from ``settings``; raises EngineError."""
    from vidchat.engine.local import LocalEngine
    from vidchat.app.server import engine_options
    from vidchat.conversation.registry import SessionRegistry
    from vidchat.app.state import AppState, default_session_settings

    state = AppState(settings=settings, model_path=model_path, banner=banner,
                     registry=SessionRegistry(settings.max_sessions, lambda: default_session_settings(settings)))
    state.engine_options = engine_options(settings, model_path, state.tiny)
    if banner:
        # Asked for by name it is no surprise; a fallback from 'auto' is.
        (log.info if model_option.startswith("tiny") else log.warning)(banner)
    engine = await asyncio.to_thread(LocalEngine.start, state.engine_options)
    state.engine_settled(engine)
    log.info("engine ready in %.1f s", engine.start_s)
    return state, engine


def resolve(settings: Any) -> tuple[Any, str, str | None]:
    """(settings with its preset applied, model path, banner) for settings.model,
    as app.py resolves it; raises EngineError or ValueError naming what is wrong."""
    from vidchat.app.models import resolve_model, resolve_preset
    from vidchat.app.presets import apply as apply_preset

    model_path, banner = resolve_model(settings.model, settings.cache_dir)
    preset = resolve_preset(settings.preset or settings.model)
    if settings.preset and preset is None:
        raise ValueError(f"--preset {settings.preset}: no such preset (python app.py --model list shows them)")
    if preset is not None and banner is None:
        settings = apply_preset(settings, preset)
        log.info("preset %s: %s", preset.name, preset.model)
    return settings, model_path, banner
