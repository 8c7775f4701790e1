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
from typing import Any, Callable, Sequence

from vidchat.conversation.answers import Answer, AnswerOptions, AnswerQueue, AnswerSlot
from vidchat.conversation.events import EventHub, SettingsChanged
from vidchat.conversation.memory import with_memory
from vidchat.engine.interface import SEED_RANGE, ChatEngine, EngineError, Prepared, Turn
from vidchat.media import FRAMES_AS
from vidchat.media.sampling import uniform_indices
from vidchat.media.scene_log import MemoryUse
from vidchat.media.session import (
    SESSION_SETTINGS,
    Sample,
    Session,
    SessionSettings,
    Setting,
    SettingValueError,
)

log = logging.getLogger(__name__)


# The one table of a question's settings: each sampling and answer field
# once, with its type, range, the page's label and the socket's names.
#
# Every door reads it: the socket's session.config/update
# (vidchat.doors.socket.config), the page's settings panel and /ask API
# (vidchat.doors.page.page_request), replay's ``--set`` and a bundle's manifest
# (vidchat.conversation.asking.checked_settings), and the checks of the settings themselves
# (SessionSettings.validate, answer_path.check_options). So a value is refused the
# same way, with the same reason, wherever it comes from; only the name in the
# message differs (the page's label on the page, the field's name elsewhere).
#
# The session's rows (how frames are kept and sampled) are
# vidchat.media.session, beside the media session that applies them;
# this module adds the answer's rows and the rules for settings given as data.

# vLLM's own limit (its SamplingParams refuse more): checked here, at every
# door, before anything is asked, instead of failing inside the engine.
MAX_TEMPERATURE = 2.0


def _table(*settings: Setting) -> dict[str, Setting]:
    return {s.name: s for s in settings}


SETTINGS: dict[str, Setting] = {**SESSION_SETTINGS, **_table(
    # How the model answers (vidchat.conversation.asking.AnswerOptions).
    Setting("frames_as", "answer", "choice", "Send frames as", "one of " + ", ".join(FRAMES_AS), choices=FRAMES_AS),
    Setting("max_tokens", "answer", "int", "Max tokens", "a whole number in 1..{high}", low=1),
    Setting("temperature", "answer", "number", "Temperature", f"a number in 0..{MAX_TEMPERATURE:g}",
            low=0.0, high=MAX_TEMPERATURE),
    Setting("include_audio", "answer", "bool", "Include audio", "true or false", aliases=("use_audio_in_video",)),
    Setting("seed", "answer", "int", "Seed", "a whole number that fits a signed 64-bit integer",
            low=SEED_RANGE[0], high=SEED_RANGE[1], nullable=True),
    Setting("system_prompt", "answer", "text", "System prompt", "text", origin="vllm-omni", nullable=True),
)}

# Where the model's context is not known (a bundle read without a model), max_tokens is only bounded by this.
UNBOUNDED_MAX_TOKENS = 1 << 20

# ---- what one question may carry, at every door ----
# A question's text and the chat history sent with it. Without a cap, a seed
# client's video.query could be as large as a WebSocket message (18 MB) and
# the page's history whatever its client posts; each question tokenizes all
# of it. The caps are far above any chat a model's context holds (the engine
# cuts history to fit): 64 K characters is ~16 K tokens, and 1 MiB of history
# is several hundred long answers.
MAX_QUESTION_CHARS = 64 * 1024

MAX_HISTORY_TURNS = 1024

MAX_HISTORY_CHARS = 1 << 20


def question_problem(question: str, history: Any = ()) -> SettingValueError | None:
    """Why a question (its text, and the history sent with it) is refused,
    naming the field ("question" or "history"); None when it is within the caps.
    ``history``: turns with a ``text`` (or role/content dicts)."""
    if isinstance(question, str) and len(question) > MAX_QUESTION_CHARS:
        return SettingValueError(f"question must be at most {MAX_QUESTION_CHARS} characters, "
                                 f"got {len(question)}", "question")
    turns = list(history or ())
    if len(turns) > MAX_HISTORY_TURNS:
        return SettingValueError(f"history must be at most {MAX_HISTORY_TURNS} turns, got {len(turns)}", "history")
    chars = sum(len(_turn_text(turn)) for turn in turns)
    if chars > MAX_HISTORY_CHARS:
        return SettingValueError(f"history must be at most {MAX_HISTORY_CHARS} characters in all, got {chars}",
                                 "history")
    return None


