"""The page's events: which function of vidchat.doors.page each control
runs, in what order, with which inputs and outputs.

The controls themselves are laid out by vidchat.doors.page.layout. Events are
registered in one fixed order (their fn_index is the access guard's map,
vidchat.doors.page.layout.page_functions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import gradio as gr

from vidchat.doors.server_contract import login_of
from vidchat.conversation.settings_table import SETTINGS
from vidchat.doors.page.answers import clear_chat, respond, stop_answer, watch_switched
from vidchat.doors.page.chat_view import restored_chat
from vidchat.doors.page.reask import bundle_choices, load_bundle, reask, reask_choices
from vidchat.doors.page.modes import TALK_NEEDS_AUDIO, talk_loop, watch_loop

# A streaming event's last message repeats its last update in full, so it
# could put back a chat that Clear chat emptied after that update: the page's
# answer events end on an update that changes nothing. (A generator that
# yields nothing at all would blank the chat.)
LAST_UPDATE_IS_NOTHING = (gr.skip(), gr.skip(), gr.skip())

QUESTION_FINISHED_JS = "() => { if (window.vidchat) window.vidchat.questions.finished += 1; }"
# Clear chat's event has ended (its empty chat is shown): the question's
# event may end first, as Clear waits for the answer it stops.
CLEAR_FINISHED_JS = "() => { if (window.vidchat) window.vidchat.clears += 1; }"
# Sending empties the question box into the field the answer event reads.
SEND_JS = "(question) => ['', question]"


@dataclass
class Controls:
    """The page's controls that events read or write."""

    chatbot: gr.Chatbot
    question: gr.Textbox
    sent_question: gr.Textbox  # hidden: the question as sent, which the answer event reads
    send: gr.Button
    stop: gr.Button
    watch_on: gr.Checkbox
    watch_question: gr.Textbox
    watch_every: gr.Number
    talk_on: gr.Checkbox
    barge_in: gr.Checkbox
    talk_silence: gr.Number
    talk_min_speech: gr.Number
    clear: gr.Button
    settings_inputs: list[gr.components.Component]
    inputs_view: gr.HTML
    details: gr.JSON
    reask_from: gr.Dropdown
    reask_btn: gr.Button
    reask_engine: gr.Radio
    bundle_file: gr.File
    comparison: gr.HTML
    loaded_bundles: gr.State
    session_id: gr.Textbox

    @property
    def outputs(self) -> list[gr.components.Component]:
        """What an answer updates: the chat, the "what the model got" panel, the reply's details."""
        return [self.chatbot, self.inputs_view, self.details]


def wire(blocks: gr.Blocks, state: Any, page: Controls) -> None:
    """Register every event of the page (inside ``blocks``)."""

    # Every function that takes the session id gets it only when the
    # caller's login opened that session (vidchat.app.access already refused
    # the call with 403 otherwise); else it is as if no session ran.
    def own(request: gr.Request, sid: Any) -> str | None:
        return sid if state.registry.get_for(sid, login_of(request.headers)) is not None else None

    asked = _questions(state, page, own)
    _watch(state, page, own, asked)
    _talk(blocks, state, page, own, asked)
    _reask(state, page, own, asked)
    _settings_help(page)
    _restore(state, page, own)  # last: the events above keep their fn_index (the guard's map)


def _restore(state: Any, page: Controls, own: Callable) -> None:
    """A tab that comes back to its session (a reload) shows that session's
    chat, as the conversation keeps it on the server."""

    async def on_session(request: gr.Request, sid):
        return await restored_chat(state, own(request, sid))

    page.session_id.change(on_session, [page.session_id], page.outputs, api_visibility="private",
                           show_progress="hidden", concurrency_limit=None)


def _settings_help(page: Controls) -> None:
    """The Sampling picker's help says what the chosen strategy does (the settings table's words)."""
    sampling = next(c for c in page.settings_inputs if c.elem_id == "vc-sampling")

    def explain(chosen):
        return gr.update(info=SETTINGS["sampling"].choice_help(chosen))

    sampling.change(explain, sampling, sampling, queue=False, show_progress="hidden", api_visibility="private")


