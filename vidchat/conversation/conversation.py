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

An answer is *over* once its Done has been taken by every reader
(:attr:`AnswerRun.over`; at once when nobody reads it). The one preemption
rule: a newer question in the chat (any door, any kind: typed, spoken,
watched) cancels the running answer, and the newer run starts only once the
older one is over (a reader that stopped reading holds it at most
PREEMPT_GRACE_S). A re-ask runs beside the chat (its own slot): it never
cancels the chat's answer, is never kept among the chat's answers, and so is
never read aloud nor offered as chat history. The slots, and the turn each
question takes in its slot, are vidchat.conversation.answers'.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Coroutine, Sequence

import numpy as np

from vidchat.conversation import asking
from vidchat.conversation.answers import Answer, AnswerOptions, SessionRecord
from vidchat.conversation.asking import NoFrames, Superseded
from vidchat.conversation.asking import ask as ask_answer
from vidchat.conversation.events import (
    ERROR,
    NO_FRAMES,
    REPLACED,
    SCENE,
    SPOKEN,
    STOPPED,
    TYPED,
    ChatCleared,
    Notice,
    QuestionAsked,
    QuestionRefused,
    SessionEvent,
)
from vidchat.conversation.host import Host
from vidchat.conversation.memory import session_recall
from vidchat.conversation.modes import Modes
from vidchat.conversation.runs import (  # noqa: F401 (the conversation's events, for every door)
    CANCEL_GRACE_S,
    CANCELLED,
    COMPLETED,
    FAILED,
    AnswerRun,
    Delta,
    Done,
    Queued,
    RunEvent,
    RunReader,
    Started,
    Words,
)
from vidchat.engine.interface import ChatEngine, EngineError, Turn
from vidchat.media.scene_log import MemoryUse
from vidchat.media.session import Sample, Session
from vidchat.media.streams import StreamReader, Streams, UnknownStream  # noqa: F401 (the doors' name for a refused one)
from vidchat.media.vad import Utterance

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


# A session's chat as the model has it, kept by the conversation on the
# server for every door: each exchange (the question as later turns carry it,
# and the answer's text) appended when its answer is done, cleared by Clear
# chat, bounded by one cutting rule. Doors no longer send it back with each
# question; warm-ups prepare the next question's prompt from it.

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


@dataclass(frozen=True)
class Summary(Exchange):
    """The chat's oldest exchanges folded into a summary the model wrote
    (vidchat.conversation.memory): one system turn, its text as ``question``,
    standing for ``folded`` exchanges."""

    folded: int = 0

    def turns(self) -> tuple[Turn, ...]:
        return (Turn("system", f"Summary of the earlier conversation ({self.folded} exchanges): {self.question}"),)


class ChatHistory:
    def __init__(self, max_turns: int = MAX_HISTORY_TURNS) -> None:
        self.max_turns = max_turns
        self.exchanges: list[Exchange] = []

    @property
    def folded(self) -> int:
        """Exchanges folded into the summary at its head (0: none)."""
        head = self.exchanges[0] if self.exchanges else None
        return head.folded if isinstance(head, Summary) else 0

    def fold(self, oldest: list[Exchange], summary: str) -> bool:
        """Replace ``oldest`` (still the chat's first exchanges) by one
        Summary of them; False when the chat moved on meanwhile (cleared, cut)."""
        if not oldest or len(self.exchanges) < len(oldest) \
                or any(a is not b for a, b in zip(self.exchanges, oldest)):
            return False
        folded = sum(e.folded if isinstance(e, Summary) else 1 for e in oldest)
        self.exchanges[:len(oldest)] = [Summary(None, summary, "", folded=folded)]
        return True

    def __len__(self) -> int:
        return len(self.exchanges)

    def turns(self) -> tuple[Turn, ...]:
        """The chat as a question carries it, oldest first."""
        return tuple(turn for exchange in self.exchanges for turn in exchange.turns())

    def add(self, answer_id: str | None, question: str, answer: str, stopped: bool = False) -> None:
        self._append(Exchange(answer_id, question, answer, stopped))

    def add_note(self, text: str) -> None:
        """A system message in the chat, where it was said (vidchat.doors.socket.realtime)."""
        self._append(Note(None, text, ""))

    def _append(self, exchange: Exchange) -> None:
        self.exchanges.append(exchange)
        if 2 * len(self.exchanges) > self.max_turns:
            # A quarter at a time, not an exchange every answer: what is sent
            # keeps its cached prefix between cuts (vidchat.engine.prompts).
            keep = self.max_turns * 3 // 8
            del self.exchanges[:len(self.exchanges) - keep]

    def clear(self) -> None:
        self.exchanges.clear()


