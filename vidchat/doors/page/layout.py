"""The page's layout: what each control is and where it sits, and the
access tokens the page carries. Which function each control runs is
vidchat.doors.page.layout.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
from dataclasses import dataclass
from typing import Any, Callable

import gradio as gr
from starlette.routing import Mount

from vidchat.conversation.asking import SETTINGS
from vidchat.conversation.events import Notice
from vidchat.conversation.modes import DEFAULT_EVERY_S
from vidchat.doors import UPLOAD_DELETE_CACHE, as_text, login_of
from vidchat.doors.page.chat import (
    HEAD,
    NOT_RUNNING,
    PREVIEW_HTML,
    TALK_HTML,
    feed,
    frames_html,
    model_label,
    notice,
    rendered,
    typing,
)
from vidchat.doors.page.questions import (
    MAX_BUNDLE_BYTES,
    TALK_MIN_SPEECH_LABEL,
    TALK_NEEDS_AUDIO,
    TALK_SILENCE_LABEL,
    WATCH_EVERY_LABEL,
    both_switch,
    bundle_choices,
    clear_chat,
    load_bundle,
    mode_updates,
    page_question,
    reask,
    reask_choices,
    reask_engines,
    remember_tab,
    respond,
    stop_answer,
    tab_bundles,
    talk_switch,
    watch_switch,
)
from vidchat.media import FRAMES_AS, evs
from vidchat.media.vad import TurnSettings

log = logging.getLogger(__name__)


# The page's events: which function of vidchat.doors.page each control
# runs, in what order, with which inputs and outputs.
#
# The controls themselves are laid out by vidchat.doors.page.layout. Events are
# registered in one fixed order (their fn_index is the access guard's map,
# vidchat.doors.page.layout.page_functions).

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
# draws them (vidchat.doors.page.chat), before the question's round trip.
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


def _header(state) -> None:
    with gr.Row(elem_classes="vc-header"):
        gr.HTML(
            "<div class='vc-title'><h1>vidchat</h1>"
            f"<span class='vc-model' title='{as_text(state.model_path)}'>"
            f"{as_text(model_label(state))}</span></div>"
        )
        if state.access.hf_oauth:
            gr.LoginButton(size="sm", scale=0, min_width=160)
    if state.banner:
        gr.HTML(f"<div class='vc-banner' role='alert'>{as_text(state.banner)}</div>")


def _settings_panel(state) -> list[gr.components.Component]:
    """The settings accordion; returns its inputs in respond()'s order."""
    s = state.settings
    max_images = max(1, s.max_images)
    with gr.Accordion("Settings", open=False, elem_id="vc-settings"):
        with gr.Row():
            k = gr.Slider(1, max_images, value=min(s.frames_per_question, max_images), step=1,
                          label=SETTINGS["num_sample_frames"].label, elem_id="vc-frames-per-question")
            # The picker shows each strategy's label and sends its name (the
            # protocol's); its help says what the chosen one does (events.py).
            strategy = SETTINGS["sampling"]
            sampling = gr.Dropdown(strategy.page_choices(), value=s.sampling, label=strategy.label,
                                   elem_id="vc-sampling", info=strategy.choice_help(s.sampling))
            window = SETTINGS["sample_seconds"]
            by_value = {value: label for label, value in strategy.page_choices()}
            seconds = gr.Slider(1, 60, value=10, step=1, label=f"{window.label} (s)", elem_id="vc-sample-seconds",
                                info=f"Used by “{by_value['latest_seconds']}”")
        with gr.Row():
            evs_on = gr.Checkbox(value=True, label=SETTINGS["evs_enabled"].label)
            threshold = gr.Slider(
                0.5, 1.0, value=evs.DEFAULT_THRESHOLD, step=0.005, label=SETTINGS["evs_threshold"].label,
                info="A frame is kept when more than (1 − threshold) of the picture changed: 0.95 → 5 %.",
            )
            # More than --max-session-mb holds at the stored size is refused
            # when asked, with the budget named (the model's size is known then).
            max_frames = gr.Slider(4, 256, value=64, step=1, label=SETTINGS["max_frames"].label,
                                   info="At most what the server's --max-session-mb holds")
        with gr.Row():
            frames_as = gr.Radio(list(FRAMES_AS), value=s.frames_as, label=SETTINGS["frames_as"].label)
            audio_on = gr.Checkbox(value=True, label=f"{SETTINGS['include_audio'].label} (models that take it)")
            max_tokens = gr.Slider(1, 2048, value=s.max_tokens, step=1, label=SETTINGS["max_tokens"].label,
                                   elem_id="vc-max-tokens")
            temperature = gr.Slider(0.0, 1.5, value=s.temperature, step=0.05, label=SETTINGS["temperature"].label,
                                    elem_id="vc-temperature")
            seed = gr.Textbox(value="", label=SETTINGS["seed"].label, placeholder="random", elem_id="vc-seed",
                              info="A whole number makes sampling repeatable; empty picks a new one each time.")
        allowed = bool(s.record_dir)
        record = gr.Checkbox(value=False, interactive=allowed, elem_id="vc-record",
                             label="Record each answer as a bundle on the server (its links: at the top of "
                                   "What the model got, and under each answer)" if allowed else
                             "Record (off: the server was started without --record-dir)")
        system_prompt = gr.Textbox(value=s.system_prompt, label=SETTINGS["system_prompt"].label, lines=2, max_lines=6,
                                   elem_id="vc-system-prompt", info="Put before every conversation; empty: none.")
    _checked_by_vidchat(k, seconds, threshold, max_frames, max_tokens, temperature)
    return [k, sampling, seconds, evs_on, threshold, max_frames, frames_as, audio_on, max_tokens, temperature, seed,
            record, system_prompt]