def _questions(state: Any, page: Controls, own: Callable) -> tuple[Any, Any]:
    """Typed questions (Enter, Send, the public /ask), Stop and Clear chat;
    returns the typed question's two events, which Watch, Talk and the
    re-ask list follow."""

    async def on_question(request: gr.Request, message, history, sid, *raw):
        async for update in respond(state, message, history, own(request, sid), *raw):
            yield update

    async def on_page_question(request: gr.Request, message, history, sid, *raw):
        async for update in on_question(request, message, history, sid, *raw):
            yield update
        yield LAST_UPDATE_IS_NOTHING

    async def on_stop(request: gr.Request, sid):
        await stop_answer(state, own(request, sid))
        return False  # Stop ends watching too: the Watch box says so

    # The question box is not an output of the (long) answer event, so it
    # stays editable while an answer streams: a new question then
    # replaces the running answer. The box empties as the question is sent:
    # a step in the browser moves its text into a hidden field, and the
    # answer event, which follows, reads it from there. (Gradio's page runs
    # one trigger's events one after another, each to its end: an event
    # emptying the box after the answer's would wait for the whole answer.)
    outputs = page.outputs
    inputs = [page.sent_question, page.chatbot, page.session_id, *page.settings_inputs]
    answer_events = dict(concurrency_limit=None, show_progress="minimal", trigger_mode="multiple")
    # The page counts typed questions asked (static/js/questions.js, at the
    # key press) and finished (below): a question refused with a notice
    # has no "what the model got" panel, so only the event's end says its
    # reply is whole (tests, QA scripts).
    submit_evt, click_evt = (
        trigger(None, page.question, [page.question, page.sent_question], js=SEND_JS, queue=False,
                trigger_mode="multiple", api_visibility="private")
        .then(on_page_question, inputs, outputs, api_visibility="private", **answer_events)
        for trigger in (page.question.submit, page.send.click))
    # The public /ask: the same answer, whose last message is the whole
    # reply (what an API client reads as the result).
    ask_api = gr.Button(visible=False, elem_id="vc-ask-api")
    ask_api.click(on_question, [page.question, *inputs[1:]], outputs, api_name="ask", concurrency_limit=None)
    for evt in (submit_evt, click_evt):
        evt.then(None, None, None, js=QUESTION_FINISHED_JS, queue=False, api_visibility="private")
    # Stop ends the answer on the server (stop_answer), not the answer's
    # event: that event goes on to its last update, which marks the answer
    # stopped and folds what the model got under it (a cancelled event ends
    # where it was, with no mark).
    page.stop.click(on_stop, [page.session_id], page.watch_on, concurrency_limit=None, api_name="stop")

    async def on_clear(request: gr.Request, sid, loaded):
        await clear_chat(state, own(request, sid))
        choices = bundle_choices(loaded)  # the old chat's answers are no longer offered; loaded bundles are
        return [], None, gr.Dropdown(choices=choices, value=choices[0][1] if choices else None)

    page.clear.click(on_clear, [page.session_id, page.loaded_bundles], [page.chatbot, page.details, page.reask_from],
                     api_visibility="private").then(None, None, None, js=CLEAR_FINISHED_JS, queue=False,
                                                    api_visibility="private")
    return submit_evt, click_evt


def _watch(state: Any, page: Controls, own: Callable, asked: tuple[Any, Any]) -> None:
    """Watch: the loop that asks the standing question at scene changes."""

    async def on_watch(request: gr.Request, on, q, every, history, sid, *raw):
        async for update in watch_loop(state, on, q, every, history, own(request, sid), *raw):
            yield update
        yield (*LAST_UPDATE_IS_NOTHING, gr.skip())

    watch_inputs = [page.watch_on, page.watch_question, page.watch_every, page.chatbot, page.session_id,
                    *page.settings_inputs]
    watch_events = dict(concurrency_limit=None, show_progress="hidden", trigger_mode="always_last")

    def on_watch_switched(request: gr.Request, on, sid):
        watch_switched(state, on, own(request, sid))

    page.watch_on.change(on_watch_switched, [page.watch_on, page.session_id], None, queue=False,
                         trigger_mode="multiple", api_visibility="private")
    watch_outputs = [*page.outputs, page.watch_on]  # a refused Watch unticks
    page.watch_on.change(on_watch, watch_inputs, watch_outputs, api_name="watch", **watch_events)
    for evt in asked:  # after a typed question, watching goes on from the new chat
        evt.then(on_watch, watch_inputs, watch_outputs, api_visibility="private", **watch_events)


