"""The page's events: which function of vidchat.doors.page each control
runs, in what order, with which inputs and outputs.

The controls themselves are laid out by vidchat.doors.page.layout. Events are
registered in one fixed order (their fn_index is the access guard's map,
vidchat.doors.page.layout.page_functions).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

import gradio as gr

from vidchat.doors.server_contract import login_of
from vidchat.conversation.session_events import Notice
from vidchat.conversation.settings_table import SETTINGS
from vidchat.doors.page.answers import clear_chat, page_question, respond, stop_answer
from vidchat.doors.page.chat_feed import feed
from vidchat.doors.page.rendered import rendered
from vidchat.doors.page.reask import bundle_choices, load_bundle, reask, reask_choices, remember_tab, tab_bundles
from vidchat.doors.page.modes import TALK_NEEDS_AUDIO, both_switch, mode_updates, talk_switch, watch_switch
from vidchat.doors.page.view import NOT_RUNNING, notice, typing

# Said in the chat when Stop (beside Send) ended watching as well as the answer.
WATCH_STOPPED = "Stop switched Watch off as well: tick Watch to go on watching."

# A streaming API event's last message repeats its last update in full: the
# API events end on an update that changes nothing. (A generator that
# yields nothing at all would blank the chat.)
LAST_UPDATE_IS_NOTHING = (gr.skip(), gr.skip(), gr.skip())

# A typed question's event has ended: counted, and a "Thinking…" still last
# in the chat with no typed question left in flight goes (the browser put it
# there at Send, and a session gone meanwhile has no chat feed to replace it).
QUESTION_FINISHED_JS = ("(chat) => { const q = window.vidchat?.questions; if (q) q.finished += 1;"
                        " const last = chat?.[chat.length - 1];"
                        " const stale = q && q.asked === q.finished && JSON.stringify(last?.content ?? '')"
                        ".includes('vc-typing');"
                        " return [stale ? chat.slice(0, -1) : chat]; }")  # (one output: in a list of one)
# Clear chat's event has ended (the tab's chat is empty).
CLEAR_FINISHED_JS = "() => { if (window.vidchat) window.vidchat.clears += 1; }"
# Sending empties the question box into the field the question's event
# reads. With no session (the camera not started, or stopped) there is no
# conversation to ask and no chat feed: the question and why it was not
# asked join the chat here, in the browser, as the server would say it.
# With one, the question and "Thinking…" show at once, as the chat feed
# draws them (vidchat.doors.page.chat_feed), before the question's round trip.
# (In the browser a message's content is a list of typed parts.)
def _in_browser(message: dict) -> str:
    return json.dumps({**message, "content": [{"type": "text", "text": message["content"]}]}, ensure_ascii=False)


SEND_JS = ("(question, chat) => !question.trim() ? ['', question, chat]"
           " : ['', window.vidchat?.sessionId ? question : '',"
           " [...(chat || []), {role: 'user', content: [{type: 'text', text: question}]},"
           " window.vidchat?.sessionId ? %s : %s]]" % (_in_browser(typing()), _in_browser(notice(NOT_RUNNING))))


@dataclass
class Controls:
    """The page's controls that events read or write."""

    chatbot: gr.Chatbot
    question: gr.Textbox
    sent_question: gr.Textbox  # hidden: the question as sent, which the question's event reads
    question_note: gr.Markdown  # why nothing was asked, when there is no chat to say it in
    send: gr.Button
    stop: gr.Button
    watch_on: gr.Checkbox
    watch_question: gr.Textbox
    watch_every: gr.Number
    talk_on: gr.Checkbox
    barge_in: gr.Checkbox
    talk_silence: gr.Number
    talk_min_speech: gr.Number
    both_models: gr.Checkbox  # Both models (shown with --compare-model only)
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

    _questions(state, page, own)
    _clear(state, page, own)
    _watch(state, page, own)
    _talk(blocks, state, page, own)

    async def on_both(request: gr.Request, on, sid):
        return await both_switch(state, on, own(request, sid))

    page.both_models.change(on_both, [page.both_models, page.session_id], [page.both_models, page.question_note],
                            api_name="both_models", show_progress="hidden", trigger_mode="multiple",
                            concurrency_limit=None)
    _reask(state, page, own)
    _settings_help(page)
    _chat(state, page, own)  # last: the events above keep their fn_index (the guard's map)


