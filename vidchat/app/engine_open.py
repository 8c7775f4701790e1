"""How the app opens its engine, as the server and the tools without one
(replay, QA suites: vidchat.qa.engine_start) do: the engine's options from
the settings, and the engine they name (vLLM in this process, or the model
served at --engine-url). Apart from the server, so a tool opens an engine
without importing the app's routes and doors."""

from __future__ import annotations

import asyncio
from typing import Any

from vidchat.app.settings import Settings
from vidchat.devtools import tinymodel
from vidchat.engine import ChatEngine, EngineOptions
from vidchat.engine.local import LocalEngine

# With --audio-segments on: room for 30 s of audio in 2-s clips (the oldest
# are merged beyond this; vidchat.engine.audio_clips).
SEGMENTED_MAX_AUDIOS = 16


def engine_options(settings: Settings, model_path: str, tiny: bool, main: bool = True) -> EngineOptions:
    """The engine's options (``main``: the main engine, whose vLLM stats feed /metrics)."""
    return EngineOptions(
        model=model_path,
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
        priority_scheduling=settings.prewarm != "off",
        encoder_cache_frames=settings.max_sessions * settings.frames_per_question,
        tensor_parallel_size=settings.tensor_parallel_size,
        data_parallel_size=settings.data_parallel_size,
        prometheus_stats=main,
        role="main" if main else "compare",
    )



async def open_engine(state: Any) -> ChatEngine:
    """The engine ``state.settings`` names, started in a worker thread: vLLM
    in this process, or the model served at --engine-url (whose model path
    then becomes the state's). Raises EngineError with vLLM's own reason."""
    settings = state.settings
    if not settings.engine_url:
        return await asyncio.to_thread(LocalEngine.start, state.engine_options)
    from vidchat.engine.remote import RemoteEngine

    engine = await asyncio.to_thread(
        RemoteEngine.start, state.engine_options, settings.engine_url,
        session_header=settings.engine_session_header, connect_timeout=settings.engine_connect_timeout,
        first_byte_timeout=settings.engine_first_byte_timeout)
    state.model_path = engine.model_path
    return engine