# Both models, live (``--compare-model``): with the session's switch on,
# each question of the chat is asked of the second model too, on the very
# frames, audio, chat and seed the first model got, so the two answers differ
# only by the model. It runs in a slot of its own beside the chat (a re-ask
# never replaces it, nor it the chat's answer), waits for its place in the same
# fair queue as every answer, and is kept and recorded as an answer of its own
# (its own "what the model got" and bundle). Its events are the session's,
# marked ``second`` with the chat question's ticket, so every door can show
# the two side by side; it never joins the chat's history (the chat continues
# with the first model's answers).

NOT_ANSWERED = "Both models: the second model did not answer this question. "


async def ask_second(conversation: Conversation, first: Answer, history: Sequence[Turn], *,
                     record: bool) -> AnswerRun | None:
    """The second model's answer to the chat's question ``first`` (None,
    with a notice in the chat, when it can't answer)."""
    host = conversation.serving()
    slot = conversation.second
    await slot.cancel_answer()  # the previous question's second answer, if it still runs
    engine = host.engine_now("compare")  # not waited for: the chat's answer runs meanwhile
    if engine is None:
        conversation.event_hub.publish(Notice(NOT_ANSWERED + host.readiness("compare")[1]))
        return None
    ticket = first.ticket
    try:
        answer = await ask_answer(engine, slot, first.question, first.options, history=history,
                                  queue=host.answer_gate, sample=first.sample, spoken=first.spoken, ticket=ticket,
                                  current=lambda: slot.holds(ticket), memory=first.memory)
    except Superseded:
        return None
    except (EngineError, NoFrames, ValueError) as exc:
        conversation.event_hub.publish(Notice(NOT_ANSWERED + str(exc)))
        return None
    answer.chat = conversation.chat_began
    return AnswerRun(conversation, slot, answer, record=record, continues_chat=False, remember=True)


# How long a newer question waits for the replaced answer's Done to be
# delivered: long enough for any reader that still reads (the abort takes
# effect at vLLM's next step), short enough that a reader that went away
# without closing its run never holds the chat.
PREEMPT_GRACE_S = 5.0


