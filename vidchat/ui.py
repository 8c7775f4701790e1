"""The Gradio page: live preview and chat side by side, settings folded away,
and a panel showing exactly what the model was given for the last question.

Browser behaviour (camera, WebRTC) lives in static/vidchat.js; this module
lays out the page and runs the chat events through vidchat.chat, the same
path the WebSocket protocol uses.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import io
import logging
import math
import secrets
import time
from pathlib import Path
from typing import Any, AsyncIterator

import gradio as gr
from PIL import Image
from starlette.routing import Mount

from vidchat import answer_inputs, chat, evs, recording
from vidchat.chat import Answer, OptionError
from vidchat import talk
from vidchat.settings_table import SETTINGS, UNBOUNDED_MAX_TOKENS
from vidchat.engine import NO_SPOKEN_QUESTIONS, EngineError, Turn
from vidchat.markup import as_text
from vidchat.vad import TurnSettings
from vidchat.media import FRAMES_AS
from vidchat.access import login_of
from vidchat.session import SAMPLING_STRATEGIES, Session
from vidchat.sessions import Entry
from vidchat.watch import DEFAULT_EVERY_S, SceneWatch

log = logging.getLogger(__name__)

HEAD = '<link rel="stylesheet" href="/static/vidchat.css"><script src="/static/vidchat.js" defer></script>'

PREVIEW_HTML = """
<div class="vc-live" id="vc-live-access" data-mode="{access_mode}">
  <div class="vc-ready" id="vc-ready" role="status"></div>
  <div class="vc-video-wrap">
    <video id="vc-preview" autoplay playsinline muted></video>
    <div class="vc-conn" id="vc-conn" data-tone="idle">Not started</div>
  </div>
  <div class="vc-controls">
    <button id="vc-start" class="vc-btn vc-primary">Start camera</button>
    <button id="vc-stop" class="vc-btn" disabled>Stop camera</button>
  </div>
  <div class="vc-devices">
    <label>Source <select id="vc-source" title="Switching keeps the session: same buffer, same chat">
      <option value="camera" selected>Camera</option>
      <option value="screen">Screen, window or tab</option>
      <option value="file">Video file</option></select></label>
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
  <div class="vc-file-row" id="vc-file-row" hidden>
    <label>Video file <input type="file" id="vc-file" accept="video/*,audio/*"></label>
    <label>or from the server <select id="vc-media"><option value="">(none listed)</option></select></label>
    <span class="vc-muted">Plays here (pause, seek and loop with its controls) and goes to the model like a camera;
      it is never uploaded.</span>
  </div>
  <div class="vc-stats" id="vc-stats">No session</div>
  <div class="vc-live-view" id="vc-live-view" hidden>
    <div class="vc-kept" id="vc-kept" title="The newest frames the filter kept"></div>
    <svg class="vc-chart" id="vc-chart" viewBox="0 0 200 40" preserveAspectRatio="none" role="img"
         aria-label="time to first token and tokens per second of recent answers"></svg>
    <div class="vc-chart-legend vc-muted" id="vc-chart-legend"></div>
  </div>
  <div class="vc-store vc-muted" id="vc-store">{store_limit}</div>
  <div class="vc-note" id="vc-note" role="status"></div>
</div>
"""

# Browser-side Talk controls (static/vidchat.js): the answers are read aloud
# with the browser's own speech synthesis, so they cost the server nothing.
TALK_HTML = """
<div class="vc-talk-bar" id="vc-talk-bar">
  <span class="vc-talk-status" id="vc-talk-status" data-state="off" role="status">Talk is off</span>
  <label class="vc-muted">Voice <select id="vc-voice"><option value="">browser default</option></select></label>
  <button class="vc-btn" id="vc-mute" type="button" aria-pressed="false">🔊 Read aloud</button>
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

# Page notices are chat messages too, but not the model's words: they carry
# this marker (Gradio keeps a message's metadata across the round trip, and a
# metadata without a title renders as an ordinary bubble) and never go back
# to the model as assistant turns.
NOTICE = {"log": "vidchat notice"}


def notice(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text, "metadata": dict(NOTICE)}


def is_notice(message: dict[str, Any]) -> bool:
    return (message.get("metadata") or {}).get("log") == NOTICE["log"]


# A spoken question's bubble (Talk mode): its label, then a player.
SPOKEN = {"log": "vidchat spoken question"}


def spoken_bubble(answer, answer_id: str) -> dict[str, Any]:
    label = chat.spoken_label(answer.spoken.seconds)
    player = (f"<audio controls preload='none' class='vc-spoken-audio' "
              f"src='{answer_inputs.PATH_PREFIX}{answer_id}/audio.wav'></audio>")
    return {"role": "user", "content": f"{label}\n\n{player}", "metadata": dict(SPOKEN)}


def _is_spoken(message: dict[str, Any]) -> bool:
    return (message.get("metadata") or {}).get("log") == SPOKEN["log"]


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
    """The conversation as the model had it: user questions and its own
    answers, without the page's notices (and without thoughts or other
    titled messages)."""
    turns: list[Turn] = []
    for m in history:
        text = _message_text(m.get("content")).strip()
        if _is_spoken(m):
            text = text.split("\n", 1)[0].strip()  # its label: the audio can't be heard again
        role = m.get("role")
        if role == "assistant" and is_notice(m) and turns and turns[-1].role == "user":
            turns.pop()  # a question the model never answered (no camera, an error...)
            continue
        if role not in ("user", "assistant") or not text or is_notice(m) or (m.get("metadata") or {}).get("title"):
            continue
        if role == "user" and turns and turns[-1].role == "user":
            turns.pop()  # asked again before an answer came
        turns.append(Turn(role, text))
    if turns and turns[-1].role == "user":
        turns.pop()
    return turns


