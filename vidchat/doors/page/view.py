"""How the page shows things: the chat's own messages (notices, spoken
questions), what the model got, the re-ask comparison, the model's label.
No events here."""

from __future__ import annotations

from typing import Any

from vidchat.conversation import answer_path
from vidchat.conversation.answer_path import Answer
from vidchat.doors import inputs as answer_inputs
from vidchat.doors.markup import as_text


HEAD = '<link rel="stylesheet" href="/static/vidchat/vidchat.css"><script type="module" src="/static/vidchat/vidchat.js"></script>'

PREVIEW_HTML = """
<div class="vc-live" id="vc-live-access" data-mode="{access_mode}" data-suites="{suites}">
  <div class="vc-video-wrap">
    <video id="vc-preview" autoplay playsinline muted></video>
    <div class="vc-conn" id="vc-conn" data-tone="idle">Not started</div>
    <div class="vc-ready" id="vc-ready" role="status"></div>
  </div>
  <div class="vc-controls">
    <button id="vc-start" class="vc-btn vc-primary" disabled title="The page's script is loading">Start camera</button>
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
    <div class="vc-chart-box">
      <div class="vc-chart-axis" aria-hidden="true"><span id="vc-chart-top"></span><span>0</span></div>
      <svg class="vc-chart" id="vc-chart" viewBox="0 0 200 40" preserveAspectRatio="none" role="img"
           aria-label="time to first token and tokens per second of recent answers"></svg>
    </div>
    <div class="vc-chart-legend vc-muted" id="vc-chart-legend"></div>
  </div>
  <div class="vc-store vc-muted" id="vc-store">{store_limit}</div>
  <div class="vc-note" id="vc-note" role="status"></div>
</div>
"""

# Browser-side Talk controls (static/js/talk.js): the answers are read aloud
# with the browser's own speech synthesis, so they cost the server nothing.
TALK_HTML = """
<div class="vc-talk-bar" id="vc-talk-bar">
  <span class="vc-talk-status" id="vc-talk-status" data-state="off" role="status">Talk is off</span>
  <span class="vc-level" id="vc-talk-level" hidden aria-hidden="true"><span class="vc-level-bar"></span></span>
  <label class="vc-muted">Voice <select id="vc-voice"><option value="">browser default</option></select></label>
  <button class="vc-btn" id="vc-mute" type="button" aria-pressed="false">🔊 Read aloud</button>
</div>
"""

