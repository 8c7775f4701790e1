"""A session's conversation with the model: the one owner of what a session
does with it, for every door (the page, the socket protocol, replay).

A door asks (:meth:`Conversation.ask` for the chat, :meth:`Conversation.reask`
beside it) and gets an :class:`AnswerRun`: a typed stream of events that
mirrors a realtime API's response — :class:`Queued` while it waits for a
place, :class:`Started`, a :class:`Delta` per piece of text, and always one
:class:`Done` last, with its status (``completed``, ``cancelled`` or
``failed``). The run itself waits for its place, streams, aborts the vLLM
request when nobody reads on, gives its place back, remembers the answer's
inputs and records it when asked to. A door only turns those events into
its wire format.

The one preemption rule: a newer question in the chat (any door, any kind:
typed, spoken, watched) cancels the running answer, and the newer run starts
only once the older run's Done has been delivered (or a short grace has
passed, for a reader that stopped reading). A re-ask runs beside the chat
(its own slot): it never cancels the chat's answer, is never kept among the
chat's answers, and so is never read aloud nor offered as chat history.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Protocol, Sequence, Union

from vidchat.conversation import chat, kept
from vidchat.conversation.answer_queue import Abandoned
from vidchat.conversation.chat import Answer, AnswerOptions
from vidchat.conversation.session import Sample
from vidchat.conversation.sessions import Entry
from vidchat.conversation.watch import SceneWatch
from vidchat.engine import ChatEngine, EngineError, Turn
from vidchat.media.vad import Utterance

log = logging.getLogger(__name__)

# How long a newer question waits for the replaced answer's Done to be
# delivered: long enough for any reader that still reads (the abort takes
# effect at vLLM's next step), short enough that a reader that went away
# without closing its run never holds the chat.
PREEMPT_GRACE_S = 5.0

COMPLETED, CANCELLED, FAILED = "completed", "cancelled", "failed"

# A bundle's manifest names the door its answer came through.
_RECORDED_FROM = {"webrtc": "page", "ws": "socket", "realtime": "realtime"}


@dataclass(frozen=True)
class Queued:
    """The answer waits for a place (--max-concurrent-answers): ``ahead`` answers before it."""

    ahead: int


@dataclass(frozen=True)
class Started:
    """The answer has its place; text follows."""

    answer: Answer


@dataclass(frozen=True)
class Delta:
    text: str


@dataclass(frozen=True)
class Done:
    """The run's last event, always delivered once.

    ``started``: it had a place (false: cancelled while it waited, nothing
    was generated). ``current``: it was still its slot's answer at the end
    (false: a newer question took over). ``answer_id``: under which the
    answer's inputs are kept for its session (/inputs/<id>/). ``bundle``: the
    recording's folder when it was recorded; ``record_error`` why not."""

    answer: Answer
    status: str
    error: str | None
    started: bool
    current: bool
    answer_id: str | None
    bundle: Path | None = None
    record_error: str | None = None

    @property
    def text(self) -> str:
        return self.answer.reply.text


RunEvent = Union[Queued, Started, Delta, Done]


class Words(Protocol):
    """How a door says one answer run (:meth:`AnswerRun.say`): the socket
    doors' answer loop, written once."""

    async def queued(self, ahead: int) -> None: ...

    async def started(self, answer: Answer) -> None: ...

    async def delta(self, text: str) -> bool:
        """False: the client is gone (the run stops generating)."""

    async def done(self, done: Done) -> None: ...


