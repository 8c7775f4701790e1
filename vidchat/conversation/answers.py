"""An answer and where it runs: one question with exactly what the model was
given (:class:`Answer`, with its :class:`AnswerOptions`), its place in the
fair queue in front of the engine (:class:`AnswerQueue`), and the slots a
session's answers run in (:class:`AnswerSlot`, three to a :class:`SessionRecord`).

The queue: at most --max-concurrent-answers answers generate at once, across
all sessions and every door. Questions beyond the cap wait first come, first
served, and are told how many questions are ahead of them whenever that
changes. A session never holds more than one place, since its new question
replaces its old one (vidchat.conversation.asking.ask), so first-come order is
also fair between sessions.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import secrets
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Awaitable, Callable, Literal, Protocol

from vidchat.conversation.events import TYPED, EventHub
from vidchat.engine.interface import Reply, Turn
from vidchat.engine.weights import model_name
from vidchat.media.scene_log import MemoryUse
from vidchat.media.session import Sample, Session
from vidchat.media.streams import StreamReader
from vidchat.media.vad import Utterance

log = logging.getLogger(__name__)


OnWait = Callable[[int], Awaitable[None]]  # called with the number of questions ahead


class TalkListener(Protocol):
    """What a session's record knows of its Talk listener (vidchat.conversation.modes.Listener)."""

    @property
    def running(self) -> bool: ...

    def set_playback(self, on: bool, hold_s: float = 0.3) -> None: ...


class Abandoned(Exception):
    """The question left the queue before its turn (replaced, stopped, session closed)."""


class _Waiter:
    def __init__(self) -> None:
        self.granted = False
        self.changed = asyncio.Event()


class Slot:
    """One answer's permission to generate; release it exactly once."""

    def __init__(self, queue: "AnswerQueue | None") -> None:
        self._queue = queue

    def release(self) -> None:
        queue, self._queue = self._queue, None
        if queue is not None:
            queue._release()


class AnswerQueue:
    def __init__(self, limit: int = 0) -> None:
        self.limit = limit  # 0: no cap
        self.running = 0
        # Every question that asked for a place since the start, whatever came
        # of it: how a test sees that a refused call ran nothing.
        self.asked = 0
        self._waiting: collections.deque[_Waiter] = collections.deque()
        # Called with every answer (vidchat.conversation.asking.Answer) about to ask for its
        # turn, before it may generate (vidchat.conversation.warmup gives way to it).
        self.arrival_hooks: list[Callable[[Answer], Awaitable[None]]] = []

    async def announce(self, answer: Answer) -> None:
        for hook in list(self.arrival_hooks):
            try:
                await hook(answer)
            except Exception:
                log.exception("answer arrival hook failed")

    def snapshot(self) -> dict[str, int]:
        return {"limit": self.limit, "running": self.running, "waiting": len(self._waiting)}

    async def acquire(self, on_wait: OnWait | None = None, abandon: asyncio.Event | None = None) -> Slot:
        """Wait for a turn. Raises Abandoned when `abandon` is set first."""
        self.asked += 1
        if self.limit <= 0:
            return Slot(None)
        if self.running < self.limit and not self._waiting:
            self.running += 1
            return Slot(self)
        waiter = _Waiter()
        self._waiting.append(waiter)
        told = None
        try:
            while not waiter.granted:
                if abandon is not None and abandon.is_set():
                    raise Abandoned()
                ahead = self._waiting.index(waiter)
                if ahead != told and on_wait is not None:
                    told = ahead
                    await on_wait(ahead)
                    continue  # the queue may have moved while we were telling
                waiter.changed.clear()
                waits = [asyncio.ensure_future(waiter.changed.wait())]
                if abandon is not None:
                    waits.append(asyncio.ensure_future(abandon.wait()))
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
        except BaseException:
            if waiter.granted:
                self._release()  # our turn came as we left: pass it on
            else:
                self._waiting.remove(waiter)
                self._tell_all()
            raise
        return Slot(self)

    def _release(self) -> None:
        self.running -= 1
        while self._waiting and self.running < self.limit:
            waiter = self._waiting.popleft()
            waiter.granted = True
            self.running += 1
            waiter.changed.set()
        self._tell_all()

    def _tell_all(self) -> None:
        for waiter in self._waiting:
            waiter.changed.set()


