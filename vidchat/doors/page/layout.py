"""The page's layout: what each control is and where it sits, which
function each runs, and the access tokens the page carries.

Gradio lays out the page, its settings and sign-in, and runs the events
that are not a question (Stop, Clear, Watch, Talk, re-ask, the public API).
A typed question is one request of the page's own (POST /webrtc/ask, which
returns its ticket) and the chat panel is drawn by static/js/chat.js from
the session's events (vidchat.doors.page.chat): no Gradio event carries a
question or the chat, and nothing here reads or writes Gradio's state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import gradio as gr
from starlette.routing import Mount

from vidchat.conversation.asking import MAX_TEMPERATURE, SETTINGS
from vidchat.conversation.events import Notice
from vidchat.conversation.modes import DEFAULT_EVERY_S
from vidchat.doors import UPLOAD_DELETE_CACHE, PageServer, as_text, login_of
from vidchat.doors.page.chat import (
    CLEAR_ICON,
    COPY_ICON,
    HEAD,
    NOT_RUNNING,
    PREVIEW_HTML,
    TALK_HTML,
    frames_html,
    markdown_html,
    model_label,
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
    page_defaults,
    reask,
    reask_choices,
    reask_engines,
    respond,
    stop_answer,
    talk_switch,
    watch_switch,
)
from vidchat.media import FRAMES_AS
from vidchat.media.session import MAX_FRAMES_LIMIT
from vidchat.media.vad import TurnSettings

log = logging.getLogger(__name__)


# The page's events: which function of vidchat.doors.page each control
# runs, with which inputs and outputs. (Their fn_index is the access
# guard's map, vidchat.doors.page.layout.page_functions, read once they are all registered.)

# Said in the chat when Stop (beside Send) ended watching as well as the answer.
WATCH_STOPPED = "Stop switched Watch off as well: tick Watch to go on watching."

# A streaming API event's last message repeats its last update in full: the
# API events end on an update that changes nothing. (A generator that
# yields nothing at all would blank the chat.)
LAST_UPDATE_IS_NOTHING = (gr.skip(), gr.skip(), gr.skip())

# The chat panel: its strip (the label, the clear icon) above the list of
# messages that static/js/chat.js draws from the session's events. The
# template is what the chat says to a question asked with no session (there
# is no conversation to ask, and no event stream to draw it from).
CHAT_HTML = """
<div class="vc-chat-panel">
  <div class="vc-chat-strip"><span class="vc-chat-label">Chat</span>
    <button type="button" class="vc-chat-clear" title="Clear chat">{clear_icon}Clear</button></div>
  <div class="vc-chat-list" role="log" aria-live="polite" aria-label="Chat"></div>
  <template id="vc-copy-icon">{copy_icon}</template>
  <template id="vc-not-running"><div class="vc-msg vc-bot vc-notice" data-testid="bot"><div class="vc-md">{not_running}</div></div></template>
</div>
"""

# What the model got (newest answer, named in it): drawn by static/js/chat.js from the same events.
INPUTS_HTML = """<div id="vc-inputs-html">{empty}</div>
<details class="vc-reply-details"><summary>Reply details</summary><pre id="vc-details">null</pre></details>"""


@dataclass
class Controls:
    """The page's controls that events read or write."""

    api_chat: gr.Chatbot  # hidden: the public API's chat (/ask, /watch, /talk), in and out
    question: gr.Textbox
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
    scene_share: gr.Slider  # what Watch counts as a scene change (not among the public API's inputs)
    inputs_panel: gr.Accordion
    api_inputs_view: gr.HTML  # hidden: what the model got, as the public API returns it
    api_details: gr.JSON  # hidden: the reply's details, as the public API returns them
    reask_panel: gr.Accordion
    reask_from: gr.Dropdown
    reask_btn: gr.Button
    reask_engine: gr.Radio
    bundle_file: gr.File
    comparison: gr.HTML
    loaded_bundles: gr.State
    session_id: gr.Textbox

    @property
    def api_outputs(self) -> list[gr.components.Component]:
        """What the public API's answer returns: the chat, the "what the model got" panel, the reply's details."""
        return [self.api_chat, self.api_inputs_view, self.api_details]


def wire(blocks: gr.Blocks, state: PageServer, page: Controls) -> None:
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


def _settings_help(page: Controls) -> None:
    """The Sampling picker's help says what the chosen strategy does (the settings table's words)."""
    sampling = next(c for c in page.settings_inputs if c.elem_id == "vc-sampling")

    def explain(chosen):
        return gr.update(info=SETTINGS["sampling"].choice_help(chosen))

    sampling.change(explain, sampling, sampling, queue=False, show_progress="hidden", api_visibility="private")


