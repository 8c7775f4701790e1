"""Shared fixtures and the suite's rules.

Tiers: every test is exactly one of ``unit`` (no engine, no browser),
``engine`` (real vLLM, in-process or in a server subprocess) or ``browser``
(Chromium). A module of one tier states it with ``pytestmark``; in a module
of several, each test carries its own marker, so ``-m unit`` selects exactly
the unit tier. A unit-tier test that
starts vLLM, a server or Chromium fails (the guard below), so ``make
test-fast`` stays fast and honest.

Engines and servers are started once per test session and shared: isolation
comes from a new vidchat session (each has its own cache salt), not a new
process. The run ends with a count of the vLLM engines it started.
"""

from __future__ import annotations

import asyncio as _asyncio
import collections
import os
import sys
from pathlib import Path

import pytest

from vidchat import tinymodel
from vidchat.devtools import harness
from vidchat.devtools.harness import (  # noqa: F401 - re-exported for the test modules
    ROOT,
    NeverHappened,
    Server,
    allocate_port,
    eventually,
    eventually_async,
)
from vidchat.engine import Engine, EngineOptions

CACHE_DIR = Path(os.environ.get("VIDCHAT_CACHE_DIR", Path.home() / ".cache" / "vidchat"))
ARTIFACTS = ROOT / "test-artifacts"

# Small enough to start fast on 2 cores, large enough for 16 frames + audio.
TEST_MAX_MODEL_LEN = 4096
TEST_MAX_IMAGES = 16
# Short protocol timeouts so the idle/config timeout tests run in seconds.
SERVER_ARGS = ["--ws-idle-timeout", "4", "--ws-config-timeout", "2", "--session-idle-timeout", "8"]

TIERS = ("unit", "engine", "browser")
# Unit tests are quick by definition; engine and browser tests get a generous
# default (pyproject's timeout) unless they set their own.
UNIT_TIMEOUT_S = 30

free_port = allocate_port  # the name the older test modules use


# ---- tiers ----


def pytest_configure(config: pytest.Config) -> None:
    for tier, what in (("unit", "no engine, no browser"), ("engine", "real vLLM (in-process or a server)"),
                       ("browser", "headless Chromium against a real server")):
        config.addinivalue_line("markers", f"{tier}: tier: {what}")


def tiers_of(item: pytest.Item) -> set[str]:
    return {m.name for m in item.iter_markers() if m.name in TIERS}


def tier_of(item: pytest.Item) -> str | None:
    tiers = tiers_of(item)
    return next(iter(tiers)) if len(tiers) == 1 else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    untiered, doubled = [], []
    for item in items:
        tier = tier_of(item)
        if not tiers_of(item):
            untiered.append(item.nodeid)
        elif tier is None:
            doubled.append(item.nodeid)
        if tier == "unit" and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(UNIT_TIMEOUT_S))
    problems = [f"no tier marker (unit, engine or browser): {n}" for n in untiered]
    problems += [f"more than one tier marker (module and test?): {n}" for n in doubled]
    if problems:
        raise pytest.UsageError("\n".join(problems))


class TierViolation(RuntimeError):
    pass


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise TierViolation(f"a unit-tier test must not start {what}: mark it engine or browser")
    return refuse


@pytest.fixture(autouse=True)
def _tier_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """In the unit tier, starting vLLM, a server or Chromium raises."""
    if tier_of(request.node) == "unit":
        monkeypatch.setattr(Engine, "start", _refuse("a vLLM engine"))
        monkeypatch.setattr(harness, "start_server", _refuse("a vidchat server"))
        monkeypatch.setattr(sys.modules[__name__], "start_server", _refuse("a vidchat server"))
        if "vllm.v1.engine.async_llm" in sys.modules:
            monkeypatch.setattr(sys.modules["vllm.v1.engine.async_llm"].AsyncLLM, "__init__",
                                _refuse("a vLLM engine"))
        try:
            from playwright.async_api import BrowserType as AsyncBrowserType
            from playwright.sync_api import BrowserType as SyncBrowserType
        except ImportError:
            pass
        else:
            monkeypatch.setattr(AsyncBrowserType, "launch", _refuse("Chromium"))
            monkeypatch.setattr(SyncBrowserType, "launch", _refuse("Chromium"))
    yield