class AnswerRun:
    """One question's answer, as events (:meth:`events`, read once)."""

    def __init__(self, conversation: "Conversation", slot: Entry, answer: Answer, *, record: bool,
                 continues_chat: bool, remember: bool) -> None:
        self.conversation, self.slot, self.answer = conversation, slot, answer
        self.record, self.continues_chat, self.remember = record, continues_chat, remember
        self.finished = asyncio.Event()  # set once Done is delivered, or the reader stopped reading
        self.superseded = False  # a newer question took its slot: its Done is not current

    async def cancel(self, why: str | None = None) -> None:
        """Stop generating (or waiting); the run still ends with its Done
        (``why``: its answer's cancelled_by, when it is the first cause)."""
        await self.answer.cancel(why)

    async def events(self) -> AsyncIterator[RunEvent]:
        answer, reply = self.answer, self.answer.reply
        error: str | None = None
        started = False
        current = True
        try:
            try:
                async with contextlib.aclosing(_places(answer)) as places:
                    async for ahead in places:
                        yield Queued(ahead)
                started = True
                yield Started(answer)
                async for delta in reply:
                    yield Delta(delta)
            except Abandoned:
                pass  # replaced or stopped while it waited: it never started
            except EngineError as exc:
                error = str(exc)
            except Exception:  # noqa: BLE001 - reported as the answer's failure, the session goes on
                log.exception("session %s…: answer failed", answer.session_id[:6])
                error = "Query processing failed"
            finally:
                try:
                    # Aborts the vLLM request if nobody read it to the end.
                    await asyncio.shield(reply.aclose())
                except Exception:  # noqa: BLE001
                    log.debug("aborting the reply failed", exc_info=True)
                released = chat.release(self.slot, answer, continues_chat=self.continues_chat)
                current = released and not self.superseded
            yield await self._done(error, started, current)
        finally:
            self.finished.set()

    async def _done(self, error: str | None, started: bool, current: bool) -> Done:
        answer = self.answer
        status = FAILED if error else CANCELLED if (answer.reply.stats.cancelled or not started) else COMPLETED
        conversation = self.conversation
        answer_id = kept.remember(conversation.entry, answer) if self.remember else None
        bundle = record_error = None
        if self.record and started and answer_id is not None:
            try:
                bundle = await kept.save_bundle(conversation.state, conversation.entry, answer, answer_id,
                                                         source=_RECORDED_FROM.get(conversation.entry.kind, "socket"))
            except kept.RecordingOff as exc:
                record_error = f"Not recorded: {exc}."
            except OSError as exc:
                record_error = f"Could not save the recording: {exc}"
        stats = answer.reply.stats
        # One line per answer, whichever door asked: what ran, how it ended and why.
        log.info("session %s…: answer %s %s: %d of %d tokens (%s), prompt %d tokens (%d cached), "
                 "%d frames, history %d of %d turns%s", answer.session_id[:6], answer_id or "-", status,
                 stats.completion_tokens, answer.options.max_tokens, stats.finish_reason or "no finish",
                 stats.prompt_tokens, stats.cached_tokens, stats.frames, stats.history_turns,
                 stats.history_turns_total, f", {answer.cancelled_by}" if answer.cancelled_by else "")
        return Done(answer, status, error, started, current, answer_id, bundle, record_error)

    async def say(self, words: "Words") -> None:
        """Read the run to its end in a door's words; a door that can no longer
        say a delta (its client is gone) stops the generation."""
        async with contextlib.aclosing(self.events()) as events:
            async for event in events:
                if isinstance(event, Queued):
                    await words.queued(event.ahead)
                elif isinstance(event, Started):
                    await words.started(event.answer)
                elif isinstance(event, Delta):
                    if not await words.delta(event.text):
                        await self.cancel()
                else:
                    await words.done(event)

    async def finish(self) -> Done:
        """Read the run to its end without a door (replay, benchmarks)."""
        async with contextlib.aclosing(self.events()) as events:
            async for event in events:
                if isinstance(event, Done):
                    return event
        raise AssertionError("an answer run ends with Done")


