"""The page's questions: its settings read through the one settings table,
and the question asked of the conversation, which runs its answer. A typed
question is one request (POST /webrtc/ask: :func:`ask_typed`), which
applies its settings and returns its ticket; the chat shows it from the
session's events (vidchat.doors.page.chat). Stop and Clear chat; re-asks
beside the chat; Watch and Talk switched from the page.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
from pathlib import Path
from typing import Any, AsyncIterator

import gradio as gr

from vidchat.conversation import asking, bundles, events, modes, runs
from vidchat.conversation.asking import SETTINGS, UNBOUNDED_MAX_TOKENS, OptionError
from vidchat.conversation.conversation import Conversation
from vidchat.conversation.events import AnswerEvent, Closed, Notice, QuestionRefused
from vidchat.conversation.runs import CANCELLED, Delta, Done, Started
from vidchat.doors import PageServer, as_text
from vidchat.doors.page.chat import (
    NOT_RUNNING,
    ChatTranscript,
    Redraws,
    _short,
    compare_html,
    exchange_updates,
    frames_html,
    model_label,
    notice,
    second_model_label,
)
from vidchat.engine import NO_SPOKEN_QUESTIONS, EngineError
from vidchat.media import evs, is_number
from vidchat.media.frame_buffer import DEFAULT_SCENE_CHANGE_SHARE
from vidchat.media.session import Session
from vidchat.media.vad import TurnSettings

log = logging.getLogger(__name__)


def typed(value: Any) -> str:
    """What a page number box held, as its user would say it."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return "the box is empty or not a number"
    return f"you typed {value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else f"you typed {value!r}"


def positive_number(label: str, value: Any, unit: str, then: str) -> float:
    """A page number box that must hold a number above 0; else OptionError
    in the user's words: the box's label, what it takes, what it held, and
    what happens now (``then``)."""
    if not is_number(value) or not value > 0:
        raise OptionError(f"{label}: enter {unit} above 0 ({typed(value)}); {then}")
    return float(value)


def _seed(value: Any) -> int | None:
    """The page's Seed box: text; empty is a random seed."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    text = value.strip() if isinstance(value, str) else value
    try:
        return SETTINGS["seed"].from_page(int(text) if isinstance(text, str) else text)
    except ValueError as exc:
        if isinstance(text, str) and not text.lstrip("+-").isdigit():
            raise OptionError(f"Seed must be a whole number (or empty for a random one), got {value!r}") from None
        raise OptionError(str(exc)) from None


@dataclasses.dataclass
class PageRequest:
    """The chat panel's settings for one question, as the session and the answer path take them."""

    sampling: dict[str, Any]
    options: asking.AnswerOptions
    record: bool = False  # save the answer as a bundle under --record-dir


def page_request(state, k, sampling, seconds, evs_on, threshold, max_frames, frames_as, audio_on,
                 max_tokens, temperature, seed, record=False, system_prompt=None,
                 scene_change_share=None) -> PageRequest:
    """Turn the page's (or the public /ask API's) raw values into settings;
    raises OptionError naming the field, so the chat can say what to fix.
    (The ones after ``seed`` may be left out by an API caller: their defaults.)"""
    raw = dict(num_sample_frames=k, sampling=sampling, sample_seconds=seconds, evs_enabled=evs_on,
               evs_threshold=threshold, max_frames=max_frames, frames_as=frames_as, include_audio=audio_on,
               max_tokens=max_tokens, temperature=temperature)
    if scene_change_share is not None:
        raw["scene_change_share"] = scene_change_share
    engine = getattr(state, "engine", None)  # None while the model loads
    high = {"max_tokens": engine.options.max_model_len if engine is not None else UNBOUNDED_MAX_TOKENS}
    values = {}
    try:
        for name, value in raw.items():  # each read and checked by the one settings table
            values[name] = SETTINGS[name].from_page(value, high=high.get(name))
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    sampling_changes = {name: v for name, v in values.items() if SETTINGS[name].target == "session"}
    options = state.answer_defaults().updated(
        seed=_seed(seed), **{name: v for name, v in values.items() if SETTINGS[name].target == "answer"})
    if isinstance(system_prompt, str):  # None (an API caller that leaves it out): the server's default
        options = options.updated(system_prompt=system_prompt.strip() or None)
    return PageRequest(sampling_changes, options, record=bool(record))