NOT_RUNNING = (
    "The camera isn't running yet. Press **Start camera** under the preview, allow access, "
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


# Between a question and its first token (reading the frames, the prompt):
# the page's chat says the model is at work rather than showing nothing, or
# an empty bubble. Words, not only dots: a screen reader and a machine
# without the page's styles read them too.
TYPING = "<span class='vc-typing'>Thinking…</span>"


def typing() -> dict[str, Any]:
    return notice(TYPING)


# A spoken question's bubble (Talk mode): its label, then a player.
SPOKEN = {"log": "vidchat spoken question"}


def spoken_bubble(answer, answer_id: str) -> dict[str, Any]:
    label = answer_path.spoken_label(answer.spoken.seconds)
    player = (f"<audio controls preload='metadata' class='vc-spoken-audio' "
              f"src='{answer_inputs.PATH_PREFIX}{answer_id}/audio.wav'></audio>")
    return {"role": "user", "content": f"{label}\n\n{player}", "metadata": dict(SPOKEN)}


def fold_message(entry: Any, answer: Answer, answer_id: str) -> dict[str, Any]:
    """The "what the model got" fold under an answer, as the chat shows it
    (its thumbnails are encoded here: call it off the event loop)."""
    return {"role": "assistant",
            "content": answer_inputs.details_html(answer, answer_id, answer_id in entry.bundles),
            "metadata": {"title": answer_inputs.title(answer), "status": "done", "id": answer_id}}


def frames_html(answer, answer_id: str | None = None, recorded: bool = False) -> str:
    """Thumbnails of the frames sent, inline as data URLs: nothing touches
    disk; above them, where its record (and its bundle, when recorded) downloads."""
    if answer is None:
        return "<p class='vc-muted'>Ask a question to see the frames and audio the model received.</p>"
    tiles = []
    positions, at_jump = answer.sample.frame_source_times(), answer.sample.frame_source_at_jump()
    for frame, t, idx, pos, near in zip(answer.sample.frames, answer.sample.timestamps, answer.sample.indices,
                                        positions, at_jump):
        src = answer_inputs.thumb_data_url(frame, (160, 120), quality=80)
        tiles.append(
            f"<figure><img src='{src}' alt='frame {as_text(idx)}'>"
            f"<figcaption>{answer_inputs.frame_caption(idx, answer.sample.relative(t), pos, near)}</figcaption></figure>"
        )
    audio = answer.reply.stats.audio_seconds
    head = (
        f"<p>{len(tiles)} frame(s) as {as_text(answer.options.frames_as)}, "
        f"{audio:.1f} s of audio{'' if audio else ' (none)'}; times in seconds since the session's first media.</p>"
    )
    links = f"<p class='vc-record-links'>{answer_inputs.record_links_html(answer_id, recorded)}</p>" if answer_id else ""
    keep = (mark_html(answer_id, getattr(answer, "mark", None)) + add_to_suite_html(answer_id)) if answer_id else ""
    return (links + keep + head + answer_inputs.new_frames_line(answer.summary()) + "<div class='vc-frames'>"
            + "".join(tiles) + "</div>" + answer_inputs.history_cut(answer))


def mark_html(answer_id: str, mark: dict | None) -> str:
    """Good or bad, with a note (static/js/suites.js posts it; vidchat.conversation.answer_marks keeps it)."""
    said = ""
    if mark:
        said = f"marked {as_text(mark['mark'])}" + (f": {as_text(mark['note'])}" if mark.get("note") else "")
    pressed = (mark or {}).get("mark")
    return (f"<form class='vc-mark' data-answer='{as_text(answer_id)}'><span class='vc-mark-ask'>This answer is</span>"
            f"<button type='button' class='vc-btn' data-mark='good' aria-pressed='{str(pressed == 'good').lower()}'>"
            "✓ Good</button>"
            f"<button type='button' class='vc-btn' data-mark='bad' aria-pressed='{str(pressed == 'bad').lower()}'>"
            "✗ Bad</button>"
            "<input name='note' placeholder='why (optional)' aria-label='why this answer is good or bad'>"
            f"<span class='vc-mark-said' role='status'>{said}</span></form>")


def add_to_suite_html(answer_id: str) -> str:
    """Add to suite (static/js/suites.js shows it when the server has a --suite-dir)."""
    return (f"<form class='vc-add-suite' data-answer='{as_text(answer_id)}'>"
            "<input name='note' placeholder='note (what to look for)' aria-label='note'>"
            "<input name='expect' placeholder='expect these words (comma-separated)' aria-label='expect these words'>"
            "<button type='submit' class='vc-btn'>Add to suite</button>"
            "<span class='vc-add-suite-said' role='status'></span></form>")


def model_label(state) -> str:
    """The model as a person would name it: a hub id, a folder's name, or the test model."""
    if state.tiny:
        return "tiny test model (random weights)"
    path = state.model_path.rstrip("/")
    return path.rsplit("/", 1)[-1] if path.startswith(("/", ".", "~")) else path


def second_model_label(state) -> str:
    """--compare-model's model, as the page names it."""
    name = state.compare_model_path.rstrip("/").rsplit("/", 1)[-1]
    return "tiny test model (vision only)" if state.compare_tiny and "vl" in name else name


def both_labels(state) -> tuple[str, str]:
    """The two models of Both models, as their answers are headed."""
    return model_label(state), f"{second_model_label(state)} (second model)"


def both_html(labels: tuple[str, str], first: str, second: str) -> str:
    """Both models' answers to one question, side by side (one above the
    other on a narrow screen): each headed by its model, its text as said."""
    cols = "".join(f"<div class='vc-both-col'><div class='vc-both-model'>{as_text(label)}</div>"
                   f"<div class='vc-both-text'>{as_text(text)}</div></div>"
                   for label, text in zip(labels, (first, second)))
    return f"<div class='vc-both'>{cols}</div>"


# ---------------------------------------------------------------------------

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


def waiting_text(ahead: int) -> str:
    if ahead <= 0:
        return "⏳ waiting: yours is the next question to be answered"
    return f"⏳ waiting: {ahead} question{'s' if ahead != 1 else ''} ahead"