async def _places(answer: Answer) -> AsyncIterator[int]:
    """The number of answers ahead while this one waits for its place;
    raises Abandoned when it is cancelled while it waits."""
    places: asyncio.Queue[int] = asyncio.Queue()

    async def tell(ahead: int) -> None:
        places.put_nowait(ahead)

    waiting = asyncio.ensure_future(answer.wait_turn(tell))
    try:
        while not waiting.done():
            getter = asyncio.ensure_future(places.get())
            await asyncio.wait({waiting, getter}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield getter.result()
            else:
                getter.cancel()
        waiting.result()
    finally:
        if not waiting.done():  # the reader went away while it waited
            await answer.cancel()
            waiting.cancel()


class Conversation:
    """What one session does with the model (one per registry entry: :func:`of`)."""

    def __init__(self, state: Any, entry: Entry) -> None:
        self.state, self.entry = state, entry
        self._chat_run: AnswerRun | None = None

    async def ask(self, question: str, options: AnswerOptions, *, engine: ChatEngine | None = None,
                  history: Sequence[Turn] = (), sample: Sample | None = None, spoken: Any = None,
                  question_audio: Any = None, record: bool = False, continues_chat: bool = True,
                  remember: bool = True, frames_optional: bool = False) -> AnswerRun:
        """A question in the chat: the running answer is cancelled and its
        Done delivered before this one starts. Raises NoFrames, Superseded
        (a newer question arrived while this one was prepared) or EngineError
        (QuestionTooLarge before anything is cancelled)."""
        chat.check_question(question, history)
        previous = self._chat_run
        if previous is not None:
            previous.superseded = True
        await self.entry.cancel_answer()
        if previous is not None and not previous.finished.is_set():
            try:
                await asyncio.wait_for(previous.finished.wait(), PREEMPT_GRACE_S)
            except asyncio.TimeoutError:
                log.info("session %s…: the replaced answer's reader did not finish; going on",
                         self.entry.session.id[:6])
        answer = await chat.ask(engine or self.state.engine, self.entry, question, options, history=history,
                                queue=self.state.answer_gate, sample=sample, spoken=spoken,
                                question_audio=question_audio, frames_optional=frames_optional)
        run = AnswerRun(self, self.entry, answer, record=record, continues_chat=continues_chat, remember=remember)
        self._chat_run = run
        return run

    @property
    def answering(self) -> bool:
        """A chat answer runs whose Done has not been delivered yet (a newer question would cut it short)."""
        run = self._chat_run
        return run is not None and not run.finished.is_set()

    async def scene_changes(self, watcher: SceneWatch, stopped: Callable[[], bool]) -> AsyncIterator[float | None]:
        """Watch mode's moments to ask the standing question, for every
        door: each (rate-limited) scene change, none while the model loads,
        and never one that cuts an answer short: a change during an answer
        is asked about once that answer's Done is delivered. Ends when
        ``stopped()`` says watching was switched off."""
        async for t in watcher.changes(stopped):
            if self.state.engine is None:
                continue
            while (run := self._chat_run) is not None and not run.finished.is_set() and not stopped():
                await run.finished.wait()
            if stopped():
                return
            yield t

    async def heard(self, listener: Any, stale: Callable[[], bool] = lambda: False,
                    starts: bool = False) -> AsyncIterator[Any]:
        """Talk mode's turns for a door, from the session's listener
        (vidchat.conversation.talk): each finished utterance (and, with ``starts``, each
        speech start) until ``stale()`` says this reader no longer owns the
        chat (looked at every second while nothing is heard). An utterance
        heard just as the reader went stale is put back for the reader that
        owns the chat now, never asked by this one nor dropped."""
        while True:
            waiter = asyncio.ensure_future(listener.next_event() if starts else listener.next_utterance())
            try:
                while not waiter.done():
                    await asyncio.wait({waiter}, timeout=1.0)
                    if stale():
                        return
            finally:
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None and stale() \
                        and isinstance(waiter.result(), Utterance):
                    listener.put_back(waiter.result())
                waiter.cancel()
            yield waiter.result()

    async def reask(self, original: Answer, options: AnswerOptions, sample: Sample, *,
                    engine: ChatEngine | None = None) -> AnswerRun:
        """An earlier answer's question again on ``sample`` (its frozen
        inputs), beside the chat: the chat's answer goes on; a newer re-ask
        replaces a running one. A re-ask is not kept among the session's
        answers: those are the chat's (Talk reads the newest aloud, the
        re-ask list and the timings chart read them), and a re-ask of a
        loaded bundle would keep its decoded frames with the session."""
        slot = self.entry.side_slot()
        answer = await chat.ask(engine or self.state.engine, slot, original.question, options,
                                history=original.history, queue=self.state.answer_gate, sample=sample,
                                spoken=original.spoken)
        return AnswerRun(self, slot, answer, record=False, continues_chat=False, remember=False)


@dataclass
class Standalone:
    """What a conversation needs of the app, for a tool without one (the
    benchmarks): an engine, and optionally the answer queue."""

    engine: ChatEngine
    answer_gate: Any = None
    settings: Any = None  # no --record-dir: recording is off


def of(state: Any, entry: Entry) -> Conversation:
    """The entry's conversation, made on first use."""
    conversation = getattr(entry, "conversation", None)
    if conversation is None:
        conversation = entry.conversation = Conversation(state, entry)
    return conversation
