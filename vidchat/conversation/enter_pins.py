"""The samples taken as Enter was pressed (vidchat.conversation.prewarm
``question_now``): one per session, each for the question on its way."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

# A sample taken as Enter is pressed (question_now) serves the question that
# reaches the server within this long; later, the question samples anew.
PIN_S = 2.0


@dataclass
class Pin:
    """The sample taken as Enter was pressed, for the question on its way."""

    at: float  # time.monotonic()
    sample: Any
    settings: Any  # the session's settings it was taken with
    turn: int  # the conversation's turn then (Conversation.turn): a later question makes the pin stale
    warmed: bool = False


class EnterPins:
    """The samples taken as Enter was pressed, one per session, each for the question on its way."""

    def __init__(self) -> None:
        self._pins: dict[str, Pin] = {}
        self._taking: set[str] = set()  # sessions whose Enter sample is being taken

    def begin(self, entry: Any, now: float) -> bool:
        """Whether an Enter report of this session may take a pin (then call
        :meth:`end` once its sample is taken): not while a report's sample is
        being taken, nor while the session's pin waits for its question."""
        sid = entry.session.id
        if sid in self._taking or self.waiting(entry, now):
            return False
        self._taking.add(sid)  # at once: reports posted together, each awaiting its sample, pass one by one
        return True

    def end(self, session_id: str) -> None:
        self._taking.discard(session_id)

    def put(self, session_id: str, pin: Pin) -> None:
        self._pins[session_id] = pin

    def get(self, session_id: str) -> Pin | None:
        return self._pins.get(session_id)

    def take(self, entry: Any) -> Pin | None:
        """The pin for this question (None when there is none, it is older
        than PIN_S, or the question came with other sampling settings): used once."""
        pin = self._pins.pop(entry.session.id, None)
        if (pin is None or time.monotonic() - pin.at > PIN_S or pin.settings != entry.session.settings
                or pin.turn != entry.turn):
            return None
        return pin

    def waiting(self, entry: Any, now: float) -> bool:
        """A fresh pin of this session waits for its question (warmed or not):
        another Enter before that question arrives takes no new one."""
        pin = self._pins.get(entry.session.id)
        return pin is not None and now - pin.at < PIN_S and pin.turn == entry.turn

    def unwarmed(self, entry: Any, now: float) -> bool:
        """A fresh pin of this session's coming question, not warmed yet: warmed before anything else."""
        pin = self._pins.get(entry.session.id)
        return pin is not None and not pin.warmed and self.waiting(entry, now)

    def prune(self, live: dict[str, Any], now: float) -> None:
        """Forget the pins of ended sessions, stale ones, and those a question overtook."""
        for sid in [s for s in self._pins if s not in live or now - self._pins[s].at > PIN_S
                    or self._pins[s].turn != live[s].turn]:
            del self._pins[sid]
