"""The answer path, shared by both doors: check the options, sample the
session's buffer, prepare the prompt off the event loop, and make the result
the session's one running answer (the one it replaces is aborted in vLLM).

Every question, from the page or the socket, goes through :func:`ask` and
yields one :class:`Answer` record; the page's details panel and the socket's
``response.text.done`` stats both read :meth:`Answer.summary`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from vidchat.conversation.answer_queue import Abandoned, AnswerQueue, OnWait, Slot
from vidchat.media.session import Sample, Session, SessionSettings
from vidchat.media.sampling import uniform_indices
from vidchat.conversation.session_record import SessionRecord, SideSlot
from vidchat.conversation.settings_table import UNBOUNDED_MAX_TOKENS, check_all, question_problem, read_settings
from vidchat.conversation.session_events import TYPED, EventHub, SettingsChanged
from vidchat.engine import ChatEngine, EngineError, Prepared, Reply, Turn

log = logging.getLogger(__name__)


class NoFrames(EngineError):
    """A question arrived before the session had any frame. Its text is the
    fact; each door adds what its own user should do about it (``said_with``),
    in words that user acts on: the core never asks which door it serves."""

    FACT = "No frames available."

    def __init__(self) -> None:
        super().__init__(self.FACT)

    def said_with(self, hint: str) -> str:
        return f"{self.FACT} {hint}"


class OptionError(ValueError):
    """An answer option or sampling setting is out of range; the message names
    it, and ``field`` is its name in the settings table where one field is at fault."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class QuestionTooLarge(EngineError):
    """A question's text or its history beyond the settings table's caps;
    ``field`` is "question" or "history"."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def check_question(question: str, history: Sequence[Turn] = ()) -> None:
    """Refuse a question beyond the caps (QuestionTooLarge naming the field):
    the one check every door's questions pass, before anything is cancelled."""
    problem = question_problem(question, history)
    if problem is not None:
        raise QuestionTooLarge(str(problem), problem.field)


class Superseded(EngineError):
    """A newer question for the same session arrived while this one was prepared."""


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


def check_options(options: AnswerOptions, engine: ChatEngine | None, sampling: SessionSettings | None = None) -> None:
    """The one check of a question's options, for every door.

    Raises OptionError naming the first bad value: temperature, max tokens,
    seed (a signed 64-bit integer), frames as images/video (against what the
    model takes) and, given the session's sampling settings, frames per
    question against the engine's per-prompt limit."""
    max_len = engine.options.max_model_len if engine is not None else UNBOUNDED_MAX_TOKENS
    try:
        check_all("answer", options, high={"max_tokens": max_len})
    except ValueError as exc:
        raise OptionError(str(exc), getattr(exc, "field", None)) from None
    if engine is None:
        return
    if sampling is not None:
        try:
            sampling.validate()
            engine.check_request(sampling.num_sample_frames, options.frames_as)
        except (ValueError, EngineError) as exc:
            raise OptionError(str(exc), getattr(exc, "field", None)) from None
    elif options.frames_as == "video":
        try:
            engine.check_request(1, "video")
        except EngineError as exc:
            raise OptionError(str(exc)) from None


def checked_settings(values: Any, defaults: AnswerOptions | None = None) -> tuple[AnswerOptions, SessionSettings]:
    """Settings given as data, by the names session.config takes (a loaded
    bundle's manifest), through the checks every door uses: the socket's
    table for types (settings_table.read_settings, as session.config), then
    SessionSettings.validate and check_options for ranges. Raises ValueError
    naming the field; unknown names are ignored."""
    if not isinstance(values, dict):
        raise OptionError(f"settings must be an object, got {type(values).__name__}")
    changes = read_settings(values)
    sampling = dataclasses.replace(SessionSettings(), **changes["session"])
    sampling.validate()
    options = (defaults or AnswerOptions()).updated(**changes["answer"])
    check_options(options, None, sampling)
    return options, sampling


