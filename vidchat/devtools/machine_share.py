"""The machine to one test for a moment, while the other pytest workers wait.

`make test` runs two xdist workers on a 2-core machine. A few steps cannot
be made independent of the other worker's load: a browser tab streaming a
long answer on a starved machine took 13 s to send its next key press, and
the 2,000-token answer it was meant to cut short ended on its own first
(tests/test_page.py). Such a step runs inside :meth:`MachineShare.alone`:
it waits until the other workers' running tests end and holds back their
next ones until it is done. Everything else runs side by side.

Every test holds the shared side of a lock file (per run: xdist's run id)
from its set-up to its teardown; ``alone`` turns its own test's hold into
the exclusive side. A second file, a turnstile, gives the exclusive side
precedence: a worker waiting for it holds the turnstile, which each test
passes through before taking its shared hold, so the other worker's next
test cannot slip in ahead of it. Without xdist nothing is locked.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import tempfile
from pathlib import Path
from typing import AsyncIterator, BinaryIO


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
