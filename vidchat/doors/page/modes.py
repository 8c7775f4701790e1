"""Watch (a standing question at scene changes, vidchat.conversation.watch) and Talk
(ask by voice, vidchat.conversation.talk) switched on and off from the page:
each runs as a task of the session's conversation (vidchat.conversation.modes),
and the chat shows what they ask from the session's events. The /watch and
/talk API events stream that part of the chat to an API caller."""

from __future__ import annotations

from typing import Any, AsyncIterator

import gradio as gr

from vidchat import conversation
from vidchat.conversation import talk
from vidchat.conversation.answer_path import OptionError
from vidchat.conversation.session_events import Notice
from vidchat.doors.page.answers import applied_request, positive_number
from vidchat.doors.page.chat_feed import ChatTranscript, Redraws
from vidchat.doors.page.view import notice
from vidchat.engine import NO_SPOKEN_QUESTIONS
from vidchat.media.vad import TurnSettings


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


def _options(state, entry, raw_settings: tuple):
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
            options = _options(state, entry, raw_settings)
        except ValueError as exc:
            problem = f"⚠ Watch not started, settings not accepted: {exc}"
    if problem is not None:
        return False, _said(entry, problem)  # refused: the box unticks, so ticking it again retries
    entry.modes.watch(question, every_s, options)
    return gr.skip(), gr.update(value="", visible=False)


# ---------------------------------------------------------------------------
# Talk mode: ask by voice (vidchat.conversation.talk)
# ---------------------------------------------------------------------------

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
            options = _options(state, entry, raw_settings)
        except ValueError as exc:
            problem = f"⚠ Talk not started: {exc}"
    if problem is not None:
        return False, _said(entry, problem)  # refused: the box unticks, so ticking it again retries
    entry.modes.talk(settings, bool(barge_in), options,
                                             on_speech=talk.speech_warms(state, entry))
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
        yield [*history, notice(said)] if said else history, gr.skip(), gr.skip(), False
        return
    if entry is None or not running(entry.modes):
        return
    modes = entry.modes
    with entry.event_hub.subscribe() as subscription:
        transcript = ChatTranscript(state, entry, history)
        redraws = Redraws(transcript, subscription, until=lambda: not running(modes))
        while (views_changed := await redraws.next()) is not None:
            views = await transcript.views() if views_changed else (gr.skip(), gr.skip())
            yield transcript.messages(), *views, gr.skip()
