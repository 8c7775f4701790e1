"""A session's chat as the model has it, kept by the conversation on the
server for every door: each exchange (the question as later turns carry it,
and the answer's text) appended when its answer is done, cleared by Clear
chat, bounded by one cutting rule. Doors no longer send it back with each
question; warm-ups prepare the next question's prompt from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from vidchat.engine import Turn

# What a session keeps of its chat (whole exchanges); what a question sends is
# trimmed further to the model's context (vidchat.engine.ModelEngine.fit_history).
MAX_HISTORY_TURNS = 400


@dataclass(frozen=True)
class Exchange:
    """One question and its answer, under the answer's id (/inputs/<id>/)."""

    answer_id: str | None
    question: str
    answer: str
    stopped: bool = False  # cut short (Stop, a newer question, barge-in): the text so far

    def turns(self) -> tuple[Turn, ...]:
        return Turn("user", self.question), Turn("assistant", self.answer)


@dataclass(frozen=True)
class Note(Exchange):
    """A system message a client put in the chat (the Realtime door's
    history items): one system turn, its text as ``question``."""

    def turns(self) -> tuple[Turn, ...]:
        return (Turn("system", self.question),)


class ChatHistory:
    def __init__(self, max_turns: int = MAX_HISTORY_TURNS) -> None:
        self.max_turns = max_turns
        self.exchanges: list[Exchange] = []

    def __len__(self) -> int:
        return len(self.exchanges)

    def turns(self) -> tuple[Turn, ...]:
        """The chat as a question carries it, oldest first."""
        return tuple(turn for exchange in self.exchanges for turn in exchange.turns())

    def add(self, answer_id: str | None, question: str, answer: str, stopped: bool = False) -> None:
        self._append(Exchange(answer_id, question, answer, stopped))

    def add_note(self, text: str) -> None:
        """A system message in the chat, where it was said (vidchat.doors.realtime)."""
        self._append(Note(None, text, ""))

    def _append(self, exchange: Exchange) -> None:
        self.exchanges.append(exchange)
        if 2 * len(self.exchanges) > self.max_turns:
            # A quarter at a time, not an exchange every answer: what is sent
            # keeps its cached prefix between cuts (vidchat.engine.history_cut).
            keep = self.max_turns * 3 // 8
            del self.exchanges[:len(self.exchanges) - keep]

    def clear(self) -> None:
        self.exchanges.clear()