def _chat(state: Any, page: Controls, own: Callable) -> None:
    """The tab's chat: one long-lived event per session that draws it from
    the conversation (its history, then its events), a reload included."""

    async def on_session(request: gr.Request, sid):
        entry = state.registry.get(own(request, sid))
        if entry is None:
            yield (*LAST_UPDATE_IS_NOTHING, gr.skip())
            return
        listed: list = []

        def reask_list():  # follows the chat's answers (and the bundles this tab loaded)
            choices = reask_choices(state, entry.session.id, tab_bundles(request.session_hash))
            if [c[1] for c in choices] == listed:
                return gr.skip()
            listed[:] = [c[1] for c in choices]
            return gr.Dropdown(choices=choices, value=choices[0][1] if choices else None)

        async for update in feed(state, entry, reask_list):
            yield update
        # The event's last message repeats its last update in full: ending on
        # one that changes nothing keeps a chat the browser added to since
        # (a question asked after the session ended) as it is.
        yield (*LAST_UPDATE_IS_NOTHING, gr.skip())

    # "multiple": a tab's next session (Start camera again) gets its own
    # feed while the old one ends with its session.
    page.session_id.change(on_session, [page.session_id], [*page.outputs, page.reask_from],
                           api_visibility="private", show_progress="hidden", concurrency_limit=None,
                           trigger_mode="multiple")


def _settings_help(page: Controls) -> None:
    """The Sampling picker's help says what the chosen strategy does (the settings table's words)."""
    sampling = next(c for c in page.settings_inputs if c.elem_id == "vc-sampling")

    def explain(chosen):
        return gr.update(info=SETTINGS["sampling"].choice_help(chosen))

    sampling.change(explain, sampling, sampling, queue=False, show_progress="hidden", api_visibility="private")


def _questions(state: Any, page: Controls, own: Callable) -> None:
    """Typed questions (Enter, Send, the public /ask) and Stop."""

    async def on_page_question(request: gr.Request, message, sid, *raw):
        return await page_question(state, message, own(request, sid), *raw)

    async def on_question(request: gr.Request, message, history, sid, *raw):
        async for update in respond(state, message, history, own(request, sid), *raw):
            yield update

    async def on_stop(request: gr.Request, sid):
        mine = own(request, sid)
        entry = state.registry.get(mine)
        watching = entry is not None and entry.modes.watching
        await stop_answer(state, mine)
        if watching:  # an unticked box is easy to miss: the chat says it too
            entry.event_hub.publish(Notice(WATCH_STOPPED))
        return False  # Stop ends watching too: the Watch box unticks

    # The question box is not an output of the question's event, so it stays
    # editable while an answer streams: a new question then replaces the
    # running answer. The box empties as the question is sent: a step in the
    # browser moves its text into a hidden field, which the question's event
    # reads. The event sends only the question (and the settings it is asked
    # with): the chat is the conversation's, drawn by the chat feed (_chat).
    # It ends once its answer is whole in the chat, which the page counts
    # (static/js/questions.js counts the key press): a refused question has
    # no "what the model got" panel, so only the event's end says its reply
    # is whole (tests, QA scripts).
    inputs = [page.sent_question, page.session_id, *page.settings_inputs]
    for trigger in (page.question.submit, page.send.click):
        (trigger(None, [page.question, page.chatbot], [page.question, page.sent_question, page.chatbot], js=SEND_JS,
                 queue=False,
                 trigger_mode="multiple", api_visibility="private")
         .then(on_page_question, inputs, page.question_note, api_visibility="private", concurrency_limit=None,
               show_progress="hidden", trigger_mode="multiple")
         .then(None, page.chatbot, page.chatbot, js=QUESTION_FINISHED_JS, queue=False,
               api_visibility="private"))
    # The public /ask: the same question, its part of the chat streamed after
    # the caller's chat; the last message is the whole reply (what an API
    # client reads as the result).
    ask_api = gr.Button(visible=False, elem_id="vc-ask-api")
    ask_api.click(on_question, [page.question, page.chatbot, page.session_id, *page.settings_inputs], page.outputs,
                  api_name="ask", concurrency_limit=None)
    page.stop.click(on_stop, [page.session_id], page.watch_on, concurrency_limit=None, api_name="stop")