def _talk(blocks: gr.Blocks, state: Any, page: Controls, own: Callable, asked: tuple[Any, Any]) -> None:
    """Talk: the loop that asks what the user says, and whether the model can hear at all."""

    async def on_talk(request: gr.Request, on, barge, silence, min_speech, history, sid, *raw):
        async for update in talk_loop(state, on, barge, silence, min_speech, history, own(request, sid), *raw):
            yield update
        yield (*LAST_UPDATE_IS_NOTHING, gr.skip())

    talk_inputs = [page.talk_on, page.barge_in, page.talk_silence, page.talk_min_speech, page.chatbot,
                   page.session_id, *page.settings_inputs]
    # "multiple": switching Talk off must run while the loop it ends is
    # still waiting for speech; a newer loop takes over from an older
    # one through the session's talk_epoch.
    talk_events = dict(concurrency_limit=None, show_progress="hidden", trigger_mode="multiple")
    talk_outputs = [*page.outputs, page.talk_on]  # a refused Talk unticks
    page.talk_on.change(on_talk, talk_inputs, talk_outputs, api_name="talk", **talk_events)
    for evt in asked:  # after a typed question, Talk goes on from the new chat
        evt.then(on_talk, talk_inputs, talk_outputs, api_visibility="private", **talk_events)
    for control in (page.barge_in, page.talk_silence, page.talk_min_speech):  # new settings take effect at once
        control.change(on_talk, talk_inputs, talk_outputs, api_visibility="private", **talk_events)

    async def talk_availability():
        """Once the model is loaded: Talk is unavailable (and says why) for a model that hears nothing."""
        try:
            await state.wait_engine(timeout=3600)
        except Exception:
            return gr.skip()
        if state.engine.accepts_audio:
            return gr.skip()
        return gr.Checkbox(value=False, interactive=False, label="Talk: unavailable", info=TALK_NEEDS_AUDIO)

    blocks.load(talk_availability, None, page.talk_on, api_visibility="private", show_progress="hidden")


def _reask(state: Any, page: Controls, own: Callable, asked: tuple[Any, Any]) -> None:
    """Re-ask and compare: the list of answers, loading a bundle, the re-ask itself."""

    def refresh_reask(request: gr.Request, sid, loaded):
        choices = reask_choices(state, own(request, sid), loaded)
        return gr.Dropdown(choices=choices, value=choices[0][1] if choices else None)

    for evt in asked:
        evt.then(refresh_reask, [page.session_id, page.loaded_bundles], page.reask_from, api_visibility="private")

    async def on_load_bundle(request: gr.Request, path, sid, loaded):
        loaded, _, chosen, message = await load_bundle(state, path, loaded)
        choices = reask_choices(state, own(request, sid), loaded)
        return (loaded, gr.Dropdown(choices=choices, value=chosen or (choices[0][1] if choices else None)),
                message, None)

    page.bundle_file.upload(on_load_bundle, [page.bundle_file, page.session_id, page.loaded_bundles],
                            [page.loaded_bundles, page.reask_from, page.comparison, page.bundle_file],
                            api_name="load_bundle", concurrency_limit=4)

    async def on_reask(request: gr.Request, sid, answer_id, *raw):
        *settings, which, loaded = raw
        async for update in reask(state, own(request, sid), answer_id, *settings, engine_choice=which, loaded=loaded):
            yield update

    # No cap on the event (Gradio's would be one count for every tab): what
    # bounds re-asks is their answer place, one per session or tab, since
    # each re-ask replaces that one's running re-ask (reask.reask).
    page.reask_btn.click(on_reask, [page.session_id, page.reask_from, *page.settings_inputs, page.reask_engine,
                                    page.loaded_bundles],
                         page.comparison, api_name="reask", concurrency_limit=None, show_progress="minimal")
