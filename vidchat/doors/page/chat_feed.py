"""The page's chat, said from the session's one event stream
(Conversation.events()): the page sends only its question, and every
message of the chat (the question, "waiting", the answer as it streams, the
stopped mark, the record note, "what the model got" under it, Watch's
scene notices and Talk's spoken bubbles) is drawn here from what the
conversation says happened. A tab that comes back (a reload) starts from
the conversation's history and goes on from its events.

:class:`ChatTranscript` keeps the chat as messages, :class:`Redraws` says
when to draw it again; :func:`feed` is the long-lived page event that draws
it, and :func:`exchange_updates` the same for one question of an API
caller (/ask)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import gradio as gr

from vidchat import conversation
from vidchat.conversation import CANCELLED, Delta, Done, Queued, Started, answer_path, kept
from vidchat.conversation.session_events import (
    NO_FRAMES, REPLACED, SCENE, SPOKEN as SPOKEN_CAUSE, STOPPED as STOPPED_WHY, AnswerEvent, ChatCleared, Closed,
    Notice, QuestionAsked, QuestionRefused,
)
from vidchat.doors.page.chat_view import chat_messages
from vidchat.doors.page.rendered import rendered
from vidchat.doors.page.view import NO_TEXT, SPOKEN, STOPPED, both_html, both_labels, fold_message, frames_html, \
    notice, spoken_bubble, typing, waiting_text

# What a question before any frame should have done, as the page's user acts on it.
NO_FRAMES_HINT = "Wait a moment after **Start camera**, then ask again."

# Streamed text reaches the page at most this often (20 updates a second).
STREAM_UPDATE_S = 0.05
# The browser re-renders the whole message at each update, so a long answer's
# updates come further apart (up to this), its rendering work growing with its
# length rather than with its length squared: a 2,000-token answer at 20
# updates a second kept a tab on a loaded 2-core machine from taking a key.
# Now an update comes every 0.3 s at 2,000 characters and every second from
# 8,000 on: a page of text a second is still faster than anyone reads.
STREAM_MAX_UPDATE_S = 1.0
STREAM_CHARS_PER_S = 8_000
LOADING_EVERY_S = 1.0  # how often "the model is loading" is said again while a question waits for it


@dataclass
class _Second:
    """The second model's answer to one question (Both models), beside the first's."""

    labels: tuple[str, str]  # the two models, as the page names them
    answer: Any = None
    waiting: str | None = None
    done: Any = None  # its Done
    tail: list[dict[str, Any]] = field(default_factory=list)  # its notes and fold, after the first model's

    def text(self) -> str:
        return self.answer.reply.text if self.answer is not None else ""


@dataclass
class _Exchange:
    """One question's part of the chat, by its ticket."""

    ticket: int
    lead: list[dict[str, Any]]  # the scene notice and the question's bubble
    answer: Any = None  # vidchat.conversation.answer_path.Answer, from its Started
    waiting: str | None = None  # "waiting" or "loading" while it has no place yet
    tail: list[dict[str, Any]] = field(default_factory=list)  # the marks, notes and fold after its text
    ended: bool = False
    second: _Second | None = None  # Both models: the second model's answer, side by side with this one

    def messages(self, shows_typing: bool = False) -> list[dict[str, Any]]:
        out = list(self.lead)
        text = self.answer.reply.text if self.answer is not None else ""
        if self.second is not None:
            first = text or (self.waiting if self.waiting and not self.ended else "…" if not self.ended else "")
            second = self.second.text() or self.second.waiting or ("" if self.second.done else "…")
            out.append({"role": "assistant", "content": both_html(self.second.labels, first, second)})
            return out + self.tail + self.second.tail
        if self.waiting is not None and not self.ended:
            out.append(notice(self.waiting))
        elif not text and not self.ended and shows_typing:
            out.append(typing())
        elif text or (self.answer is not None and not self.ended):
            out.append({"role": "assistant", "content": text})
        return out + self.tail