# What the registry and the doors know of a session, and the slots its
# answers run in.
#
# A session is one object, its :class:`vidchat.conversation.Conversation`,
# which builds on :class:`SessionRecord`: the record holds what every door
# reads (its media, who opened it, its limits, how to end its transport, its
# kept answers); the conversation adds what the session does with the model.
#
# Its answers run in three slots of one kind (:class:`AnswerSlot`): its chat,
# its re-asks beside the chat ("side"), and the second model's answers to the
# chat's questions ("second", Both models). One answer at a time runs in a
# slot: a newer question there replaces it. Each slot has one counter, its
# turn: each question asked in it takes the next number as its ticket (as do
# Stop, Clear and the session's end in the chat), and a question is current
# while its slot's turn is still its ticket. The second model's slot keeps no
# count of its own: its answers are to the chat's questions, under their
# tickets, current while the chat's turn is theirs.

Closer = Callable[[], Awaitable[None]]

SlotKind = Literal["chat", "side", "second"]


class AnswerSlot:
    """Where one answer at a time of a session runs (see above)."""

    def __init__(self, record: SessionRecord, kind: SlotKind, follows: AnswerSlot | None = None) -> None:
        self.record, self.kind = record, kind
        self._follows = follows  # the slot whose turn is this one's (the second model's: the chat's)
        self._turn = 0
        self.answer: Answer | None = None  # the answer being generated here
        # What the next question will most likely carry besides its frames
        # (vidchat.conversation.warmup prepares for the same kind of question).
        self.warm_options: AnswerOptions | None = None
        self.answer_ended = 0.0  # time.monotonic() when its last answer ended (the warm-ups wait a moment)
        # Held while an aborted answer winds down: an abort that reaches vLLM
        # while the request is still being registered only takes effect at its
        # first output, and a question arriving meanwhile must not start beside it.
        self._cancelling = asyncio.Lock()

    @property
    def turn(self) -> int:
        """The ticket of the slot's newest question (or of the Stop or Clear since)."""
        return self._follows.turn if self._follows is not None else self._turn

    def move(self) -> int:
        """The next ticket: a question of this slot prepared for an older one never starts."""
        if self._follows is not None:
            raise RuntimeError(f"the {self.kind} slot takes the tickets of the slot it follows")
        self._turn += 1
        return self._turn

    def holds(self, ticket: int) -> bool:
        """Whether the question with ``ticket`` is still this slot's newest (and the session open)."""
        return self.turn == ticket and not self.closed

    @property
    def session(self) -> Session:
        return self.record.session

    @property
    def cache_salt(self) -> str:
        # The session's: its prefix-cache hits, whichever slot asks, are its own.
        return self.record.cache_salt

    @property
    def closed(self) -> bool:
        return self.record.closed

    async def cancel_answer(self, why: str | None = None) -> None:
        """Abort the running answer (its vLLM request included), if any, and
        return only once no earlier answer here is still generating
        (``why``: see Answer.cancel)."""
        async with self._cancelling:
            answer, self.answer = self.answer, None
            if answer is not None:
                await answer.cancel(why)


