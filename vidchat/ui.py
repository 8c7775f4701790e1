"""The Gradio page: live preview and chat side by side, settings folded away,
and a panel showing exactly what the model was given for the last question.

Browser behaviour (camera, WebRTC) lives in static/vidchat.js; this module
lays out the page and runs the chat events through vidchat.chat, the same
path the WebSocket protocol uses.
"""

from __future__ import annotations

import base64
import html
import io
import logging
import time
from typing import Any, AsyncIterator

import gradio as gr
from PIL import Image

from vidchat import evs
from vidchat.chat import NoFrames, start_answer
from vidchat.engine import EngineError, Turn
from vidchat.session import SAMPLING_STRATEGIES

log = logging.getLogger(__name__)

HEAD = '<link rel="stylesheet" href="/static/vidchat.css"><script src="/static/vidchat.js" defer></script>'

PREVIEW_HTML = """
<div class="vc-live">
  <div class="vc-video-wrap">
    <video id="vc-preview" autoplay playsinline muted></video>
    <div class="vc-conn" id="vc-conn" data-tone="idle">Not started</div>
  </div>
  <div class="vc-controls">
    <button id="vc-start" class="vc-btn vc-primary">Start camera</button>
    <button id="vc-stop" class="vc-btn" disabled>Stop camera</button>
  </div>
  <div class="vc-devices">
    <label>Camera <select id="vc-camera"><option value="">Default</option></select></label>
    <label>Microphone <select id="vc-mic"><option value="">Default</option></select></label>
    <label>Resolution <select id="vc-res">
      <option value="320x240">320×240</option>
      <option value="640x480" selected>640×480</option>
      <option value="1280x720">1280×720</option></select></label>
    <label>Frame rate <select id="vc-fps">
      <option value="5">5 fps</option><option value="15" selected>15 fps</option>
      <option value="30">30 fps</option></select></label>
  </div>
  <div class="vc-stats" id="vc-stats">No session</div>
  <div class="vc-note" id="vc-note" role="status"></div>
</div>
"""

NOT_RUNNING = (
    "The camera isn't running yet. Press **Start camera** on the left, allow access, "
    "and ask again once the preview shows."
)
STOPPED = "(stopped)"
# The model may end its answer at once (its end token first): say so rather
# than leave an empty bubble that looks like a hang.
NO_TEXT = "(the model returned no text)"
NO_FRAMES = "No frames have arrived from the camera yet. Wait a moment after **Start camera**, then ask again."


def _message_text(content: Any) -> str:
    """Gradio 6 gives message content as a string or a list of typed parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if isinstance(content, dict):
        return content.get("text", "")
    return ""


def history_turns(history: list[dict]) -> list[Turn]:
    turns = []
    for m in history:
        text = _message_text(m.get("content")).strip()
        if m.get("role") in ("user", "assistant") and text and not m.get("metadata"):
            turns.append(Turn(m["role"], text))
    return turns


def frames_html(answer) -> str:
    """Thumbnails of the frames sent, inline as data URLs: nothing touches disk."""
    if answer is None:
        return "<p class='vc-muted'>Ask a question to see the frames and audio the model received.</p>"
    tiles = []
    for frame, t, idx in zip(answer.sample.frames, answer.sample.timestamps, answer.sample.indices):
        img = Image.fromarray(frame)
        img.thumbnail((160, 120))
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=80)
        src = base64.b64encode(buf.getvalue()).decode()
        age = t - answer.sample.timestamps[-1]
        tiles.append(
            f"<figure><img src='data:image/jpeg;base64,{src}' alt='frame {idx}'>"
            f"<figcaption>#{idx} · {age:+.1f} s</figcaption></figure>"
        )
    audio = answer.reply.stats.audio_seconds
    head = (
        f"<p>{len(tiles)} frame(s) as {html.escape(answer.options.frames_as)}, "
        f"{audio:.1f} s of audio{'' if audio else ' (none)'}; times relative to the newest frame.</p>"
    )
    return head + "<div class='vc-frames'>" + "".join(tiles) + "</div>"


def model_label(state) -> str:
    """The model as a person would name it: a hub id, a folder's name, or the test model."""
    if state.tiny:
        return "tiny test model (random weights)"
    path = state.model_path.rstrip("/")
    return path.rsplit("/", 1)[-1] if path.startswith(("/", ".", "~")) else path