def _turn_text(turn: Any) -> str:
    text = turn.get("content", "") if isinstance(turn, dict) else getattr(turn, "text", "")
    return text if isinstance(text, str) else str(text)


def check_all(target: str, values: Any, high: dict[str, float] | None = None) -> None:
    """Check every field of ``target`` ("session" or "answer") that ``values``
    (a SessionSettings or AnswerOptions) has; ValueError names the first bad one."""
    for setting in SETTINGS.values():
        if setting.target == target and hasattr(values, setting.name):
            setting.check(getattr(values, setting.name), high=(high or {}).get(setting.name))


def current_values(settings: Any, options: Any) -> dict[str, Any]:
    """Every field's value now, by its name: from ``settings`` (a
    SessionSettings) or ``options`` (an AnswerOptions), as a door reports
    the effective session (the seed's session.updated, the Realtime API's
    session.vidchat)."""
    return {name: getattr(settings if spec.target == "session" else options, name) for name, spec in SETTINGS.items()}


# Upstream's later names for the seed's fields (use_audio_in_video is
# vllm-omni's name for what vidchat calls include_audio).
ALIASES = {alias: name for name, spec in SETTINGS.items() for alias in spec.aliases}


class SettingTypeError(ValueError):
    """A value of the wrong JSON type or outside a field's choices; the message names the key as sent."""


def type_name(kinds: tuple[type, ...], nullable: bool) -> str:
    return "/".join([k.__name__ for k in kinds] + (["null"] if nullable else []))


def check_json_type(key: str, value: Any, kinds: tuple[type, ...], nullable: bool = False,
                    choices: tuple[str, ...] = ()) -> None:
    if value is None and nullable:
        return
    # JSON true/false are Python bools, which isinstance() also counts as ints.
    ok = isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))
    if not ok:
        raise SettingTypeError(f"Invalid type for '{key}': expected {type_name(kinds, nullable)}, "
                               f"got {type(value).__name__}")
    if choices and value not in choices:
        raise SettingTypeError(f"Invalid value for '{key}': expected one of {', '.join(choices)}, got {value!r}")


