"""The page's chat, said from the session's one event stream
(Conversation.events()): the page sends only its question (POST
/webrtc/ask, which returns its ticket), and every message of the chat (the
question, "waiting", the answer as it streams, the stopped mark, the record
note, "what the model got" under it, Watch's scene notices and Talk's
spoken bubbles) is drawn from what the conversation says happened. A tab
that comes back (a reload), a second tab, Watch, Talk and typed questions
all reach the chat the same way: the page reads the session's events
(``GET /webrtc/events?view=chat``) and :func:`chat_draws` says them as
drawing instructions for its chat panel, which static/js/chat.js applies.

:class:`ChatTranscript` keeps the chat as messages, :class:`Redraws` says
when to draw it again, :class:`ChatView` turns the messages into HTML
(Markdown rendered here, on the server, by markdown-it-py with raw HTML off:
a model's or a user's text can never put markup on the page);
:func:`exchange_updates` draws one question of an API caller (/ask) as
Gradio chat messages.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, AsyncGenerator, AsyncIterator, Callable

from markdown_it import MarkdownIt

from vidchat.conversation import asking, runs
from vidchat.conversation.answers import Answer
from vidchat.conversation.events import (
    NO_FRAMES,
    REPLACED,
    SCENE,
    AnswerEvent,
    ChatCleared,
    Closed,
    Notice,
    QuestionAsked,
    QuestionRefused,
)
from vidchat.conversation.events import (
    SPOKEN as SPOKEN_CAUSE,
)
from vidchat.conversation.events import (
    STOPPED as STOPPED_WHY,
)
from vidchat.conversation.runs import CANCELLED, Delta, Done, Queued, Started
from vidchat.doors import PageServer, as_text
from vidchat.doors import answer_routes as answer_inputs
from vidchat.engine.weights import model_name

# How the page shows things: the chat's own messages (notices, spoken
# questions), what the model got, the re-ask comparison, the model's label.
# No events here.

HEAD = '<link rel="stylesheet" href="/static/vidchat/vidchat.css"><script type="module" src="/static/vidchat/vidchat.js"></script>'

PREVIEW_HTML = """
<div class="vc-live" id="vc-live-access" data-mode="{access_mode}" data-suites="{suites}">
  <div class="vc-video-wrap">
    <video id="vc-preview" autoplay playsinline muted></video>
    <img id="vc-stream-frame" class="vc-stream-frame" alt="the stream's newest frame, as the server keeps it" hidden>
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
  <div class="vc-memory" id="vc-memory" hidden>
    <div class="vc-memory-head">
      <label title="A keyframe at each scene change, captioned while the model is idle: questions can ask about earlier moments">
        <input type="checkbox" id="vc-memory-on"> Memory</label>
      <span class="vc-muted" id="vc-memory-note" role="status"></span>
    </div>
    <div class="vc-memory-strip" id="vc-memory-strip" role="list" aria-label="the session's scenes, oldest first"></div>
  </div>
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
# What became of a question a newer one replaced: every question's bubble says its fate.
REPLACED_NOTE = "(replaced by a newer question before it was answered)"
REPLACED_MID = "(replaced by a newer question)"

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

# Messages whose content is the page's own markup (never a model's or a
# user's text): drawn as they are, where every other message's Markdown is
# rendered with raw HTML off.
TYPING_MARK = {"log": "vidchat thinking"}
BOTH = {"log": "vidchat both models"}


def typing() -> dict[str, Any]:
    return {"role": "assistant", "content": TYPING, "metadata": dict(TYPING_MARK)}


# A spoken question's bubble (Talk mode): its label, then a player.
SPOKEN = {"log": "vidchat spoken question"}


def spoken_bubble(answer, answer_id: str) -> dict[str, Any]:
    label = asking.spoken_label(answer.spoken.seconds)
    player = (f"<audio controls preload='metadata' class='vc-spoken-audio' "
              f"src='{answer_inputs.PATH_PREFIX}{answer_id}/audio.wav'></audio>")
    return {"role": "user", "content": f"{label}\n\n{player}", "metadata": dict(SPOKEN)}


