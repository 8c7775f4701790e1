"""What a tab's chat has shown (the chat feed marks it as it draws,
vidchat.doors.page.chat_feed), so the page's own events end only once their
effect is on the page: a question's outcome, a Clear."""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any


class Rendered:
    """What a tab's chat has shown, by question ticket and by chat."""

    def __init__(self) -> None:
        self._shown: dict[int, asyncio.Event] = {}
        self.chat_drawn = -1  # the newest chat (Conversation.generation) drawn
        self._drawn = asyncio.Event()

    def event(self, ticket: int) -> asyncio.Event:
        return self._shown.setdefault(ticket, asyncio.Event())

    def shown(self, transcript: Any) -> None:
        for ticket, exchange in transcript.exchanges.items():
            if exchange.ended:
                self.event(ticket).set()
        while len(self._shown) > 64:
            self._shown.pop(next(iter(self._shown)))
        self.chat_drawn = transcript.generation
        drawn, self._drawn = self._drawn, asyncio.Event()
        drawn.set()

    async def cleared(self, entry: Any, within: float = 2.0) -> None:
        """Return once the tab's chat shows the conversation's newest chat
        (or ``within`` seconds passed: a tab without its chat feed goes on)."""
        deadline = time.monotonic() + within
        while self.chat_drawn < entry.generation and time.monotonic() < deadline:
            try:
                await asyncio.wait_for(self._drawn.wait(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                return


_RENDERED: "weakref.WeakKeyDictionary[Any, Rendered]" = weakref.WeakKeyDictionary()


def rendered(entry: Any) -> Rendered:
    """The session's marks (keyed by its event hub: one per session, and hashable where the entry is not)."""
    return _RENDERED.setdefault(entry.event_hub, Rendered())
