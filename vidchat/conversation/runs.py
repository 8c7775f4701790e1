"""One answer run, driven by a task of its conversation (LiveKit's
SpeechHandle): its typed events (Queued, Started, Delta, Done), the readers
doors subscribe with, and the one way to stop it (AnswerRun.cancel, with a
force-done after CANCEL_GRACE_S). vidchat.conversation's module text says
how runs, readers and the preemption rule fit together.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncGenerator, Protocol, Union

from vidchat.conversation import asking, events
from vidchat.conversation.answers import Abandoned, Answer, AnswerSlot, SessionRecord
from vidchat.conversation.bundles import write_bundle
from vidchat.conversation.events import SCENE, SPOKEN, TYPED, AnswerEvent, EventHub
from vidchat.conversation.host import Host, HostSettings, Sessions
from vidchat.engine.interface import EngineError
from vidchat.media.session import Session

log = logging.getLogger(__name__)


# How long a cancelled answer may take to end before its Done is made
# without it (LiveKit's interruption timeout): vLLM's abort takes effect at
# its next step, so only an engine that hangs ever needs this.
CANCEL_GRACE_S = 3.0

# How long an answer may stream with nobody listening (no reader of the run,
# no listener of its session's events, nobody awaiting it) before it is
# cancelled: long enough for a reloading tab to come back to it, short enough
# that a client gone for good does not keep the engine busy for nobody.
UNHEARD_GRACE_S = 8.0

_RUNNING: set[asyncio.Task[None]] = set()  # the answer runs' tasks, held until they end

COMPLETED, CANCELLED, FAILED = "completed", "cancelled", "failed"

# What a run answers, by why its question was asked (metrics' ``kind``): the
# chat's own questions; re-asks and the second model's answers are kinds of
# their own, whatever asked the question they answer.
KIND_OF_CAUSE = {TYPED: "chat", SCENE: "watch", SPOKEN: "talk"}


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

    is_text = True  # vidchat.conversation.events.AnswerEvent.is_text: a reader far behind loses these first


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


class Keeper(Protocol):
    """What keeping a session's answers and bundles uses of it (a SessionRecord)."""

    @property
    def session(self) -> Session: ...

    @property
    def answers(self) -> collections.OrderedDict[str, Answer]: ...

    @property
    def bundles(self) -> dict[str, Path]: ...


class Asker(Keeper, Protocol):
    """What a run uses of the conversation that asked it
    (vidchat.conversation.conversation.Conversation): besides what it keeps,
    its door, its host, its chat's number, its event stream, and its one
    rule for what the chat keeps."""

    @property
    def kind(self) -> str: ...

    @property
    def host(self) -> Host | None: ...

    @property
    def chat_began(self) -> int: ...

    @property
    def event_hub(self) -> EventHub: ...

    def _answered(self, run: AnswerRun, done: Done) -> None: ...