def frames_html(answer) -> str:
    """Thumbnails of the frames sent, inline as data URLs: nothing touches disk."""
    if answer is None:
        return "<p class='vc-muted'>Ask a question to see the frames and audio the model received.</p>"
    tiles = []
    positions = answer.sample.frame_source_times()
    for frame, t, idx, pos in zip(answer.sample.frames, answer.sample.timestamps, answer.sample.indices, positions):
        img = Image.fromarray(frame)
        img.thumbnail((160, 120))
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=80)
        src = base64.b64encode(buf.getvalue()).decode()
        age = t - answer.sample.timestamps[-1]
        tiles.append(
            f"<figure><img src='data:image/jpeg;base64,{src}' alt='frame {as_text(idx)}'>"
            f"<figcaption>#{as_text(idx)} · {age:+.1f} s{'' if pos is None else f' · file {pos:.1f} s'}"
            "</figcaption></figure>"
        )
    audio = answer.reply.stats.audio_seconds
    head = (
        f"<p>{len(tiles)} frame(s) as {as_text(answer.options.frames_as)}, "
        f"{audio:.1f} s of audio{'' if audio else ' (none)'}; times relative to the newest frame.</p>"
    )
    return head + "<div class='vc-frames'>" + "".join(tiles) + "</div>"


def model_label(state) -> str:
    """The model as a person would name it: a hub id, a folder's name, or the test model."""
    if state.tiny:
        return "tiny test model (random weights)"
    path = state.model_path.rstrip("/")
    return path.rsplit("/", 1)[-1] if path.startswith(("/", ".", "~")) else path


# ---------------------------------------------------------------------------
# The page's question: checked, asked through vidchat.chat, streamed
# ---------------------------------------------------------------------------

def _number(label: str, value: Any) -> float:
    """A number from a page widget that is not a question setting (the watch interval, Talk's pauses)."""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        raise OptionError(f"{label} must be a number, got {value!r}")
    return number


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
    options: chat.AnswerOptions
    record: bool = False  # save the answer as a bundle under --record-dir


def page_request(state, k, sampling, seconds, evs_on, threshold, max_frames, frames_as, audio_on,
                 max_tokens, temperature, seed, record=False, system_prompt=None) -> PageRequest:
    """Turn the page's (or the public /ask API's) raw values into settings;
    raises OptionError naming the field, so the chat can say what to fix."""
    raw = dict(num_sample_frames=k, sampling=sampling, sample_seconds=seconds, evs_enabled=evs_on,
               evs_threshold=threshold, max_frames=max_frames, frames_as=frames_as, include_audio=audio_on,
               max_tokens=max_tokens, temperature=temperature)
    high = {"max_tokens": state.engine.options.max_model_len if state.engine is not None else UNBOUNDED_MAX_TOKENS}
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
    chat.apply_settings(entry.session, state.engine, request.options, request.sampling)
    return request


# Streamed text reaches the page at most this often (20 updates a second).
STREAM_UPDATE_S = 0.05


async def answer_stream(state, entry, question: str, request: PageRequest, past: list[Turn],
                        history: list[dict], event_start: float, spoken=None, pin=None,
                        chat_as_of: int | None = None) -> AsyncIterator[tuple]:
    """Ask through the shared answer path and stream the reply into the chat.
    ``spoken`` (Talk mode): the utterance is the question; its bubble, with
    a player of exactly the audio the model got, goes into the chat here.
    ``pin`` (vidchat.prewarm.Pin): the sample taken as Enter was pressed.
    ``chat_as_of``: the Clear chat count that ``history`` reflects (default:
    now). Once the chat is cleared after that, this stream shows nothing more."""
    cleared = entry.chat_cleared if chat_as_of is None else chat_as_of
    done = asyncio.Event()
    entry.chat_streams.add(done)
    try:
        async with contextlib.aclosing(_answer_updates(state, entry, question, request, past, history,
                                                       event_start, spoken, pin)) as updates:
            async for update in updates:
                if entry.chat_cleared != cleared:
                    return  # closing the updates aborts the reply: nobody reads it now
                yield update
    finally:
        entry.chat_streams.discard(done)
        done.set()