def applied_request(state, entry, raw_settings: tuple) -> PageRequest:
    """The page's settings, applied to the session's sampling (raises
    ValueError naming the field, and then changes nothing)."""
    request = page_request(state, *raw_settings)
    asking.apply_settings(entry.session, state.engine, request.options, request.sampling, entry.event_hub)
    return request


# The page's settings, by the settings table's names, in page_request's
# order (the page's POST /webrtc/ask sends them so; the Gradio events take
# them as these inputs, vidchat.doors.page.layout).
PAGE_SETTINGS = ("num_sample_frames", "sampling", "sample_seconds", "evs_enabled", "evs_threshold", "max_frames",
                 "frames_as", "include_audio", "max_tokens", "temperature", "seed", "record", "system_prompt",
                 "scene_change_share")


def page_defaults(state: PageServer) -> dict[str, Any]:
    """The page's settings as a tab opens: its controls' values
    (vidchat.doors.page.layout), and what a question that leaves one out is asked with."""
    s = state.settings
    return {"num_sample_frames": min(s.frames_per_question, max(1, s.max_images)), "sampling": s.sampling,
            "sample_seconds": 10, "evs_enabled": True, "evs_threshold": evs.DEFAULT_THRESHOLD, "max_frames": 64,
            "frames_as": s.frames_as, "include_audio": True, "max_tokens": s.max_tokens,
            "temperature": s.temperature, "seed": "", "record": runs.records_by_default(s),
            "system_prompt": s.system_prompt, "scene_change_share": DEFAULT_SCENE_CHANGE_SHARE}


def sent_settings(state: PageServer, sent: Any) -> tuple[Any, ...]:
    """The settings a page's question carries (name -> value, as its
    controls hold them), in page_request's order; one left out is the
    page's default. The Sampling picker's label stands for its strategy."""
    sent = sent if isinstance(sent, dict) else {}
    defaults = page_defaults(state)
    values = [sent.get(name, defaults[name]) for name in PAGE_SETTINGS]
    by_label = dict(SETTINGS["sampling"].page_choices())
    at = PAGE_SETTINGS.index("sampling")
    values[at] = by_label.get(values[at], values[at]) if isinstance(values[at], str) else values[at]
    return tuple(values)


def _submit(entry: Conversation, text: str, request: PageRequest) -> int:
    """Ask a typed question of the conversation, with the options its settings say."""
    entry.typed_question_at = time.monotonic()
    return entry.submit(text, request.options, record=request.record)


async def ask_typed(state: PageServer, entry: Conversation, message: Any, settings: Any) -> dict[str, Any]:
    """The page's typed question (POST /webrtc/ask): its settings read and
    applied to the session now, then asked of the conversation. Returns
    ``{"ticket": n}`` (its outcome comes as the session's events, which the
    chat panel draws), or ``{"refused": why}`` when its settings were not
    accepted (the chat says so too). Raises ValueError for no question."""
    text = message.strip() if isinstance(message, str) else ""
    if not text:
        raise ValueError("'question' must be non-empty text")
    if settings is not None and not isinstance(settings, dict):
        raise ValueError("'settings' must be an object of the page's settings by name")
    unknown = sorted(set(settings or {}) - set(PAGE_SETTINGS))
    if unknown:  # a misspelt name would otherwise be asked with its default, without a word
        raise ValueError(f"unknown setting(s) {', '.join(unknown)}: the page's are {', '.join(PAGE_SETTINGS)}")
    events.bind(entry.session.id, entry.kind)
    try:
        request = applied_request(state, entry, sent_settings(state, settings))
    except ValueError as exc:
        why = f"Settings not accepted: {exc}"
        entry.event_hub.publish(Notice(f"⚠ {why}"))
        return {"refused": why}
    event_start = time.perf_counter()
    subscription = entry.event_hub.subscribe()  # before it is asked: its first events are not missed
    ticket = _submit(entry, text, request)
    task = asyncio.ensure_future(_log_latency(subscription, ticket, event_start))
    _timing.add(task)
    task.add_done_callback(_timing.discard)
    return {"ticket": ticket}


# The latency loggers of questions still being answered (held so they are not collected).
_timing: set[asyncio.Task[None]] = set()