class AnswerRun:
    """One question's answer, run by a task of the conversation from the
    moment it is asked: it waits for its place, streams, gives its place
    back and ends with its Done whether or not anyone reads it. Doors
    listen (:meth:`events`, any number of readers, each from the first
    event); a reader that leaves unsubscribes, and when the last one
    leaves before the Done the answer is cancelled (nobody is left to read
    it: abort-on-disconnect)."""

    # ``conversation``: the Conversation that asked (its host, session, chat
    # and the rule for what the chat keeps); ``slot``: one of its three.
    def __init__(self, conversation: Asker, slot: AnswerSlot, answer: Answer, *, record: bool,
                 continues_chat: bool, remember: bool) -> None:
        self.conversation, self.slot, self.answer = conversation, slot, answer
        self.record, self.continues_chat, self.remember = record, continues_chat, remember
        # Its Done, once made (it always comes): the run has ended, its readers may not have taken it yet.
        self.done: Done | None = None
        # The answer is over: its Done has been taken by every reader (at once with none). The
        # conversation's preemption rule waits for this before a newer question in the chat starts.
        self.over = asyncio.Event()
        self._made = asyncio.Event()  # set with ``done`` (finish() waits for it)
        self._events: list[RunEvent] = []
        self._more = asyncio.Event()  # replaced at each event: readers wait on the one of their time
        self._readers = 0
        self._forced: asyncio.TimerHandle | None = None
        self._first_token_at: float | None = None
        self._awaited = False  # finish() waits for it (replay, benchmarks): someone takes its Done
        self._unheard_since: float | None = None
        self.chat = conversation.chat_began  # the chat it belongs to (Clear starts another)
        self._task = asyncio.get_running_loop().create_task(self._run())
        _RUNNING.add(self._task)  # asyncio keeps only weak references to tasks
        self._task.add_done_callback(_RUNNING.discard)

    @property
    def kind(self) -> str:
        """What it answers: "chat", "watch", "talk", "reask" or "second" (metrics' kind label)."""
        if self.slot.kind == "second":
            return "second"
        if self.slot.kind == "side":
            return "reask"
        if self.answer.spoken is not None:  # Talk, a socket's server_vad turn, or a video.query's audio_data
            return "talk"
        return KIND_OF_CAUSE.get(self.answer.cause, "chat")

    async def cancel(self, why: str | None = None) -> None:
        """The one way to stop it: stop generating (or waiting). The run
        still ends with its Done; if the engine does not let it end within
        CANCEL_GRACE_S, the Done is made without it (force-done)."""
        if self.done is None and self._forced is None:
            self._forced = asyncio.get_running_loop().call_later(CANCEL_GRACE_S, self._force_done)
        await self.answer.cancel(why)

    # -- the run -----------------------------------------------------------

    def _publish(self, event: RunEvent) -> None:
        self._events.append(event)
        more, self._more = self._more, asyncio.Event()
        more.set()
        # The session's one stream has every answer of it, those beside the chat marked.
        self.conversation.event_hub.publish(AnswerEvent(
            event, event.answer_id if isinstance(event, Done) else None, side=self.slot.kind != "chat",
            ticket=self.answer.ticket, second=self.slot.kind == "second"))

    async def _run(self) -> None:
        answer, reply = self.answer, self.answer.reply
        events.bind(self.conversation.session.id, self.conversation.kind)  # this task's log lines
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
                        _prefilled(self)
                    self._publish(Delta(delta))
                    self._check_heard()
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
                asking.release(self.slot, answer)
                current = self.slot.holds(answer.ticket)
            if self.done is None:
                self._end(await self._recorded_done(error, started, current))
        finally:
            if self.done is None:  # the task itself was cancelled (shutdown)
                self._end(self._plain_done(None, started, False, cancelled=True))

    def _check_heard(self) -> None:
        """Cancel the answer once nobody has listened for UNHEARD_GRACE_S
        (abort-on-disconnect, for every door: a socket's reader, the page's
        chat feed, an API caller's stream)."""
        if self._readers or self._awaited or self.conversation.event_hub.listeners:
            self._unheard_since = None
            return
        now = time.monotonic()
        if self._unheard_since is None:
            self._unheard_since = now
        elif now - self._unheard_since > UNHEARD_GRACE_S and self._forced is None:
            log.info("session %s…: nobody has listened to the answer for %.0f s; stopping it",
                     self.answer.session_id[:6], UNHEARD_GRACE_S)
            self._leaving = asyncio.get_running_loop().create_task(self.cancel("nobody listens"))
            _RUNNING.add(self._leaving)
            self._leaving.add_done_callback(_RUNNING.discard)

    def _force_done(self) -> None:
        """The cancelled answer did not end within the grace: its Done now
        (the engine's abort goes on in the background; its place is given back)."""
        if self.done is not None:
            return
        log.info("session %s…: a cancelled answer did not end within %.0f s; done without it",
                 self.answer.session_id[:6], CANCEL_GRACE_S)
        asking.release(self.slot, self.answer)
        self._end(self._plain_done(None, True, False, cancelled=True))

    def _end(self, done: Done) -> None:
        if self._forced is not None:
            self._forced.cancel()
        _count(self, done)
        self.conversation._answered(self, done)
        self._publish(done)
        self.done = done
        self._made.set()
        if self._readers == 0:
            self.over.set()

    def _plain_done(self, error: str | None, started: bool, current: bool, cancelled: bool = False) -> Done:
        """The run's Done without a recording, its inputs kept as asked."""
        answer = self.answer
        status = FAILED if error else CANCELLED if (cancelled or answer.reply.stats.cancelled or not started) \
            else COMPLETED
        answer_id = remember(self.conversation, answer) if self.remember else None
        return Done(answer, status, error, started, current, answer_id)

    async def _recorded_done(self, error: str | None, started: bool, current: bool) -> Done:
        done = self._plain_done(error, started, current)
        answer, answer_id = self.answer, done.answer_id
        conversation = self.conversation
        bundle = record_error = None
        if self.record and started and answer_id is not None:
            try:
                bundle = await save_bundle(conversation.host, conversation, answer, answer_id,
                                           source=events.door_name(conversation.kind))
            except RecordingOff as exc:
                record_error = f"Not recorded: {exc}."
            except OSError as exc:
                record_error = f"Could not save the recording: {exc}"
        stats = answer.reply.stats
        events.bind_answer(answer_id)
        # One line per answer, whichever door asked: what ran, how it ended and why.
        log.info("session %s…: answer %s %s: %d of %d tokens (%s), prompt %d tokens (%d cached), "
                 "%d frames, history %d of %d turns%s", answer.session_id[:6],
                 events.session_hash(answer_id) if answer_id else "-", done.status,
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
        if self.done is not None:
            self.over.set()
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
        self._awaited = True
        await self._made.wait()
        assert self.done is not None, "an answer run ends with Done"
        return self.done


def _prefilled(run: AnswerRun) -> None:
    """The engine has the question's frames encoded now: a later question or
    warm-up counts them as such (vidchat.media.sampling's encoder budget).
    Not a second model's: its engine is another one."""
    if run.slot.kind != "second":
        run.conversation.session.mark_encoded(run.answer.sample.seqs)


def _count(run: AnswerRun, done: Done) -> None:
    """Tell the app's metrics (when it keeps any) how the answer ended."""
    host = run.conversation.host
    metrics = host.metrics if host is not None else None
    if metrics is None:
        return
    answer = run.answer
    # Received: when the question was taken, before its preparation.
    received = answer.asked_at - answer.prep_ms / 1000
    first_token_s = run._first_token_at - received if run._first_token_at is not None else None
    try:
        metrics.answer_done(run.conversation.kind, done.status, first_token_s,
                            answer.reply.stats.completion_tokens, engine=answer.engine_role, run_kind=run.kind)
    except Exception:  # noqa: BLE001 - a metric never breaks an answer
        log.debug("counting the answer failed", exc_info=True)


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


async def _places(answer: Answer) -> AsyncGenerator[int, None]:
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


# What the model got, kept: each answered question's inputs stay with its
# session (the last few, under an unguessable id) for the page's "what the
# model got" view and its downloads, and a finished answer is saved as a
# bundle when recording is on. The one recording rule of every door; the view
# and the routes that serve it are vidchat.doors.answer_routes.

KEEP_PER_SESSION = 8

# Recorded bundles a session keeps track of (their folders stay on disk; the
# oldest is only forgotten by the session's download links).
KEEP_BUNDLES_PER_SESSION = 64


def remember(entry: Keeper, answer: Answer) -> str:
    """Keep an answer's inputs for its session's page; returns its id (the
    same id when the answer is already kept, e.g. a spoken question's
    player shown before its answer)."""
    kept = entry.answers
    for known_id, known in kept.items():
        if known is answer:
            return known_id
    answer_id = secrets.token_urlsafe(16)
    kept[answer_id] = answer
    while len(kept) > KEEP_PER_SESSION:
        kept.popitem(last=False)
    return answer_id


def chat_answers(entry: Asker) -> list[tuple[str, Answer]]:
    """The kept answers of the chat as it is now, newest first, as (id,
    answer): those of a cleared chat are left out (their inputs stay served
    while kept, and the live view's timings still count them)."""
    chat = entry.chat_began
    return [(answer_id, answer) for answer_id, answer in reversed(entry.answers.items())
            if answer.chat == chat]


def records_by_default(settings: HostSettings) -> bool:
    """Whether a new session records each answer unless it says otherwise
    (the page's tick, a socket's ``record: false``): yes wherever the server
    was given --record-dir, whose help promises every answer saved."""
    return bool(settings.record_dir)


async def save_bundle(host: Host | None, entry: Keeper, answer: Answer, answer_id: str, source: str) -> Path:
    """Save a finished answer as a bundle under --record-dir, in its
    session's folder, and keep it for the session's download links: the one
    recording rule of the page and the socket. Raises RecordingOff without
    --record-dir (nothing is written unless the server was told where), and
    OSError when the folder can't be written."""
    if host is None or not host.settings.record_dir:
        raise RecordingOff("the server was started without --record-dir")
    root = host.settings.record_dir
    folder = Path(root) / f"session-{time.strftime('%Y%m%d')}-{entry.session.id[:8]}"
    engine = answer.reply.engine  # the engine that answered: the second model's answers are its own
    path = await asyncio.to_thread(write_bundle, folder, answer, source=source,
                                   model_option=model_option(host.settings, answer),
                                   engine_options=engine.options)
    keep_bundle(entry, answer_id, path)
    log.info("session %s… answer recorded in %s", entry.session.id[:6], path)
    return path


def model_option(settings: HostSettings, answer: Answer) -> str:
    """The option the answering engine's model was chosen by (--model, or
    --compare-model for the second model): what a replay or a baseline of the
    answer names, so neither is credited to the other model."""
    return settings.compare_model if answer.engine_role == "compare" else settings.model


class RecordingOff(Exception):
    pass


def keep_bundle(entry: Keeper, answer_id: str, path: Path) -> None:
    """Remember a recorded answer's bundle folder for the session's download links."""
    entry.bundles[answer_id] = path
    while len(entry.bundles) > KEEP_BUNDLES_PER_SESSION:
        entry.bundles.pop(next(iter(entry.bundles)))


def find(registry: Sessions, answer_id: str) -> tuple[SessionRecord, Answer] | tuple[None, None]:
    """The session that kept answer ``answer_id``, and the answer (None, None: no such answer)."""
    for entry in registry.entries():
        answer = entry.answers.get(answer_id)
        if answer is not None:
            return entry, answer
    return None, None


def record(answer: Answer, answer_id: str | None = None) -> dict[str, Any]:
    """The answer record: question, answer text and everything the model was given (frames by time and index)."""
    out = {"id": answer_id, "question": answer.question, "answer": answer.reply.text}
    out.update(answer.summary())
    return out
