"""Keeping the native (C) heaps of the server and the engine core flat over
hours (the soak, docs/operations.md, "The soak"): a bounded oneDNN cache and
freed memory given back to the system. Apart from vidchat.engine.local so a
server whose engine is at --engine-url trims its own heap without importing
vLLM."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
from typing import Any, Callable, Iterable

log = logging.getLogger(__name__)

# oneDNN keeps every matmul primitive it builds, up to 1,024 by default.
# vLLM's CPU linears build one per layer shape and token count and keep their
# own 32 most recent per layer, so the global cache only holds shapes no layer
# uses any more: on live video (each prompt a new length) the engine core grew
# by hundreds of MB an hour filling it. :func:`bound_onednn_cache` bounds it
# to :data:`ONEDNN_PRIMITIVE_CACHE_CAPACITY` before vLLM spawns its engine
# core, which inherits the setting; an operator's own setting wins.
#
# Freed native memory goes back to the system. glibc's malloc keeps freed
# memory in its arenas for reuse and gives back to the system only what is
# free at the top of a heap. The server decodes frames on some threads and
# frees them on others, and vLLM's engine core on CPU allocates tensors of a
# new size for each prompt: both leave free holes in the middle of their
# heaps.
# ``malloc_trim(0)`` gives back every whole free page of every arena (Dask's
# documentation suggests it for the same reason). vidchat calls it every
# :data:`TRIM_EVERY_S` in the server, and in the engine core through vLLM's own
# hook for code that runs beside its model (``worker_extension_cls``:
# :class:`HeapTrimWorker`). Where the C library is not glibc it does nothing.

ONEDNN_PRIMITIVE_CACHE_CAPACITY = "16"

TRIM_EVERY_S = 60.0

WORKER_EXTENSION = f"{__name__}.HeapTrimWorker"


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_MALLOC_TRIM = _malloc_trim()


def bound_onednn_cache() -> None:
    """Bound oneDNN's global primitive cache for processes started from now on."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", ONEDNN_PRIMITIVE_CACHE_CAPACITY)


def trim_native_heap() -> bool:
    """Give this process's whole free malloc pages back to the system; True
    if any were (False also where the C library has no ``malloc_trim``)."""
    return bool(_MALLOC_TRIM(0)) if _MALLOC_TRIM is not None else False


class HeapTrimWorker:
    """Mixed into vLLM's worker class, which lives in the engine core."""

    def vidchat_trim_heap(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "trimmed": trim_native_heap()}


async def keep_trimming(engines: Callable[[], Iterable[Any]], every_s: float = TRIM_EVERY_S) -> None:
    """Trim this process, then each engine that can be (``trim_heap``), every
    ``every_s`` until cancelled. A failure is logged and tried again next time:
    an engine restarting or gone is no reason to stop."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await asyncio.to_thread(trim_native_heap)
        except Exception:
            log.debug("trimming the server's heap failed", exc_info=True)
        for engine in list(engines()):
            trim = getattr(engine, "trim_heap", None)
            if trim is None or getattr(engine, "is_dead", False):
                continue
            try:
                await trim()
            except Exception:
                log.debug("trimming an engine's heap failed", exc_info=True)