async def _answer_updates(state, entry, question: str, request: PageRequest, past: list[Turn],
                          history: list[dict], event_start: float, spoken, pin) -> AsyncIterator[tuple]:
    try:
        answer = await chat.ask(state.engine, entry, question, request.options, history=past,
                                queue=state.answer_gate, spoken=spoken,
                                sample=None if pin is None else pin.sample)
        if pin is not None:
            answer.sampled_before_ms = (time.monotonic() - pin.at) * 1000
    except chat.Superseded:
        return  # a newer question owns this tab's chat now
    except EngineError as exc:  # NoFrames included
        if spoken is not None:
            history.append({"role": "user", "content": chat.spoken_label(spoken.seconds), "metadata": dict(SPOKEN)})
        history.append(notice(str(exc) if isinstance(exc, chat.NoFrames) else f"⚠ {exc}"))
        yield history, gr.skip(), gr.skip()
        return
    if spoken is not None:
        history.append(spoken_bubble(answer, answer_inputs.remember(entry, answer)))
    log.info("chat event -> engine call: %.2f ms", (time.perf_counter() - event_start) * 1000)
    reply = answer.reply
    history.append({"role": "assistant", "content": ""})
    yield history, gr.skip(), gr.skip()
    error = None
    try:
        async for place in _wait_turn(answer):
            history[-1] = notice(waiting_text(place))
            yield history, gr.skip(), gr.skip()
        if is_notice(history[-1]):
            history[-1] = {"role": "assistant", "content": ""}
        shown = 0.0
        async for delta in reply:
            if not history[-1]["content"]:
                since_event = time.perf_counter() - event_start
                # The event's wall-clock time lets a browser on this machine
                # split its own Enter -> first token into before/after the server.
                log.info("chat event -> first token: %.1f ms (%d of %d prompt tokens from the cache; "
                         "event at %.3f)", since_event * 1000, reply.stats.cached_tokens,
                         reply.stats.prompt_tokens, time.time() - since_event)
            history[-1]["content"] += delta
            # The first text at once, then at most STREAM_UPDATE_S apart: each
            # update re-renders the whole message in the browser, and a fast
            # model's every token would keep the tab (and the server) busy.
            # The answer's last update below shows whatever is left.
            if time.monotonic() - shown >= STREAM_UPDATE_S:
                shown = time.monotonic()
                yield history, gr.skip(), gr.skip()
    except EngineError as exc:
        error = exc
    except chat.Abandoned:
        pass  # stopped or replaced while it waited
    finally:
        await reply.cancel()  # no-op when finished; aborts if the page went away
        current = chat.release(entry, answer)
    if not current:
        return  # a newer question took over this tab's chat; its event owns it from now on
    if is_notice(history[-1]):
        history.pop()  # the "waiting" line
    if not history[-1]["content"]:
        history.pop()
        history.append(notice(f"⚠ {error}" if error else STOPPED if reply.stats.cancelled else NO_TEXT))
    elif error is not None:
        history.append(notice(f"⚠ {error}"))
    # What the model got, folded under the answer. Thumbnails are encoded
    # after the answer, so they never delay its first token, and in a worker
    # thread, so they never stall the event loop.
    answer_id = answer_inputs.remember(entry, answer)
    if request.record:
        await _record(state, entry, answer, answer_id, history)
    panel = await asyncio.to_thread(answer_inputs.details_html, answer, answer_id, answer_id in entry.bundles)
    history.append({"role": "assistant", "content": panel,
                    "metadata": {"title": answer_inputs.title(answer), "status": "done", "id": answer_id}})
    yield history, await asyncio.to_thread(frames_html, answer), answer.summary()


async def _record(state, entry, answer: Answer, answer_id: str, history: list[dict]) -> None:
    """Save the answer as a bundle when the server allows recording (--record-dir)."""
    try:
        await answer_inputs.save_bundle(state, entry, answer, answer_id, source="page")
    except answer_inputs.RecordingOff:
        history.append(notice("Not recorded: the server was started without --record-dir."))
    except OSError as exc:
        history.append(notice(f"⚠ Could not save the recording: {exc}"))


def waiting_text(ahead: int) -> str:
    if ahead <= 0:
        return "⏳ waiting: yours is the next question to be answered"
    return f"⏳ waiting: {ahead} question{'s' if ahead != 1 else ''} ahead"


