"""Watch mode: a standing question asked by itself whenever the scene changes.

The filter already measures how much of the picture changed for every frame
it keeps; a kept frame where most of it changed is a scene change
(vidchat.media.frame_buffer.SCENE_CHANGE_SHARE). This module turns the session's count
of those into "ask now" moments, at most one every ``every_s`` seconds; a
change during the pause fires when the pause ends (several coalesce into one).
It knows nothing about doors: the page's watch event and ``vidchat.qa.replay
--watch`` both drive their questions from it.
"""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Callable

from vidchat.media.session import Session

DEFAULT_EVERY_S = 10.0
POLL_S = 0.25


class SceneWatch:
    """Tells when a session's scene changed, rate-limited."""

    def __init__(self, session: Session, every_s: float = DEFAULT_EVERY_S) -> None:
        if not every_s > 0:
            raise ValueError(f"watch interval must be a positive number of seconds, got {every_s!r}")
        self.session = session
        self.every_s = every_s
        self._seen = session.scene_changes  # changes before watching began do not count
        self._last_fire: float | None = None

    def due(self, now: float) -> bool:
        """Whether to ask now (`now` on the clock the caller paces with)."""
        if self.session.scene_changes == self._seen:
            return False
        if self._last_fire is not None and now - self._last_fire < self.every_s:
            return False
        self._seen = self.session.scene_changes
        self._last_fire = now
        return True

    async def changes(self, stopped: Callable[[], bool] | None = None) -> AsyncIterator[float | None]:
        """Live: yield the timeline time of each (rate-limited) scene change,
        until ``stopped()`` says watching was switched off (checked at each
        poll, so a still scene does not keep a switched-off watch alive)."""
        while stopped is None or not stopped():
            if self.due(time.monotonic()):
                yield self.session.last_scene_change_t
            await asyncio.sleep(POLL_S)
