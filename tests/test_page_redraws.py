"""When the page's chat is drawn again (vidchat.doors.page.chat.Redraws),
fed a session's events the way a reader that woke late finds them: all at
once. An answer's first words get a draw of their own, so a reply never
appears whole when it was streamed."""

from __future__ import annotations

import asyncio

import pytest

from vidchat.conversation.events import AnswerEvent, QuestionAsked
from vidchat.conversation.runs import Delta
from vidchat.doors.page.chat import Redraws

pytestmark = pytest.mark.unit


class Transcript:
    """What Redraws uses of a ChatTranscript: the text as drawn."""

    def __init__(self) -> None:
        self.text = ""
        self.exchanges: dict = {}

    async def apply(self, event: object) -> bool:
        if isinstance(event, QuestionAsked):
            self.text += f"[{event.question}] "
            return True
        if isinstance(event, AnswerEvent) and isinstance(event.event, Delta):
            self.text += event.event.text
            return True
        return False

    def say_loading(self) -> bool:
        return False


class Burst:
    """A subscription whose events all wait already; then it stays quiet."""

    def __init__(self, events: list) -> None:
        self.events = list(events)

    async def get(self, timeout: float | None = None):
        if self.events:
            return self.events.pop(0)
        await asyncio.sleep(0)
        return None

    def pending(self) -> list:
        taken, self.events = self.events, []
        return taken


def deltas(ticket: int, *texts: str, second: bool = False) -> list:
    return [AnswerEvent(Delta(t), ticket=ticket, second=second) for t in texts]


async def draws_of(events: list, count: int) -> list[str]:
    transcript = Transcript()
    redraws = Redraws(transcript, Burst(events))
    drawn = []
    for _ in range(count):
        assert await redraws.next() is not None
        drawn.append(transcript.text)
    return drawn


async def test_a_reply_found_whole_is_drawn_at_its_first_words_then_whole():
    drawn = await draws_of(deltas(1, "The ", "wall ", "is red."), 2)
    assert drawn == ["The ", "The wall is red."]


async def test_each_answer_of_a_burst_gets_its_first_words_drawn_once():
    """Both models' answers to one question (the chat's and the second's):
    each one's first text is drawn; later text is drawn as before."""
    events = deltas(1, "A", "B") + deltas(1, "x", second=True) + deltas(1, "C") + deltas(1, "y", second=True)
    drawn = await draws_of(events, 3)
    assert drawn == ["A", "ABx", "ABxCy"]


async def test_text_arriving_later_is_not_cut_again():
    transcript = Transcript()
    source = Burst(deltas(1, "one "))
    redraws = Redraws(transcript, source)
    assert await redraws.next() is not None and transcript.text == "one "
    source.events.extend(deltas(1, "two ", "three"))
    assert await redraws.next() is not None and transcript.text == "one two three"


async def test_a_question_found_with_its_answer_is_drawn_asked_first():
    """The question and "Thinking…" get a draw before the answer's first words."""
    drawn = await draws_of([QuestionAsked(1, "What?"), *deltas(1, "It ", "is.")], 3)
    assert drawn == ["[What?] ", "[What?] It ", "[What?] It is."]