def fold_message(entry: Any, answer: Answer, answer_id: str) -> dict[str, Any]:
    """The "what the model got" fold under an answer, as the chat shows it
    (its thumbnails are encoded here: call it off the event loop)."""
    return {"role": "assistant",
            "content": answer_inputs.details_html(answer, answer_id, answer_id in entry.bundles),
            "metadata": {"title": answer_inputs.title(answer), "status": "done", "id": answer_id}}


def _short_question(question: str, most: int = 80) -> str:
    line = " ".join(question.split())
    return line if len(line) <= most else line[:most - 1] + "…"


def frames_html(answer, answer_id: str | None = None, recorded: bool = False) -> str:
    """Thumbnails of the frames sent, inline as data URLs: nothing touches
    disk; above them, where its record (and its bundle, when recorded) downloads."""
    if answer is None:
        return "<p class='vc-muted'>Ask a question to see the frames and audio the model received.</p>"
    tiles = []
    positions, at_jump = answer.sample.frame_source_times(), answer.sample.frame_source_at_jump()
    walls = answer_inputs.frame_walls(answer)
    for frame, t, idx, pos, near, wall in zip(answer.sample.frames, answer.sample.timestamps, answer.sample.indices,
                                              positions, at_jump, walls):
        src = answer_inputs.thumb_data_url(frame, (160, 120), quality=80)
        tiles.append(
            f"<figure><img src='{src}' alt='frame {as_text(idx)}'>"
            f"<figcaption>{answer_inputs.frame_caption(idx, answer.sample.relative(t), pos, near, wall)}</figcaption>"
            "</figure>"
        )
    audio = answer.reply.stats.audio_seconds
    head = (
        f"<p>{len(tiles)} frame(s) as {as_text(answer.options.frames_as)}, "
        f"{audio:.1f} s of audio{'' if audio else ' (none)'}; times in seconds since the session's first media.</p>"
    )
    links = f"<p class='vc-record-links'>{answer_inputs.record_links_html(answer_id, recorded)}</p>" if answer_id else ""
    # Which question this panel is about (its verdict and Add to suite are
    # in that answer's fold in the chat, as every answer's are).
    about = (f"<p class='vc-inputs-for'>For “{as_text(_short_question(answer.question))}” "
             f"({as_text(answer.model_name)}).</p>")
    return (about + links + head + answer_inputs.new_frames_line(answer.summary()) + "<div class='vc-frames'>"
            + "".join(tiles) + "</div>" + answer_inputs.history_cut(answer))


def model_label(state) -> str:
    """The model by its one name (vidchat.engine.weights.model_name): its
    preset, hub id or folder, as records, reports and baselines name it;
    the remote server's model with --engine-url."""
    option = state.settings.model
    return model_name(state.model_path if option == "auto" and state.model_path else option)


def second_model_label(state) -> str:
    """--compare-model's model, by its one name."""
    return model_name(state.settings.compare_model or state.compare_model_path)


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


def _short(text: str, n: int = 48) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _model_cell(answer: Answer) -> str:
    engine = answer.reply.engine
    name = answer.model_name
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


def _answers_verdict(original: Answer, again: Answer | None, text: str) -> str:
    """Once the re-ask has ended: whether the two answers are the same text,
    and what that says (same weights, inputs and seed give the same answer)."""
    if again is None or again.reply.stats.finish_reason is None:
        return ""
    if text == original.reply.text:
        return "<p class='vc-same-answer' data-verdict='identical'>The answers are identical.</p>"
    same_seed = again.options.seed is not None and again.options.seed == original.options.seed
    why = (" (same seed: the model, its settings or the inputs differ)" if same_seed else
           " (another seed: a sampled answer differs by its seed)")
    return f"<p class='vc-same-answer' data-verdict='different'>The answers differ{why}.</p>"