class ChatTranscript:
    """The chat of one session as the page shows it, kept from its events."""

    def __init__(self, state: Any, entry: Any, messages: list[dict[str, Any]] | None = None,
                 shows_typing: bool = False) -> None:
        self.state, self.entry = state, entry
        # The page's own chat says "Thinking…" until the first token; an API
        # caller's stream (/ask, /watch, /talk) carries only what happened.
        self.shows_typing = shows_typing
        self.items: list[Any] = list(messages or [])  # plain messages and _Exchange, in order
        self.exchanges: dict[int, _Exchange] = {}
        self.shown: tuple[Any, str | None] | None = None  # the newest answer done: "what the model got"
        self.cleared = False
        self.generation = entry.generation  # the chat drawn (Clear starts another)

    def messages(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for item in self.items:
            out.extend(item.messages(self.shows_typing) if isinstance(item, _Exchange) else [item])
        return out

    def pending(self) -> bool:
        """A question waits for the model to load."""
        return any(not x.ended and x.answer is None for x in self.exchanges.values())

    def say_loading(self) -> bool:
        if self.state.ready or not self.pending():
            return False
        text = f"⏳ {self.state.readiness()[1]} Your question will be answered once it is ready."
        for x in self.exchanges.values():
            if not x.ended and x.answer is None:
                x.waiting = text
        return True

    async def apply(self, event: Any) -> bool:
        """Take one event; True when the chat (or what the model got) changed."""
        if isinstance(event, QuestionAsked):
            self._asked(event)
        elif isinstance(event, QuestionRefused):
            return self._refused(event)
        elif isinstance(event, AnswerEvent) and event.second:
            return await self._second(event)
        elif isinstance(event, AnswerEvent) and not event.side:
            return await self._answer(event)
        elif isinstance(event, ChatCleared):
            self.items.clear()
            self.exchanges.clear()
            self.shown, self.cleared = None, True
            self.generation += 1
        elif isinstance(event, Notice):
            self.items.append(notice(event.text))
        else:
            return False
        return True

    def _asked(self, event: QuestionAsked) -> None:
        lead: list[dict[str, Any]] = []
        if event.cause == SCENE:
            start = self.entry.session.timeline_start
            when = f" at {event.at - start:.1f} s" if event.at is not None and start is not None else ""
            lead.append(notice(f"👁 Scene changed{when}: asking the standing question."))
        if event.cause == SPOKEN_CAUSE:
            lead.append({"role": "user", "content": answer_path.spoken_label(event.spoken_seconds or 0.0),
                         "metadata": dict(SPOKEN)})
        else:
            lead.append({"role": "user", "content": event.question})
        exchange = _Exchange(event.ticket, lead)
        self.exchanges[event.ticket] = exchange
        self.items.append(exchange)

    def _refused(self, event: QuestionRefused) -> bool:
        exchange = self.exchanges.get(event.ticket)
        if exchange is None or exchange.ended:
            return False
        exchange.ended = True
        if event.why == STOPPED_WHY:
            exchange.tail.append(notice(STOPPED))
        elif event.why == NO_FRAMES:
            exchange.tail.append(notice(answer_path.NoFrames().said_with(NO_FRAMES_HINT)))
        elif event.why != REPLACED:  # replaced by a newer question: it simply was not answered
            exchange.tail.append(notice(f"⚠ {event.reason}"))
        return True

    def _exchange_of(self, event: AnswerEvent) -> _Exchange | None:
        """The question an answer event is of; one asked before this chat was
        drawn (a reload mid-answer) joins it at its first event."""
        exchange = self.exchanges.get(event.ticket)
        if exchange is not None or self.cleared:
            return exchange
        run = self.entry._chat_run
        if run is None or run.answer.ticket != event.ticket:
            return None
        exchange = _Exchange(event.ticket, [{"role": "user", "content": answer_path.spoken_text(run.answer)}],
                             answer=run.answer)
        self.exchanges[event.ticket] = exchange
        self.items.append(exchange)
        return exchange

    async def _answer(self, event: AnswerEvent) -> bool:
        exchange = self._exchange_of(event)
        if exchange is None or exchange.ended:
            return False
        inner = event.event
        if isinstance(inner, Queued):
            exchange.waiting = waiting_text(inner.ahead)
        elif isinstance(inner, Started):
            exchange.waiting = None
            exchange.answer = inner.answer
            if inner.answer.spoken is not None:  # its bubble plays exactly the audio the model got
                exchange.lead[-1] = spoken_bubble(inner.answer, kept.remember(self.entry, inner.answer))
        elif isinstance(inner, Done):
            await self._done(exchange, inner)
        return not isinstance(inner, Delta) or exchange.answer is not None

    async def _second(self, event: AnswerEvent) -> bool:
        """The second model's answer to a question of the chat (Both models)."""
        exchange = self.exchanges.get(event.ticket)
        if exchange is None:
            return False
        if exchange.second is None:
            exchange.second = _Second(both_labels(self.state))
        second, inner = exchange.second, event.event
        if isinstance(inner, Queued):
            second.waiting = waiting_text(inner.ahead)
        elif isinstance(inner, Started):
            second.waiting, second.answer = None, inner.answer
        elif isinstance(inner, Done):
            second.waiting, second.answer, second.done = None, inner.answer, inner
            if inner.error:
                second.tail.append(notice(f"⚠ Second model: {inner.error}"))
            if inner.answer_id is not None and inner.started:
                fold = await asyncio.to_thread(fold_message, self.entry, inner.answer, inner.answer_id)
                fold["metadata"] = {**fold["metadata"], "title": "Second model · " + fold["metadata"]["title"]}
                second.tail.append(fold)
        return True

    async def _done(self, exchange: _Exchange, done: Done) -> None:
        """The answer's last state: its text (or why there is none), the
        recording's note, and what the model got, folded under it. Thumbnails
        are encoded after the answer, so they never delay its first token,
        and in a worker thread, so they never stall the event loop."""
        exchange.ended, exchange.waiting = True, None
        exchange.answer = answer = done.answer
        tail = exchange.tail
        if not done.text:
            tail.append(notice(f"⚠ {done.error}" if done.error else STOPPED if done.status == CANCELLED
                               else NO_TEXT))
        elif done.error is not None:
            tail.append(notice(f"⚠ {done.error}"))
        elif done.status == CANCELLED:  # Stop, Clear, a newer question or barge-in: the text so far, then the mark
            tail.append(notice(STOPPED))
        if done.record_error:
            tail.append(notice(done.record_error if done.record_error.startswith("Not recorded")
                               else f"⚠ {done.record_error}"))
        if done.answer_id is not None and done.started:
            tail.append(await asyncio.to_thread(fold_message, self.entry, answer, done.answer_id))
            self.shown = (answer, done.answer_id)

    async def views(self) -> tuple[Any, Any]:
        """What the model got for the newest answer, and its reply's details."""
        if self.shown is None:
            return gr.skip(), (None if self.cleared else gr.skip())
        answer, answer_id = self.shown
        html = await asyncio.to_thread(frames_html, answer, answer_id, answer_id in self.entry.bundles)
        return html, answer.summary()


def _stream_every(transcript: ChatTranscript) -> float:
    """How far apart a streaming answer's updates go (STREAM_CHARS_PER_S)."""
    streaming = [x for x in transcript.exchanges.values() if not x.ended and x.answer is not None]
    longest = max((len(x.answer.reply.text) for x in streaming), default=0)
    return min(STREAM_MAX_UPDATE_S, STREAM_UPDATE_S + longest / STREAM_CHARS_PER_S)


class Redraws:
    """When to draw a transcript again, from a subscription to the session's
    events: :meth:`next` returns once the chat changed enough to be drawn
    (streamed text at most every _stream_every), True when what the model
    got changed too, and None at the session's end or once ``until()``.
    (A waiter, not a generator: the tokens pass through no layer of it.)"""

    def __init__(self, transcript: ChatTranscript, subscription: Any,
                 until: Callable[[], bool] = lambda: False) -> None:
        self.transcript, self.subscription, self.until = transcript, subscription, until
        self._drawn_at = 0.0
        self._behind = False  # text came that was not drawn yet
        self._closed = False

    async def next(self) -> bool | None:
        transcript, subscription = self.transcript, self.subscription
        while not self._closed and not self.until():
            wait = LOADING_EVERY_S
            if self._behind:
                wait = max(0.0, self._drawn_at + _stream_every(transcript) - time.monotonic())
            event = await subscription.get(timeout=wait)
            if event is None:
                if self._behind or transcript.say_loading():
                    return self._drawn(False)
                continue
            burst = [event, *subscription.pending()]
            changed, done = False, False
            for one in burst:
                changed = await transcript.apply(one) or changed
                done = done or (isinstance(one, AnswerEvent) and isinstance(one.event, Done)) \
                    or isinstance(one, (ChatCleared, QuestionRefused))
                self._closed = self._closed or isinstance(one, Closed)
            only_text = changed and not done and all(
                isinstance(one, AnswerEvent) and isinstance(one.event, Delta) for one in burst)
            if only_text and time.monotonic() - self._drawn_at < _stream_every(transcript):
                self._behind = True
            elif changed or self._behind:
                return self._drawn(done)
        return None

    def _drawn(self, views_changed: bool) -> bool:
        self._behind = False
        self._drawn_at = time.monotonic()
        return views_changed


async def feed(state: Any, entry: Any, reask_list: Callable[[], Any] = lambda: gr.skip()) -> AsyncIterator[tuple]:
    """The tab's chat for the life of its session: (chat, what the model got,
    details, the re-ask list), drawn first from the conversation's history,
    then again at each change the session's events say. ``reask_list``: the
    re-ask list's update as the chat's answers change (gr.skip() when they did not)."""
    marks = rendered(entry)
    with entry.event_hub.subscribe() as subscription:
        messages = await asyncio.to_thread(chat_messages, state, entry)
        transcript = ChatTranscript(state, entry, messages, shows_typing=True)
        last = next(((answer_id, answer) for answer_id, answer in kept.chat_answers(entry) if answer.reply.text),
                    None)
        if last is not None:
            transcript.shown = (last[1], last[0])
        yield (transcript.messages(), *(await transcript.views()), reask_list())
        marks.shown(transcript)
        redraws = Redraws(transcript, subscription)
        while (views_changed := await redraws.next()) is not None:
            views = await transcript.views() if views_changed else (gr.skip(), gr.skip())
            yield (transcript.messages(), *views, reask_list() if views_changed else gr.skip())
            marks.shown(transcript)


class _OneQuestion:
    """A subscription narrowed to one question's events (an API caller's /ask)."""

    def __init__(self, subscription: Any, ticket: int) -> None:
        self.subscription, self.ticket = subscription, ticket

    def _mine(self, event: Any) -> bool:
        return getattr(event, "ticket", self.ticket) == self.ticket and not getattr(event, "side", False) \
            and not isinstance(event, (Notice, ChatCleared))

    async def get(self, timeout: float | None = None) -> Any:
        while True:
            event = await self.subscription.get(timeout)
            if event is None or self._mine(event):
                return event

    def pending(self) -> list[Any]:
        return [e for e in self.subscription.pending() if self._mine(e)]


async def exchange_updates(state: Any, entry: Any, before: list[dict[str, Any]], ask: Callable[[], int]) \
        -> AsyncIterator[tuple]:
    """One question's part of the chat after ``before`` (an API caller's
    chat), from asking it (``ask`` returns its ticket) to its outcome."""
    with entry.event_hub.subscribe() as subscription:
        transcript = ChatTranscript(state, entry, before)
        ticket = ask()
        mine = transcript.exchanges
        redraws = Redraws(transcript, _OneQuestion(subscription, ticket),
                          until=lambda: ticket in mine and mine[ticket].ended)
        yield transcript.messages(), gr.skip(), gr.skip()
        while (views_changed := await redraws.next()) is not None:
            yield (transcript.messages(), *((await transcript.views()) if views_changed else (gr.skip(), gr.skip())))
