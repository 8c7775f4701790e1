"""Shared fixtures: the tiny models and one real vLLM engine per family,
started once per test session (each start costs ~20 s on CPU)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vidchat import tinymodel
from vidchat.engine import Engine, EngineOptions

CACHE_DIR = Path(os.environ.get("VIDCHAT_CACHE_DIR", Path.home() / ".cache" / "vidchat"))
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"

# Small enough to start fast on 2 cores, large enough for 16 frames + audio.
TEST_MAX_MODEL_LEN = 4096
TEST_MAX_IMAGES = 16


def tiny_options(path: Path, **overrides) -> EngineOptions:
    opts = dict(
        model=str(path),
        dtype="float32",
        max_model_len=TEST_MAX_MODEL_LEN,
        kv_cache_gb=0.25,
        max_images=TEST_MAX_IMAGES,
        max_image_pixels=tinymodel.MAX_PIXELS,
    )
    opts.update(overrides)
    return EngineOptions(**opts)


@pytest.fixture(scope="session")
def tiny_omni_path() -> Path:
    return tinymodel.ensure(CACHE_DIR, "omni")


@pytest.fixture(scope="session")
def tiny_vl_path() -> Path:
    return tinymodel.ensure(CACHE_DIR, "vl")


@pytest.fixture(scope="session")
def omni_engine(tiny_omni_path):
    engine = Engine.start(tiny_options(tiny_omni_path))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