async def _wait_turn(answer: Answer) -> AsyncIterator[int]:
    """Yield the number of questions ahead while the answer waits for its
    place (--max-concurrent-answers); raises chat.Abandoned when stopped."""
    places: asyncio.Queue[int] = asyncio.Queue()

    async def tell(ahead: int) -> None:
        places.put_nowait(ahead)

    waiting = asyncio.ensure_future(answer.wait_turn(tell))
    try:
        while not waiting.done():
            getter = asyncio.ensure_future(places.get())
            await asyncio.wait({waiting, getter}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield getter.result()
            else:
                getter.cancel()
        waiting.result()
    finally:
        if not waiting.done():  # the page went away while it waited
            await answer.cancel()
            waiting.cancel()


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
            if state.engine_error or state.engine is not None:
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
    past = history_turns(history)
    history.append({"role": "user", "content": text})
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    if entry is not None:
        entry.watch_epoch += 1  # a running watch loop yields the chat to this question
        entry.talk_epoch += 1  # so does the talk loop (the listener goes on; the page restarts the loop)
        chat_as_of = entry.chat_cleared  # the chat this event was sent with
        entry.typed_question_at = time.monotonic()
    if entry is None:
        history.append(notice(NOT_RUNNING))
        yield history, gr.skip(), gr.skip()
        return
    try:
        async for update in _wait_for_model(state, history):
            yield update
    except EngineError as exc:
        history.append(notice(f"⚠ {exc}"))
        yield history, gr.skip(), gr.skip()
        return
    try:
        request = applied_request(state, entry, raw_settings)
    except ValueError as exc:  # OptionError or the session's own validation
        history.append(notice(f"⚠ Settings not accepted: {exc}"))
        yield history, gr.skip(), gr.skip()
        return
    # The sample taken as Enter was pressed (vidchat.prewarm), already warmed.
    pin = state.prewarmer.take_pin(entry) if getattr(state, "prewarmer", None) is not None else None
    async for update in answer_stream(state, entry, text, request, past, history, event_start, pin=pin,
                                      chat_as_of=chat_as_of):
        yield update


# ---------------------------------------------------------------------------
# Re-ask and compare: an earlier answer's exact inputs, other settings
# ---------------------------------------------------------------------------

MAX_LOADED_BUNDLES = 8
MAX_BUNDLE_BYTES = 256 << 20  # a bundle of 64 frames at 1280×720 is ~100 MB of PNG


def reask_choices(state, sid: str, loaded: dict | None = None) -> list[tuple[str, str]]:
    """The session's remembered answers, newest first, then bundles loaded
    into this tab, as (label, answer id)."""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    out = []
    if entry is not None:
        for n, (answer_id, answer) in enumerate(reversed(entry.answers.items())):
            out.append((f"{'latest: ' if n == 0 else ''}{_short(answer.question)} ({len(answer.sample.frames)} "
                        f"frames, T={answer.options.temperature:g})", answer_id))
    for answer_id, answer in reversed((loaded or {}).items()):
        out.append((f"bundle: {_short(answer.question)} ({len(answer.sample.frames)} frames, "
                    f"{answer.bundle_name})", answer_id))
    return out


def _short(text: str, n: int = 48) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _model_cell(answer: Answer) -> str:
    engine = answer.reply.engine
    name = str(engine.model_path).rstrip("/").rsplit("/", 1)[-1]
    revision = getattr(engine, "model_revision", "")
    return (f"<span title='{as_text(str(engine.model_path))}'>{as_text(name)}</span>"
            + (f"<br><small>{as_text(revision)}</small>" if revision else ""))


def _column(heading: str, answer: Answer | None, text: str) -> str:
    rows = ""
    if answer is not None:
        rec = answer.summary()
        cells = (("frames", f"{rec['frames']} as {rec['frames_as']}"),
                 ("audio", f"{rec['audio_seconds']:.1f} s"),
                 ("temperature", rec["temperature"]),
                 ("seed", rec["seed"] if rec["seed"] is not None else "random"),
                 ("max tokens", rec["max_tokens"]),
                 ("system prompt", _short(rec.get("system_prompt") or "(none)", 60)),
                 ("prompt tokens", rec["prompt_tokens"]),
                 ("first token", f"{rec['ttft_ms']} ms" if rec.get("ttft_ms") is not None else "–"),
                 ("tokens/s", f"{rec['tokens_per_s']:.1f}" if rec.get("tokens_per_s") else "–"))
        rows = f"<tr><th>model</th><td>{_model_cell(answer)}</td></tr>"
        rows += "".join(f"<tr><th>{label}</th><td>{as_text(value)}</td></tr>" for label, value in cells)
        rows += f"<tr><th>inputs_sha256</th><td><code>{as_text(str(rec['inputs_sha256'])[:16])}…</code></td></tr>"
    return (f"<div class='vc-compare-col'><h4>{as_text(heading)}</h4>"
            f"<div class='vc-compare-text'>{as_text(text) or '…'}</div><table>{rows}</table></div>")


def compare_html(original: Answer, again: Answer | None, text: str, note: str = "",
                 again_heading: str = "Re-asked") -> str:
    same = again is not None and again.reply.stats.inputs_sha256 == original.reply.stats.inputs_sha256
    verdict = ("" if again is None or not again.reply.stats.inputs_sha256 else
               "<p class='vc-muted'>Same inputs (inputs_sha256 matches).</p>" if same else
               "<p class='vc-muted'>Different inputs: a subset of the original frames, audio left out, or a "
               "model that does not take audio.</p>")
    heading = f"Recorded ({original.bundle_name})" if original.bundle_name else "Original"
    return (f"<p><b>{as_text(original.question)}</b></p>{verdict}"
            f"{'<p class=vc-muted>' + as_text(note) + '</p>' if note else ''}"
            f"<div class='vc-compare' id='vc-compare-cols'>{_column(heading, original, original.reply.text)}"
            f"{_column(again_heading, again, text)}</div>")


def reask_engines(state) -> list[tuple[str, str]]:
    """The models a re-ask can go to, as (label, value) for the page's radio."""
    out = [(f"{model_label(state)} (this server's model)", "main")]
    if state.compare_model_path:
        name = state.compare_model_path.rstrip("/").rsplit("/", 1)[-1]
        out.append((f"{'tiny test model (vision only)' if state.compare_tiny and 'vl' in name else name} "
                    "(--compare-model)", "compare"))
    return out


async def _reask_engine(state, which: str):
    if which == "compare":
        ready, reason = state.compare_readiness()
        if not ready:
            raise EngineError(reason)
        return state.compare_engine
    return await state.wait_engine(timeout=0)


async def load_bundle(state, path: Any, loaded: dict | None) -> tuple[dict, list[tuple[str, str]], str, str]:
    """Read an uploaded bundle zip into this tab: (loaded, its choice list, the
    id to select, a message). The upload is deleted once read."""
    loaded = dict(loaded or {})
    if not path:
        return loaded, [], "", ""
    path = str(getattr(path, "path", path))
    try:
        size = Path(path).stat().st_size
        if size > MAX_BUNDLE_BYTES:
            raise recording.BundleError(f"the file is {size / 2**20:.0f} MiB; a bundle may be at most "
                                        f"{MAX_BUNDLE_BYTES >> 20} MiB")
        bundle = await asyncio.to_thread(recording.read_bundle, path)
        intact = await asyncio.to_thread(lambda: bundle.digest() == bundle.inputs_sha256)
    except (recording.BundleError, OSError) as exc:
        return loaded, [], "", f"<p class='vc-note'>⚠ Not a bundle vidchat can read: {as_text(str(exc))}</p>"
    finally:
        try:  # Gradio kept the upload on disk; nothing of it stays once read
            Path(path).unlink()
        except OSError:
            pass
    answer = recording.recorded_answer(bundle)
    answer_id = "bundle-" + secrets.token_urlsafe(12)
    loaded[answer_id] = answer
    while len(loaded) > MAX_LOADED_BUNDLES:
        loaded.pop(next(iter(loaded)))
    warn = ("" if intact else " Its frames and audio do not hash to the inputs_sha256 it records: the files were "
            "changed after recording.")
    message = compare_html(answer, None, "", f"Loaded the bundle ({len(answer.sample.frames)} frames"
                           f"{', audio' if answer.sample.audio is not None else ''}). Choose settings and a model, "
                           "then Re-ask." + warn)
    return loaded, [], answer_id, message


async def reask(state, sid: str, answer_id: str, *raw_settings: Any, engine_choice: str = "main",
                loaded: dict | None = None) -> AsyncIterator[str]:
    """Ask an earlier answer's (or a loaded bundle's) question again on its
    exact frames, audio and history, with the page's current settings and
    the chosen model; yields the comparison."""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    original = None
    if isinstance(answer_id, str):
        original = (entry.answers.get(answer_id) if entry is not None else None) or (loaded or {}).get(answer_id)
    if original is None:
        yield ("<p class='vc-note'>Pick an answer of this session (answers are kept while the session runs) or "
               "load a recorded bundle to re-ask.</p>")
        return
    try:
        engine = await _reask_engine(state, engine_choice if engine_choice in ("main", "compare") else "main")
    except EngineError as exc:
        yield f"<p class='vc-note'>⚠ {as_text(str(exc))}</p>"
        return
    try:
        request = page_request(state, *raw_settings)
        chat.check_options(request.options, engine)
        wanted = request.sampling["num_sample_frames"]
        sample = chat.frozen_sample(original, wanted)
    except ValueError as exc:
        yield f"<p class='vc-note'>⚠ Settings not accepted: {as_text(str(exc))}</p>"
        return
    note = (f"The original had {len(original.sample.frames)} frames; all of them are used."
            if wanted > len(original.sample.frames) else "")
    if entry is None:
        # A bundle re-asked before any source started: a session of its own,
        # outside the registry (it holds no media), with its own cache salt.
        entry = Entry(Session("bundle-" + answer_id), kind="bundle")
    slot = entry.side_slot()
    heading = "Re-asked" if engine is state.engine else "Re-asked on the second model"
    try:
        again = await chat.ask(engine, slot, original.question, request.options, history=original.history,
                               queue=state.answer_gate, sample=sample, spoken=original.spoken)
    except chat.Superseded:
        return
    except EngineError as exc:
        yield f"<p class='vc-note'>⚠ {as_text(str(exc))}</p>"
        return
    yield compare_html(original, None, "", note, heading)
    try:
        async for _ in _wait_turn(again):
            pass
        async for _ in again.reply:
            yield compare_html(original, None, again.reply.text, note, heading)
    except (chat.Abandoned, EngineError) as exc:
        note = f"⚠ {exc}" if isinstance(exc, EngineError) else "Stopped."
    finally:
        await again.reply.cancel()
        chat.release(slot, again, continues_chat=False)
    if entry.kind != "bundle":
        answer_inputs.remember(entry, again)
    yield compare_html(original, again, again.reply.text, note, heading)


# ---------------------------------------------------------------------------
# Watch mode: a standing question asked on scene changes
# ---------------------------------------------------------------------------

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
            watcher = SceneWatch(entry.session, _number("Watch interval", every))
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
    seen_clear = entry.chat_cleared
    async for t in watcher.changes(stopped):
        seen_clear = _follow_clear(entry, history, seen_clear)
        try:
            request = applied_request(state, entry, raw_settings)
        except ValueError as exc:
            history.append(notice(f"⚠ Watch stopped, settings not accepted: {exc}"))
            yield history, gr.skip(), gr.skip(), False
            return
        past = history_turns(history)
        start = entry.session.timeline_start
        when = f" at {t - start:.1f} s" if t is not None and start is not None else ""
        if stopped():  # switched off while the settings were read
            return
        history.append(notice(f"👁 Scene changed{when}: asking the standing question."))
        history.append({"role": "user", "content": question})
        # Closed explicitly when watching stops mid-answer: its reply is
        # cancelled then, not whenever the generator happens to be collected.
        async with contextlib.aclosing(answer_stream(state, entry, question, request, past, history,
                                                     time.perf_counter(), chat_as_of=seen_clear)) as stream:
            async for update in stream:
                if stopped():
                    return
                yield (*update, gr.skip())


# ---------------------------------------------------------------------------
# Talk mode: ask by voice (vidchat.talk)
# ---------------------------------------------------------------------------

TALK_NEEDS_AUDIO = "Talk needs a model that hears: " + NO_SPOKEN_QUESTIONS.split(". ", 1)[1]


def _follow_clear(entry, history: list[dict], seen: int) -> int:
    """A loop's own copy of the chat empties when the page's chat was cleared
    since ``seen``; returns the clear count to compare with next time."""
    if entry.chat_cleared != seen:
        history.clear()
    return entry.chat_cleared


def talk_settings(silence_ms: Any, min_speech_ms: Any) -> TurnSettings:
    settings = TurnSettings(min_silence_s=_number("Pause that ends a question (ms)", silence_ms) / 1000,
                            min_speech_s=_number("Shortest question (ms)", min_speech_ms) / 1000)
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
    seen_clear = entry.chat_cleared
    def stale() -> bool:  # the session ended, a typed question took the chat, or Talk went off
        return state.registry.get(sid) is not entry or entry.talk_epoch != epoch or not listener.running

    while True:
        waiter = asyncio.ensure_future(listener.next_utterance())
        try:
            while not waiter.done():
                await asyncio.wait({waiter}, timeout=1.0)
                if stale():
                    return
        finally:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None and stale():
                # Heard just as this loop went stale: the loop that owns the
                # chat now asks it (this one would cancel the live answer and
                # then drop the question).
                listener.put_back(waiter.result())
            waiter.cancel()
        spoken = waiter.result()
        seen_clear = _follow_clear(entry, history, seen_clear)
        try:
            request = applied_request(state, entry, raw_settings)
        except ValueError as exc:
            history.append(notice(f"⚠ Settings not accepted: {exc}"))
            yield history, gr.skip(), gr.skip(), gr.skip()
            continue
        entry.watch_epoch += 1  # a running watch loop yields the chat to the spoken question
        past = history_turns(history)
        async for update in answer_stream(state, entry, "", request, past, history, time.perf_counter(),
                                          spoken=spoken, chat_as_of=seen_clear):
            if entry.talk_epoch != epoch:
                return
            yield (*update, gr.skip())


async def clear_chat(state, sid: str) -> None:
    """Clear chat: the answer streaming into the old chat stops (nobody reads
    it now) and nothing of the old chat comes back: not that answer's last
    update, nor a watch or talk loop's copy of the chat. Watch and Talk go on."""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    if entry is not None:
        entry.chat_cleared += 1
        entry.warm_history = ()  # the next question carries no chat: nor does its warm-up
        streams = [asyncio.ensure_future(done.wait()) for done in entry.chat_streams]
        await entry.cancel_answer()
        # Returned only once each stream into the old chat has stopped: its
        # updates already sent reach the page before the empty chat does.
        if streams:
            _, late = await asyncio.wait(streams, timeout=CLEAR_WAIT_S)
            for waiter in late:
                waiter.cancel()


async def stop_answer(state, sid: str) -> None:
    """Stop: the running answer ends, and so does watching (the page unticks Watch)."""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    if entry is not None:
        entry.watch_epoch += 1
        await entry.cancel_answer()


def watch_switched(state, on: bool, sid: str) -> None:
    """Watch unticked: the running watch loop ends at once, even while it
    waits for a scene change (its event would otherwise hold the switch's
    queue, so the "off" never ran and watching went on)."""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    if entry is not None and not on:
        entry.watch_epoch += 1


# ---------------------------------------------------------------------------
# Layout
# ---------------------------------------------------------------------------

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
                          label="Frames per question")
            sampling = gr.Dropdown(list(SAMPLING_STRATEGIES), value="uniform", label="Sampling", elem_id="vc-sampling",
                                   info="stable: spread like uniform, but a new frame changes only the newest pick, "
                                        "so questions share their prompt prefix")
            seconds = gr.Slider(1, 60, value=10, step=1, label="Window for latest_seconds (s)")
        with gr.Row():
            evs_on = gr.Checkbox(value=True, label="Drop near-duplicate frames")
            threshold = gr.Slider(
                0.5, 1.0, value=evs.DEFAULT_THRESHOLD, step=0.005, label="Filter threshold",
                info="A frame is kept when more than (1 − threshold) of the picture changed: 0.95 → 5 %.",
            )
            # More than --max-session-mb holds at the stored size is refused
            # when asked, with the budget named (the model's size is known then).
            max_frames = gr.Slider(4, 256, value=64, step=1, label="Max frames kept",
                                   info="At most what the server's --max-session-mb holds")
        with gr.Row():
            frames_as = gr.Radio(list(FRAMES_AS), value=s.frames_as, label="Send frames as")
            audio_on = gr.Checkbox(value=True, label="Include audio (models that take it)")
            max_tokens = gr.Slider(1, 2048, value=s.max_tokens, step=1, label="Max tokens", elem_id="vc-max-tokens")
            temperature = gr.Slider(0.0, 1.5, value=s.temperature, step=0.05, label="Temperature",
                                    elem_id="vc-temperature")
            seed = gr.Textbox(value="", label="Seed", placeholder="random", elem_id="vc-seed",
                              info="A whole number makes sampling repeatable; empty picks a new one each time.")
        allowed = bool(s.record_dir)
        record = gr.Checkbox(value=False, interactive=allowed, elem_id="vc-record",
                             label="Record each answer as a bundle on the server" if allowed else
                             "Record (off: the server was started without --record-dir)")
        system_prompt = gr.Textbox(value=s.system_prompt, label="System prompt", lines=2, max_lines=6,
                                   elem_id="vc-system-prompt", info="Put before every conversation; empty: none.")
    return [k, sampling, seconds, evs_on, threshold, max_frames, frames_as, audio_on, max_tokens, temperature, seed,
            record, system_prompt]