# ---- counting engine starts ----

ENGINE_STARTS: collections.Counter = collections.Counter()


def count_engine_start(kind: str) -> None:
    """For engines the suite starts itself (``vllm serve``); in-process and app.py engines count themselves."""
    ENGINE_STARTS[kind] += 1


_real_engine_start = Engine.start.__func__


def _counted_engine_start(cls, options: EngineOptions) -> Engine:
    count_engine_start("in-process")
    return _real_engine_start(cls, options)


Engine.start = classmethod(_counted_engine_start)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if ENGINE_STARTS:
        parts = ", ".join(f"{kind} {n}" for kind, n in sorted(ENGINE_STARTS.items()))
        terminalreporter.write_line(f"vLLM engine starts: {sum(ENGINE_STARTS.values())} ({parts})")


# ---- models and engines ----


def tiny_options(path: Path, **overrides) -> EngineOptions:
    opts = dict(
        model=str(path),
        dtype="float32",
        max_model_len=TEST_MAX_MODEL_LEN,
        kv_cache_gb=0.25,
        max_images=TEST_MAX_IMAGES,
        max_image_pixels=tinymodel.MAX_PIXELS,
        max_audios=16,  # room for --audio-segments, which tests switch on where they need it
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
def vl_engine(tiny_vl_path):
    """The vision-only family (Qwen2-VL), shared by every module that needs it."""
    engine = Engine.start(tiny_options(tiny_vl_path))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


# ---- the app, served by uvicorn in a subprocess exactly as users run it ----


def start_server(args: list[str], log_path: Path, timeout: float = 240, env_extra: dict | None = None,
                 token: str | None = None) -> Server:
    """harness.start_server with the suite's model cache; counts the engines it starts."""
    srv = harness.start_server(args, log_path, timeout=timeout, env_extra=env_extra, token=token,
                               cache_dir=CACHE_DIR)
    srv.counted_engines = 0
    _note_server_engines(srv)
    return srv


def _note_server_engines(srv: Server) -> None:
    started = srv.engine_starts()
    if started > srv.counted_engines:
        ENGINE_STARTS["server"] += started - srv.counted_engines
        srv.counted_engines = started


def stop_server(srv: Server) -> int:
    if hasattr(srv, "counted_engines"):
        _note_server_engines(srv)  # a compare model may have finished loading since
    return harness.stop_server(srv)


TINY_SERVER_ARGS = ["--model", "tiny", "--max-images", str(TEST_MAX_IMAGES), "--max-model-len",
                    str(TEST_MAX_MODEL_LEN), "--kv-cache-gb", "0.25"]


@pytest.fixture(scope="session")
def server(tiny_omni_path, artifacts_dir) -> Server:
    """The loopback server every test shares unless it needs other flags."""
    srv = start_server([*TINY_SERVER_ARGS, *SERVER_ARGS], artifacts_dir / "server.log")
    yield srv
    stop_server(srv)


def thumbnail_colours(inputs_html: str) -> list:
    """Mean colour of the top band (background only) of each thumbnail the
    page shows under 'What the model got'."""
    import base64
    import io
    import re

    import numpy as np
    from PIL import Image

    colours = []
    for b64 in re.findall(r"data:image/jpeg;base64,([A-Za-z0-9+/=]+)", inputs_html):
        img = np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"), dtype=np.float32)
        colours.append(img[: img.shape[0] // 6].reshape(-1, 3).mean(0))
    return colours


async def until_idle(server, within: float = 1.0) -> int:
    """Wait until the engine runs nothing; returns what still runs after ``within`` s (0 when it went idle)."""
    async def idle() -> bool:
        return await _asyncio.to_thread(server.running_requests) == 0

    try:
        await eventually_async(idle, within, "the engine has no running request")
        return 0
    except NeverHappened:
        return await _asyncio.to_thread(server.running_requests)
