"""Worker threads for media work (decoding, filtering, storing frames).

They run at a lower scheduling priority than the rest of the process: on a
small machine the event loop (signalling, streamed tokens, every session's
messages) must get a core before a thread decoding somebody's 8 MB frame
does. Two workers bound the cores media decoding can take. Measured with
bench/looplag.py (4 WebRTC clients at 30 fps + two clients sending 8 MB
frames, 2 cores): loop lag p99 35.8 -> 27.3 ms, max 119 -> 49 ms against
asyncio's default executor.

Fair shares. Every job belongs to a *share* (a session's id; by default the
calling asyncio task, i.e. one connection's reader or one track's consumer).
A share has at most one job running at a time, and the shares with work
waiting take turns (round robin). A first-come queue would let one client
sending 16 MP PNGs fast keep both workers busy with its backlog while every
other session's frames, WebRTC's included, waited behind it; with turns, a
session waits for at most one job of each other busy share.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Hashable, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
MEDIA_WORKERS = 2
MEDIA_NICENESS = 5


def _lower_priority() -> None:
    try:  # Linux schedules threads individually: this lowers only the worker
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), MEDIA_NICENESS)
    except (AttributeError, OSError) as exc:
        log.debug("media thread keeps normal priority: %s", exc)


class FairWorkers:
    """A fixed set of threads that run each share's jobs in order, one at a
    time per share, taking the shares with waiting jobs in turn."""

    def __init__(self, workers: int, name: str, initializer: Callable[[], None] | None = None) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers!r}")
        self._workers = workers
        self._name = name
        self._initializer = initializer
        self._cond = threading.Condition()
        # Jobs of any result type wait together: each pairs a Future with the
        # callable whose result it carries (Any: one T per job, not per queue).
        self._pending: dict[Hashable, collections.deque[tuple[Future[Any], Callable[[], Any]]]] = {}
        self._turns: collections.deque[Hashable] = collections.deque()  # shares with a job waiting, none running
        self._threads: list[threading.Thread] = []

    def submit(self, share: Hashable, fn: Callable[[], T]) -> Future[T]:
        """Queue ``fn`` for ``share``; its Future (cancel it to skip a job not yet started)."""
        future: Future[T] = Future()
        with self._cond:
            if not self._threads:
                self._start()
            queue = self._pending.get(share)
            if queue is None:
                # A share with nothing queued is not running either (it leaves
                # _pending only once its last job ended): its turn starts now.
                queue = self._pending[share] = collections.deque()
                self._turns.append(share)
            queue.append((future, fn))
            self._cond.notify()
        return future

    def _start(self) -> None:
        # Started on first use, so importing the module costs no threads.
        for i in range(self._workers):
            thread = threading.Thread(target=self._work, name=f"{self._name}_{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _next(self) -> tuple[Hashable, Future[Any], Callable[[], Any]]:
        with self._cond:
            while not self._turns:
                self._cond.wait()
            share = self._turns.popleft()
            future, fn = self._pending[share].popleft()
            return share, future, fn

    def _done(self, share: Hashable) -> None:
        with self._cond:
            if self._pending[share]:
                self._turns.append(share)  # to the back: every other waiting share goes first
                self._cond.notify()
            else:
                del self._pending[share]

    def _work(self) -> None:
        if self._initializer is not None:
            self._initializer()
        while True:
            share, future, fn = self._next()
            try:
                if future.set_running_or_notify_cancel():  # False: cancelled while it waited
                    try:
                        result = fn()
                    except BaseException as exc:  # the caller's to handle, never the worker's end
                        future.set_exception(exc)
                    else:
                        future.set_result(result)
            finally:
                self._done(share)


_pool = FairWorkers(MEDIA_WORKERS, "vidchat-media", initializer=_lower_priority)
_NO_TASK = object()  # the share of callers outside any task (a loop driven by hand)


async def run_media(fn: Callable[..., T], *args: Any, share: Hashable | None = None, **kwargs: Any) -> T:
    """Run media work off the event loop, on the low-priority media workers,
    in ``share``'s turn: pass the session's id where the work is a session's;
    by default the share is the calling task."""
    if share is None:
        share = asyncio.current_task() or _NO_TASK
    return await asyncio.wrap_future(_pool.submit(share, functools.partial(fn, *args, **kwargs)))


# Voice activity detection (Talk mode) has its own thread: each session's
# detector is stateful (one feeder at a time), it costs ~30 ms per second of
# audio, and a turn's end must not wait behind a large frame's decoding.
_vad_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vidchat-vad")


async def run_vad(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run voice activity detection off the event loop, on its own thread."""
    return await asyncio.get_running_loop().run_in_executor(_vad_pool, functools.partial(fn, *args, **kwargs))
