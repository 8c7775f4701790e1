"""Waiting for a condition with a deadline, never for a fixed time.

A wait that runs out says what never happened and what it saw last, so a
failure reads as a sentence instead of a bare ``assert False``. The tests,
the benchmarks and :mod:`vidchat.devtools.vllm_servers` share these waits.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, Awaitable, Callable, TypeVar

T = TypeVar("T")


class NeverHappened(AssertionError):
    """A condition did not hold within its deadline."""


def _describe(what: str, within: float, last: Any) -> str:
    shown = repr(last)
    if len(shown) > 600:
        shown = shown[:600] + "…"
    return f"within {within:g} s, never: {what} (last seen: {shown})"


class _Tries:
    """The bookkeeping both waits share: the deadline and the last thing seen."""

    def __init__(self, within: float, what: str) -> None:
        self.within, self.what = within, what
        self.deadline = time.monotonic() + within
        self.last: Any = None

    def saw(self, value: Any) -> bool:
        self.last = value
        return bool(value) and not isinstance(value, Exception)

    def give_up_if_late(self) -> None:
        if time.monotonic() >= self.deadline:
            raise NeverHappened(_describe(self.what, self.within, self.last))


def eventually(predicate: Callable[[], T], within: float, what: str, interval: float = 0.05) -> T:
    """Call ``predicate`` until it returns something truthy and return that;
    raise :class:`NeverHappened` naming ``what`` once ``within`` seconds pass.
    An exception the predicate raises counts as "not yet" (a server still
    starting refuses connections) and is shown if the deadline passes; an
    AssertionError is final (the predicate says it can never come true)."""
    tries = _Tries(within, what)
    while True:
        try:
            value = predicate()
        except AssertionError:
            raise
        except Exception as exc:  # noqa: BLE001 - "not yet", reported at the deadline
            value = exc
        if tries.saw(value):
            return value
        tries.give_up_if_late()
        time.sleep(interval)


async def eventually_async(predicate: Callable[[], T | Awaitable[T]], within: float, what: str,
                           interval: float = 0.05) -> T:
    """:func:`eventually` for a running event loop: ``predicate`` may be a
    plain function or return an awaitable; the loop keeps running between
    tries. A blocking predicate (HTTP with urllib) belongs in
    ``asyncio.to_thread`` inside it."""
    tries = _Tries(within, what)
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
        except AssertionError:
            raise
        except Exception as exc:  # noqa: BLE001
            value = exc
        if tries.saw(value):
            return value
        tries.give_up_if_late()
        await asyncio.sleep(interval)