def mount(app, state):
    with gr.Blocks(title="vidchat") as blocks:
        _header(state)
        with gr.Row(equal_height=False, elem_classes="vc-main"):
            with gr.Column(scale=5, min_width=300):
                gr.HTML(PREVIEW_HTML.replace("{store_limit}", as_text(state.store_limit_text()))
                        .replace("{access_mode}", access_mode(state)), elem_id="vc-live-panel")
            with gr.Column(scale=6, min_width=300):
                chatbot = gr.Chatbot(label="Chat", height=440, elem_id="vc-chat", buttons=["copy"])
                with gr.Row(elem_classes="vc-ask"):
                    question = gr.Textbox(placeholder="Ask about what the camera sees…", show_label=False, scale=8,
                                          lines=1, max_lines=4, elem_id="vc-question")
                    send = gr.Button("Send", variant="primary", scale=1, min_width=70, elem_id="vc-send")
                    stop = gr.Button("Stop", scale=1, min_width=70, elem_id="vc-stop-answer")
                with gr.Row(elem_classes="vc-watch"):
                    watch_on = gr.Checkbox(value=False, label="Watch: ask on scene changes", scale=2,
                                           elem_id="vc-watch")
                    watch_question = gr.Textbox(value="What just changed?", label="Standing question", scale=4,
                                                elem_id="vc-watch-question")
                    watch_every = gr.Number(value=DEFAULT_EVERY_S, minimum=1, label="At most every (s)", scale=1,
                                            elem_id="vc-watch-every")
                with gr.Row(elem_classes="vc-talk"):
                    talk_on = gr.Checkbox(value=False, label="Talk: ask by voice", scale=2, elem_id="vc-talk",
                                          info="Asks when you stop speaking; answers are read aloud")
                    barge_in = gr.Checkbox(value=True, label="Speaking stops the answer", scale=2,
                                           elem_id="vc-barge-in")
                    talk_silence = gr.Number(value=round(TurnSettings.min_silence_s * 1000), minimum=100,
                                             maximum=5000, label="Pause that ends a question (ms)", scale=1,
                                             elem_id="vc-talk-silence")
                    talk_min_speech = gr.Number(value=round(TurnSettings.min_speech_s * 1000), minimum=30,
                                                maximum=5000, label="Shortest question (ms)", scale=1,
                                                elem_id="vc-talk-min-speech")
                gr.HTML(TALK_HTML, elem_id="vc-talk-panel")
                clear = gr.Button("Clear chat", size="sm", elem_id="vc-clear")
        settings_inputs = _settings_panel(state)
        with gr.Accordion("What the model got (last question)", open=False, elem_id="vc-inputs"):
            inputs_view = gr.HTML(frames_html(None))
            details = gr.JSON(label="Reply details", value=None)
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
        session_id = gr.Textbox(visible="hidden", elem_id="vidchat-session-id")
        # Filled when the page loads, for a logged-in user only (Gradio runs
        # no event for a page that has not logged in).
        page_token = gr.Textbox(visible="hidden", elem_id="vidchat-page-token")
        if state.access.hf_oauth:
            def issue_token(profile: gr.OAuthProfile | None) -> str:
                return hf_page_token(state, profile.username if profile else None)
        else:
            def issue_token(request: gr.Request) -> str:
                return password_page_token(state, request.username)
        blocks.load(issue_token, None, page_token, queue=False, api_visibility="private")

        # Every function that takes the session id gets it only when the
        # caller's login opened that session (vidchat.access already refused
        # the call with 403 otherwise); else it is as if no session ran.
        def own(request: gr.Request, sid: Any) -> str | None:
            return sid if state.registry.get_for(sid, login_of(request.headers)) is not None else None

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
        # replaces the running answer. A separate instant event clears it.
        outputs = [chatbot, inputs_view, details]
        inputs = [question, chatbot, session_id, *settings_inputs]
        answer_events = dict(concurrency_limit=None, show_progress="minimal", trigger_mode="multiple")
        # The page counts typed questions asked (in the event itself, so the
        # count is up before its answer can show) and finished: a question
        # refused with a notice has no "what the model got" panel, so only
        # the event's end says its reply is whole (tests, QA scripts).
        answer_events["js"] = QUESTION_ASKED_JS
        submit_evt = question.submit(on_page_question, inputs, outputs, api_visibility="private", **answer_events)
        click_evt = send.click(on_page_question, inputs, outputs, api_visibility="private", **answer_events)
        # The public /ask: the same answer, whose last message is the whole
        # reply (what an API client reads as the result).
        ask_api = gr.Button(visible=False, elem_id="vc-ask-api")
        ask_api.click(on_question, inputs, outputs, api_name="ask", concurrency_limit=None)
        for trigger in (question.submit, send.click):
            trigger(lambda: "", None, question, queue=False, trigger_mode="multiple", api_visibility="private")
        for evt in (submit_evt, click_evt):
            evt.then(None, None, None, js=QUESTION_FINISHED_JS, queue=False, api_visibility="private")
        stop.click(on_stop, [session_id], watch_on, cancels=[submit_evt, click_evt], concurrency_limit=None,
                   api_name="stop")
        async def on_clear(request: gr.Request, sid):
            await clear_chat(state, own(request, sid))
            return [], None

        clear.click(on_clear, [session_id], [chatbot, details], api_visibility="private")

        async def on_watch(request: gr.Request, on, q, every, history, sid, *raw):
            async for update in watch_loop(state, on, q, every, history, own(request, sid), *raw):
                yield update
            yield (*LAST_UPDATE_IS_NOTHING, gr.skip())

        watch_inputs = [watch_on, watch_question, watch_every, chatbot, session_id, *settings_inputs]
        watch_events = dict(concurrency_limit=None, show_progress="hidden", trigger_mode="always_last")
        def on_watch_switched(request: gr.Request, on, sid):
            watch_switched(state, on, own(request, sid))

        watch_on.change(on_watch_switched, [watch_on, session_id], None, queue=False, trigger_mode="multiple",
                        api_visibility="private")
        watch_outputs = [*outputs, watch_on]  # a refused Watch unticks
        watch_on.change(on_watch, watch_inputs, watch_outputs, api_name="watch", **watch_events)
        for evt in (submit_evt, click_evt):  # after a typed question, watching goes on from the new chat
            evt.then(on_watch, watch_inputs, watch_outputs, api_visibility="private", **watch_events)

        async def on_talk(request: gr.Request, on, barge, silence, min_speech, history, sid, *raw):
            async for update in talk_loop(state, on, barge, silence, min_speech, history, own(request, sid), *raw):
                yield update
            yield (*LAST_UPDATE_IS_NOTHING, gr.skip())

        talk_inputs = [talk_on, barge_in, talk_silence, talk_min_speech, chatbot, session_id, *settings_inputs]
        # "multiple": switching Talk off must run while the loop it ends is
        # still waiting for speech; a newer loop takes over from an older
        # one through the session's talk_epoch.
        talk_events = dict(concurrency_limit=None, show_progress="hidden", trigger_mode="multiple")
        talk_outputs = [*outputs, talk_on]  # a refused Talk unticks
        talk_on.change(on_talk, talk_inputs, talk_outputs, api_name="talk", **talk_events)
        for evt in (submit_evt, click_evt):  # after a typed question, Talk goes on from the new chat
            evt.then(on_talk, talk_inputs, talk_outputs, api_visibility="private", **talk_events)
        for control in (barge_in, talk_silence, talk_min_speech):  # new settings take effect at once
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

        blocks.load(talk_availability, None, talk_on, api_visibility="private", show_progress="hidden")

        def refresh_reask(request: gr.Request, sid, loaded):
            choices = reask_choices(state, own(request, sid), loaded)
            return gr.Dropdown(choices=choices, value=choices[0][1] if choices else None)

        for evt in (submit_evt, click_evt):
            evt.then(refresh_reask, [session_id, loaded_bundles], reask_from, api_visibility="private")

        async def on_load_bundle(request: gr.Request, path, sid, loaded):
            loaded, _, chosen, message = await load_bundle(state, path, loaded)
            choices = reask_choices(state, own(request, sid), loaded)
            return (loaded, gr.Dropdown(choices=choices, value=chosen or (choices[0][1] if choices else None)),
                    message, None)

        bundle_file.upload(on_load_bundle, [bundle_file, session_id, loaded_bundles],
                           [loaded_bundles, reask_from, comparison, bundle_file], api_name="load_bundle",
                           concurrency_limit=4)

        async def on_reask(request: gr.Request, sid, answer_id, *raw):
            *settings, which, loaded = raw
            async for update in reask(state, own(request, sid), answer_id, *settings, engine_choice=which, loaded=loaded):
                yield update

        reask_btn.click(on_reask, [session_id, reask_from, *settings_inputs, reask_engine, loaded_bundles],
                        comparison, api_name="reask", concurrency_limit=None, show_progress="minimal")

    app = gr.mount_gradio_app(app, blocks, path="/", head=HEAD, max_file_size=MAX_BUNDLE_BYTES,
                              theme=gr.themes.Soft(), footer_links=[], auth=state.access.gradio_auth(),
                              auth_message=_auth_message(state))
    gradio_app = next(r.app for r in app.routes if isinstance(r, Mount) and r.path == "")
    state.page_logins.attach(gradio_app, *page_functions(blocks, session_id))
    return app


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


# A streaming event's last message repeats its last update in full, so it
# could put back a chat that Clear chat emptied after that update: the page's
# answer events end on an update that changes nothing. (A generator that
# yields nothing at all would blank the chat.)
CLEAR_WAIT_S = 5.0  # at most this long for answers streaming into a chat being cleared to stop
LAST_UPDATE_IS_NOTHING = (gr.skip(), gr.skip(), gr.skip())

QUESTION_ASKED_JS = "(...inputs) => { if (window.vidchat) window.vidchat.questions.asked += 1; return inputs; }"
QUESTION_FINISHED_JS = "() => { if (window.vidchat) window.vidchat.questions.finished += 1; }"


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