def compare_html(original: Answer, again: Answer | None, text: str, note: str = "",
                 again_heading: str = "Re-asked") -> str:
    same = again is not None and again.reply.stats.inputs_sha256 == original.reply.stats.inputs_sha256
    verdict = ("" if again is None or not again.reply.stats.inputs_sha256 else
               "<p class='vc-muted'>Same inputs (inputs_sha256 matches).</p>" if same else
               "<p class='vc-muted'>Different inputs: a subset of the original frames, audio left out, or a "
               "model that does not take audio.</p>")
    verdict += _answers_verdict(original, again, text)
    heading = f"Recorded ({original.bundle_name})" if original.bundle_name else "Original"
    return (f"<p><b>{as_text(original.question)}</b></p>{verdict}"
            f"{'<p class=vc-muted>' + as_text(note) + '</p>' if note else ''}"
            f"<div class='vc-compare' id='vc-compare-cols'>{_column(heading, original, original.reply.text)}"
            f"{_column(again_heading, again, text)}</div>")


def waiting_text(ahead: int) -> str:
    if ahead <= 0:
        return "⏳ waiting: yours is the next question to be answered"
    return f"⏳ waiting: {ahead} question{'s' if ahead != 1 else ''} ahead"


# The chat panel drawn from the conversation's history, which keeps the
# chat on the server: what a tab's chat feed starts from (vidchat.doors.page.chat;
# a reload shows the same chat), so the chat it shows is the one the model has. Each exchange is its question,
# its answer's text (marked where it was cut short) and, while the session
# still keeps that answer's inputs, the "what the model got" fold under it.

def chat_messages(state: PageServer, entry: Any) -> list[dict[str, Any]]:
    """The chat's messages, oldest first, as the page's chatbot shows them."""
    messages: list[dict[str, Any]] = []
    for exchange in entry.history.exchanges:
        messages.append({"role": "user", "content": exchange.question})
        messages.append({"role": "assistant", "content": exchange.answer})
        if exchange.stopped:
            messages.append(notice(STOPPED))
        answer = entry.answers.get(exchange.answer_id) if exchange.answer_id else None
        if answer is not None:
            messages.append(fold_message(entry, answer, exchange.answer_id))
    return messages


# What a question before any frame should have done, as the page's user acts on it.
NO_FRAMES_HINT = "Wait a moment after **Start camera**, then ask again."


def no_frames_hint(entry: Any) -> str:
    """What to do when a question found no frames, for the source in use: a
    stream of the server's has no Start camera, only its own state."""
    stream = getattr(entry, "stream", None)
    if stream is None:
        return NO_FRAMES_HINT
    snap = stream.snapshot()
    why = f": {snap['error']}" if snap.get("error") else ""
    return f"The stream **{snap['name']}** is {snap['state']}{why}; ask again once its frames come."

# Streamed text reaches the page at most this often (20 updates a second).
STREAM_UPDATE_S = 0.05

# The browser re-renders the whole message at each update, so a long answer's
# updates come further apart (up to this), its rendering work growing with its
# length rather than with its length squared: a 2,000-token answer at 20
# updates a second kept a tab on a loaded 2-core machine from taking a key.
# Now an update comes every 0.3 s at 2,000 characters and every second from
# 8,000 on: a page of text a second is still faster than anyone reads.
STREAM_MAX_UPDATE_S = 1.0

STREAM_CHARS_PER_S = 8_000

LOADING_EVERY_S = 1.0  # how often "the model is loading" is said again while a question waits for it


@dataclass
class _Second:
    """The second model's answer to one question (Both models), beside the first's."""

    labels: tuple[str, str]  # the two models, as the page names them
    answer: Any = None
    waiting: str | None = None
    done: Any = None  # its Done
    tail: list[dict[str, Any]] = field(default_factory=list)  # its notes and fold, after the first model's

    def text(self) -> str:
        return self.answer.reply.text if self.answer is not None else ""