class Conversation(SessionRecord):
    """A session and what it does with the model: the registry's one object
    per session (SessionRegistry.create); its chat's answers run in its
    ``chat`` slot (vidchat.conversation.answers says how slots and turns go)."""

    def __init__(self, session: Session, kind: str, *, host: Host | None = None, client: str | None = None,
                 owner: str | None = None) -> None:
        super().__init__(session, kind, client=client, owner=owner)
        # What it asks with (vidchat.app.state.AppState, or Standalone for a
        # tool without an app): its engines by role, the answer queue, the
        # settings. None until its registry is given one (a test's session).
        self.host = host
        self._chat_run: AnswerRun | None = None
        self.history = ChatHistory()  # the chat, on the server, for every door and the warm-ups
        # The chat's turn (its slot's): each question, Stop, Clear and the
        # session's end take the next number; a question prepared for an
        # older one never starts. Clear starts a new chat at the number it
        # took: the chat's answers are those asked since.
        self.chat_began = 0
        self._moved_by = ""  # what moved the turn last (a question, "stop", "clear", "closed")
        self._turn_cause = TYPED  # why the turn's question was asked (typed, scene, spoken)
        self._tasks: set[asyncio.Task[object]] = set()  # questions asked in a task of the conversation (submit)
        self.modes = Modes(self)  # Watch and Talk, as tasks of the conversation
        # A keyframe of the scene log picked on the page's timeline: its next question gets it.
        self.memory_pin: int | None = None
        self.closers.append(self._closed)

    def serving(self) -> Host:
        """Its host; a session asked before it has one is a mistake of its maker."""
        if self.host is None:
            raise RuntimeError(f"session {self.session.id[:6]}… has no host to ask with")
        return self.host

    # -- the chat's turn and the one way to stop its answer ------------------

    def _move_turn(self, by: str) -> int:
        self._moved_by = by
        return self.chat.move()

    async def cancel(self, why: str | None = None) -> None:
        """The one way to cancel the chat's answer (Stop, Clear, barge-in, a
        newer question): its run ends with a cancelled Done within its grace."""
        run = self._chat_run
        if run is not None and run.done is None:
            await run.cancel(why)
        elif self.chat.answer is not None:  # an answer asked outside a run (vidchat.conversation.asking.ask)
            await self.chat.cancel_answer(why)
        await self.second.cancel_answer(why)  # Both models: the second model's answer to the same question

    async def stop(self, why: str | None = None) -> None:
        """Stop: the running answer ends, a question not started yet ends
        stopped, and watching ends."""
        self._move_turn("stop")
        self.modes.stop_watching()
        await self.cancel(why)

    def clear(self) -> None:
        """Clear chat: the history goes, and an answer of the old chat ending
        later is not added to the new one (nor does the next warm-up carry
        it); its answer is cancelled (nobody's chat shows it any more).
        Watch and Talk go on."""
        self.chat_began = self._move_turn("clear")
        self.history.clear()
        self.event_hub.publish(ChatCleared(self.chat_began))
        if self._chat_run is not None and self._chat_run.done is None:
            self._in_task(self.cancel())

    async def _closed(self) -> None:
        """The session ended: nothing more is asked (a registry closer)."""
        self._move_turn("closed")
        self.modes.stop_watching()
        for task in list(self._tasks):
            task.cancel()

    def release(self) -> None:
        super().release()
        self._chat_run = None  # its last answer's run: the answer's frames with it

    def _in_task(self, work: Coroutine[Any, Any, object]) -> asyncio.Task[object]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _answered(self, run: AnswerRun, done: Done) -> None:
        """The one rule for what the chat keeps: an answer of this chat, in its
        slot, that the door continues the chat with, and that said something
        (a stopped answer's text too: the user saw it)."""
        text = done.answer.reply.text.strip()
        if (not run.continues_chat or run.slot is not self.chat or run.chat != self.chat_began
                or not done.started or not text):
            return
        # History comes before the frames in the prompt: the next warm-up
        # prepares the next question's start from it (Conversation.warm_history).
        self.history.add(done.answer_id, asking.spoken_text(done.answer), text, stopped=done.status == CANCELLED)

    @property
    def warm_history(self) -> tuple[Turn, ...]:
        """The chat the next question will carry, so its warm-up (vidchat.conversation.warmup)
        starts as the question will."""
        return self.history.turns()

    # -- asking ------------------------------------------------------------

    async def ask(self, question: str, options: AnswerOptions, *, engine: ChatEngine | None = None,
                  history: Sequence[Turn] | None = None, sample: Sample | None = None,
                  spoken: Utterance | None = None, question_audio: np.ndarray | None = None, record: bool = False,
                  continues_chat: bool = True, remember: bool = True, frames_optional: bool = False,
                  ticket: int | None = None,
                  cause: str = TYPED, at: float | None = None, memory: MemoryUse | None = None) -> AnswerRun:
        """A question in the chat: the running answer is cancelled and its
        Done delivered before this one starts. ``history``: None, the
        conversation's own chat (``continues_chat``; none otherwise), taken
        once the replaced answer has ended. ``ticket``: the turn
        :meth:`submit` took for it (else it takes the next). Raises
        NoFrames, Superseded (a newer question, Stop or Clear came while it
        was prepared) or EngineError (QuestionTooLarge before anything is
        cancelled). ``memory``: what it gets of the session's memory, as
        recorded (a bundle's re-ask); by default the session's own, if on."""
        asking.check_question(question, history or ())
        if ticket is None:
            ticket = self._asked(question, cause, at, spoken)
        elif ticket != self.turn:
            raise asking.Superseded("A newer question replaced this one.")
        previous = self._chat_run
        if previous is not None and previous.done is None:
            await previous.cancel()  # arms its force-done: its Done comes within the grace
        if previous is not None and not previous.over.is_set():
            try:
                await asyncio.wait_for(previous.over.wait(), PREEMPT_GRACE_S)
            except asyncio.TimeoutError:
                log.info("session %s…: the replaced answer's reader did not finish; going on",
                         self.session.id[:6])
        if history is None:
            history = self.history.turns() if continues_chat else ()
        host = self.serving()
        engine = engine or await host.engine_for("main")
        if memory is None:  # with or without its chat (the seed's history off): memory is the session's
            memory = await self._recall(engine, question, with_frames=options.frames_as == "images")
        answer = await asking.ask(engine, self.chat, question, options,
                                  history=history, queue=host.answer_gate, sample=sample, spoken=spoken,
                                  question_audio=question_audio, frames_optional=frames_optional,
                                  ticket=ticket, current=lambda: self.chat.holds(ticket), memory=memory)
        answer.chat, answer.cause = self.chat_began, self._turn_cause
        answer.history_folded = self.history.folded if history and continues_chat else 0
        if self.stream is not None:
            answer.source_state = self.stream.state
        run = AnswerRun(self, self.chat, answer, record=record, continues_chat=continues_chat, remember=remember)
        self._chat_run = run
        if self.both_models and continues_chat:
            self._in_task(ask_second(self, answer, history, record=record))
        return run

    async def _recall(self, engine: ChatEngine, question: str, with_frames: bool = True) -> MemoryUse | None:
        """What this question gets of the session's memory (None: memory off);
        a keyframe pinned on the page's timeline is used once."""
        options = self.serving().memory
        if options is None or not self.session.settings.memory:
            return None
        pinned, self.memory_pin = self.memory_pin, None
        return await asyncio.to_thread(session_recall, self, engine, question, options, pinned, with_frames)

    def _asked(self, question: str, cause: str, at: float | None, spoken: Utterance | None) -> int:
        ticket = self._move_turn("question")
        if spoken is not None:
            cause = SPOKEN
        elif at is not None:
            cause = SCENE
        self._turn_cause = cause
        self.event_hub.publish(QuestionAsked(ticket, question, cause, at,
                                                None if spoken is None else round(spoken.seconds, 3)))
        return ticket

    def submit(self, question: str, options: AnswerOptions | Callable[[], AnswerOptions], *, cause: str = TYPED,
               at: float | None = None, spoken: Utterance | None = None, sample: Sample | None = None,
               pinned_at: float | None = None, record: bool = False) -> int:
        """Ask in a task of the conversation, for a door that only listens
        (the page): the question joins the chat at once (QuestionAsked), waits
        for the model when it still loads, and its outcome comes as the
        session's events: its answer's, or QuestionRefused (replaced,
        stopped, no frames, an engine error). ``options`` may be a callable,
        read once the model runs (a ValueError it raises refuses the
        question). ``pinned_at``: when ``sample`` was taken (time.monotonic()).
        Returns the question's ticket."""
        ticket = self._asked(question, cause, at, spoken)
        self._in_task(_submitted(self, ticket, question, options, spoken, sample, pinned_at, record))
        return ticket

    def events(self) -> AsyncIterator[SessionEvent]:
        """The session's one event stream (vidchat.conversation.events),
        from now on: every door says each event in its own wire format."""
        return self.event_hub.events()

    @property
    def answering(self) -> bool:
        """A chat answer runs whose Done has not been delivered yet (a newer question would cut it short)."""
        run = self._chat_run
        return run is not None and not run.over.is_set()

    async def reask(self, original: Answer, options: AnswerOptions, sample: Sample, *,
                    engine: ChatEngine | None = None) -> AnswerRun:
        """An earlier answer's question again on ``sample`` (its frozen
        inputs), beside the chat: the chat's answer goes on; a newer re-ask
        replaces a running one. A re-ask is not kept among the session's
        answers: those are the chat's (Talk reads the newest aloud, the
        re-ask list and the timings chart read them), and a re-ask of a
        loaded bundle would keep its decoded frames with the session.
        ``options`` without a seed take the original's: the same weights,
        inputs and seed give the same answer, so a difference means something."""
        if options.seed is None and original.options.seed is not None:
            options = dataclasses.replace(options, seed=original.options.seed)
        slot = self.side
        ticket = slot.move()
        await slot.cancel_answer()
        host = self.serving()
        answer = await asking.ask(engine or await host.engine_for("main"), slot, original.question, options,
                                  history=original.history, queue=host.answer_gate, sample=sample,
                                  spoken=original.spoken, ticket=ticket,
                                  current=lambda: slot.holds(ticket), memory=original.memory)
        return AnswerRun(self, slot, answer, record=False, continues_chat=False, remember=False)


