"""vidchat.engine.local: the server and the engine core give their free
native memory back every minute (docs/operations.md, "The soak"). The engine
core's side runs through real vLLM in tests/test_engine.py."""

from __future__ import annotations

import asyncio

import pytest

from vidchat.engine.native_heap import HeapTrimWorker, keep_trimming, trim_native_heap

pytestmark = pytest.mark.unit


class FakeEngine:
    def __init__(self, name: str, calls: list[str], *, fails: bool = False, dead: bool = False):
        self.name, self.calls, self.fails, self.is_dead = name, calls, fails, dead

    async def trim_heap(self) -> list[dict]:
        self.calls.append(self.name)
        if self.fails:
            raise RuntimeError("engine core gone")
        return []


def test_this_process_can_be_trimmed_on_glibc():
    # glibc (this project's Linux) has malloc_trim; the answer is whether pages went back.
    assert isinstance(trim_native_heap(), bool)
    assert HeapTrimWorker().vidchat_trim_heap()["pid"] > 0


async def test_every_live_engine_is_trimmed_each_round_and_a_failing_one_stops_nothing():
    calls: list[str] = []
    engines = (FakeEngine("failing", calls, fails=True), None,
               FakeEngine("dead", calls, dead=True), FakeEngine("ok", calls))
    task = asyncio.create_task(keep_trimming(lambda: engines, every_s=0.0))
    try:
        while len(calls) < 6:  # three rounds
            await asyncio.sleep(0)
    finally:
        task.cancel()
    assert calls[:6] == ["failing", "ok"] * 3
