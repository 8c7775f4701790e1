"""The page's questions: its settings read through the one settings table,
asked through the conversation, streamed into the chat; Stop and Clear chat.
(Re-asks beside the chat: vidchat.doors.page.reask.)"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any, AsyncIterator

import gradio as gr

from vidchat import conversation
from vidchat.conversation import CANCELLED, Delta, Done, Queued, Started, answer_path, kept, log_context
from vidchat.conversation.answer_path import OptionError
from vidchat.conversation.settings_table import SETTINGS, UNBOUNDED_MAX_TOKENS
from vidchat.engine import EngineError
from vidchat.media.numbers import is_number
from vidchat.doors.page.view import (
    NOT_RUNNING, NO_TEXT, SPOKEN, STOPPED, fold_message, frames_html, is_notice, mark_stopped, notice,
    spoken_bubble, waiting_text,
)

log = logging.getLogger(__name__)

# What a question before any frame should have done, as the page's user acts on it.
NO_FRAMES_HINT = "Wait a moment after **Start camera**, then ask again."
CLEAR_WAIT_S = 5.0  # at most this long for answers streaming into a chat being cleared to stop


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
    options: answer_path.AnswerOptions
    record: bool = False  # save the answer as a bundle under --record-dir


def page_request(state, k, sampling, seconds, evs_on, threshold, max_frames, frames_as, audio_on,
                 max_tokens, temperature, seed, record=False, system_prompt=None) -> PageRequest:
    """Turn the page's (or the public /ask API's) raw values into settings;
    raises OptionError naming the field, so the chat can say what to fix."""
    raw = dict(num_sample_frames=k, sampling=sampling, sample_seconds=seconds, evs_enabled=evs_on,
               evs_threshold=threshold, max_frames=max_frames, frames_as=frames_as, include_audio=audio_on,
               max_tokens=max_tokens, temperature=temperature)
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
    answer_path.apply_settings(entry.session, state.engine, request.options, request.sampling, entry.events)
    return request


# Streamed text reaches the page at most this often (20 updates a second).
STREAM_UPDATE_S = 0.05
# The browser re-renders the whole message at each update, so a long answer's
# updates come further apart (up to this), its rendering work growing with its
# length rather than with its length squared: a 2,000-token answer at 20
# updates a second kept a tab on a loaded 2-core machine from taking a key.
# At 0.4 s apart it still did: in a two-worker test run a tab streaming a
# 2,000-token answer (8,000 characters) took 32 s to send its next question
# and 20 s more to send Stop. Now an update comes every 0.3 s at 2,000
# characters and every second from 8,000 on: a page of text a second is
# still faster than anyone reads.
STREAM_MAX_UPDATE_S = 1.0
STREAM_CHARS_PER_S = 8_000


async def answer_stream(state, entry, question: str, request: PageRequest, history: list[dict],
                        event_start: float, spoken=None, pin=None, chat_as_of: int | None = None,
                        stops_as_of: int | None = None) -> AsyncIterator[tuple]:
    """Ask through the shared answer path and stream the reply into the chat.
    ``spoken`` (Talk mode): the utterance is the question; its bubble, with
    a player of exactly the audio the model got, goes into the chat here.
    ``pin`` (vidchat.conversation.prewarm.Pin): the sample taken as Enter was pressed.
    ``chat_as_of``: the Clear chat count that ``history`` reflects (default:
    now). Once the chat is cleared after that, this stream shows nothing more.
    ``stops_as_of``: the Stop count when the question arrived; a Stop since
    (while the question waited to start) stops its answer at once."""
    talking = conversation.of(state, entry)
    cleared = talking.generation if chat_as_of is None else chat_as_of
    done = asyncio.Event()
    entry.chat_streams.add(done)
    try:
        async with contextlib.aclosing(_answer_updates(state, entry, question, request, history,
                                                       event_start, spoken, pin, stops_as_of)) as updates:
            async for update in updates:
                if talking.generation != cleared:
                    return  # closing the updates aborts the reply: nobody reads it now
                yield update
    finally:
        entry.chat_streams.discard(done)
        done.set()


async def _answer_updates(state, entry, question: str, request: PageRequest, history: list[dict],
                          event_start: float, spoken, pin, stops_as_of: int | None = None) -> AsyncIterator[tuple]:
    """The conversation's answer run as the chat's messages."""
    try:
        # The chat the model gets is the conversation's, kept on the server;
        # ``history`` is only the page's picture of it.
        run = await conversation.of(state, entry).ask(question, request.options, spoken=spoken,
                                                      sample=None if pin is None else pin.sample,
                                                      record=request.record)
        if stops_as_of is not None and entry.chat_stops != stops_as_of:
            await run.cancel()  # Stop came while it was prepared: it ends at once, marked stopped
    except answer_path.Superseded:
        return  # a newer question owns this tab's chat now
    except EngineError as exc:  # NoFrames included
        if spoken is not None:
            history.append({"role": "user", "content": answer_path.spoken_label(spoken.seconds), "metadata": dict(SPOKEN)})
        history.append(notice(exc.said_with(NO_FRAMES_HINT) if isinstance(exc, answer_path.NoFrames) else f"⚠ {exc}"))
        yield history, gr.skip(), gr.skip()
        return
    # Listening from here: if this stream is closed before its answer's Done
    # (Clear, the tab gone), the answer is cancelled, whatever it waits for.
    async with contextlib.aclosing(run.events()) as events:
        answer = run.answer
        if pin is not None:
            answer.sampled_before_ms = (time.monotonic() - pin.at) * 1000
        if spoken is not None:
            history.append(spoken_bubble(answer, kept.remember(entry, answer)))
        log.info("chat event -> engine call: %.2f ms", (time.perf_counter() - event_start) * 1000)
        reply = answer.reply
        history.append({"role": "assistant", "content": ""})
        yield history, gr.skip(), gr.skip()
        shown = 0.0
        async for event in events:
            if isinstance(event, Queued):
                history[-1] = notice(waiting_text(event.ahead))
                yield history, gr.skip(), gr.skip()
            elif isinstance(event, Started):
                if is_notice(history[-1]):
                    history[-1] = {"role": "assistant", "content": ""}
            elif isinstance(event, Delta):
                if not history[-1]["content"]:
                    since_event = time.perf_counter() - event_start
                    # The event's wall-clock time lets a browser on this machine
                    # split its own Enter -> first token into before/after the server.
                    log.info("chat event -> first token: %.1f ms (%d of %d prompt tokens from the cache; "
                             "event at %.3f)", since_event * 1000, reply.stats.cached_tokens,
                             reply.stats.prompt_tokens, time.time() - since_event)
                history[-1]["content"] += event.text
                # The first text at once, then STREAM_UPDATE_S apart or more: each
                # update re-renders the whole message in the browser, and a fast
                # model's every token would keep the tab (and the server) busy.
                # The answer's last update below shows whatever is left.
                every = min(STREAM_MAX_UPDATE_S, STREAM_UPDATE_S + len(history[-1]["content"]) / STREAM_CHARS_PER_S)
                if time.monotonic() - shown >= every:
                    shown = time.monotonic()
                    yield history, gr.skip(), gr.skip()
            elif event.current:  # Done, and this chat's answer still: a newer question's event owns it otherwise
                yield await _final_update(entry, event, history)


async def _final_update(entry, done: Done, history: list[dict]) -> tuple:
    """The answer's last update: its text (or why there is none), the
    recording's note, and what the model got, folded under the answer.
    Thumbnails are encoded after the answer, so they never delay its first
    token, and in a worker thread, so they never stall the event loop."""
    answer = done.answer
    if is_notice(history[-1]):
        history.pop()  # the "waiting" line
    if not history[-1]["content"]:
        history.pop()
        history.append(notice(f"⚠ {done.error}" if done.error else STOPPED if done.status == CANCELLED else NO_TEXT))
    elif done.error is not None:
        history.append(notice(f"⚠ {done.error}"))
    elif done.status == CANCELLED:  # Stop, Clear or barge-in: the text so far, then the mark
        history.append(notice(STOPPED))
    if done.record_error:
        history.append(notice(done.record_error if done.record_error.startswith("Not recorded")
                              else f"⚠ {done.record_error}"))
    history.append(await asyncio.to_thread(fold_message, entry, answer, done.answer_id))
    return history, await asyncio.to_thread(frames_html, answer, done.answer_id, done.answer_id in entry.bundles), \
        answer.summary()


async def _wait_for_model(state, history: list[dict]) -> AsyncIterator[tuple]:
    """While the model loads, show how long it has been loading; raises EngineError if it fails."""
    if state.ready:
        return
    history.append(notice(""))
    while True:
        try:
            await state.wait_engine(timeout=1.0)
            history.pop()
            return
        except EngineError:
            if state.engine_down or state.ready:
                history.pop()
                raise
        history[-1] = notice(f"⏳ {state.readiness()[1]} Your question will be answered once it is ready.")
        yield history, gr.skip(), gr.skip()


async def respond(state, message: str, history: list[dict], sid: str, *raw_settings: Any) -> AsyncIterator[tuple]:
    """The chat event: one question from the page (or the public /ask API)."""
    event_start = time.perf_counter()
    text = (message or "").strip() if isinstance(message, str) else ""
    history = list(history or [])
    if not text:
        yield history, gr.skip(), gr.skip()
        return
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    if entry is None:
        history += [{"role": "user", "content": text}, notice(NOT_RUNNING)]
        yield history, gr.skip(), gr.skip()
        return
    log_context.bind(entry.session.id, entry.kind)
    cutting = conversation.of(state, entry).answering
    if cutting:
        mark_stopped(history)  # this question cuts the running answer short
    history.append({"role": "user", "content": text})
    entry.watch_epoch += 1  # a running watch loop yields the chat to this question
    entry.talk_epoch += 1  # so does the talk loop (the listener goes on; the page restarts the loop)
    chat_as_of = conversation.of(state, entry).generation  # the chat this event was sent with
    stops_as_of = entry.chat_stops
    entry.typed_question_at = time.monotonic()
    if not cutting:
        # The question shows in the chat as it is sent, not with its answer's
        # first words. (An answer it cuts short would still write its own
        # chat over it: then the question shows once that answer has stopped.)
        yield history, gr.skip(), gr.skip()
    try:
        async with contextlib.aclosing(_wait_for_model(state, history)) as loading:
            async for update in loading:
                if entry.chat_stops != stops_as_of:  # Stop while the model loads: not asked
                    history[-1] = notice(STOPPED)
                    yield history, gr.skip(), gr.skip()
                    return
                yield update
    except EngineError as exc:
        history.append(notice(f"⚠ {exc}"))
        yield history, gr.skip(), gr.skip()
        return
    if conversation.of(state, entry).generation != chat_as_of:
        return  # Clear chat while the model loaded: the question went with the old chat
    try:
        request = applied_request(state, entry, raw_settings)
    except ValueError as exc:  # OptionError or the session's own validation
        history.append(notice(f"⚠ Settings not accepted: {exc}"))
        yield history, gr.skip(), gr.skip()
        return
    # The sample taken as Enter was pressed (vidchat.conversation.prewarm), already warmed.
    pin = state.prewarmer.take_pin(entry) if getattr(state, "prewarmer", None) is not None else None
    async for update in answer_stream(state, entry, text, request, history, event_start, pin=pin,
                                      chat_as_of=chat_as_of, stops_as_of=stops_as_of):
        yield update


# ---------------------------------------------------------------------------
async def clear_chat(state, sid: str) -> None:
    """Clear chat: the answer streaming into the old chat stops (nobody reads
    it now) and nothing of the old chat comes back: not that answer's last
    update, nor a watch or talk loop's copy of the chat. Watch and Talk go on."""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    if entry is not None:
        conversation.of(state, entry).clear()  # a new chat: the model's (and the next warm-up's) too
        entry.question_seq += 1  # a question still being prepared for the old chat never starts
        streams = [asyncio.ensure_future(done.wait()) for done in entry.chat_streams]
        await entry.cancel_answer()
        # Returned only once each stream into the old chat has stopped: its
        # updates already sent reach the page before the empty chat does.
        if streams:
            _, late = await asyncio.wait(streams, timeout=CLEAR_WAIT_S)
            for waiter in late:
                waiter.cancel()
        # Once the stopped answer is kept too: none of the old chat is offered for re-asking.
        kept.chat_cleared(entry)


async def stop_answer(state, sid: str) -> None:
    """Stop: the running answer ends, and so does watching (the page unticks Watch)."""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    if entry is not None:
        entry.watch_epoch += 1
        entry.chat_stops += 1  # a question not started yet ends too (respond)
        await entry.cancel_answer()


def watch_switched(state, on: bool, sid: str) -> None:
    """Watch unticked: the running watch loop ends at once, even while it
    waits for a scene change (its event would otherwise hold the switch's
    queue, so the "off" never ran and watching went on)."""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    if entry is not None and not on:
        entry.watch_epoch += 1


# ---------------------------------------------------------------------------
