"""The page's questions: its settings read through the one settings table,
and the question asked of the conversation, which runs its answer; the chat
shows it from the session's events (vidchat.doors.page.chat_feed). Stop and
Clear chat. (Re-asks beside the chat: vidchat.doors.page.reask.)"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any, AsyncIterator, Callable

import gradio as gr

from vidchat import conversation
from vidchat.conversation import Delta, Done, Started, answer_path, log_context
from vidchat.conversation.answer_path import OptionError
from vidchat.conversation.session_events import AnswerEvent, Closed, QuestionRefused
from vidchat.conversation.settings_table import SETTINGS, UNBOUNDED_MAX_TOKENS
from vidchat.media.numbers import is_number
from vidchat.doors.page.chat_feed import exchange_updates
from vidchat.doors.page.rendered import rendered
from vidchat.doors.page.view import NOT_RUNNING, notice

log = logging.getLogger(__name__)

# How long a question's page event waits, once its answer is done, for the
# tab's chat to show it (the chat feed draws it; a tab without one goes on).
SHOWN_WAIT_S = 2.0


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
    answer_path.apply_settings(entry.session, state.engine, request.options, request.sampling, entry.event_hub)
    return request


def _record(raw_settings: tuple) -> bool:
    """The page's Record box, in page_request's order."""
    return len(raw_settings) > 11 and bool(raw_settings[11])


def _options(state, entry, raw_settings: tuple) -> Callable[[], answer_path.AnswerOptions]:
    """The question's options as the session runs them, read (and its
    sampling settings applied) once the model runs: a value above what the
    loaded model takes is refused then, naming the field."""
    return lambda: applied_request(state, entry, raw_settings).options


def _submit(state, entry, text: str, raw_settings: tuple) -> int:
    """Ask a typed question of the conversation, with the sample taken as
    Enter was pressed when there is one (vidchat.conversation.prewarm, already warmed)."""
    entry.typed_question_at = time.monotonic()
    pin = state.prewarmer.take_pin(entry) if getattr(state, "prewarmer", None) is not None and state.ready else None
    return entry.submit(text, _options(state, entry, raw_settings),
                                                sample=None if pin is None else pin.sample,
                                                pinned_at=None if pin is None else pin.at,
                                                record=_record(raw_settings))


async def page_question(state, message: Any, sid: str | None, *raw_settings: Any) -> Any:
    """The page's typed question: asked, and this event ends once its
    outcome is in the tab's chat (the chat feed draws it). Returns the
    note under the question box: why nothing was asked, when nothing was."""
    event_start = time.perf_counter()
    text = message.strip() if isinstance(message, str) else ""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    if not text:
        return gr.skip()
    if entry is None:
        return gr.update(value=NOT_RUNNING, visible=True)
    log_context.bind(entry.session.id, entry.kind)
    with entry.event_hub.subscribe() as subscription:
        ticket = _submit(state, entry, text, raw_settings)
        await _outcome(subscription, ticket, event_start)
    try:
        await asyncio.wait_for(rendered(entry).event(ticket).wait(), SHOWN_WAIT_S)
    except asyncio.TimeoutError:
        pass
    return gr.update(value="", visible=False)


async def _outcome(subscription: Any, ticket: int, event_start: float) -> None:
    """Wait for the question's answer to end (or its refusal), logging the
    server's share of its latency (bench/page.py reads these lines)."""
    answer = None
    first_token = True
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
            log.info("chat event -> first token: %.1f ms (%d of %d prompt tokens from the cache; %d of %d frames "
                     "new; event at %.3f)", since * 1000, stats.cached_tokens, stats.prompt_tokens,
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
        yield history, gr.skip(), gr.skip()
        return
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    if entry is None:
        yield [*history, {"role": "user", "content": text}, notice(NOT_RUNNING)], gr.skip(), gr.skip()
        return
    log_context.bind(entry.session.id, entry.kind)
    async for update in exchange_updates(state, entry, history, lambda: _submit(state, entry, text, raw_settings)):
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
