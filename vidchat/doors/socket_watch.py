"""A socket session's watch (``session.update {"watch": …}``): a standing
question asked at scene changes, its answers sent unasked as ordinary
``response.start`` … ``response.text.done`` with ``"watch": true``.

When to ask is the conversation's (scene_changes, never cutting an answer
short); this only switches it on and off for the connection.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from vidchat.conversation.modes import scene_changes
from vidchat.conversation.watch import SceneWatch
from vidchat.doors.protocol_config import ConfigError, WatchRequest
from vidchat.doors.socket_answers import Client, SocketAnswers

log = logging.getLogger(__name__)

WATCH_NEEDS_EVS = "watch needs evs_enabled: the frame filter is what sees scene changes"


class SocketWatch:
    """The standing question of one connection and the task asking it."""

    def __init__(self, conn: Client, answers: SocketAnswers) -> None:
        self.conn, self.answers = conn, answers
        self.request: WatchRequest | None = None
        self._task: asyncio.Task | None = None

    def describe(self) -> dict[str, Any] | None:
        return self.request.describe() if self.request is not None else None

    async def set(self, watch: WatchRequest | None) -> None:
        """Start, change or stop asking the standing question at scene
        changes. A watched answer still streaming ends first (cancelled, its
        response.text.done sent), as unticking Watch on the page ends it."""
        session = self.conn.entry.session
        if watch is not None and not session.settings.evs_enabled:
            raise ConfigError(WATCH_NEEDS_EVS)
        self.request = watch
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
            await self.answers.end_watched()
        if watch is not None:
            watcher = SceneWatch(session, watch.every_s)
            self._task = asyncio.create_task(self._watching(watcher, watch), name=f"watch-ws-{session.id[:6]}")

    def stop(self) -> None:
        """No more watched questions (the session ends)."""
        self.request = None
        if self._task is not None:
            self._task.cancel()

    async def _watching(self, watcher: SceneWatch, watch: WatchRequest) -> None:
        """Ask the standing question at each (rate-limited) scene change. An
        answer already streaming (typed, spoken or watched) is never cut
        short by a scene change: the change is asked about once it ends."""
        conn = self.conn
        try:
            talking = conn.entry
            async for _ in scene_changes(talking, watcher, lambda: self.request is not watch or self.answers.closed):
                await asyncio.shield(self.answers.ask_logged(watch.question, watched=True))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("ws %s: watching failed", conn.peer)