def apply_settings(session: Session, engine: ChatEngine | None, options: AnswerOptions,
                   sampling_changes: dict[str, Any], events: EventHub | None = None) -> None:
    """Check a question's options against the sampling settings they will run
    with, then apply those settings to the session; nothing changes on error
    (raises OptionError or the settings' own ValueError). ``events``: the
    session's stream, told which values changed (SettingsChanged)."""
    check_options(options, engine, dataclasses.replace(session.settings, **sampling_changes))
    if sampling_changes:
        before = dataclasses.asdict(session.settings)
        session.update_settings(**sampling_changes)
        changed = {k: v for k, v in dataclasses.asdict(session.settings).items() if before.get(k) != v}
        if changed and events is not None:
            events.publish(SettingsChanged(changed))


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
    chat: int = 0  # the chat it was asked in (Conversation.generation: Clear starts another)
    session_id: str = ""

    queue: AnswerQueue | None = None
    history: tuple[Turn, ...] = ()  # the earlier turns the model was given
    spoken: Any = None  # vidchat.media.vad.Utterance: the audio was the question (Talk mode)
    # The sample was taken as Enter was pressed, this long before the
    # question was asked (vidchat.conversation.prewarm.Prewarmer.question_now); None: on arrival.
    sampled_before_ms: float | None = None
    asked_at: float = field(default_factory=time.monotonic)  # on the session's clock (its timeline)
    cancelled_by: str | None = None  # why it was cancelled, when the canceller said (the first cause)
    mark: dict | None = None  # a QA verdict, {"mark": "good" | "bad", "note"} (vidchat.conversation.answer_marks)
    # A stream's state when asked ("live", "reconnecting", ...; vidchat.media.streams), None for other sources.
    source_state: str | None = None
    # Why it was asked (vidchat.conversation.session_events: typed, scene, spoken).
    cause: str = TYPED
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
        the reason a door reports (vidchat.conversation.talk.BARGED_IN …)."""
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
        return self.reply.engine.options.role

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
            engine=self.engine_role,
            model_revision=getattr(self.reply.engine, "model_revision", ""),
            prompt=self.prompt_text,  # as the model's template rendered it, special tokens included
            mark=self.mark,
        )
        if self.source_state is not None:  # watching a stream: whether it was live when asked
            stats["source_state"] = self.source_state
        return stats


async def ask(
    engine: ChatEngine,
    entry: SessionRecord | SideSlot,
    question: str,
    options: AnswerOptions,
    history: Sequence[Turn] = (),
    queue: AnswerQueue | None = None,
    sample: Sample | None = None,
    spoken: Any = None,
    question_audio: Any = None,
    frames_optional: bool = False,
    ticket: int = 0,
    current: Callable[[], bool] = lambda: True,
) -> Answer:
    """Answer a question about this session's buffer, replacing any answer it
    is still generating.

    The buffer is sampled now (frames that arrive later count for the next
    question); the prompt and media are prepared in a worker thread. Questions
    take effect in arrival order: one overtaken by a newer question while it
    was prepared (``current()`` false for its ``ticket``: the conversation's
    turn moved on) raises Superseded and never reaches vLLM. A given `sample`
    (a re-ask of an earlier answer's exact inputs) replaces the buffer's.
    ``frames_optional``: a question with no frame yet is asked on its text
    (and audio) alone instead of raising NoFrames (the Realtime API allows it)."""
    t0 = time.perf_counter()
    check_question(question, history)  # before the running answer is cancelled: a refusal changes nothing
    session = entry.session
    if question_audio is not None:
        sample, spoken = _with_question_audio(session, question_audio)
    if sample is None:
        sample = session.sample(span=None if spoken is None else (spoken.start, spoken.end))
    if not sample.frames and not frames_optional:
        raise NoFrames()
    asked_with = options  # what the next warm-up prepares for (a drawn seed changes no prompt)
    if options.seed is None:
        # The seed it actually uses, drawn here and recorded with the answer,
        # so a sampled answer replays exactly from its record or bundle.
        options = options.updated(seed=secrets.randbits(63))
    prepared = await asyncio.to_thread(prepare, engine, entry, sample, options, history, question,
                                       spoken=spoken is not None)
    if entry.closed:
        raise Superseded("The session closed before this question started.")
    if not current():
        raise Superseded("A newer question replaced this one.")
    answer = Answer(question, engine.submit(prepared), sample, options, prompt_text=prepared.prompt_text,
                    ticket=ticket, prep_ms=(time.perf_counter() - t0) * 1000, video_fps=prepared.video_fps,
                    queue=queue, history=tuple(history), session_id=session.id, spoken=spoken)
    # No await since the ticket check: no other question can have started.
    entry.answer = answer
    entry.warm_options = asked_with  # the next warm-up (vidchat.conversation.prewarm) prepares for the same kind of question
    log.info(
        "session %s… question %d: %d frames as %s, %.1f s audio, prepared in %.1f ms",
        session.id[:6], ticket, len(sample.frames), options.frames_as,
        prepared.stats.audio_seconds, answer.prep_ms,
    )
    return answer


def prepare(engine: ChatEngine, entry: SessionRecord | SideSlot, sample: Sample, options: AnswerOptions, history: Sequence[Turn] = (),
            question: str = "", warmup: bool = False, spoken: bool = False) -> Prepared:
    """A sample and options as the engine's prompt, with the session's cache
    salt: the one rule for questions and their warm-ups (vidchat.conversation.prewarm),
    so a warm-up's prompt is exactly the question's minus the question."""
    return engine.prepare(
        question,
        sample.frames,
        sample.audio if options.include_audio or spoken else None,
        frame_times=sample.timestamps,
        history=history,
        system_prompt=options.system_prompt,
        frames_as=options.frames_as,
        max_tokens=options.max_tokens,
        temperature=options.temperature,
        seed=options.seed,
        cache_salt=entry.cache_salt,
        # Kept-frame numbers name the frames in vLLM's encoder cache, per session.
        frame_ids=[str(q) for q in sample.seqs] if len(sample.seqs) == len(sample.frames) else None,
        warmup=warmup,
        spoken=spoken,
        audio_parts=sample.audio_parts,
    )


def _with_question_audio(session: Session, audio: Any) -> tuple[Sample, Any]:
    """A sample for a question spoken in the query itself: frames over the
    audio's duration up to the newest media, and exactly that audio."""
    import numpy as np

    from vidchat.media import AUDIO_RATE
    from vidchat.media.vad import Utterance

    audio = np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
    end = session.newest_frame_time
    if end is None:
        end = time.monotonic()
    start = end - audio.size / AUDIO_RATE
    rms = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64)))) if audio.size else 0.0
    spoken = Utterance(start, end, 20.0 * math.log10(rms) if rms > 1e-9 else -120.0)
    sample = session.sample(span=(start, end))
    return dataclasses.replace(sample, audio=audio, audio_start=start, audio_end=end), spoken


def spoken_text(answer: Answer) -> str:
    """The question as later turns of the chat carry it: a spoken one can't
    be heard again, so it stands as a note of itself."""
    if answer.spoken is None:
        return answer.question.strip()
    return spoken_label(answer.spoken.seconds)


def spoken_label(seconds: float) -> str:
    return f"🎤 spoken question ({seconds:.1f} s)"


def frozen_sample(answer: Answer, frames: int | None = None) -> Sample:
    """An earlier answer's exact inputs, for asking again with other settings;
    `frames` takes that many of its frames, spread evenly (never new ones)."""
    original = answer.sample
    n = len(original.frames)
    if frames is None or frames >= n:
        picks = list(range(n))
    elif frames < 1:
        raise OptionError(f"frames per question must be at least 1, got {frames}")
    else:
        picks = uniform_indices(n, frames)
    return original.frames_at(picks)


def release(entry: SessionRecord | SideSlot, answer: Answer) -> None:
    """Mark an answer finished: its place and its slot are free. (What the
    chat keeps of it is the conversation's: Conversation._answered.)"""
    answer.free()
    if entry.answer is answer:
        entry.answer = None
        entry.answer_ended = time.monotonic()