def _checked_by_vidchat(*sliders: gr.Slider) -> None:
    """A value typed into a slider's box outside its range would be refused
    by Gradio before vidchat sees it: an error badge in place of the chat and
    a toast that names no field. Its value goes to vidchat's settings table
    instead, which refuses it with the field's label and leaves the chat be."""
    for slider in sliders:
        slider.preprocess = _as_sent


def _as_sent(payload):
    return payload


def page_state_capacity(max_sessions: int) -> int:
    """How many tabs' page state Gradio keeps. It keeps a copy of the page's
    component state for each tab it has seen (about 110 KB for this page),
    by default for 10,000 tabs: over a gigabyte that a long-running server
    grows into as visitors come and go, never given back. The least recently
    used goes first, so a tab in use keeps its own (one idle while hundreds
    of others came loses only the bundles it had loaded, see the docs); the
    bound leaves room for many more tabs than sessions (a tab without a
    camera has no session)."""
    return max(256, 8 * max_sessions)


def mount(app, state):
    """Mount the page at / on ``app`` (behind Gradio's login when access
    needs one) and tell the access guard which of its functions take the
    session id; returns the app."""
    # Uploads are deleted by Gradio once old (delete_cache; each counts against
    # its login's --max-upload-mb until then), and none is larger than a login may keep.
    with gr.Blocks(title="vidchat", delete_cache=UPLOAD_DELETE_CACHE) as blocks:
        _header(state)
        page = _controls(state)
        _page_token(blocks, state)
        wire(blocks, state, page)
    blocks.state_session_capacity = page_state_capacity(state.settings.max_sessions)
    app = gr.mount_gradio_app(app, blocks, path="/", head=HEAD,
                              max_file_size=min(MAX_BUNDLE_BYTES, state.access.upload_bytes),
                              theme=gr.themes.Soft(), footer_links=[], auth=state.access.gradio_auth(),
                              auth_message=_auth_message(state))
    gradio_app = next(r.app for r in app.routes if isinstance(r, Mount) and r.path == "")
    state.page_logins.attach(gradio_app, *page_functions(blocks, page.session_id))
    state.page_app = gradio_app
    return app


def _controls(state) -> Controls:
    """Every control of the page, laid out: the live preview beside the
    chat, then settings, what the model got, and re-ask."""
    with gr.Row(equal_height=False, elem_classes="vc-main"):
        with gr.Column(scale=5, min_width=300):
            gr.HTML(PREVIEW_HTML.replace("{store_limit}", as_text(state.store_limit_text()))
                    .replace("{access_mode}", access_mode(state))
                    .replace("{suites}", "on" if state.settings.suite_dir else "off"), elem_id="vc-live-panel")
        with gr.Column(scale=6, min_width=300):
            chat = _chat_column(state)
    settings_inputs = _settings_panel(state)
    with gr.Accordion("What the model got (last question)", open=False, elem_id="vc-inputs"):
        inputs_view = gr.HTML(frames_html(None))
        details = gr.JSON(label="Reply details", value=None)
    reasking = _reask_panel(state)
    if state.settings.suite_dir:
        _suites_panel(state)
    session_id = gr.Textbox(visible="hidden", elem_id="vidchat-session-id")
    return Controls(**chat, settings_inputs=settings_inputs, inputs_view=inputs_view, details=details, **reasking,
                    session_id=session_id)