@dataclass
class _Exchange:
    """One question's part of the chat, by its ticket."""

    ticket: int
    lead: list[dict[str, Any]]  # the scene notice and the question's bubble
    answer: Any = None  # vidchat.conversation.asking.Answer, from its Started
    waiting: str | None = None  # "waiting" or "loading" while it has no place yet
    tail: list[dict[str, Any]] = field(default_factory=list)  # the marks, notes and fold after its text
    ended: bool = False
    second: _Second | None = None  # Both models: the second model's answer, side by side with this one

    def messages(self, shows_typing: bool = False) -> list[dict[str, Any]]:
        out = list(self.lead)
        text = self.answer.reply.text if self.answer is not None else ""
        if self.second is not None:
            first = text or (self.waiting if self.waiting and not self.ended else "…" if not self.ended else "")
            second = self.second.text() or self.second.waiting or ("" if self.second.done else "…")
            out.append({"role": "assistant", "content": both_html(self.second.labels, first, second),
                        "metadata": dict(BOTH)})
            return out + self.tail + self.second.tail
        if self.waiting is not None and not self.ended:
            out.append(notice(self.waiting))
        elif not text and not self.ended and shows_typing:
            out.append(typing())
        elif text or (self.answer is not None and not self.ended):
            out.append({"role": "assistant", "content": text})
        return out + self.tail