class SessionRecord:
    """A session as the registry keeps it, with its three answer slots."""

    def __init__(self, session: Session, kind: str, *, client: str | None = None,
                 owner: str | None = None) -> None:
        self.session = session
        self.kind = kind  # the door that opened it: "webrtc", "ws", "realtime", "replay", "bundle"
        self.chat = AnswerSlot(self, "chat")
        self.side = AnswerSlot(self, "side")
        self.second = AnswerSlot(self, "second", follows=self.chat)
        # Whatever owns the session's transport (a peer connection, a socket)
        # registers how to end it, so expiry and shutdown can close it.
        self.closers: list[Closer] = []
        # Set by SessionRegistry.close: a question still being prepared then
        # never reaches vLLM (nobody is left to read its answer).
        self.closed = False
        self.media: Any = None  # the live media's counters (WebRTC), shown in the page's status line
        # Proves a reconnecting tab owns this session (WebRTC); never logged.
        self.resume_token = secrets.token_urlsafe(24)
        # Sent with every request of this session as vLLM's cache_salt, so prefix
        # cache hits never cross sessions (no timing channel between users).
        self.cache_salt = secrets.token_hex(16)
        self.bundles: dict[str, Path] = {}  # recorded answers' bundle folders, by answer id (--record-dir)
        # The last answers' inputs, by answer id (vidchat.doors.answer_routes).
        self.answers: collections.OrderedDict[str, Answer] = collections.OrderedDict()
        self.client = client  # the client's network address (for --max-sessions-per-client)
        # The login that opened it (vidchat.app.access: a page user, a Hugging Face
        # user or the server token); only that login is served its frames,
        # answers and page calls. None: the server asks for no login.
        self.owner = owner
        self.deadline: float | None = None  # time.monotonic() at which --session-time-limit ends it
        self.talk: TalkListener | None = None  # Talk mode's listener (vidchat.conversation.modes), once Talk was on
        # time.monotonic() when the page's last typed question arrived: an Enter
        # report arriving after it is that question's, late (vidchat.conversation.warmup).
        self.typed_question_at = float("-inf")
        # What happens in the session, for every door that listens
        # (vidchat.conversation.events; Conversation.events() is its stream).
        self.event_hub = EventHub()
        # Both models (--compare-model): each chat question is asked of the
        # second model too (vidchat.conversation.conversation).
        self.both_models = False
        self.stream: StreamReader | None = None  # the stream of --stream it watches (vidchat.conversation.conversation)
        # Its tab went away and may come back for it (a reload, WebRTC's
        # grace): nobody asks meanwhile, so it gets no warm-ups.
        self.away = False
        # Its tab stopped its source (the page's Stop): the session, its chat
        # and kept answers wait for the next Start; it is never idle
        # (SessionRegistry.expire), and ends when its tab goes.
        self.paused = False
        # How many times a tab attached itself to it (an offer, a resume, a
        # paused tab's claim after a reload): a tab that went away is gone for
        # good if none came back within the reload grace.
        self.attachments = 0
        # Until when (time.monotonic()) that tab said it is loading again: the
        # reload grace waits for it this long (vidchat.doors.webrtc_routes).
        self.returning_until = 0.0
        # How many of its tabs' chat streams are open now: a Stop heard after
        # its tab's stream closed (the browser shut as Stop was clicked) has
        # no stream whose end would start the reload grace.
        self.chat_readers = 0

    @property
    def turn(self) -> int:
        """The chat's turn: its newest question's ticket (or Stop's, Clear's, the end's since)."""
        return self.chat.turn

    @property
    def warm_history(self) -> tuple[Turn, ...]:
        """The chat the next question will carry, for its warm-up
        (vidchat.conversation.warmup); a conversation keeps one, a bare record none."""
        return ()

    # The session's answer is its chat's (the doors' and the warm-ups' word for it).
    @property
    def answer(self) -> Answer | None:
        return self.chat.answer

    @answer.setter
    def answer(self, answer: Answer | None) -> None:
        self.chat.answer = answer

    @property
    def warm_options(self) -> AnswerOptions | None:
        return self.chat.warm_options

    @warm_options.setter
    def warm_options(self, options: AnswerOptions | None) -> None:
        self.chat.warm_options = options

    def slots(self) -> tuple[AnswerSlot, AnswerSlot, AnswerSlot]:
        return self.chat, self.side, self.second

    def release(self) -> None:
        """The session has closed: let its frames, audio, kept answers and
        last answers go now, not at the garbage collector's next full pass
        (the conversation refers back to itself, see SessionRegistry.close)."""
        self.session.reset()
        self.answers.clear()
        self.closers.clear()
        for slot in self.slots():
            slot.answer = None

    def time_left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())


@dataclass
class AnswerOptions:
    frames_as: str = "images"
    max_tokens: int = 256
    temperature: float = 0.7
    include_audio: bool = True
    system_prompt: str | None = None
    seed: int | None = None

    def updated(self, **changes: Any) -> "AnswerOptions":
        return replace(self, **changes)


