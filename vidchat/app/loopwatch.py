"""Event-loop lag, measured from inside the server.

A task asks to wake every ``interval_s`` and records how late it woke: that
delay is how long something else held the event loop (a decode, a JSON
parse, a template render), i.e. how long every other session's signalling,
frames and streamed tokens waited. ``/api/health`` reports it, and
``bench/looplag.py`` reads it under load.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Callable


class LoopWatch:
    def __init__(self, interval_s: float = 0.01, keep: int = 6_000,
                 observe: Callable[[float], None] | None = None) -> None:
        self.interval_s = interval_s
        self._observe = observe  # each lag in seconds (the /metrics histogram)
        self._lags_ms: collections.deque[float] = collections.deque(maxlen=keep)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="loopwatch")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            due = time.perf_counter() + self.interval_s
            await asyncio.sleep(self.interval_s)
            lag_s = max(0.0, time.perf_counter() - due)
            self._lags_ms.append(lag_s * 1000)
            if self._observe is not None:
                self._observe(lag_s)

    def reset(self) -> None:
        """Start a new measurement window (the benchmark calls this before loading the server)."""
        self._lags_ms.clear()

    def snapshot(self) -> dict[str, Any]:
        lags = sorted(self._lags_ms)
        if not lags:
            return {"samples": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}

        def pick(q: float) -> float:
            return round(lags[min(len(lags) - 1, int(q * (len(lags) - 1)))], 2)

        return {"samples": len(lags), "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": round(lags[-1], 2)}