class ChatTranscript:
    """The chat of one session as the page shows it, kept from its events."""

    def __init__(self, state: PageServer, entry: Any, messages: list[dict[str, Any]] | None = None,
                 shows_typing: bool = False) -> None:
        self.state, self.entry = state, entry
        # The page's own chat says "Thinking…" until the first token; an API
        # caller's stream (/ask, /watch, /talk) carries only what happened.
        self.shows_typing = shows_typing
        self.items: list[Any] = list(messages or [])  # plain messages and _Exchange, in order
        self.exchanges: dict[int, _Exchange] = {}
        self.shown: tuple[Any, str | None] | None = None  # the newest answer done: "what the model got"
        self.cleared = False
        self.generation = entry.chat_began  # the chat drawn: its number (Clear starts another)
        self._views: tuple[str | None, str, dict[str, Any] | None] | None = None  # views()'s, by answer id

    def messages(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for item in self.items:
            out.extend(item.messages(self.shows_typing) if isinstance(item, _Exchange) else [item])
        return out

    def pending(self) -> bool:
        """A question waits for the model to load."""
        return any(not x.ended and x.answer is None for x in self.exchanges.values())

    def say_loading(self) -> bool:
        if self.state.ready or not self.pending():
            return False
        text = f"⏳ {self.state.readiness()[1]} Your question will be answered once it is ready."
        for x in self.exchanges.values():
            if not x.ended and x.answer is None:
                x.waiting = text
        return True

    async def apply(self, event: Any) -> bool:
        """Take one event; True when the chat (or what the model got) changed."""
        if isinstance(event, QuestionAsked):
            self._asked(event)
        elif isinstance(event, QuestionRefused):
            return self._refused(event)
        elif isinstance(event, AnswerEvent) and event.second:
            return await self._second(event)
        elif isinstance(event, AnswerEvent) and not event.side:
            return await self._answer(event)
        elif isinstance(event, ChatCleared):
            self.items.clear()
            self.exchanges.clear()
            self.shown, self.cleared = None, True
            self.generation = event.chat
        elif isinstance(event, Notice):
            self.items.append(notice(event.text))
        else:
            return False
        return True

    def _asked(self, event: QuestionAsked) -> None:
        lead: list[dict[str, Any]] = []
        if event.cause == SCENE:
            start = self.entry.session.timeline_start
            when = f" at {event.at - start:.1f} s" if event.at is not None and start is not None else ""
            lead.append(notice(f"👁 Scene changed{when}: asking the standing question."))
        if event.cause == SPOKEN_CAUSE:
            lead.append({"role": "user", "content": asking.spoken_label(event.spoken_seconds or 0.0),
                         "metadata": dict(SPOKEN)})
        else:
            lead.append({"role": "user", "content": event.question})
        exchange = _Exchange(event.ticket, lead)
        self.exchanges[event.ticket] = exchange
        self.items.append(exchange)

    def _refused(self, event: QuestionRefused) -> bool:
        exchange = self.exchanges.get(event.ticket)
        if exchange is None or exchange.ended:
            return False
        exchange.ended = True
        if event.why == STOPPED_WHY:
            exchange.tail.append(notice(STOPPED))
        elif event.why == NO_FRAMES:
            exchange.tail.append(notice(asking.NoFrames().said_with(no_frames_hint(self.entry))))
        elif event.why == REPLACED:
            exchange.tail.append(notice(REPLACED_NOTE))
        else:
            exchange.tail.append(notice(f"⚠ {event.reason}"))
        return True

    def _exchange_of(self, event: AnswerEvent) -> _Exchange | None:
        """The question an answer event is of; one asked before this chat was
        drawn (a reload mid-answer) joins it at its first event."""
        exchange = self.exchanges.get(event.ticket)
        if exchange is not None or self.cleared:
            return exchange
        run = self.entry._chat_run
        if run is None or run.answer.ticket != event.ticket:
            return None
        exchange = _Exchange(event.ticket, [{"role": "user", "content": asking.spoken_text(run.answer)}],
                             answer=run.answer)
        self.exchanges[event.ticket] = exchange
        self.items.append(exchange)
        return exchange

    async def _answer(self, event: AnswerEvent) -> bool:
        exchange = self._exchange_of(event)
        if exchange is None or exchange.ended:
            return False
        inner = event.event
        if isinstance(inner, Queued):
            exchange.waiting = waiting_text(inner.ahead)
        elif isinstance(inner, Started):
            exchange.waiting = None
            exchange.answer = inner.answer
            if inner.answer.spoken is not None:  # its bubble plays exactly the audio the model got
                exchange.lead[-1] = spoken_bubble(inner.answer, runs.remember(self.entry, inner.answer))
        elif isinstance(inner, Done):
            await self._done(exchange, inner)
        return not isinstance(inner, Delta) or exchange.answer is not None

    async def _second(self, event: AnswerEvent) -> bool:
        """The second model's answer to a question of the chat (Both models)."""
        exchange = self.exchanges.get(event.ticket)
        if exchange is None:
            return False
        if exchange.second is None:
            exchange.second = _Second(both_labels(self.state))
        second, inner = exchange.second, event.event
        if isinstance(inner, Queued):
            second.waiting = waiting_text(inner.ahead)
        elif isinstance(inner, Started):
            second.waiting, second.answer = None, inner.answer
        elif isinstance(inner, Done):
            second.waiting, second.answer, second.done = None, inner.answer, inner
            if inner.error:
                second.tail.append(notice(f"⚠ Second model: {inner.error}"))
            if inner.answer_id is not None and inner.started:
                fold = await asyncio.to_thread(fold_message, self.entry, inner.answer, inner.answer_id)
                fold["metadata"] = {**fold["metadata"], "title": "Second model · " + fold["metadata"]["title"]}
                second.tail.append(fold)
        return True

    async def _done(self, exchange: _Exchange, done: Done) -> None:
        """The answer's last state: its text (or why there is none), the
        recording's note, and what the model got, folded under it. Thumbnails
        are encoded after the answer, so they never delay its first token,
        and in a worker thread, so they never stall the event loop."""
        exchange.ended, exchange.waiting = True, None
        exchange.answer = answer = done.answer
        tail = exchange.tail
        # Cut short with a newer question in the chat: that question (typed,
        # spoken or Watch's) replaced it; else Stop did.
        cut = REPLACED_MID if any(t > exchange.ticket for t in self.exchanges) else STOPPED
        if not done.text:
            tail.append(notice(f"⚠ {done.error}" if done.error else cut if done.status == CANCELLED
                               else NO_TEXT))
        elif done.error is not None:
            tail.append(notice(f"⚠ {done.error}"))
        elif done.status == CANCELLED:  # the text so far, then the mark
            tail.append(notice(cut))
        if done.record_error:
            tail.append(notice(done.record_error if done.record_error.startswith("Not recorded")
                               else f"⚠ {done.record_error}"))
        if done.answer_id is not None and done.started:
            tail.append(await asyncio.to_thread(fold_message, self.entry, answer, done.answer_id))
            self.shown = (answer, done.answer_id)

    async def views(self) -> tuple[str, dict[str, Any] | None]:
        """What the model got for the newest answer, and its reply's details
        (the empty panel before any answer, and again once the chat is
        cleared). Kept between calls: its thumbnails are encoded once per answer."""
        key = None if self.shown is None else self.shown[1]
        if self._views is None or self._views[0] != key:
            if self.shown is None:
                self._views = (key, frames_html(None), None)
            else:
                answer, answer_id = self.shown
                html = await asyncio.to_thread(frames_html, answer, answer_id, answer_id in self.entry.bundles)
                self._views = (key, html, answer.summary())
        return self._views[1], self._views[2]


def _stream_every(transcript: ChatTranscript) -> float:
    """How far apart a streaming answer's updates go (STREAM_CHARS_PER_S)."""
    streaming = [x for x in transcript.exchanges.values() if not x.ended and x.answer is not None]
    longest = max((len(x.answer.reply.text) for x in streaming), default=0)
    return min(STREAM_MAX_UPDATE_S, STREAM_UPDATE_S + longest / STREAM_CHARS_PER_S)


class Redraws:
    """When to draw a transcript again, from a subscription to the session's
    events: :meth:`next` returns once the chat changed enough to be drawn
    (streamed text at most every _stream_every), True when what the model
    got changed too, and None at the session's end or once ``until()``.
    (A waiter, not a generator: the tokens pass through no layer of it.)"""

    def __init__(self, transcript: ChatTranscript, subscription: Any,
                 until: Callable[[], bool] = lambda: False) -> None:
        self.transcript, self.subscription, self.until = transcript, subscription, until
        self._drawn_at = 0.0
        self._behind = False  # text came that was not drawn yet
        self._closed = False
        self.closed_because = ""  # the session's end, as its Closed event says
        self._held: list[Any] = []  # the rest of a burst cut at an answer's first text
        self._texted: set[tuple[int, bool, bool]] = set()  # answers whose first text was drawn

    async def next(self) -> bool | None:
        transcript, subscription = self.transcript, self.subscription
        while not self._closed and not self.until():
            if self._held:
                burst, self._held = self._held, []
            else:
                wait = LOADING_EVERY_S
                if self._behind:
                    wait = max(0.0, self._drawn_at + _stream_every(transcript) - time.monotonic())
                event = await subscription.get(timeout=wait)
                if event is None:
                    if self._behind or transcript.say_loading():
                        return self._drawn(False)
                    continue
                burst = [event, *subscription.pending()]
            changed, done = False, False
            for at, one in enumerate(burst):
                changed = await transcript.apply(one) or changed
                done = done or (isinstance(one, AnswerEvent) and isinstance(one.event, Done)) \
                    or isinstance(one, (ChatCleared, QuestionRefused))
                if isinstance(one, Closed):
                    self._closed, self.closed_because = True, one.reason
                if (isinstance(one, QuestionAsked) or self._first_text(one)) and at + 1 < len(burst):
                    # A question is drawn as asked ("Thinking…" under it), and
                    # an answer's first words as they come, even when the reader
                    # woke behind the whole reply: the first token is what a
                    # person waits for, and a reply drawn at once never looks
                    # like it streamed.
                    self._held = burst[at + 1:]
                    return self._drawn(done)
            only_text = changed and not done and all(
                isinstance(one, AnswerEvent) and isinstance(one.event, Delta) for one in burst)
            if only_text and time.monotonic() - self._drawn_at < _stream_every(transcript):
                self._behind = True
            elif changed or self._behind:
                return self._drawn(done)
        return None

    def _first_text(self, event: Any) -> bool:
        if not (isinstance(event, AnswerEvent) and isinstance(event.event, Delta)) or not event.event.text:
            return False
        key = (event.ticket, event.side, event.second)
        if key in self._texted:
            return False
        self._texted.add(key)
        return True

    def _drawn(self, views_changed: bool) -> bool:
        self._behind = False
        self._drawn_at = time.monotonic()
        return views_changed


# The chat panel's HTML (static/js/chat.js draws it). Markdown as Gradio's
# Chatbot rendered it (CommonMark with tables and strikethrough, a line break
# where the text breaks a line), with raw HTML off: the text is escaped, and
# markdown-it-py refuses javascript: and data: links.
_MARKDOWN = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable(["table", "strikethrough"])

# Rendered messages kept by their source (a chat redrawn at each streamed
# token renders only the message that changed).
_RENDER_CACHE_SIZE = 512


# Icons are drawn, not emoji: a machine without an emoji font shows emoji as boxes.
COPY_ICON = ("<svg viewBox='0 0 24 24' width='15' height='15' aria-hidden='true' fill='none' stroke='currentColor' "
             "stroke-width='2'><rect x='9' y='9' width='11' height='11' rx='2'/>"
             "<path d='M5 15V5a2 2 0 0 1 2-2h8'/></svg>")
CLEAR_ICON = ("<svg viewBox='0 0 24 24' width='15' height='15' aria-hidden='true' fill='none' stroke='currentColor' "
              "stroke-width='2'><path d='M4 7h16M9 7V4h6v3M6 7l1 13h10l1-13'/></svg>")


def markdown_html(text: str) -> str:
    return str(_MARKDOWN.render(text))


def _trusted(message: dict[str, Any]) -> bool:
    """A message whose content is the page's own markup: a fold (its title),
    "Thinking…", a spoken question's player, Both models' columns."""
    meta = message.get("metadata") or {}
    return bool(meta.get("title")) or meta.get("log") in (TYPING_MARK["log"], SPOKEN["log"], BOTH["log"])


def message_html(message: dict[str, Any]) -> str:
    """One chat message as the panel shows it: the question's bubble, an
    answer's (with its copy button), a notice, or a fold ("what the model
    got") closed under its title."""
    meta = message.get("metadata") or {}
    raw = message.get("content")
    content = raw if isinstance(raw, str) else ""
    role = "user" if message.get("role") == "user" else "bot"
    if meta.get("title"):
        return (f"<div class='vc-msg vc-bot vc-fold-msg' data-testid='bot'><details class='vc-fold'>"
                f"<summary role='button'><span class='vc-fold-title'>{as_text(meta['title'])}</span></summary>"
                f"<div class='vc-fold-body'>{content}</div></details></div>")
    if _trusted(message):
        body = content
    elif role == "user":
        # A question is shown as typed: `*star*` stays stars, `<img>` stays text.
        body = f"<p class='vc-typed'>{as_text(content)}</p>"
    else:
        body = markdown_html(content)
    kind = " vc-notice" if meta.get("log") == NOTICE["log"] else ""
    copy = (f"<button type='button' class='vc-copy' aria-label='Copy this answer' title='Copy'>{COPY_ICON}</button>"
            if role == "bot" and not kind and not meta else "")
    return f"<div class='vc-msg vc-{role}{kind}' data-testid='{role}'><div class='vc-md'>{body}</div>{copy}</div>"


class ChatView:
    """What a tab's chat panel shows, kept per stream, so each draw names
    only what changed: the messages in order (by a key that stays with a
    message while it streams), the HTML of those new or changed, and the
    questions whose outcome the chat now shows (the page counts its own
    questions finished by them)."""

    def __init__(self) -> None:
        self._shown: dict[str, str] = {}  # key -> HTML the panel has
        self._rendered: dict[str, str] = {}  # message source -> HTML
        self._ended: dict[int, None] = {}  # the questions said ended (the newest 256)
        self._open: set[int] = set()  # the questions drawn and not ended
        self._generation: int | None = None

    def _html(self, message: dict[str, Any]) -> str:
        source = json.dumps([message.get("role"), message.get("content"), message.get("metadata")],
                            default=str, ensure_ascii=False)
        html = self._rendered.pop(source, None)
        if html is None:
            html = message_html(message)
            while len(self._rendered) >= _RENDER_CACHE_SIZE:
                self._rendered.pop(next(iter(self._rendered)))
        self._rendered[source] = html  # newest last
        return html

    def _keyed(self, transcript: ChatTranscript) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        for n, item in enumerate(transcript.items):
            if isinstance(item, _Exchange):
                out.extend((f"q{item.ticket}.{k}", m) for k, m in enumerate(item.messages(transcript.shows_typing)))
            else:
                out.append((f"m{n}", item))
        return out

    def draw(self, transcript: ChatTranscript) -> dict[str, Any]:
        """The next draw: ``reset`` (a new chat: empty the panel first),
        ``order`` (every message's key), ``html`` (key -> HTML of the
        messages new or changed), ``ended`` (questions whose outcome is now
        shown) and ``generation`` (the chat's: Clear starts another)."""
        reset = self._generation != transcript.generation
        if reset:
            self._shown.clear()
        self._generation = transcript.generation
        keyed = self._keyed(transcript)
        changed = {}
        for key, message in keyed:
            html = self._html(message)
            if self._shown.get(key) != html:
                changed[key] = self._shown[key] = html
        order = [key for key, _ in keyed]
        for gone in set(self._shown) - set(order):
            del self._shown[gone]
        now = transcript.exchanges
        ended = [t for t, x in now.items() if x.ended and t not in self._ended]
        # A question whose chat was cleared before it ended is over for the page too.
        ended += [t for t in self._open if t not in now and t not in self._ended]
        self._open = {t for t, x in now.items() if not x.ended}
        for t in ended:
            self._ended[t] = None
        while len(self._ended) > 256:
            self._ended.pop(next(iter(self._ended)))
        return {"reset": reset, "order": order, "html": changed, "ended": ended,
                "generation": transcript.generation}


async def chat_draws(state: PageServer, entry: Any) -> AsyncGenerator[tuple[str, dict[str, Any]], None]:
    """The tab's chat for the life of its session, said from the session's
    events as (event name, body): ``chat.draw`` (ChatView.draw) and
    ``inputs.view`` (what the model got for the newest answer: ``html``, and
    the reply's ``details``), drawn first from the conversation's history,
    then again at each change its events say; ``closed`` last."""
    with entry.event_hub.subscribe() as subscription:
        messages = await asyncio.to_thread(chat_messages, state, entry)
        transcript = ChatTranscript(state, entry, messages, shows_typing=True)
        last = next(((answer_id, answer) for answer_id, answer in runs.chat_answers(entry) if answer.reply.text),
                    None)
        if last is not None:
            transcript.shown = (last[1], last[0])
        view = ChatView()
        yield "chat.draw", view.draw(transcript)
        html, details = await transcript.views()
        yield "inputs.view", {"html": html, "details": details}
        redraws = Redraws(transcript, subscription)
        generation = transcript.generation
        while (views_changed := await redraws.next()) is not None:
            yield "chat.draw", view.draw(transcript)
            if views_changed or transcript.generation != generation:
                generation = transcript.generation
                html, details = await transcript.views()
                yield "inputs.view", {"html": html, "details": details}
    yield "closed", {"reason": redraws.closed_because}


class _OneQuestion:
    """A subscription narrowed to one question's events (an API caller's /ask)."""

    def __init__(self, subscription: Any, ticket: int) -> None:
        self.subscription, self.ticket = subscription, ticket

    def _mine(self, event: Any) -> bool:
        return getattr(event, "ticket", self.ticket) == self.ticket and not getattr(event, "side", False) \
            and not isinstance(event, (Notice, ChatCleared))

    async def get(self, timeout: float | None = None) -> Any:
        while True:
            event = await self.subscription.get(timeout)
            if event is None or self._mine(event):
                return event

    def pending(self) -> list[Any]:
        return [e for e in self.subscription.pending() if self._mine(e)]


async def exchange_updates(state: PageServer, entry: Any, before: list[dict[str, Any]], ask: Callable[[], int]) \
        -> AsyncIterator[tuple]:
    """One question's part of the chat after ``before`` (an API caller's
    chat), from asking it (``ask`` returns its ticket) to its outcome."""
    with entry.event_hub.subscribe() as subscription:
        transcript = ChatTranscript(state, entry, before)
        ticket = ask()
        mine = transcript.exchanges
        redraws = Redraws(transcript, _OneQuestion(subscription, ticket),
                          until=lambda: ticket in mine and mine[ticket].ended)
        # Every update carries the views whole (never gr.skip() for one of
        # them): an output skipped and then given a value is what made
        # Gradio keep a stray copy of it per answer.
        yield transcript.messages(), *(await transcript.views())
        while await redraws.next() is not None:
            yield transcript.messages(), *(await transcript.views())
