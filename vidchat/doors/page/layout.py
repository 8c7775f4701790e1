"""The page's layout: what each control is and where it sits, and the
access tokens the page carries. Which function each control runs is
vidchat.doors.page.events."""

from __future__ import annotations

import logging
from typing import Any

import gradio as gr
from starlette.routing import Mount

from vidchat.doors.server_contract import UPLOAD_DELETE_CACHE
from vidchat.conversation.settings_table import SETTINGS
from vidchat.conversation.watch import DEFAULT_EVERY_S
from vidchat.doors.markup import as_text
from vidchat.doors.page.view import HEAD, PREVIEW_HTML, TALK_HTML, frames_html, model_label
from vidchat.media import FRAMES_AS, evs
from vidchat.media.vad import TurnSettings
from vidchat.doors.page.reask import MAX_BUNDLE_BYTES, reask_engines
from vidchat.doors.page.events import Controls, wire
from vidchat.doors.page.modes import TALK_MIN_SPEECH_LABEL, TALK_SILENCE_LABEL, WATCH_EVERY_LABEL

log = logging.getLogger(__name__)


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
    (static/js/suites.js draws it from /suites; vidchat.qa.suite_runs runs it)."""
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