def _clear(state: Any, page: Controls, own: Callable) -> None:
    """Clear chat, and the chat's own clear icon."""

    async def on_clear(request: gr.Request, sid, loaded):
        mine = own(request, sid)
        await clear_chat(state, mine)
        entry = state.registry.get(mine)
        if entry is not None:  # returned once the tab's chat is empty
            await rendered(entry).cleared(entry)
        choices = bundle_choices(loaded)  # the old chat's answers are no longer offered; loaded bundles are
        return gr.Dropdown(choices=choices, value=choices[0][1] if choices else None)

    # The chat's own clear icon empties only the browser's copy of the chat:
    # it clears the conversation as Clear chat does, or the chat would come back.
    for trigger in (page.clear.click, page.chatbot.clear):
        trigger(on_clear, [page.session_id, page.loaded_bundles], page.reask_from,
                api_visibility="private").then(None, None, None, js=CLEAR_FINISHED_JS, queue=False,
                                               api_visibility="private")


def _watch(state: Any, page: Controls, own: Callable) -> None:
    """Watch: the standing question asked at scene changes, by a task of the conversation."""

    async def on_switch(request: gr.Request, on, q, every, sid, *raw):
        return await watch_switch(state, on, q, every, own(request, sid), *raw)

    async def on_watch_api(request: gr.Request, on, q, every, history, sid, *raw):
        sid = own(request, sid)
        switched = await watch_switch(state, on, q, every, sid, *raw)
        async for update in mode_updates(state, sid, history, switched, lambda modes: modes.watching):
            yield update
        yield (*LAST_UPDATE_IS_NOTHING, gr.skip())

    switch_inputs = [page.watch_on, page.watch_question, page.watch_every, page.session_id, *page.settings_inputs]
    page.watch_on.change(on_switch, switch_inputs, [page.watch_on, page.question_note], api_visibility="private",
                         show_progress="hidden", trigger_mode="multiple", concurrency_limit=None)
    # The /watch API: switch it, then the chat as watching asks, until it ends.
    watch_api = gr.Button(visible=False, elem_id="vc-watch-api")
    watch_api.click(on_watch_api, [page.watch_on, page.watch_question, page.watch_every, page.chatbot,
                                   page.session_id, *page.settings_inputs], [*page.outputs, page.watch_on],
                    api_name="watch", concurrency_limit=None, show_progress="hidden")


def _talk(blocks: gr.Blocks, state: Any, page: Controls, own: Callable) -> None:
    """Talk: each utterance asked as it ends, by a task of the conversation; and whether the model can hear at all."""

    async def on_switch(request: gr.Request, on, barge, silence, min_speech, sid, *raw):
        return await talk_switch(state, on, barge, silence, min_speech, own(request, sid), *raw)

    async def on_talk_api(request: gr.Request, on, barge, silence, min_speech, history, sid, *raw):
        sid = own(request, sid)
        switched = await talk_switch(state, on, barge, silence, min_speech, sid, *raw)
        async for update in mode_updates(state, sid, history, switched, lambda modes: modes.talking):
            yield update
        yield (*LAST_UPDATE_IS_NOTHING, gr.skip())

    switch_inputs = [page.talk_on, page.barge_in, page.talk_silence, page.talk_min_speech, page.session_id,
                     *page.settings_inputs]
    # New settings take effect at once: each control switches Talk again.
    for control in (page.talk_on, page.barge_in, page.talk_silence, page.talk_min_speech):
        control.change(on_switch, switch_inputs, [page.talk_on, page.question_note], api_visibility="private",
                       show_progress="hidden", trigger_mode="multiple", concurrency_limit=None)
    talk_api = gr.Button(visible=False, elem_id="vc-talk-api")
    talk_api.click(on_talk_api, [page.talk_on, page.barge_in, page.talk_silence, page.talk_min_speech, page.chatbot,
                                 page.session_id, *page.settings_inputs], [*page.outputs, page.talk_on],
                   api_name="talk", concurrency_limit=None, show_progress="hidden")

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


def _reask(state: Any, page: Controls, own: Callable) -> None:
    """Re-ask and compare: the list of answers, loading a bundle, the re-ask itself."""

    async def on_load_bundle(request: gr.Request, path, sid, loaded):
        loaded, _, chosen, message = await load_bundle(state, path, loaded)
        remember_tab(request.session_hash, loaded)  # the chat feed lists them beside the chat's answers
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
