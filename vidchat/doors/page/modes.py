"""Watch (a standing question at scene changes, vidchat.conversation.watch) and Talk
(ask by voice, vidchat.conversation.talk) as the page's long-running events."""

from __future__ import annotations

import contextlib
import time
from typing import Any, AsyncIterator

import gradio as gr

from vidchat import conversation
from vidchat.conversation import talk
from vidchat.conversation.answer_path import OptionError
from vidchat.conversation.watch import SceneWatch
from vidchat.doors.page.answers import answer_stream, applied_request, positive_number, watch_switched
from vidchat.doors.page.view import notice
from vidchat.engine import NO_SPOKEN_QUESTIONS
from vidchat.media.vad import TurnSettings


# The page's labels of the boxes the refusals name (vidchat.doors.page.layout uses them).
WATCH_EVERY_LABEL = "At most every (s)"
TALK_SILENCE_LABEL = "Pause that ends a question (ms)"
TALK_MIN_SPEECH_LABEL = "Shortest question (ms)"


async def watch_loop(state, on: bool, question: str, every: Any, history: list[dict], sid: str,
                     *raw_settings: Any) -> AsyncIterator[tuple]:
    """While the Watch switch is on, ask `question` at each scene change (at
    most once every `every` seconds). A question typed meanwhile ends this
    loop (its answer owns the chat); the page restarts it after that answer.
    Called with ``on`` false (the switch unticked, or an API client), the
    running loop ends."""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    if not on:
        watch_switched(state, False, sid)
        return
    history = list(history or [])
    question = (question or "").strip() if isinstance(question, str) else ""
    problem = ("Watch mode needs a running source: press **Start camera** first." if entry is None else
               "Watch mode needs a standing question." if not question else None)
    if problem is None:
        try:
            watcher = SceneWatch(entry.session, positive_number(WATCH_EVERY_LABEL, every, "seconds", "Watch is off."))
        except ValueError as exc:
            problem = f"⚠ {exc}"
    if problem is None and not entry.session.settings.evs_enabled:
        problem = "Watch mode needs **Drop near-duplicate frames** on: the filter is what sees scene changes."
    if problem is not None:
        history.append(notice(problem))
        yield history, gr.skip(), gr.skip(), False  # refused: the box unticks, so ticking it again retries
        return
    entry.watch_epoch += 1
    epoch = entry.watch_epoch

    def stopped() -> bool:
        # Switched off, Stop pressed, a typed question, or the session ended
        # (the status line says why): each bumps the epoch or drops the entry.
        return entry.watch_epoch != epoch or state.registry.get(sid) is not entry

    entry.watch_running = epoch
    try:
        async with contextlib.aclosing(_watch_answers(state, entry, watcher, stopped, question, history,
                                                      raw_settings)) as answers:
            async for update in answers:
                yield update
    finally:
        if entry.watch_running == epoch:
            entry.watch_running = None


async def _watch_answers(state, entry, watcher: SceneWatch, stopped, question: str, history: list[dict],
                         raw_settings: tuple) -> AsyncIterator[tuple]:
    seen_clear = conversation.of(state, entry).generation
    async for t in conversation.of(state, entry).scene_changes(watcher, stopped):
        seen_clear = _follow_clear(state, entry, history, seen_clear)
        try:
            request = applied_request(state, entry, raw_settings)
        except ValueError as exc:
            history.append(notice(f"⚠ Watch stopped, settings not accepted: {exc}"))
            yield history, gr.skip(), gr.skip(), False
            return
        start = entry.session.timeline_start
        when = f" at {t - start:.1f} s" if t is not None and start is not None else ""
        if stopped():  # switched off while the settings were read
            return
        history.append(notice(f"👁 Scene changed{when}: asking the standing question."))
        history.append({"role": "user", "content": question})
        # Closed explicitly when watching stops mid-answer: its reply is
        # cancelled then, not whenever the generator happens to be collected.
        async with contextlib.aclosing(answer_stream(state, entry, question, request, history,
                                                     time.perf_counter(), chat_as_of=seen_clear)) as stream:
            async for update in stream:
                if stopped():
                    return
                yield (*update, gr.skip())


# ---------------------------------------------------------------------------
# Talk mode: ask by voice (vidchat.conversation.talk)
# ---------------------------------------------------------------------------

TALK_NEEDS_AUDIO = "Talk needs a model that hears: " + NO_SPOKEN_QUESTIONS.split(". ", 1)[1]


def _follow_clear(state, entry, history: list[dict], seen: int) -> int:
    """A loop's own copy of the chat empties when the page's chat was cleared
    since ``seen`` (the conversation's chat number); returns the number to compare with next time."""
    now = conversation.of(state, entry).generation
    if now != seen:
        history.clear()
    return now


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


async def talk_loop(state, on: bool, barge_in: bool, silence_ms: Any, min_speech_ms: Any, history: list[dict],
                    sid: str, *raw_settings: Any) -> AsyncIterator[tuple]:
    """While the Talk switch is on, ask each utterance the microphone hears,
    as it ends. The listener (with barge-in) runs for the session whether
    or not this loop does: a typed question ends the loop (its answer owns
    the chat), and the page restarts it after that answer."""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    if not on:
        if entry is not None:
            await talk.stop(entry)
        return
    history = list(history or [])
    problem = None
    if entry is None:
        problem = "Talk mode needs a running source with sound: press **Start camera** (with the microphone) first."
    elif state.engine is not None and not state.engine.accepts_audio:
        problem = f"⚠ {TALK_NEEDS_AUDIO}"
    if problem is None:
        try:
            settings = talk_settings(silence_ms, min_speech_ms)
        except OptionError as exc:
            problem = f"⚠ Talk not started: {exc}"
    if problem is not None:
        history.append(notice(problem))
        yield history, gr.skip(), gr.skip(), False  # refused: the box unticks, so ticking it again retries
        return
    listener = talk.listener(entry, settings, bool(barge_in), on_speech=talk.speech_warms(state, entry))
    entry.talk_epoch += 1
    epoch = entry.talk_epoch
    seen_clear = conversation.of(state, entry).generation
    def stale() -> bool:  # the session ended, a typed question took the chat, or Talk went off
        return state.registry.get(sid) is not entry or entry.talk_epoch != epoch or not listener.running

    # A stale loop never takes an utterance from the loop that owns the chat
    # now (it would cancel the live answer and then drop the question).
    async with contextlib.aclosing(conversation.of(state, entry).heard(listener, stale)) as heard:
        async for spoken in heard:
            seen_clear = _follow_clear(state, entry, history, seen_clear)
            try:
                request = applied_request(state, entry, raw_settings)
            except ValueError as exc:
                history.append(notice(f"⚠ Settings not accepted: {exc}"))
                yield history, gr.skip(), gr.skip(), gr.skip()
                continue
            entry.watch_epoch += 1  # a running watch loop yields the chat to the spoken question
            async for update in answer_stream(state, entry, "", request, history, time.perf_counter(),
                                              spoken=spoken, chat_as_of=seen_clear):
                if entry.talk_epoch != epoch:
                    return
                yield (*update, gr.skip())