async def _log_latency(subscription: Any, ticket: int, event_start: float) -> None:
    """Log the server's share of a question's latency, until its answer
    ends or it is refused (bench/page.py reads these lines)."""
    answer = None
    first_token = True
    with subscription:
        while True:
            event = await subscription.get()
            if isinstance(event, Closed) or isinstance(event, QuestionRefused) and event.ticket == ticket:
                return
            if not isinstance(event, AnswerEvent) or event.side or event.ticket != ticket:
                continue
            inner = event.event
            if isinstance(inner, Started):
                answer = inner.answer
                log.info("chat event -> engine call: %.2f ms", (time.perf_counter() - event_start) * 1000)
            elif isinstance(inner, Delta) and first_token and answer is not None:
                first_token = False
                stats = answer.reply.stats
                since = time.perf_counter() - event_start
                # The event's wall-clock time lets a browser on this machine split
                # its own Enter -> first token into before/after the server.
                log.info("chat event -> first token: %.1f ms (%d of %d prompt tokens from the cache; %d of %d "
                         "frames new; event at %.3f)", since * 1000, stats.cached_tokens, stats.prompt_tokens,
                         answer.sample.new_frames, len(answer.sample.frames), time.time() - since)
            elif isinstance(inner, Done):
                return


async def respond(state, message: Any, history: list[dict], sid: str, *raw_settings: Any) -> AsyncIterator[tuple]:
    """The public /ask API: one question, its part of the chat streamed after
    the caller's ``history`` (the caller's picture of the chat: the model's
    context is the conversation's own), the last message the whole reply."""
    text = message.strip() if isinstance(message, str) else ""
    history = list(history or [])
    if not text:
        yield history, frames_html(None), None
        return
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    if entry is None:
        yield [*history, {"role": "user", "content": text}, notice(NOT_RUNNING)], frames_html(None), None
        return
    events.bind(entry.session.id, entry.kind)
    try:
        request = applied_request(state, entry, raw_settings)
    except ValueError as exc:
        yield ([*history, {"role": "user", "content": text}, notice(f"⚠ Settings not accepted: {exc}")],
               frames_html(None), None)
        return
    async for update in exchange_updates(state, entry, history, lambda: _submit(entry, text, request)):
        yield update


async def clear_chat(state, sid: str | None) -> None:
    """Clear chat: the conversation's chat goes (and its answer stops); the
    tab's chat empties as the conversation says so. Watch and Talk go on."""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    if entry is not None:
        entry.clear()


async def stop_answer(state, sid: str | None) -> None:
    """Stop: the running answer ends, a question not started ends stopped,
    and watching ends (the page unticks Watch)."""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    if entry is not None:
        await entry.stop()


# Re-ask and compare on the page: an earlier answer's exact inputs (the
# session's kept answers, or a bundle loaded into the tab) asked again with
# other settings, or on the second model, beside the chat.

# A tab holds one loaded bundle; loading another replaces it. (It held 8,
# each up to 512 MB decoded plus its audio, and an API client can open tabs
# at will.) Its frames stay PNG bytes until re-asked (recording.LazyFrames).
MAX_LOADED_BUNDLES = 1

MAX_BUNDLE_BYTES = 256 << 20  # a bundle of 64 frames at 1280×720 is ~100 MB of PNG


