"""Media workers: each session gets its share of the decode threads."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from vidchat.media import workers
from vidchat.media.workers import FairWorkers, run_media

pytestmark = pytest.mark.unit

# Bounds a broken scheduler's failure, never a condition of passing: every
# wait below returns as soon as its event happens.
STUCK_S = 5.0


class Log:
    """Events in the order they happened, from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[str] = []

    def add(self, event: str) -> None:
        with self._lock:
            self.events.append(event)


def gated_job(log: Log, name: str, gate: threading.Event, started: threading.Event | None = None):
    def job() -> str:
        log.add(f"{name}>")
        if started is not None:
            started.set()
        gate.wait(STUCK_S * 2)  # bounded, so a failing run still ends its threads
        log.add(f"{name}<")
        return name
    return job


async def event_set(event: threading.Event) -> bool:
    return await asyncio.to_thread(event.wait, STUCK_S)


def test_one_sessions_backlog_does_not_delay_another_session():
    # Session A queues many slow (large-frame) decodes, then B sends one
    # frame: B's decode runs on the idle worker at once, not after A's backlog.
    async def main() -> None:
        log, gate, a0_started = Log(), threading.Event(), threading.Event()
        a_jobs = [asyncio.ensure_future(run_media(gated_job(log, f"A{i}", gate, a0_started if i == 0 else None),
                                                  share="session-a")) for i in range(6)]
        try:
            assert await event_set(a0_started)
            b_job = asyncio.ensure_future(run_media(lambda: log.add("B") or "B", share="session-b"))
            done, _ = await asyncio.wait([b_job, *a_jobs], timeout=STUCK_S, return_when=asyncio.FIRST_COMPLETED)
            assert done == {b_job}, f"B waited behind A's backlog: {log.events}"
        finally:
            gate.set()
        assert await asyncio.gather(*a_jobs) == [f"A{i}" for i in range(6)]
        # A's jobs ran one at a time, in order; B's ran while A's first held a worker.
        assert log.events == ["A0>", "B"] + [e for i in range(6) for e in (f"A{i}>", f"A{i}<")][1:]

    asyncio.run(main())


def test_shares_take_turns_and_keep_their_own_order():
    # One worker, so the order is exact: after each job the next waiting
    # share goes, and a share's own jobs keep the order they were sent in.
    pool = FairWorkers(1, "test-fair")
    log, gate, started = Log(), threading.Event(), threading.Event()
    first = pool.submit("a", gated_job(log, "a0", gate, started))
    assert started.wait(STUCK_S)
    futures = [pool.submit(share, lambda name=f"{share}{i}": log.add(name))
               for share, i in [("a", 1), ("a", 2), ("a", 3), ("b", 0), ("b", 1), ("c", 0)]]
    gate.set()
    for f in [first, *futures]:
        f.result(STUCK_S)
    assert log.events == ["a0>", "a0<", "b0", "c0", "a1", "b1", "a2", "a3"]


def held_pool(workers: int, name: str, share: str) -> tuple[FairWorkers, Log, threading.Event, Any]:
    """A pool whose first job (``share``'s "a0") has started and waits on the
    gate: (pool, log, gate, that job's future)."""
    pool = FairWorkers(workers, name)
    log, gate, started = Log(), threading.Event(), threading.Event()
    first = pool.submit(share, gated_job(log, "a0", gate, started))
    assert started.wait(STUCK_S)
    return pool, log, gate, first


def test_a_share_never_runs_two_jobs_at_once():
    pool, log, gate, first = held_pool(2, "test-one-each", "a")
    second = pool.submit("a", lambda: log.add("a1"))
    other = pool.submit("b", lambda: log.add("b0"))
    other.result(STUCK_S)  # the second worker was free, and took b, not a's next job
    assert log.events == ["a0>", "b0"]
    gate.set()
    first.result(STUCK_S), second.result(STUCK_S)
    assert log.events == ["a0>", "b0", "a0<", "a1"]


def test_cancelled_jobs_are_skipped_and_errors_reach_the_caller():
    pool, log, gate, running = held_pool(1, "test-cancel", "s")
    skipped = pool.submit("s", lambda: log.add("never"))
    assert skipped.cancel()  # the caller went away while it waited (run_media's await was cancelled)

    def broken() -> None:
        raise ValueError("not an image")

    failing = pool.submit("s", broken)
    after = pool.submit("s", lambda: log.add("after") or 7)
    gate.set()
    assert running.result(STUCK_S) == "a0"
    with pytest.raises(ValueError, match="not an image"):
        failing.result(STUCK_S)
    assert after.result(STUCK_S) == 7  # the worker outlived the error
    assert log.events == ["a0>", "a0<", "after"]


def test_run_media_passes_results_and_errors_through():
    def broken() -> None:
        raise ValueError("not an image")

    async def main() -> None:
        assert await run_media(divmod, 7, 2, share="s") == (3, 1)
        assert await run_media(int, "ff", base=16) == 255
        with pytest.raises(ValueError, match="not an image"):
            await run_media(broken, share="s")

    asyncio.run(main())


def test_default_share_is_the_calling_task():
    # Callers that name no share (a socket's message parsing) get one per
    # task: one connection's reader does not wait behind another's.
    async def main() -> None:
        log, gate, started = Log(), threading.Event(), threading.Event()

        async def reader(jobs) -> None:
            for job in jobs:
                await run_media(job)

        a = asyncio.ensure_future(reader([gated_job(log, "a0", gate, started), lambda: log.add("a1")]))
        try:
            assert await event_set(started)
            await asyncio.wait_for(reader([lambda: log.add("b0")]), STUCK_S)
        finally:
            gate.set()
        await a
        assert log.events == ["a0>", "b0", "a0<", "a1"]

    asyncio.run(main())


def test_the_media_pool_keeps_two_low_priority_workers():
    assert workers.MEDIA_WORKERS == 2
    assert workers._pool._workers == workers.MEDIA_WORKERS