def _chat_column(state) -> dict[str, Any]:
    """The chat, the question box, and the Watch, Talk and Both models switches under it."""
    # Each message in its own bubble: a notice (a refused setting, Stop) is
    # read as what it is, not as more words of the answer or notice before it.
    chatbot = gr.Chatbot(label="Chat", height=440, elem_id="vc-chat", buttons=["copy"],
                         group_consecutive_messages=False)
    with gr.Row(elem_classes="vc-ask"):
        # Its label is its accessible name (shown only to screen readers: the
        # placeholder says it on screen, in the chosen source's words, static/js/wording.js).
        question = gr.Textbox(placeholder="Ask about the camera…", label="Question", show_label=False,
                              scale=8, lines=1, max_lines=4, elem_id="vc-question")
        send = gr.Button("Send", variant="primary", scale=1, min_width=70, elem_id="vc-send")
        stop = gr.Button("Stop", scale=1, min_width=70, elem_id="vc-stop-answer")
    sent_question = gr.Textbox(visible="hidden", elem_id="vc-sent-question")
    # A setting refused in the page (static/js/slider_checks.js) says so here, under the question.
    gr.HTML("<div id='vc-refused' class='vc-refused' role='alert' hidden></div>", elem_id="vc-refused-box")
    # Why nothing was asked when there is no session (no chat to say it in).
    question_note = gr.Markdown(visible=False, elem_id="vc-question-note", elem_classes="vc-refused")
    with gr.Row(elem_classes="vc-watch"):
        watch_on = gr.Checkbox(value=False, label="Watch: ask on scene changes", scale=2, elem_id="vc-watch")
        watch_question = gr.Textbox(value="What just changed?", label="Standing question", scale=4,
                                    elem_id="vc-watch-question")
        # No minimum/maximum on these numbers: Gradio's own check would replace the
        # chat with an error badge; vidchat checks them and names the field.
        watch_every = gr.Number(value=DEFAULT_EVERY_S, label=WATCH_EVERY_LABEL, scale=1, elem_id="vc-watch-every")
    with gr.Row(elem_classes="vc-talk"):
        talk_on = gr.Checkbox(value=False, label="Talk: ask by voice", scale=2, elem_id="vc-talk",
                              info="Asks when you stop speaking; answers are read aloud")
        barge_in = gr.Checkbox(value=True, label="Speaking stops the answer", scale=2, elem_id="vc-barge-in")
        talk_silence = gr.Number(value=round(TurnSettings.min_silence_s * 1000), label=TALK_SILENCE_LABEL,
                                 scale=1, elem_id="vc-talk-silence")
        talk_min_speech = gr.Number(value=round(TurnSettings.min_speech_s * 1000), label=TALK_MIN_SPEECH_LABEL,
                                    scale=1, elem_id="vc-talk-min-speech")
    gr.HTML(TALK_HTML, elem_id="vc-talk-panel")
    # Only with --compare-model: each question answered by both models, side by side.
    both_models = gr.Checkbox(value=False, label="Both models: each question to both, side by side",
                              visible=bool(state.compare_model_path), elem_id="vc-both-models",
                              info="The second model gets the same frames, audio, chat and seed")
    clear = gr.Button("Clear chat", size="sm", elem_id="vc-clear")
    return dict(chatbot=chatbot, both_models=both_models, question=question, sent_question=sent_question, question_note=question_note,
                send=send, stop=stop,
                watch_on=watch_on, watch_question=watch_question, watch_every=watch_every, talk_on=talk_on,
                barge_in=barge_in, talk_silence=talk_silence, talk_min_speech=talk_min_speech, clear=clear)


