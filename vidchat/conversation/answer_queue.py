"""A fair queue in front of the engine: at most --max-concurrent-answers
answers generate at once, across all sessions and both doors.

Questions beyond the cap wait first come, first served, and are told how many
questions are ahead of them whenever that changes. A session never holds more
than one place, since its new question replaces its old one
(vidchat.conversation.answer_path.ask), so first-come order is also fair between sessions.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any, Awaitable, Callable

log = logging.getLogger(__name__)

OnWait = Callable[[int], Awaitable[None]]  # called with the number of questions ahead


class Abandoned(Exception):
    """The question left the queue before its turn (replaced, stopped, session closed)."""


class _Waiter:
    def __init__(self) -> None:
        self.granted = False
        self.changed = asyncio.Event()


class Slot:
    """One answer's permission to generate; release it exactly once."""

    def __init__(self, queue: "AnswerQueue | None") -> None:
        self._queue = queue

    def release(self) -> None:
        queue, self._queue = self._queue, None
        if queue is not None:
            queue._release()


class AnswerQueue:
    def __init__(self, limit: int = 0) -> None:
        self.limit = limit  # 0: no cap
        self.running = 0
        # Every question that asked for a place since the start, whatever came
        # of it: how a test sees that a refused call ran nothing.
        self.asked = 0
        self._waiting: collections.deque[_Waiter] = collections.deque()
        # Called with every answer (vidchat.conversation.answer_path.Answer) about to ask for its
        # turn, before it may generate (vidchat.conversation.prewarm gives way to it).
        self.arrival_hooks: list[Callable[[Any], Awaitable[None]]] = []

    async def announce(self, answer: Any) -> None:
        for hook in list(self.arrival_hooks):
            try:
                await hook(answer)
            except Exception:
                log.exception("answer arrival hook failed")

    def snapshot(self) -> dict[str, int]:
        return {"limit": self.limit, "running": self.running, "waiting": len(self._waiting)}

    async def acquire(self, on_wait: OnWait | None = None, abandon: asyncio.Event | None = None) -> Slot:
        """Wait for a turn. Raises Abandoned when `abandon` is set first."""
        self.asked += 1
        if self.limit <= 0:
            return Slot(None)
        if self.running < self.limit and not self._waiting:
            self.running += 1
            return Slot(self)
        waiter = _Waiter()
        self._waiting.append(waiter)
        told = None
        try:
            while not waiter.granted:
                if abandon is not None and abandon.is_set():
                    raise Abandoned()
                ahead = self._waiting.index(waiter)
                if ahead != told and on_wait is not None:
                    told = ahead
                    await on_wait(ahead)
                    continue  # the queue may have moved while we were telling
                waiter.changed.clear()
                waits = [asyncio.ensure_future(waiter.changed.wait())]
                if abandon is not None:
                    waits.append(asyncio.ensure_future(abandon.wait()))
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
        except BaseException:
            if waiter.granted:
                self._release()  # our turn came as we left: pass it on
            else:
                self._waiting.remove(waiter)
                self._tell_all()
            raise
        return Slot(self)

    def _release(self) -> None:
        self.running -= 1
        while self._waiting and self.running < self.limit:
            waiter = self._waiting.popleft()
            waiter.granted = True
            self.running += 1
            waiter.changed.set()
        self._tell_all()

    def _tell_all(self) -> None:
        for waiter in self._waiting:
            waiter.changed.set()