class TabBundles(dict):
    """A tab's loaded bundle by answer id, and ``slot``: where all the tab's
    re-asks run while it has no session, kept across loads, so a re-ask
    replaces the tab's running one and a tab holds one answer place at most
    (a fresh slot per call let one tab take every --max-concurrent-answers place)."""

    def __init__(self, *args: Any, slot: Conversation | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slot = slot


def _tab_slot(state: PageServer, loaded: dict | None) -> Conversation:
    """The entry a tab's re-asks run on when it has no session (see TabBundles)."""
    slot = getattr(loaded, "slot", None)
    if slot is None:
        # Outside the registry (it holds no media), with its own cache salt.
        slot = Conversation(Session("bundle-" + secrets.token_urlsafe(9)), kind="bundle", host=state)
        if isinstance(loaded, TabBundles):
            loaded.slot = slot
    return slot


def _audio_cap(state: PageServer) -> float:
    """Most seconds of audio a loaded bundle may hold: the socket doors' --ws-max-audio-seconds."""
    return getattr(getattr(state, "settings", None), "ws_max_audio_seconds", bundles.MAX_AUDIO_SECONDS)


def reask_choices(state, sid: str, loaded: dict | None = None) -> list[tuple[str, str]]:
    """The answers of the session's chat (not of a cleared one), newest
    first, then bundles loaded into this tab, as (label, answer id). A label
    starts with when the question was asked, on the session's timeline
    (seconds since its first media, as the frames' captions), so the same
    question asked twice reads as two even where a phone cuts the label short."""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    out = []
    if entry is not None:
        start = entry.session.timeline_start
        for n, (answer_id, answer) in enumerate(runs.chat_answers(entry)):
            when = [] if start is None else [f"at {answer.asked_at - start:.1f} s"]
            head = ", ".join((["latest"] if n == 0 else []) + when)
            # Each names its model: Both models' two answers to one question are two entries.
            out.append((f"{head + ': ' if head else ''}{_short(answer.question)} ({answer.model_name}, "
                        f"{len(answer.sample.frames)} frames, T={answer.options.temperature:g})", answer_id))
    return out + bundle_choices(loaded)


def bundle_choices(loaded: dict | None) -> list[tuple[str, str]]:
    """The bundles loaded into this tab, newest first, as (label, answer id)."""
    return [(f"bundle: {_short(answer.question)} ({len(answer.sample.frames)} frames, {answer.bundle_name})",
             answer_id) for answer_id, answer in reversed((loaded or {}).items())]


def reask_engines(state) -> list[tuple[str, str]]:
    """The models a re-ask can go to, as (label, value) for the page's radio."""
    out = [(f"{model_label(state)} (this server's model)", "main")]
    if state.compare_model_path:
        out.append((f"{second_model_label(state)} (--compare-model)", "compare"))
    return out


async def _reask_engine(state, which: str):
    if which == "compare":
        ready, reason = state.compare_readiness()
        if not ready:
            raise EngineError(reason)
        return state.compare_engine
    return await state.wait_engine(timeout=0)


async def load_bundle(state, path: Any, loaded: dict | None) -> tuple[dict, list[tuple[str, str]], str, str]:
    """Read an uploaded bundle zip into this tab, in place of the one it held:
    (loaded, its choice list, the id to select, a message). The upload is
    deleted once read."""
    loaded = TabBundles(loaded or {}, slot=getattr(loaded, "slot", None))
    if not path:
        return loaded, [], "", ""
    path = str(getattr(path, "path", path))
    try:
        size = Path(path).stat().st_size
        if size > MAX_BUNDLE_BYTES:
            raise bundles.BundleError(f"the file is {size / 2**20:.0f} MiB; a bundle may be at most "
                                        f"{MAX_BUNDLE_BYTES >> 20} MiB")
        bundle = await asyncio.to_thread(bundles.read_bundle, path, lazy=True,
                                         max_audio_seconds=_audio_cap(state))
        intact = await asyncio.to_thread(lambda: bundle.digest() == bundle.inputs_sha256)
    except (bundles.BundleError, OSError) as exc:
        return loaded, [], "", f"<p class='vc-note'>⚠ Not a bundle vidchat can read: {as_text(str(exc))}</p>"
    finally:
        try:  # Gradio kept the upload on disk; nothing of it stays once read
            Path(path).unlink()
        except OSError:
            pass
    answer = bundles.recorded_answer(bundle)
    answer_id = "bundle-" + secrets.token_urlsafe(12)
    loaded[answer_id] = answer
    while len(loaded) > MAX_LOADED_BUNDLES:  # the one loaded before goes (a re-ask of it running ends on its own)
        loaded.pop(next(iter(loaded)))
    warn = ("" if intact else " Its frames and audio do not hash to the inputs_sha256 it records: the files were "
            "changed after recording.")
    # Only what this page offers: a model to choose only when a second one is served.
    choose = ("Choose the model, change Settings above if you like" if state.compare_model_path else
              "Change Settings above if you like")
    # In a worker: its record reads every frame's size, which decodes the lazy frames.
    message = await asyncio.to_thread(
        compare_html, answer, None, "", f"Loaded the bundle ({len(answer.sample.frames)} frames"
        f"{', audio' if answer.sample.audio is not None else ''}). {choose}, then press "
        "“Re-ask with these settings”." + warn)
    return loaded, [], answer_id, message


async def reask(state, sid: str, answer_id: str, *raw_settings: Any, engine_choice: str = "main",
                loaded: dict | None = None) -> AsyncIterator[str]:
    """Ask an earlier answer's (or a loaded bundle's) question again on its
    exact frames, audio and history, with the page's current settings and
    the chosen model; yields the comparison."""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    original = None
    if isinstance(answer_id, str):
        original = (entry.answers.get(answer_id) if entry is not None else None) or (loaded or {}).get(answer_id)
    if original is None:
        yield ("<p class='vc-note'>Pick an answer of this session (answers are kept while the session runs) or "
               "load a recorded bundle to re-ask.</p>")
        return
    try:
        engine = await _reask_engine(state, engine_choice if engine_choice in ("main", "compare") else "main")
    except EngineError as exc:
        yield f"<p class='vc-note'>⚠ {as_text(str(exc))}</p>"
        return
    # A loaded bundle's frames, decoded for this re-ask (its comparison reads each frame's size at every update).
    original = await asyncio.to_thread(bundles.with_frames_decoded, original)
    try:
        request = page_request(state, *raw_settings)
        asking.check_options(request.options, engine)
        wanted = request.sampling["num_sample_frames"]
        sample = asking.frozen_sample(original, wanted)
    except ValueError as exc:
        yield f"<p class='vc-note'>⚠ Settings not accepted: {as_text(str(exc))}</p>"
        return
    note = (f"The original had {len(original.sample.frames)} frames; all of them are used."
            if wanted > len(original.sample.frames) else "")
    if entry is None:
        # A bundle re-asked before any source started: the tab's own slot,
        # which each of its re-asks shares (one answer place per tab).
        entry = _tab_slot(state, loaded)
    heading = "Re-asked" if engine is state.engine else "Re-asked on the second model"
    try:
        run = await entry.reask(original, request.options, sample, engine=engine)
    except asking.Superseded:
        return
    except EngineError as exc:
        yield f"<p class='vc-note'>⚠ {as_text(str(exc))}</p>"
        return
    yield compare_html(original, None, "", note, heading)
    async with contextlib.aclosing(run.events()) as events:
        async for event in events:
            if isinstance(event, Delta):
                yield compare_html(original, None, run.answer.reply.text, note, heading)
            elif isinstance(event, Done):
                if not event.current:
                    return  # a newer re-ask of this tab replaced it: the comparison is that one's now
                if event.error:
                    note = f"⚠ {event.error}"
                elif event.status == CANCELLED:
                    note = "Stopped."
                yield compare_html(original, event.answer, event.text, note, heading)


# Watch (a standing question at scene changes, vidchat.conversation.modes) and Talk
# (ask by voice, vidchat.conversation.modes) switched on and off from the page:
# each runs as a task of the session's conversation (vidchat.conversation.modes),
# and the chat shows what they ask from the session's events. The /watch and
# /talk API events stream that part of the chat to an API caller.

# The page's labels of the boxes the refusals name (vidchat.doors.page.layout uses them).
WATCH_EVERY_LABEL = "At most every (s)"

TALK_SILENCE_LABEL = "Pause that ends a question (ms)"

TALK_MIN_SPEECH_LABEL = "Shortest question (ms)"


def _said(entry: Any, text: str) -> Any:
    """A refusal: into the session's chat when there is one, else under the question box."""
    if entry is None:
        return gr.update(value=text, visible=True)
    entry.event_hub.publish(Notice(text))
    return gr.skip()


def _mode_options(state, entry, raw_settings: tuple):
    """A mode's questions ask with the page's settings as they were last
    applied (by this switch or a typed question since): the session's sampling
    settings are the session's; these are the answer options."""
    entry.warm_options = applied_request(state, entry, raw_settings).options
    return lambda: entry.warm_options or state.answer_defaults()


async def watch_switch(state, on: bool, question: Any, every: Any, sid: str | None, *raw_settings: Any) -> tuple:
    """Watch ticked or unticked: returns (the box, the note under the question box)."""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    if not on:
        if entry is not None:
            entry.modes.stop_watching()
        return gr.skip(), gr.skip()
    question = question.strip() if isinstance(question, str) else ""
    problem = ("Watch mode needs a running source: press **Start camera** first." if entry is None else
               "Watch mode needs a standing question." if not question else None)
    every_s = 0.0
    if problem is None:
        try:
            every_s = positive_number(WATCH_EVERY_LABEL, every, "seconds", "Watch is off.")
        except ValueError as exc:
            problem = f"⚠ {exc}"
    if problem is None and not entry.session.settings.evs_enabled:
        problem = "Watch mode needs **Drop near-duplicate frames** on: the filter is what sees scene changes."
    if problem is None:
        try:
            options = _mode_options(state, entry, raw_settings)
        except ValueError as exc:
            problem = f"⚠ Watch not started, settings not accepted: {exc}"
    if problem is not None:
        return False, _said(entry, problem)  # refused: the box unticks, so ticking it again retries
    entry.modes.watch(question, every_s, options)
    return gr.skip(), gr.update(value="", visible=False)


TALK_NEEDS_AUDIO = "Talk needs a model that hears: " + NO_SPOKEN_QUESTIONS.split(". ", 1)[1]


async def both_switch(state, on: bool, sid: str | None) -> tuple:
    """Both models ticked or unticked: returns (the box, the note under the question box)."""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    if not on:
        if entry is not None:
            entry.both_models = False
        return gr.skip(), gr.skip()
    problem = ("Both models needs a second model: start vidchat with `--compare-model MODEL`."
               if not state.compare_model_path else
               "Both models needs a running source: press **Start camera** first." if entry is None else None)
    if problem is not None:
        return False, _said(entry, problem)
    entry.both_models = True
    ready, reason = state.compare_readiness()
    if not ready:  # kept on: the second model answers once it is ready
        entry.event_hub.publish(Notice(f"Both models: {reason}"))
    return gr.skip(), gr.skip()


def talk_settings(silence_ms: Any, min_speech_ms: Any) -> TurnSettings:
    settings = TurnSettings(
        min_silence_s=positive_number(TALK_SILENCE_LABEL, silence_ms, "milliseconds", "Talk is off.") / 1000,
        min_speech_s=positive_number(TALK_MIN_SPEECH_LABEL, min_speech_ms, "milliseconds", "Talk is off.") / 1000)
    try:
        settings.validate()
    except ValueError as exc:
        raise OptionError(str(exc).replace("min_silence_s", "the pause that ends a question")
                          .replace("min_speech_s", "the shortest question")) from None
    return settings


async def talk_switch(state, on: bool, barge_in: bool, silence_ms: Any, min_speech_ms: Any, sid: str | None,
                      *raw_settings: Any) -> tuple:
    """Talk ticked, unticked or its settings changed: returns (the box, the
    note under the question box). The listener (with barge-in) runs for the
    session; each utterance it hears is asked as it ends."""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    if not on:
        if entry is not None:
            await entry.modes.stop_talking()
        return gr.skip(), gr.skip()
    problem = None
    if entry is None:
        problem = "Talk mode needs a running source with sound: press **Start camera** (with the microphone) first."
    elif state.engine is not None and not state.engine.accepts_audio:
        problem = f"⚠ {TALK_NEEDS_AUDIO}"
    if problem is None:
        try:
            settings = talk_settings(silence_ms, min_speech_ms)
            options = _mode_options(state, entry, raw_settings)
        except ValueError as exc:
            problem = f"⚠ Talk not started: {exc}"
    if problem is not None:
        return False, _said(entry, problem)  # refused: the box unticks, so ticking it again retries
    entry.modes.talk(settings, bool(barge_in), options,
                                             on_speech=modes.speech_warms(state, entry))
    return gr.skip(), gr.update(value="", visible=False)


async def mode_updates(state, sid: str | None, history: list[dict], switched: tuple, running) -> AsyncIterator[tuple]:
    """An API caller's /watch or /talk: the switch's outcome, then the chat
    after ``history`` as the mode asks and the model answers, until the mode
    ends (switched off, Stop, the session's end). Yields (chat, what the
    model got, details, the box)."""
    box, note = switched
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    history = list(history or [])
    if box is False:
        said = note.get("value") if isinstance(note, dict) else None
        yield [*history, notice(said)] if said else history, frames_html(None), None, False
        return
    if entry is None or not running(entry.modes):
        return
    modes = entry.modes
    with entry.event_hub.subscribe() as subscription:
        transcript = ChatTranscript(state, entry, history)
        redraws = Redraws(transcript, subscription, until=lambda: not running(modes))
        while await redraws.next() is not None:  # the views whole each time (see chat.exchange_updates)
            yield transcript.messages(), *(await transcript.views()), gr.skip()
