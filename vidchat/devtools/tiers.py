"""The test suite's rules, as a pytest plugin (pyproject's addopts load it
with ``-p vidchat.devtools.tiers``).

Tiers: every test is exactly one of ``unit`` (no engine, no browser),
``engine`` (real vLLM, in-process or in a server subprocess) or ``browser``
(Chromium). A module of one tier states it with ``pytestmark``; in a module
of several tiers each test carries its own marker, so ``-m unit`` selects
exactly the unit tier. A test with no tier, or two, is a usage error. A
unit-tier test that starts vLLM, a vidchat server or Chromium fails (the
guard below), so ``make test-fast`` stays fast and honest; unit tests get a
short timeout, the others pyproject's.

The run ends with the count of vLLM engines it started (in-process, inside
app.py servers, and ``vllm serve`` processes a test starts itself).
"""

from __future__ import annotations

import collections
import sys
from typing import Any

import pytest

TIERS = ("unit", "engine", "browser")
UNIT_TIMEOUT_S = 30

ENGINE_STARTS: collections.Counter = collections.Counter()


def tiers_of(item: pytest.Item) -> set[str]:
    return {m.name for m in item.iter_markers() if m.name in TIERS}


def tier_of(item: pytest.Item) -> str | None:
    tiers = tiers_of(item)
    return next(iter(tiers)) if len(tiers) == 1 else None


def pytest_configure(config: pytest.Config) -> None:
    for tier, what in (("unit", "no engine, no browser"), ("engine", "real vLLM (in-process or a server)"),
                       ("browser", "headless Chromium against a real server")):
        config.addinivalue_line("markers", f"{tier}: tier: {what}")
    _count_in_process_engines()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems = []
    for item in items:
        tiers = tiers_of(item)
        if not tiers:
            problems.append(f"no tier marker (unit, engine or browser): {item.nodeid}")
        elif len(tiers) > 1:
            problems.append(f"more than one tier marker ({', '.join(sorted(tiers))}): {item.nodeid}")
        elif "unit" in tiers and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(UNIT_TIMEOUT_S))
    if problems:
        raise pytest.UsageError("\n".join(problems))


class TierViolation(RuntimeError):
    pass


def _refuse(what: str):
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise TierViolation(f"a unit-tier test must not start {what}: mark it engine or browser")
    return refuse


@pytest.fixture(autouse=True)
def _tier_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """In the unit tier, starting vLLM, a vidchat server or Chromium raises."""
    if tier_of(request.node) == "unit":
        from vidchat.devtools import harness
        from vidchat.engine import Engine

        monkeypatch.setattr(Engine, "start", _refuse("a vLLM engine"))
        monkeypatch.setattr(harness, "start_server", _refuse("a vidchat server"))
        suite_conftest = sys.modules.get("conftest")
        if suite_conftest is not None and hasattr(suite_conftest, "start_server"):
            monkeypatch.setattr(suite_conftest, "start_server", _refuse("a vidchat server"))
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


def count_engine_start(kind: str) -> None:
    """For engines a test starts itself (``vllm serve``); in-process and app.py engines count themselves."""
    ENGINE_STARTS[kind] += 1


def counted_server(server: Any) -> Any:
    """Count the engines an app.py server has started so far (its log says); returns the server."""
    started = server.engine_starts()
    counted = getattr(server, "counted_engines", 0)
    if started > counted:
        ENGINE_STARTS["in servers"] += started - counted
        server.counted_engines = started
    return server


def _count_in_process_engines() -> None:
    from vidchat.engine import Engine

    raw = Engine.__dict__.get("start")
    # Counted already, or replaced (a unit test's guard, around an inner pytest run).
    if not isinstance(raw, classmethod) or getattr(raw.__func__, "counted", False):
        return
    real_start = raw.__func__

    def counted_start(cls, options):
        count_engine_start("in-process")
        return real_start(cls, options)

    counted_start.counted = True
    Engine.start = classmethod(counted_start)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if ENGINE_STARTS:
        parts = ", ".join(f"{kind} {n}" for kind, n in sorted(ENGINE_STARTS.items()))
        terminalreporter.write_line(f"vLLM engine starts: {sum(ENGINE_STARTS.values())} ({parts})")