def _reask_panel(state) -> dict[str, Any]:
    """Re-ask and compare: an earlier answer (or a loaded bundle) asked again on the same inputs."""
    with gr.Accordion("Re-ask and compare", open=False, elem_id="vc-reask-panel"):
        two_models = bool(state.compare_model_path)
        gr.Markdown("Ask an earlier question again on **exactly the same frames, audio and history**, with the "
                    "settings above (frames per question takes that many of the original frames; the system "
                    "prompt is in Settings too), and see both answers side by side. A recorded bundle (.zip) "
                    "can be loaded and re-asked the same way. "
                    + ("Choose which model answers." if two_models else
                       "To put the same inputs to two models, start vidchat with `--compare-model MODEL` "
                       "(memory for both), or run two servers and re-ask a recorded bundle on each "
                       "(`python -m vidchat.replay BUNDLE --model …`)."), elem_classes="vc-muted")
        with gr.Row():
            # Custom values: the list is per session (refreshed after each answer), and the
            # API takes any answer id; reask() checks it belongs to the session or the tab.
            reask_from = gr.Dropdown(choices=[], label="Answer to re-ask", scale=4, elem_id="vc-reask-from",
                                     allow_custom_value=True)
            reask_btn = gr.Button("Re-ask with these settings", scale=1, elem_id="vc-reask")
        with gr.Row():
            reask_engine = gr.Radio(reask_engines(state), value="main", label="Model", visible=two_models,
                                    elem_id="vc-reask-model", scale=3)
            bundle_file = gr.File(label="Load a recorded bundle (.zip)", file_types=[".zip"], type="filepath",
                                  elem_id="vc-bundle-file", scale=2, height=130)
        comparison = gr.HTML("", elem_id="vc-compare")
        loaded_bundles = gr.State({})
    return dict(reask_from=reask_from, reask_btn=reask_btn, reask_engine=reask_engine, bundle_file=bundle_file,
                comparison=comparison, loaded_bundles=loaded_bundles)


def _suites_panel(state) -> None:
    """The suite of --suite-dir: its cases, a run on this model (or the
    second one) with its progress, the table of its asks and its report
    (static/js/suites.js draws it from /suites; vidchat.qa.suite runs it)."""
    names = dict((value, label) for label, value in reask_engines(state))
    second = (f"<button type='button' class='vc-suite-run' data-engine='compare'>Run on the second model: "
              f"{as_text(names['compare'])}</button>" if "compare" in names else "")
    with gr.Accordion("Suites", open=False, elem_id="vc-suites-panel"):
        gr.HTML(f"""<div id='vc-suites'>
<p class='vc-muted'>The QA suite in <code>{as_text(state.settings.suite_dir)}</code>: each case asks a recorded answer's
exact inputs again (Add to suite, under an answer's <em>What the model got</em>) or a clip at set moments, and checks
the answer. A run shares this server's model and its queue with the live chats; its reports go into the suite's
<code>runs/</code> folder. The same suite runs on the command line: <code>python -m vidchat.suite run</code>.</p>
<div class='vc-suite-cases' aria-live='polite'>Open this panel to read the suite.</div>
<div class='vc-suite-buttons'><button type='button' class='vc-suite-run' data-engine='main'>Run on this model:
{as_text(model_label(state))}</button>{second}</div>
<p class='vc-suite-progress' role='status'></p>
<div class='vc-suite-results'></div>
</div>""", elem_id="vc-suites-box")


def _page_token(blocks: gr.Blocks, state) -> None:
    """The hidden field the page's own calls carry their access token in;
    filled when the page loads, for a logged-in user only (Gradio runs no
    event for a page that has not logged in)."""
    page_token = gr.Textbox(visible="hidden", elem_id="vidchat-page-token")
    if state.access.hf_oauth:
        def issue_token(profile: gr.OAuthProfile | None) -> str:
            return hf_page_token(state, profile.username if profile else None)
    else:
        def issue_token(request: gr.Request) -> str:
            return password_page_token(state, request.username)
    blocks.load(issue_token, None, page_token, queue=False, api_visibility="private")


def page_functions(blocks: gr.Blocks, session_id: gr.components.Component) -> tuple[dict[int, int], dict[str, int]]:
    """For the access guard: the page's functions that take the session id
    (fn_index -> its place in their inputs), and the fn_index of each API name."""
    takes_session = {}
    by_name = {}
    for fn in blocks.fns.values():
        for position, component in enumerate(fn.inputs):
            if component is session_id:
                takes_session[fn._id] = position
        if isinstance(fn.api_name, str):
            by_name[fn.api_name] = fn._id
    return takes_session, by_name


def access_mode(state) -> str:
    """How this page gets its credential: 'none', 'login' (password) or 'hf'."""
    if not state.access.required:
        return "none"
    return "hf" if state.access.hf_oauth else "login"


def _auth_message(state) -> str | None:
    if state.access.passwords:
        return "This vidchat needs a login."
    if state.access.token:
        return "This vidchat needs its access token: type it as the password (any user name)."
    return None