def _questions(state: PageServer, page: Controls, own: Callable) -> None:
    """The public /ask, and Stop. (The page's own typed question is POST
    /webrtc/ask, static/js/questions.js: no Gradio event.)"""

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

    # The public /ask: the question, its part of the chat streamed after
    # the caller's chat; the last message is the whole reply (what an API
    # client reads as the result).
    ask_api = gr.Button(visible=False, elem_id="vc-ask-api")
    ask_api.click(on_question, [page.question, page.api_chat, page.session_id, *page.settings_inputs],
                  page.api_outputs, api_name="ask", concurrency_limit=None)
    page.stop.click(on_stop, [page.session_id], page.watch_on, concurrency_limit=None, api_name="stop")


def _clear(state: PageServer, page: Controls, own: Callable) -> None:
    """Clear chat, and the chat's own clear icon."""

    async def on_clear(request: gr.Request, sid, loaded):
        await clear_chat(state, own(request, sid))  # the tab's chat empties as the session's events say
        choices = bundle_choices(loaded)  # the old chat's answers are no longer offered; loaded bundles are
        return gr.Dropdown(choices=choices, value=choices[0][1] if choices else None)

    # The chat panel's own clear icon presses Clear chat (static/js/chat.js).
    page.clear.click(on_clear, [page.session_id, page.loaded_bundles], page.reask_from, api_visibility="private")


def _watch(state: PageServer, page: Controls, own: Callable) -> None:
    """Watch: the standing question asked at scene changes, by a task of the conversation."""

    async def on_switch(request: gr.Request, on, q, every, sid, *raw):
        return await watch_switch(state, on, q, every, own(request, sid), *raw)

    async def on_watch_api(request: gr.Request, on, q, every, history, sid, *raw):
        sid = own(request, sid)
        switched = await watch_switch(state, on, q, every, sid, *raw)
        async for update in mode_updates(state, sid, history, switched, lambda modes: modes.watching):
            yield update
        yield (*LAST_UPDATE_IS_NOTHING, gr.skip())

    switch_inputs = [page.watch_on, page.watch_question, page.watch_every, page.session_id, *page.settings_inputs,
                     page.scene_share]
    page.watch_on.change(on_switch, switch_inputs, [page.watch_on, page.question_note], api_visibility="private",
                         show_progress="hidden", trigger_mode="multiple", concurrency_limit=None)
    # The /watch API: switch it, then the chat as watching asks, until it ends.
    watch_api = gr.Button(visible=False, elem_id="vc-watch-api")
    watch_api.click(on_watch_api, [page.watch_on, page.watch_question, page.watch_every, page.api_chat,
                                   page.session_id, *page.settings_inputs], [*page.api_outputs, page.watch_on],
                    api_name="watch", concurrency_limit=None, show_progress="hidden")