async def _submitted(conversation: Conversation, ticket: int, question: str,
                     options: AnswerOptions | Callable[[], AnswerOptions], spoken: Utterance | None,
                     sample: Sample | None, pinned_at: float | None, record: bool) -> None:
    """A submitted question, asked in a task of its conversation (Conversation.submit)."""
    refused: tuple[str, str] | None = None
    try:
        await _engine_up(conversation, ticket)
        if conversation.turn != ticket:
            raise asking.Superseded("")
        try:
            chosen = options() if callable(options) else options
        except ValueError as exc:
            raise EngineError(f"Settings not accepted: {exc}") from None
        run = await conversation.ask(question, chosen, ticket=ticket, spoken=spoken, sample=sample, record=record)
        if pinned_at is not None:
            run.answer.sampled_before_ms = (time.monotonic() - pinned_at) * 1000
    except asking.Superseded:
        refused = (STOPPED if conversation._moved_by == "stop" else REPLACED, "")
    except asking.NoFrames as exc:
        refused = (NO_FRAMES, str(exc))
    except EngineError as exc:
        refused = (ERROR, str(exc))
    except asyncio.CancelledError:
        refused = (STOPPED, "")
        raise
    except Exception:  # noqa: BLE001 - the question fails, the session goes on
        log.exception("session %s…: question failed", conversation.session.id[:6])
        refused = (ERROR, "Query processing failed")
    finally:
        if refused is not None:
            conversation.event_hub.publish(QuestionRefused(ticket, *refused))