def password_page_token(state, username: str | None) -> str:
    access = state.access
    if not access.required or access.hf_oauth:
        return ""
    # The name Gradio's login recorded, as it recorded it: the guard reads the
    # same name from the login cookie, and both must name one login.
    return access.page_token(username if username is not None else "user")


def hf_page_token(state, username: str | None) -> str:
    """A page token for a signed-in Hugging Face user on the allow-list; else none."""
    if not state.access.hf_user_allowed(username):
        if username:
            log.info("Hugging Face user %r is not on --hf-users", username)
        return ""
    return state.access.page_token(username)


# The page state Gradio keeps for each tab, kept from growing.
#
# Gradio keeps a copy of the page's component state for every tab it has
# seen (each component's configuration, the chat, the last answer's "what
# the model got" and reply details, the tab's loaded bundle). Two things
# grew it on a server left running (bench/soak.py found them;
# docs/operations.md, "What the soak found"):
#
# - **Every answer, in an open tab.** An output first given ``gr.skip()``
#   (an update) and then a value (the answer's inputs view and details, once
#   it is done) is stored by Gradio 6 under a fresh component id each time,
#   beside the component's own: about 12 KB more per answer that nothing
#   reads (the tab's ``config_values`` are only written, and the extra
#   component copies are only looked up under ids no event has). Each round
#   drops the entries under ids that are not the page's own.
# - **Every tab, once closed.** When a tab closes (its heartbeat stream
#   ends) Gradio only marks its copy closed; the copy stays until
#   ``page_state_capacity`` newer tabs push it out. A tab closed and not used
#   for ``--closed-tab-timeout`` s is forgotten. A tab whose heartbeat only
#   blinked (it reconnects, stays marked closed, and its next event finds its
#   state) is in use, so it is kept; one that comes back after it was
#   forgotten starts from the page's defaults, as Gradio's own expiry would
#   leave it after an hour.
#
# The rounds run on the event loop, where Gradio changes these copies too.

ROUND_EVERY_S = 60.0  # at most; a few times within the timeout when it is shorter


def _stray_keys(holder: Any, table: dict) -> list[int]:
    """The ids in one of a tab's tables that are not the page's own components."""
    return [key for key in table if key not in holder.blocks.blocks]


def tab_counts(holder: Any) -> dict[str, int]:
    """How many tabs' state Gradio holds, how many of those are closed, and
    how many stray component copies they hold now (/api/health's ``page_tabs``)."""
    states = list(holder.session_data.values())
    return {"held": len(states), "closed": sum(1 for s in states if getattr(s, "is_closed", False)),
            "stray_copies": sum(len(_stray_keys(holder, s.config_values)) for s in states)}


def drop_stray_copies(holder: Any) -> int:
    """Drop, in every tab's state, the entries under ids that are not the
    page's own components; returns how many went."""
    dropped = 0
    for tab_state in list(holder.session_data.values()):
        for table in (tab_state.config_values, tab_state.blocks_config.blocks):
            stray = _stray_keys(holder, table)
            for key in stray:
                del table[key]
            dropped += len(stray)
    return dropped


def forget_closed_tabs(holder: Any, keep_s: float, now: datetime.datetime | None = None) -> int:
    """Drop the state of each tab closed and unused for ``keep_s``; returns how many went."""
    now = now or datetime.datetime.now()
    idle_since = dict(holder.time_last_used)
    gone = [tab for tab, tab_state in list(holder.session_data.items())
            if getattr(tab_state, "is_closed", False)
            and (now - idle_since.get(tab, datetime.datetime.min)).total_seconds() >= keep_s]
    for tab in gone:
        holder.delete_state(tab)  # gr.State values' delete callbacks, as Gradio's own expiry runs them
        with holder.lock:
            holder.session_data.pop(tab, None)
            holder.time_last_used.pop(tab, None)
    return len(gone)


async def keep_tab_states_bounded(holder_of: Callable[[], Any], keep_s: float) -> None:
    """A round of both every so often until cancelled (the app's lifespan runs it)."""
    every_s = min(ROUND_EVERY_S, max(0.5, keep_s / 4))
    while True:
        await asyncio.sleep(every_s)
        holder = holder_of()
        if holder is None:  # no page mounted
            continue
        try:
            gone = forget_closed_tabs(holder, keep_s)
            dropped = drop_stray_copies(holder)
        except Exception:
            log.exception("keeping the tabs' page state bounded failed")
            continue
        if gone or dropped:
            log.debug("page state: forgot %d closed tab(s), dropped %d stray component copies", gone, dropped)