def read_settings(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The table's fields among ``values`` (by name or alias), type-checked,
    grouped by target: {"session": {...}, "answer": {...}}. Unknown keys are
    ignored; ranges are checked later, where every door checks them
    (SessionSettings.validate, answer_path.check_options). Raises SettingTypeError."""
    named: dict[str, Any] = {}
    for key, value in values.items():
        name = ALIASES.get(key, key)
        spec = SETTINGS.get(name)
        if spec is None:
            continue
        check_json_type(key, value, spec.json_kinds(), spec.nullable, spec.choices)
        if name in named and named[name] != value:
            other = name if key != name else next(a for a, n in ALIASES.items() if n == name and a in values)
            raise SettingTypeError(f"'{key}' and '{other}' are the same setting but have different values; send one")
        named[name] = value
    out: dict[str, dict[str, Any]] = {"session": {}, "answer": {}}
    for name, value in named.items():
        out[SETTINGS[name].target][name] = value
    if "system_prompt" in out["answer"]:
        out["answer"]["system_prompt"] = out["answer"]["system_prompt"] or None  # "" = no system prompt
    return out


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


async def ask(
    engine: ChatEngine,
    entry: AnswerSlot,
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
    memory: MemoryUse | None = None,
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
    (and audio) alone instead of raising NoFrames (the Realtime API allows it).
    ``memory``: what the question gets of its session's memory
    (vidchat.conversation.memory), its block before the question and its
    keyframes before the sampled frames."""
    t0 = time.perf_counter()
    check_question(question, history)  # before the running answer is cancelled: a refusal changes nothing
    session = entry.session
    if question_audio is not None:
        sample, spoken = _with_question_audio(session, question_audio)
    if sample is None:
        sample = session.sample(span=None if spoken is None else (spoken.start, spoken.end))
    if not sample.frames and not frames_optional:
        raise NoFrames()
    if memory is not None and memory.frames and options.frames_as == "images":
        # The keyframes asked about come first: the oldest live frames make room for them.
        excess = len(sample.frames) + len(memory.frames) - engine.options.max_images
        if excess > 0:
            sample = sample.frames_at(list(range(min(excess, len(sample.frames) - 1), len(sample.frames))))
    asked_with = options  # what the next warm-up prepares for (a drawn seed changes no prompt)
    if options.seed is None:
        # The seed it actually uses, drawn here and recorded with the answer,
        # so a sampled answer replays exactly from its record or bundle.
        options = options.updated(seed=secrets.randbits(63))
    prepared = await asyncio.to_thread(prepare, engine, entry, sample, options, history, question,
                                       spoken=spoken is not None, memory=memory)
    if entry.closed:
        raise Superseded("The session closed before this question started.")
    if not current():
        raise Superseded("A newer question replaced this one.")
    answer = Answer(question, engine.submit(prepared), sample, options, prompt_text=prepared.prompt_text,
                    ticket=ticket, prep_ms=(time.perf_counter() - t0) * 1000, video_fps=prepared.video_fps,
                    queue=queue, history=tuple(history), session_id=session.id, spoken=spoken, memory=memory)
    # No await since the ticket check: no other question can have started.
    entry.answer = answer
    # The next warm-up (vidchat.conversation.warmup) prepares for the same kind of question.
    entry.warm_options = asked_with
    log.info(
        "session %s… question %d: %d frames as %s, %.1f s audio, prepared in %.1f ms",
        session.id[:6], ticket, len(sample.frames), options.frames_as,
        prepared.stats.audio_seconds, answer.prep_ms,
    )
    return answer


def prepare(engine: ChatEngine, entry: AnswerSlot, sample: Sample, options: AnswerOptions,
            history: Sequence[Turn] = (), question: str = "", warmup: bool = False, spoken: bool = False,
            memory: MemoryUse | None = None) -> Prepared:
    """A sample and options as the engine's prompt, with the session's cache
    salt: the one rule for questions and their warm-ups (vidchat.conversation.warmup),
    so a warm-up's prompt is exactly the question's minus the question.
    ``memory``: its block goes before the question, its keyframes before the
    sampled frames (as images; a video's frames stay the live ones)."""
    frame_ids = [str(q) for q in sample.seqs] if len(sample.seqs) == len(sample.frames) else None
    frames, times = list(sample.frames), list(sample.timestamps)
    if memory is not None and memory.frames and options.frames_as == "images" and not warmup:
        frames = [f.pixels for f in memory.frames] + frames
        times = [f.t for f in memory.frames] + times
        frame_ids = None if frame_ids is None else memory.frame_ids() + frame_ids
    return engine.prepare(
        with_memory(question, memory),
        frames,
        sample.audio if options.include_audio or spoken else None,
        frame_times=times,
        history=history,
        system_prompt=options.system_prompt,
        frames_as=options.frames_as,
        max_tokens=options.max_tokens,
        temperature=options.temperature,
        seed=options.seed,
        cache_salt=entry.cache_salt,
        # Kept-frame numbers name the frames in vLLM's encoder cache, per session.
        frame_ids=frame_ids,
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


def release(entry: AnswerSlot, answer: Answer) -> None:
    """Mark an answer finished: its place and its slot are free. (What the
    chat keeps of it is the conversation's: Conversation._answered.)"""
    answer.free()
    if entry.answer is answer:
        entry.answer = None
        entry.answer_ended = time.monotonic()