# How often a submitted question waiting for the model looks whether a newer
# question, Stop or Clear replaced it meanwhile.
ENGINE_WAIT_LOOK_S = 1.0


async def _engine_up(conversation: Conversation, ticket: int) -> None:
    """Wait while the model loads or restarts, as long as question ``ticket``
    is the chat's newest; raises EngineError when the engine is down for good."""
    host = conversation.serving()
    while host.engine_now("main") is None and conversation.turn == ticket:
        try:
            await asyncio.wait_for(host.engine_for("main"), ENGINE_WAIT_LOOK_S)
        except asyncio.TimeoutError:
            pass


# A session watching one of the server's streams (--stream,
# vidchat.media.streams): the one rule every door follows when its client
# chooses a stream (the seed socket's ``session.config {"source": {"stream":
# NAME}}``, the Realtime door's ``session.update``, the page's Source menu).
# The session is attached to the stream's one reader, leaves any stream it
# watched before, and is detached when it ends; while attached its client
# sends no frames of its own (:func:`refuse_own_frames` says so, naming the
# stream), and each answer's record says whether the stream was live when it
# was asked (``source_state``).

def attach_stream(entry: SessionRecord, streams: Streams, name: str) -> StreamReader:
    """Attach ``entry``'s session to stream ``name``; raises UnknownStream naming it and the streams there are."""
    reader = streams.attach(name, entry.session)
    if entry.stream is None:
        async def leave() -> None:
            streams.detach(entry.session)

        entry.closers.append(leave)
    entry.stream = reader
    return reader


def detach_stream(entry: SessionRecord, streams: Streams) -> None:
    """The session watches no stream any more (its frames stay)."""
    if entry.stream is not None:
        streams.detach(entry.session)
        entry.stream = None


def refuse_own_frames(entry: SessionRecord) -> str | None:
    """Why a client's own frame is refused (its session watches a stream), or None."""
    if entry.stream is None:
        return None
    return (f"this session watches the stream {entry.stream.name!r}: it takes no frames of its own "
            "(choose no stream to send your own)")
