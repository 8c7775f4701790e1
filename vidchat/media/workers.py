"""Worker threads for media work (decoding, filtering, storing frames).

They run at a lower scheduling priority than the rest of the process: on a
small machine the event loop (signalling, streamed tokens, every session's
messages) must get a core before a thread decoding somebody's 8 MB frame
does. Two workers bound the cores media decoding can take. Measured with
bench/looplag.py (4 WebRTC clients at 30 fps + two clients sending 8 MB
frames, 2 cores): loop lag p99 35.8 -> 27.3 ms, max 119 -> 49 ms against
asyncio's default executor.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
MEDIA_WORKERS = 2
MEDIA_NICENESS = 5


def _lower_priority() -> None:
    try:  # Linux schedules threads individually: this lowers only the worker
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), MEDIA_NICENESS)
    except (AttributeError, OSError) as exc:
        log.debug("media thread keeps normal priority: %s", exc)


_pool = ThreadPoolExecutor(max_workers=MEDIA_WORKERS, thread_name_prefix="vidchat-media",
                           initializer=_lower_priority)


async def run_media(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run media work off the event loop, on the low-priority media workers."""
    return await asyncio.get_running_loop().run_in_executor(_pool, functools.partial(fn, *args, **kwargs))


# Voice activity detection (Talk mode) has its own thread: each session's
# detector is stateful (one feeder at a time), it costs ~30 ms per second of
# audio, and a turn's end must not wait behind a large frame's decoding.
_vad_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vidchat-vad")


async def run_vad(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run voice activity detection off the event loop, on its own thread."""
    return await asyncio.get_running_loop().run_in_executor(_vad_pool, functools.partial(fn, *args, **kwargs))