def mount(app, state):
    s = state.settings
    max_images = max(1, s.max_images)

    with gr.Blocks(title="vidchat") as blocks:
        with gr.Row(elem_classes="vc-header"):
            gr.HTML(
                "<div class='vc-title'><h1>vidchat</h1>"
                f"<span class='vc-model' title='{html.escape(state.model_path)}'>"
                f"{html.escape(model_label(state))}</span></div>"
            )
        if state.banner:
            gr.HTML(f"<div class='vc-banner' role='alert'>{html.escape(state.banner)}</div>")
        with gr.Row(equal_height=False, elem_classes="vc-main"):
            with gr.Column(scale=5, min_width=300):
                gr.HTML(PREVIEW_HTML, elem_id="vc-live-panel")
            with gr.Column(scale=6, min_width=300):
                chatbot = gr.Chatbot(label="Chat", height=440, elem_id="vc-chat", buttons=["copy"])
                with gr.Row(elem_classes="vc-ask"):
                    question = gr.Textbox(
                        placeholder="Ask about what the camera sees…",
                        show_label=False,
                        scale=8,
                        lines=1,
                        max_lines=4,
                        elem_id="vc-question",
                    )
                    send = gr.Button("Send", variant="primary", scale=1, min_width=70, elem_id="vc-send")
                    stop = gr.Button("Stop", scale=1, min_width=70, elem_id="vc-stop-answer")
                clear = gr.Button("Clear chat", size="sm", elem_id="vc-clear")
        with gr.Accordion("Settings", open=False, elem_id="vc-settings"):
            with gr.Row():
                k = gr.Slider(1, max_images, value=min(16, max_images), step=1, label="Frames per question")
                sampling = gr.Dropdown(list(SAMPLING_STRATEGIES), value="uniform", label="Sampling")
                seconds = gr.Slider(1, 60, value=10, step=1, label="Window for latest_seconds (s)")
            with gr.Row():
                evs_on = gr.Checkbox(value=True, label="Drop near-duplicate frames")
                threshold = gr.Slider(
                    0.5, 1.0, value=evs.DEFAULT_THRESHOLD, step=0.005, label="Filter threshold",
                    info="A frame is kept when more than (1 − threshold) of the picture changed: 0.95 → 5 %.",
                )
                max_frames = gr.Slider(4, 256, value=64, step=1, label="Max frames kept")
            with gr.Row():
                frames_as = gr.Radio(["images", "video"], value=s.frames_as, label="Send frames as")
                audio_on = gr.Checkbox(value=True, label="Include audio (models that take it)")
                max_tokens = gr.Slider(1, 2048, value=s.max_tokens, step=1, label="Max tokens", elem_id="vc-max-tokens")
                temperature = gr.Slider(0.0, 1.5, value=s.temperature, step=0.05, label="Temperature",
                                        elem_id="vc-temperature")
        with gr.Accordion("What the model got (last question)", open=False, elem_id="vc-inputs"):
            inputs_view = gr.HTML(frames_html(None))
            details = gr.JSON(label="Reply details", value=None)
        session_id = gr.Textbox(visible="hidden", elem_id="vidchat-session-id")

        settings_inputs = [k, sampling, seconds, evs_on, threshold, max_frames, frames_as, audio_on, max_tokens, temperature]

        async def respond(
            message: str, history: list[dict], sid: str,
            k_, sampling_, seconds_, evs_on_, threshold_, max_frames_, frames_as_, audio_on_, max_tokens_, temp_,
        ) -> AsyncIterator[tuple]:
            event_start = time.perf_counter()
            text = (message or "").strip()
            history = list(history or [])
            if not text:
                yield history, gr.skip(), gr.skip()
                return
            past = history_turns(history)
            history.append({"role": "user", "content": text})
            entry = state.registry.get(sid)
            if entry is None:
                history.append({"role": "assistant", "content": NOT_RUNNING})
                yield history, gr.skip(), gr.skip()
                return
            try:
                entry.session.update_settings(
                    num_sample_frames=int(k_), sampling=sampling_, sample_seconds=float(seconds_),
                    evs_enabled=bool(evs_on_), evs_threshold=float(threshold_), max_frames=int(max_frames_),
                )
            except ValueError as exc:
                history.append({"role": "assistant", "content": f"⚠ Settings not accepted: {exc}"})
                yield history, gr.skip(), gr.skip()
                return
            # One answer per tab: a new question replaces one still streaming.
            previous = entry.reply
            if previous is not None:
                await previous.cancel()
            options = state.answer_defaults().updated(
                frames_as=frames_as_, include_audio=bool(audio_on_), max_tokens=int(max_tokens_),
                temperature=float(temp_),
            )
            try:
                answer = start_answer(state.engine, entry.session, text, options, history=past)
            except NoFrames:
                history.append({"role": "assistant", "content": NO_FRAMES})
                yield history, gr.skip(), gr.skip()
                return
            except EngineError as exc:
                history.append({"role": "assistant", "content": f"⚠ {exc}"})
                yield history, gr.skip(), gr.skip()
                return
            # vidchat's own share of the latency: chat event -> engine call.
            answer.prep_ms = (time.perf_counter() - event_start) * 1000
            log.info("chat event -> engine call: %.2f ms", answer.prep_ms)
            reply = answer.reply
            entry.reply = reply
            history.append({"role": "assistant", "content": ""})
            yield history, gr.skip(), gr.skip()
            try:
                async for delta in reply:
                    if not history[-1]["content"]:
                        log.info("chat event -> first token: %.1f ms", (time.perf_counter() - event_start) * 1000)
                    history[-1]["content"] += delta
                    yield history, gr.skip(), gr.skip()
            except EngineError as exc:
                history[-1]["content"] += f"\n\n⚠ {exc}"
            finally:
                replaced = entry.reply is not reply
                if not replaced:
                    entry.reply = None
                await reply.cancel()  # no-op when finished; aborts if the page went away
            if replaced:
                # A newer question took over this tab's chat; its event owns
                # the chat from now on, so don't overwrite it with this history.
                return
            if not history[-1]["content"]:
                history[-1]["content"] = STOPPED if reply.stats.cancelled else NO_TEXT
            # Thumbnails are encoded after the answer, so they never delay its first token.
            yield history, frames_html(answer), answer.summary()

        async def stop_answer(sid: str) -> None:
            entry = state.registry.get(sid)
            reply = entry.reply if entry else None
            if reply is not None:
                await reply.cancel()

        # The question box is not an output of the (long) answer event, so it
        # stays editable while an answer streams: a new question then
        # replaces the running answer. A separate instant event clears it.
        outputs = [chatbot, inputs_view, details]
        inputs = [question, chatbot, session_id, *settings_inputs]
        answer_events = dict(concurrency_limit=None, show_progress="minimal", trigger_mode="multiple")
        submit_evt = question.submit(respond, inputs, outputs, api_name="ask", **answer_events)
        click_evt = send.click(respond, inputs, outputs, api_visibility="private", **answer_events)
        for trigger in (question.submit, send.click):
            trigger(lambda: "", None, question, queue=False, trigger_mode="multiple", api_visibility="private")
        stop.click(stop_answer, [session_id], None, cancels=[submit_evt, click_evt], concurrency_limit=None,
                   api_name="stop")
        clear.click(lambda: ([], None), None, [chatbot, details], api_visibility="private")

    return gr.mount_gradio_app(app, blocks, path="/", head=HEAD, theme=gr.themes.Soft(), footer_links=[])
