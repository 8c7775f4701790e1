"""A session's conversation with the model: the one owner of what a session
does with it, for every door (the page, the socket protocol, replay).

A door asks (:meth:`Conversation.ask` for the chat, :meth:`Conversation.reask`
beside it) and gets an :class:`AnswerRun`: a typed stream of events that
mirrors a realtime API's response — :class:`Queued` while it waits for a
place, :class:`Started`, a :class:`Delta` per piece of text, and always one
:class:`Done` last, with its status (``completed``, ``cancelled`` or
``failed``). The run is driven by a task of the conversation from the
moment it is asked (LiveKit's SpeechHandle): it waits for its place,
streams, gives its place back, remembers the answer's inputs and records it
when asked to, and ends with its Done whether anyone reads it or not. Doors
listen (:meth:`AnswerRun.events`) and only turn the events into their wire
format; a door that leaves unsubscribes, and when the last one leaves before
the Done the answer is cancelled. :meth:`AnswerRun.cancel` is the one way to
stop it; a cancelled run whose engine does not let go is force-done after
CANCEL_GRACE_S.

The one preemption rule: a newer question in the chat (any door, any kind:
typed, spoken, watched) cancels the running answer, and the newer run starts
only once the older run's Done has been taken by its readers (at once when
nobody reads it; a reader that stopped reading holds it at most
PREEMPT_GRACE_S). A re-ask runs beside the chat (its own slot): it never
cancels the chat's answer, is never kept among the chat's answers, and so is
never read aloud nor offered as chat history.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Protocol, Sequence, Union

from vidchat.conversation import chat, kept, log_context
from vidchat.conversation.history import ChatHistory
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
# How long a cancelled answer may take to end before its Done is made
# without it (LiveKit's interruption timeout): vLLM's abort takes effect at
# its next step, so only an engine that hangs ever needs this.
CANCEL_GRACE_S = 3.0
_RUNNING: set[asyncio.Task] = set()  # the answer runs' tasks, held until they end

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
    """One question's answer, run by a task of the conversation from the
    moment it is asked: it waits for its place, streams, gives its place
    back and ends with its Done whether or not anyone reads it. Doors
    listen (:meth:`events`, any number of readers, each from the first
    event); a reader that leaves unsubscribes, and when the last one
    leaves before the Done the answer is cancelled (nobody is left to read
    it: abort-on-disconnect)."""

    def __init__(self, conversation: "Conversation", slot: Entry, answer: Answer, *, record: bool,
                 continues_chat: bool, remember: bool) -> None:
        self.conversation, self.slot, self.answer = conversation, slot, answer
        self.record, self.continues_chat, self.remember = record, continues_chat, remember
        self.ended = asyncio.Event()  # set by the run as its Done is made: it always comes
        self.finished = asyncio.Event()  # set once every reader has taken the Done (at once with no reader)
        self.superseded = False  # a newer question took its slot: its Done is not current
        self._events: list[RunEvent] = []
        self._more = asyncio.Event()  # replaced at each event: readers wait on the one of their time
        self._readers = 0
        self._forced: asyncio.TimerHandle | None = None
        self._first_token_at: float | None = None
        self.generation = conversation.generation  # the chat it belongs to (Clear starts another)
        self._task = asyncio.get_running_loop().create_task(self._run())
        _RUNNING.add(self._task)  # asyncio keeps only weak references to tasks
        self._task.add_done_callback(_RUNNING.discard)

    async def cancel(self, why: str | None = None) -> None:
        """The one way to stop it: stop generating (or waiting). The run
        still ends with its Done; if the engine does not let it end within
        CANCEL_GRACE_S, the Done is made without it (force-done)."""
        if not self.ended.is_set() and self._forced is None:
            self._forced = asyncio.get_running_loop().call_later(CANCEL_GRACE_S, self._force_done)
        await self.answer.cancel(why)

    # -- the run -----------------------------------------------------------

    def _publish(self, event: RunEvent) -> None:
        self._events.append(event)
        more, self._more = self._more, asyncio.Event()
        more.set()

    async def _run(self) -> None:
        answer, reply = self.answer, self.answer.reply
        log_context.bind(self.conversation.entry.session.id, self.conversation.entry.kind)  # this task's log lines
        error: str | None = None
        started = False
        current = True
        try:
            try:
                async with contextlib.aclosing(_places(answer)) as places:
                    async for ahead in places:
                        self._publish(Queued(ahead))
                started = True
                self._publish(Started(answer))
                async for delta in reply:
                    if self._first_token_at is None:
                        self._first_token_at = time.monotonic()
                    self._publish(Delta(delta))
            except Abandoned:
                pass  # replaced or stopped while it waited: it never started
            except EngineError as exc:
                error = str(exc)
            except Exception:  # noqa: BLE001 - reported as the answer's failure, the session goes on
                log.exception("session %s…: answer failed", answer.session_id[:6])
                error = "Query processing failed"
            finally:
                try:
                    await asyncio.shield(reply.aclose())  # aborts the vLLM request if it did not end
                except Exception:  # noqa: BLE001
                    log.debug("aborting the reply failed", exc_info=True)
                released = chat.release(self.slot, answer)
                current = released and not self.superseded
            if not self.ended.is_set():
                self._end(await self._done(error, started, current))
        finally:
            if not self.ended.is_set():  # the task itself was cancelled (shutdown)
                self._end(self._plain_done(None, started, False, cancelled=True))

    def _force_done(self) -> None:
        """The cancelled answer did not end within the grace: its Done now
        (the engine's abort goes on in the background; its place is given back)."""
        if self.ended.is_set():
            return
        log.info("session %s…: a cancelled answer did not end within %.0f s; done without it",
                 self.answer.session_id[:6], CANCEL_GRACE_S)
        chat.release(self.slot, self.answer)
        self._end(self._plain_done(None, True, False, cancelled=True))

    def _end(self, done: Done) -> None:
        if self._forced is not None:
            self._forced.cancel()
        self._count(done)
        self.conversation._answered(self, done)
        self._publish(done)
        self.ended.set()
        if self._readers == 0:
            self.finished.set()

    def _count(self, done: Done) -> None:
        """Tell the app's metrics (when it keeps any) how the answer ended."""
        metrics = getattr(self.conversation.state, "metrics", None)
        if metrics is None:
            return
        answer = self.answer
        # Received: when the question was taken, before its preparation.
        received = answer.asked_at - answer.prep_ms / 1000
        first_token_s = self._first_token_at - received if self._first_token_at is not None else None
        try:
            metrics.answer_done(self.conversation.entry.kind, done.status, first_token_s,
                                answer.reply.stats.completion_tokens)
        except Exception:  # noqa: BLE001 - a metric never breaks an answer
            log.debug("counting the answer failed", exc_info=True)

    def _plain_done(self, error: str | None, started: bool, current: bool, cancelled: bool = False) -> Done:
        """The run's Done without a recording, its inputs kept as asked."""
        answer = self.answer
        status = FAILED if error else CANCELLED if (cancelled or answer.reply.stats.cancelled or not started) \
            else COMPLETED
        answer_id = kept.remember(self.conversation.entry, answer) if self.remember else None
        return Done(answer, status, error, started, current, answer_id)

    async def _done(self, error: str | None, started: bool, current: bool) -> Done:
        done = self._plain_done(error, started, current)
        answer, answer_id = self.answer, done.answer_id
        conversation = self.conversation
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
        log_context.bind_answer(answer_id)
        # One line per answer, whichever door asked: what ran, how it ended and why.
        log.info("session %s…: answer %s %s: %d of %d tokens (%s), prompt %d tokens (%d cached), "
                 "%d frames, history %d of %d turns%s", answer.session_id[:6], answer_id or "-", done.status,
                 stats.completion_tokens, answer.options.max_tokens, stats.finish_reason or "no finish",
                 stats.prompt_tokens, stats.cached_tokens, stats.frames, stats.history_turns,
                 stats.history_turns_total, f", {answer.cancelled_by}" if answer.cancelled_by else "")
        return dataclasses.replace(done, bundle=bundle, record_error=record_error)

    # -- listening ---------------------------------------------------------

    def events(self) -> "RunReader":
        """A reader of the run's events, from its first to its Done,
        subscribed from this call on (close it to unsubscribe: the last
        reader to leave before the Done cancels the answer)."""
        return RunReader(self)

    def _reader_left(self, took_done: bool) -> None:
        self._readers -= 1
        if self._readers:
            return
        if self.ended.is_set():
            self.finished.set()
        elif not took_done and not self.answer._abandon.is_set():
            # The last door listening went away: nobody reads this answer now.
            self._leaving = asyncio.get_running_loop().create_task(self.cancel())
            _RUNNING.add(self._leaving)
            self._leaving.add_done_callback(_RUNNING.discard)

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
        """Wait for the run's Done without a door (replay, benchmarks)."""
        await self.ended.wait()
        done = self._events[-1]
        assert isinstance(done, Done), "an answer run ends with Done"
        return done


class RunReader:
    """One door's subscription to an answer run (:meth:`AnswerRun.events`):
    an async iterator of its events from the first; once the Done has been
    taken, the next step (or closing it) tells the run it was delivered."""

    def __init__(self, run: AnswerRun) -> None:
        self._run = run
        self._seen = 0
        self._took_done = False
        self._left = False
        run._readers += 1

    def __aiter__(self) -> "RunReader":
        return self

    async def __anext__(self) -> RunEvent:
        run = self._run
        if self._took_done or self._left:
            await self.aclose()
            raise StopAsyncIteration
        while self._seen >= len(run._events):
            await run._more.wait()
        event = run._events[self._seen]
        self._seen += 1
        self._took_done = isinstance(event, Done)
        return event

    async def aclose(self) -> None:
        if not self._left:
            self._left = True
            self._run._reader_left(self._took_done)

    def __del__(self) -> None:
        # A reader dropped without closing it (a door's task torn down) still unsubscribes.
        if not self._left:
            self._left = True
            try:
                self._run._reader_left(self._took_done)
            except RuntimeError:  # no running loop any more (interpreter shutdown)
                pass


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
        self.history = ChatHistory()  # the chat, on the server, for every door and the warm-ups
        self.generation = 0  # the chat's number: Clear starts a new one

    def clear(self) -> None:
        """Clear chat: the history goes, and an answer of the old chat ending
        later is not added to the new one (nor does the next warm-up carry it)."""
        self.generation += 1
        self.history.clear()
        self.entry.warm_history = ()

    def _answered(self, run: AnswerRun, done: Done) -> None:
        """The one rule for what the chat keeps: an answer of this chat, in its
        slot, that the door continues the chat with, and that said something
        (a stopped answer's text too: the user saw it)."""
        text = done.answer.reply.text.strip()
        if (not run.continues_chat or run.slot is not self.entry or run.generation != self.generation
                or not done.started or not text):
            return
        self.history.add(done.answer_id, chat.spoken_text(done.answer), text)
        # History comes before the frames in the prompt: the next warm-up
        # prepares the next question's start, chat included.
        self.entry.warm_history = self.history.turns()

    async def ask(self, question: str, options: AnswerOptions, *, engine: ChatEngine | None = None,
                  history: Sequence[Turn] | None = None, sample: Sample | None = None, spoken: Any = None,
                  question_audio: Any = None, record: bool = False, continues_chat: bool = True,
                  remember: bool = True, frames_optional: bool = False) -> AnswerRun:
        """A question in the chat: the running answer is cancelled and its
        Done delivered before this one starts. ``history``: None, the
        conversation's own chat (``continues_chat``; none otherwise), taken
        once the replaced answer has ended. Raises NoFrames, Superseded
        (a newer question arrived while this one was prepared) or EngineError
        (QuestionTooLarge before anything is cancelled)."""
        chat.check_question(question, history or ())
        previous = self._chat_run
        if previous is not None:
            previous.superseded = True
            if not previous.ended.is_set():
                await previous.cancel()  # arms its force-done: its Done comes within the grace
        await self.entry.cancel_answer()
        if previous is not None and not previous.finished.is_set():
            try:
                await asyncio.wait_for(previous.finished.wait(), PREEMPT_GRACE_S)
            except asyncio.TimeoutError:
                log.info("session %s…: the replaced answer's reader did not finish; going on",
                         self.entry.session.id[:6])
        if history is None:
            history = self.history.turns() if continues_chat else ()
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