@dataclass
class Answer:
    """One question with exactly what the model was given."""

    question: str
    reply: Reply
    sample: Sample
    options: AnswerOptions
    prompt_text: str = ""
    ticket: int = 0  # the session's question number, in arrival order
    prep_ms: float = 0.0
    video_fps: float | None = None
    bundle_name: str = ""  # the recording this answer was read from (a bundle loaded into the page)
    chat: int = 0  # the chat it was asked in (Conversation.chat_began: Clear starts another)
    session_id: str = ""

    queue: AnswerQueue | None = None
    history: tuple[Turn, ...] = ()  # the earlier turns the model was given
    spoken: Utterance | None = None  # the audio was the question (Talk mode)
    # The sample was taken as Enter was pressed, this long before the
    # question was asked (vidchat.conversation.warmup.Prewarmer.question_now); None: on arrival.
    sampled_before_ms: float | None = None
    asked_at: float = field(default_factory=time.monotonic)  # on the session's clock (its timeline)
    cancelled_by: str | None = None  # why it was cancelled, when the canceller said (the first cause)
    mark: dict[str, str] | None = None  # a QA verdict, {"mark": "good" | "bad", "note"} (vidchat.conversation.bundles)
    # A stream's state when asked ("live", "reconnecting", ...; vidchat.media.streams), None for other sources.
    source_state: str | None = None
    # Why it was asked (vidchat.conversation.events: typed, scene, spoken).
    cause: str = TYPED
    # What it got of its session's memory (vidchat.conversation.memory; None: memory off).
    memory: MemoryUse | None = None
    # Exchanges of its history folded into a summary (vidchat.conversation.memory; 0: none).
    history_folded: int = 0
    _slot: Slot | None = field(default=None, repr=False)
    _abandon: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    async def wait_turn(self, on_wait: OnWait | None = None) -> None:
        """Wait for a place among the answers generating at once
        (--max-concurrent-answers); call before reading the reply. Raises
        Abandoned when the answer is cancelled while it waits."""
        if self.queue is None or self._slot is not None:
            return
        await self.queue.announce(self)
        slot = await self.queue.acquire(on_wait, self._abandon)
        if self._abandon.is_set():
            slot.release()
            raise Abandoned()
        self._slot = slot

    def free(self) -> None:
        """Give the answer's place in the queue back (idempotent)."""
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.release()

    async def cancel(self, why: str | None = None) -> None:
        """Stop generating (or waiting); the vLLM request is aborted. ``why``:
        the reason a door reports (vidchat.conversation.modes.BARGED_IN …)."""
        if not self._abandon.is_set():
            self.cancelled_by = why
        self._abandon.set()
        try:
            await self.reply.aclose()
        finally:
            self.free()

    @property
    def engine_role(self) -> str:
        """Which of the server's engines answered: "main" or "compare" (--compare-model)."""
        role: str = self.reply.engine.options.role
        return role

    @property
    def model_name(self) -> str:
        """The answering model's one name (vidchat.engine.weights.model_name)."""
        engine = self.reply.engine
        options = getattr(engine, "options", None)
        name = getattr(options, "name", "") or ""
        return name or model_name(str(getattr(engine, "model_path", "") or ""))

    def summary(self) -> dict[str, Any]:
        sample = self.sample
        stats = self.reply.stats.as_dict()
        stats.update(
            frame_indices=list(sample.indices),
            frame_times=[sample.relative(t) for t in sample.timestamps],
            frame_sizes=[f"{f.shape[1]}x{f.shape[0]}" for f in sample.frames],
            audio_span=([sample.relative(sample.audio_start), sample.relative(sample.audio_end)]
                        if sample.audio_start is not None and stats.get("audio_seconds") else None),
            # Where in the played file (seconds of the file; null for a live source).
            frame_source_times=[None if p is None else round(p, 3) for p in sample.frame_source_times()],
            # Captured within a few tenths of a seek: that frame's position may be the other side's.
            frame_source_at_jump=sample.frame_source_at_jump(),
            audio_source_span=([None if p is None else round(p, 3) for p in sample.audio_source_span]
                               if sample.audio_source_span is not None and stats.get("audio_seconds") else None),
            source=sample.source,
            # Frames swapped for already-encoded ones to stay within the
            # encoder budget (a CPU that encodes slower than frames are kept).
            frames_substituted=sample.substituted,
            # ...and those left out where nothing encoded was left to swap in
            # (a session's first seconds); frames_new: those not yet encoded
            # when sampled, which this question encoded (or waited for).
            frames_left_out=sample.left_out,
            frames_new=sample.new_frames,
            sampled_at_enter_ms=None if self.sampled_before_ms is None else round(self.sampled_before_ms, 1),
            frames_as=self.options.frames_as,
            video_fps=None if self.video_fps is None else round(self.video_fps, 3),
            seed=self.options.seed,
            temperature=self.options.temperature,
            max_tokens=self.options.max_tokens,
            prep_ms=round(self.prep_ms, 2),
            ttft_ms=None if stats.get("ttft_s") is None else round(stats["ttft_s"] * 1000, 1),
            prefill_ms=None if stats.get("prefill_s") is None else round(stats["prefill_s"] * 1000, 1),
            include_audio=self.options.include_audio or self.spoken is not None,
            # A spoken question (Talk mode): its span on the timeline; the
            # audio the model got is exactly that span (audio_span).
            spoken_question=None if self.spoken is None else {
                "seconds": round(self.spoken.seconds, 3),
                "start": sample.relative(self.spoken.start),
                "end": sample.relative(self.spoken.end),
            },
            system_prompt=self.options.system_prompt,
            model=self.reply.engine.model_path,
            # The model's one name (preset, hub id or folder: vidchat.engine.weights.model_name),
            # with model_revision the exact weights: what reports, baselines and the page call it.
            model_name=self.model_name,
            engine=self.engine_role,
            model_revision=getattr(self.reply.engine, "model_revision", ""),
            prompt=self.prompt_text,  # as the model's template rendered it, special tokens included
            mark=self.mark,
        )
        if self.source_state is not None:  # watching a stream: whether it was live when asked
            stats["source_state"] = self.source_state
        if self.memory is not None:  # vidchat.conversation.memory: what it got of the scene log
            stats.update(self.memory.record(sample.origin))
            stats["history_folded"] = self.history_folded
        return stats