def _talk(blocks: gr.Blocks, state: PageServer, page: Controls, own: Callable) -> None:
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
    talk_api.click(on_talk_api, [page.talk_on, page.barge_in, page.talk_silence, page.talk_min_speech,
                                 page.api_chat, page.session_id, *page.settings_inputs],
                   [*page.api_outputs, page.talk_on],
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


def _reask(state: PageServer, page: Controls, own: Callable) -> None:
    """Re-ask and compare: the list of answers, loading a bundle, the re-ask itself."""

    async def on_load_bundle(request: gr.Request, path, sid, loaded):
        loaded, _, chosen, message = await load_bundle(state, path, loaded)
        choices = reask_choices(state, own(request, sid), loaded)
        return (loaded, gr.Dropdown(choices=choices, value=chosen or (choices[0][1] if choices else None)),
                message, None)

    async def on_look(request: gr.Request, sid, loaded, chosen):
        """The list as the chat's answers are now (and the bundle this tab
        loaded), read as the panel opens or the list is opened; the choice
        stays unless it is no longer offered (then the newest)."""
        choices = reask_choices(state, own(request, sid), loaded)
        values = [value for _, value in choices]
        return gr.Dropdown(choices=choices, value=chosen if chosen in values else values[0] if values else None)

    for trigger in (page.reask_panel.expand, page.reask_from.focus):
        trigger(on_look, [page.session_id, page.loaded_bundles, page.reask_from], page.reask_from,
                api_visibility="private", show_progress="hidden", concurrency_limit=None)

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


def _settings_panel(state) -> tuple[list[gr.components.Component], gr.Slider]:
    """The settings accordion; returns its inputs in respond()'s order
    (vidchat.doors.page.questions.PAGE_SETTINGS: static/js/settings.js reads
    them by their elem_id for the page's own questions)."""
    s = state.settings
    d = page_defaults(state)
    max_images = max(1, s.max_images)
    with gr.Accordion("Settings", open=False, elem_id="vc-settings"):
        with gr.Row():
            k = gr.Slider(1, max_images, value=d["num_sample_frames"], step=1,
                          label=SETTINGS["num_sample_frames"].label, elem_id="vc-frames-per-question")
            # The picker shows each strategy's label and sends its name (the
            # protocol's); its help says what the chosen one does (events.py).
            strategy = SETTINGS["sampling"]
            sampling = gr.Dropdown(strategy.page_choices(), value=d["sampling"], label=strategy.label,
                                   elem_id="vc-sampling", info=strategy.choice_help(d["sampling"]))
            window = SETTINGS["sample_seconds"]
            by_value = {value: label for label, value in strategy.page_choices()}
            seconds = gr.Slider(1, 60, value=d["sample_seconds"], step=1, label=f"{window.label} (s)",
                                elem_id="vc-sample-seconds", info=f"Used by “{by_value['latest_seconds']}”")
        with gr.Row():
            evs_on = gr.Checkbox(value=d["evs_enabled"], label=SETTINGS["evs_enabled"].label, elem_id="vc-evs")
            threshold = gr.Slider(
                0.5, 1.0, value=d["evs_threshold"], step=0.005, label=SETTINGS["evs_threshold"].label,
                info="A frame is kept when more than (1 − threshold) of the picture changed: 0.95 → 5 %.",
                elem_id="vc-evs-threshold",
            )
            # The server's own limit: what --max-session-mb holds at the stored
            # size (a value beyond it is refused in its box, as the server would).
            kept_high = max(4, min(MAX_FRAMES_LIMIT, state.frames_kept_limit()))
            max_frames = gr.Slider(4, kept_high, value=min(d["max_frames"], kept_high), step=1,
                                   label=SETTINGS["max_frames"].label,
                                   info=f"At most {kept_high}: what the server's --max-session-mb holds",
                                   elem_id="vc-max-frames")
        with gr.Row():
            frames_as = gr.Radio(list(FRAMES_AS), value=d["frames_as"], label=SETTINGS["frames_as"].label,
                                 elem_id="vc-frames-as")
            audio_on = gr.Checkbox(value=d["include_audio"],
                                   label=f"{SETTINGS['include_audio'].label} (models that take it)",
                                   elem_id="vc-include-audio")
            # The model's context is the server's limit (the prompt takes its share when asked).
            tokens_high = max(1, s.max_model_len)
            max_tokens = gr.Slider(1, tokens_high, value=min(d["max_tokens"], tokens_high), step=1,
                                   label=SETTINGS["max_tokens"].label, elem_id="vc-max-tokens")
            temperature = gr.Slider(0.0, MAX_TEMPERATURE, value=d["temperature"], step=0.05,
                                    label=SETTINGS["temperature"].label,
                                    elem_id="vc-temperature")
            seed = gr.Textbox(value=d["seed"], label=SETTINGS["seed"].label, placeholder="random", elem_id="vc-seed",
                              info="A whole number makes sampling repeatable; empty picks a new one each time.")
        allowed = bool(s.record_dir)
        record = gr.Checkbox(value=d["record"], interactive=allowed, elem_id="vc-record",
                             label="Record each answer as a bundle on the server (its links: at the top of "
                                   "What the model got, and under each answer)" if allowed else
                             "Record (off: the server was started without --record-dir)")
        system_prompt = gr.Textbox(value=d["system_prompt"], label=SETTINGS["system_prompt"].label, lines=2,
                                   max_lines=6, elem_id="vc-system-prompt",
                                   info="Put before every conversation; empty: none.")
        # What Watch counts as a scene change (vidchat.media.frame_buffer): lower is more sensitive.
        scene_share = gr.Slider(0.01, 1.0, value=d["scene_change_share"], step=0.01,
                                label=SETTINGS["scene_change_share"].label, elem_id="vc-scene-share",
                                info="Watch asks when this share of the picture changed since the last scene "
                                     "change, or was crossed by motion in the last few seconds: lower is more "
                                     "sensitive.")
    _checked_by_vidchat(k, seconds, threshold, max_frames, max_tokens, temperature, scene_share)
    # The public API events' inputs stay as they were (a caller passes them by
    # position); the scene share goes with the page's own questions (by name)
    # and with the Watch switch.
    return [k, sampling, seconds, evs_on, threshold, max_frames, frames_as, audio_on, max_tokens, temperature, seed,
            record, system_prompt], scene_share


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
    """How many tabs' page state Gradio keeps (Gradio's own bound, set
    through its public ``state_session_capacity``). It keeps the values of
    the page's controls for each tab it has seen, by default for 10,000
    tabs, never given back. The chat and what the model got are not among
    them (static/js/chat.js draws them from the session's events), so a
    tab's copy is its settings, its switches and its loaded bundle. The
    least recently used goes first, so a tab in use keeps its own (one idle
    while hundreds of others came loses only the bundle it had loaded, see
    the docs); the bound leaves room for many more tabs than sessions (a tab
    without a camera has no session)."""
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
    settings_inputs, scene_share = _settings_panel(state)
    with gr.Accordion("What the model got (newest answer)", open=False, elem_id="vc-inputs") as inputs_panel:
        gr.HTML(INPUTS_HTML.replace("{empty}", frames_html(None)), elem_id="vc-inputs-view")
    reasking = _reask_panel(state)
    if state.settings.suite_dir:
        _suites_panel(state)
    session_id = gr.Textbox(visible="hidden", elem_id="vidchat-session-id")
    # The public API's outputs (never shown on the page, whose chat and
    # inputs panel static/js/chat.js draws).
    api_inputs_view = gr.HTML(visible=False, elem_id="vc-api-inputs")
    api_details = gr.JSON(visible=False, elem_id="vc-api-details")
    return Controls(**chat, settings_inputs=settings_inputs, scene_share=scene_share, inputs_panel=inputs_panel,
                    api_inputs_view=api_inputs_view, api_details=api_details, **reasking, session_id=session_id)


def _chat_column(state) -> dict[str, Any]:
    """The chat, the question box, and the Watch, Talk and Both models switches under it."""
    # Each message in its own bubble: a notice (a refused setting, Stop) is
    # read as what it is, not as more words of the answer or notice before it.
    gr.HTML(CHAT_HTML.replace("{not_running}", markdown_html(NOT_RUNNING)).replace("{clear_icon}", CLEAR_ICON)
            .replace("{copy_icon}", COPY_ICON),
            elem_id="vc-chat")
    api_chat = gr.Chatbot(visible=False, elem_id="vc-api-chat")
    with gr.Row(elem_classes="vc-ask"):
        # Its label is its accessible name (shown only to screen readers: the
        # placeholder says it on screen, in the chosen source's words, static/js/wording.js).
        question = gr.Textbox(placeholder="Ask about the camera…", label="Question", show_label=False,
                              scale=8, lines=1, max_lines=4, elem_id="vc-question")
        send = gr.Button("Send", variant="primary", scale=1, min_width=70, elem_id="vc-send")
        stop = gr.Button("Stop", scale=1, min_width=70, elem_id="vc-stop-answer")
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
    # What watching is doing, from the live stats (static/js/live.js).
    gr.HTML("<p id='vc-watch-status' class='vc-muted' role='status' hidden></p>", elem_id="vc-watch-status-box")
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
    return dict(api_chat=api_chat, both_models=both_models, question=question, question_note=question_note,
                send=send, stop=stop,
                watch_on=watch_on, watch_question=watch_question, watch_every=watch_every, talk_on=talk_on,
                barge_in=barge_in, talk_silence=talk_silence, talk_min_speech=talk_min_speech, clear=clear)


def _reask_panel(state) -> dict[str, Any]:
    """Re-ask and compare: an earlier answer (or a loaded bundle) asked again on the same inputs."""
    with gr.Accordion("Re-ask and compare", open=False, elem_id="vc-reask-panel") as reask_panel:
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
    return dict(reask_panel=reask_panel, reask_from=reask_from, reask_btn=reask_btn, reask_engine=reask_engine, bundle_file=bundle_file,
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
<p class='vc-muted'>The QA suite in the server's folder <code>{as_text(Path(state.settings.suite_dir).name)}</code>: each case asks a recorded answer's
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
    for fn_index, fn in blocks.fns.items():  # Blocks.fns: each event's function by its fn_index
        for position, component in enumerate(fn.inputs):
            if component is session_id:
                takes_session[fn_index] = position
        if isinstance(fn.api_name, str):
            by_name[fn.api_name] = fn_index
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
