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

The run ends with the count of vLLM engines it started: in this process, in
the servers, replays and benchmarks it launched (vidchat.engine notes each
start in a file this plugin names), and ``vllm serve`` processes a test
starts itself.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, AsyncIterator, BinaryIO

import pytest

from vidchat.engine import ENGINE_START_LOG_ENV  # noqa: E402


def _share_the_cores() -> None:
    """Split over N xdist workers, each worker's engines get cores/N compute
    threads. Left at their default (every core) each vLLM engine's OpenMP
    threads wait at barriers for threads that another worker's engine has
    descheduled: two workers on 2 cores then spent half as much CPU again
    for the same tests. Set before torch is imported here or in a server."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ.setdefault(name, str(threads))


_share_the_cores()

TIERS = ("unit", "engine", "browser")

UNIT_TIMEOUT_S = 30


def tiers_of(item: pytest.Item) -> set[str]:
    return {m.name for m in item.iter_markers() if m.name in TIERS}


def tier_of(item: pytest.Item) -> str | None:
    tiers = tiers_of(item)
    return next(iter(tiers)) if len(tiers) == 1 else None


def pytest_configure(config: pytest.Config) -> None:
    for tier, what in (("unit", "no engine, no browser"), ("engine", "real vLLM (in-process or a server)"),
                       ("browser", "headless Chromium against a real server")):
        config.addinivalue_line("markers", f"{tier}: tier: {what}")
    _engine_start_log(config)


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
        from vidchat.engine.local import LocalEngine

        monkeypatch.setattr(LocalEngine, "start", _refuse("a vLLM engine"))
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


def count_engine_start(kind: str) -> None:
    """For engines that are not vidchat's own (a test's ``vllm serve``). Noted
    in the shared file, so a run split over xdist workers counts them too."""
    with open(os.environ[ENGINE_START_LOG_ENV], "a") as f:
        f.write(f"{kind.replace(' ', '_')} 0 -\n")


def _engine_start_log(config: pytest.Config) -> str:
    if not hasattr(config, "_vidchat_engine_log"):
        # A pytest run inside a test (pytester) keeps the outer run's file:
        # the outer run's engines go on being counted there.
        path = os.environ.get(ENGINE_START_LOG_ENV)
        if not path:
            fd, path = tempfile.mkstemp(prefix="vidchat-engine-starts-", suffix=".log")
            os.close(fd)
            os.environ[ENGINE_START_LOG_ENV] = path
        config._vidchat_engine_log = path
        # Each pytest process (the run itself, or each xdist worker) notes its
        # pid, so the summary can tell in-process engines from launched ones.
        with open(path, "a") as f:
            f.write(f"pytest {os.getpid()} -\n")
    return config._vidchat_engine_log


def engine_starts(config: pytest.Config) -> collections.Counter:
    with open(_engine_start_log(config)) as f:
        lines = [line.split() for line in f if line.strip()]
    pytest_pids = {words[1] for words in lines if words[0] == "pytest"}
    counts: collections.Counter = collections.Counter()
    for first, *_ in lines:
        if first == "pytest":
            continue
        if not first.isdigit():
            counts[first.replace("_", " ")] += 1
        else:
            counts["in-process" if first in pytest_pids else "in servers, replays, benches"] += 1
    return counts


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the run's own process reports for all of them
    counts = engine_starts(config)
    if counts:
        parts = ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items()))
        terminalreporter.write_line(f"vLLM engine starts: {sum(counts.values())} ({parts})")


# The machine to one test for a moment, while the other pytest workers wait.
#
# `make test` runs two xdist workers on a 2-core machine. A few steps cannot
# be made independent of the other worker's load: a browser tab streaming a
# long answer on a starved machine took 13 s to send its next key press, and
# the 2,000-token answer it was meant to cut short ended on its own first
# (tests/test_page.py). Such a step runs inside :meth:`MachineShare.alone`:
# it waits until the other workers' running tests end and holds back their
# next ones until it is done. Everything else runs side by side.
#
# Every test holds the shared side of a lock file (per run: xdist's run id)
# from its set-up to its teardown; ``alone`` turns its own test's hold into
# the exclusive side. A second file, a turnstile, gives the exclusive side
# precedence: a worker waiting for it holds the turnstile, which each test
# passes through before taking its shared hold, so the other worker's next
# test cannot slip in ahead of it. Without xdist nothing is locked.

class MachineShare:
    """One worker's side of the run's lock (one test at a time per worker)."""

    def __init__(self, run_id: str | None, folder: Path | None = None) -> None:
        self.run_id = run_id
        base = Path(folder or tempfile.gettempdir())
        self._main_path = base / f"vidchat-tests-{run_id}.lock"
        self._turnstile_path = base / f"vidchat-tests-{run_id}.turnstile"
        self._main: BinaryIO | None = None
        self._turnstile: BinaryIO | None = None

    @classmethod
    def for_this_process(cls) -> "MachineShare":
        """The lock of this pytest-xdist run (none in a run without workers)."""
        return cls(os.environ.get("PYTEST_XDIST_TESTRUNUID"))

    @property
    def active(self) -> bool:
        return self.run_id is not None

    def test_starts(self) -> None:
        """Hold the shared side (waits while another worker's test is alone)."""
        if not self.active:
            return
        self._main = self._main or open(self._main_path, "ab")  # noqa: SIM115 - held across calls
        self._turnstile = self._turnstile or open(self._turnstile_path, "ab")  # noqa: SIM115
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._main, fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)

    def test_ends(self) -> None:
        if self._main is not None:
            fcntl.flock(self._main, fcntl.LOCK_UN)

    def _take_alone(self) -> None:
        # This test's own shared hold goes first: two workers each asking to
        # be alone while holding it would wait for each other for ever.
        fcntl.flock(self._main, fcntl.LOCK_UN)
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)  # the other worker's next test waits here
        try:
            fcntl.flock(self._main, fcntl.LOCK_EX)  # ...and this waits for its running one
        finally:
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)

    @contextlib.asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        """Run the block while no other worker runs a test. Call it from a
        test that holds its shared side (:meth:`test_starts`)."""
        if not self.active or self._main is None:
            yield
            return
        await asyncio.to_thread(self._take_alone)
        try:
            yield
        finally:
            fcntl.flock(self._main, fcntl.LOCK_SH)  # back to sharing, for the rest of this test

    def close(self) -> None:
        for f in (self._main, self._turnstile):
            if f is not None:
                f.close()
        self._main = self._turnstile = None
