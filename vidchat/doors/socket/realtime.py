"""The OpenAI Realtime door at ``/v1/realtime``: apps written against the
official SDK (``AsyncOpenAI(base_url=…/v1).realtime.connect(model=…)``) get
live video with the local model.

An adapter over the parts the seed door (vidchat.doors.socket.seed) uses: the
socket session's access, lifecycle and event loop (vidchat.doors.socket.session),
frames through the session's filter into its buffer (``input_image`` items
are frames on the timeline, vidchat.doors.socket.intake), audio onto its
timeline (``input_audio_buffer.append``, resampled to 16 kHz), questions
through the conversation (:meth:`vidchat.conversation.Conversation.ask`),
server VAD as the conversation's listener (vidchat.doors.socket.session),
settings checked by the one settings table, responses one at a time
(vidchat.doors.socket.realtime). This module only translates events;
their shapes are :mod:`vidchat.doors.socket.realtime_events`, the table of them is
docs/realtime.md.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from vidchat.conversation import asking, runs
from vidchat.conversation.asking import MAX_QUESTION_CHARS, current_values
from vidchat.conversation.conversation import UnknownStream, attach_stream, detach_stream
from vidchat.conversation.registry import TooManySessions
from vidchat.doors import DoorSettings, Server
from vidchat.doors.answer_routes import record_links
from vidchat.doors.socket import realtime_events as rt
from vidchat.doors.socket.config import ConfigError
from vidchat.doors.socket.intake import Refused, SocketMedia, is_millis, pcm16_audio
from vidchat.doors.socket.realtime_events import EventError, message_item
from vidchat.doors.socket.session import NO_AUDIO_OUTPUT_NOTICE, SocketSession, SocketTurns, check_record
from vidchat.engine import EngineError
from vidchat.media import AUDIO_RATE
from vidchat.media.audio import AudioInput, ClipTooShort, Pcm16Resampler
from vidchat.media.vad import SpeechStarted, Utterance

if TYPE_CHECKING:
    from fastapi import WebSocket

log = logging.getLogger(__name__)


# The OpenAI Realtime door's conversation items: what a client's
# ``conversation.item.create`` may hold (checked whole before anything is
# taken in), how the door says an item back, and the question the items
# build up until the next response. Pure, no I/O, like
# :mod:`vidchat.doors.socket.realtime_events`.

IMAGE_TYPES = ("data:image/jpeg", "data:image/png", "data:image/webp")


@dataclass(frozen=True)
class Part:
    kind: str  # "input_text", "input_audio" or "input_image"
    value: Any  # the text, the base64 audio, or the image's data URL
    pts_ms: Any = None
    index: int = 0


# What an assistant's or a system message may hold (the GA types'), and where its text is.
HISTORY_CONTENT = {"assistant": {"output_text": "text", "output_audio": "transcript"},
                   "system": {"input_text": "text"}}


def message_role(item: Any) -> str:
    """A conversation.item.create's message role ("user", "assistant",
    "system"); raises EventError for anything else (function calls and their
    outputs: tools are not served)."""
    if not isinstance(item, dict):
        raise EventError("conversation.item.create needs an 'item' object", param="item")
    role = item.get("role")
    if item.get("type", "message") != "message" or role not in ("user", *HISTORY_CONTENT):
        raise EventError("only messages are taken (item.type \"message\", item.role \"user\", \"assistant\" "
                         "or \"system\")", code="unsupported_item", param="item.role")
    return role


def history_text(item: dict[str, Any], role: str) -> str:
    """An assistant's or a system message's text (an output_audio part by
    its transcript: there is no audio to keep), checked; raises EventError.
    Clients replay their chat this way after a reconnect and at hand-offs."""
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise EventError("item.content must be a non-empty list", param="item.content")
    kinds, texts = HISTORY_CONTENT[role], []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds:
            raise EventError(f"item.content[{i}].type of a{'n' if role == 'assistant' else ''} {role} message must "
                             f"be {' or '.join(kinds)}, got {kind!r}", code="unsupported_content",
                             param=f"item.content[{i}].type")
        key = kinds[kind]
        text = part.get(key)
        if not isinstance(text, str) and not (kind == "output_audio" and text is None):  # audio with no transcript
            raise EventError(f"item.content[{i}].{key} must be a string", param=f"item.content[{i}].{key}")
        texts.append(text or "")
    text = "\n".join(t for t in texts if t)
    if len(text) > MAX_QUESTION_CHARS:
        raise EventError(f"item.content: a history message is at most {MAX_QUESTION_CHARS} characters",
                         "question_too_long", "item.content")
    return text


def history_item(item_id: str, role: str, text: str) -> dict[str, Any]:
    """An assistant's or a system message as conversation.item.added/done say it back."""
    return message_item(item_id, role, "completed",
                        [{"type": "output_text" if role == "assistant" else "input_text", "text": text}])


def user_parts(item: Any) -> list[Part]:
    """A user message's content, checked before anything is taken in; raises EventError."""
    if message_role(item) != "user":
        raise EventError("item.role must be \"user\" here", code="unsupported_item", param="item.role")
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise EventError("item.content must be a non-empty list", param="item.content")
    parts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        key = {"input_text": "text", "input_audio": "audio", "input_image": "image_url"}.get(kind)
        param = f"item.content[{i}]"
        if key is None:
            raise EventError(f"{param}.type must be input_text, input_audio or input_image, got {kind!r}",
                             code="unsupported_content", param=f"{param}.type")
        value = part.get(key)
        if not isinstance(value, str) or (kind != "input_text" and not value):
            raise EventError(f"{param}.{key} must be a {'string' if kind == 'input_text' else 'non-empty string'}",
                             param=f"{param}.{key}")
        if kind == "input_image" and not value[:20].lower().startswith(IMAGE_TYPES):
            raise EventError(f"{param}.image_url must be a data URL of a JPEG, PNG or WebP image "
                             "(data:image/jpeg;base64,…)", code="invalid_image", param=f"{param}.image_url")
        pts = part.get("pts_ms")
        if pts is not None and (kind != "input_image" or not is_millis(pts)):
            raise EventError(f"{param}.pts_ms must be a number of milliseconds on an input_image, got {pts!r}",
                             param=f"{param}.pts_ms")
        parts.append(Part(kind, value, pts, i))
    return parts


def acked_item(item_id: str, parts: list[Part]) -> dict[str, Any]:
    """The user item as conversation.item.added/done say it: its parts without
    their media (an image is not sent back; an audio part is named, not echoed)."""
    return message_item(item_id, "user", "completed", [{"type": p.kind, "text": p.value} if p.kind == "input_text"
                                                        else {"type": p.kind} for p in parts])


class Question:
    """The text and audio items added since the last response: the next
    response's question. An item that would pass a limit is refused whole.
    Image items count too: a picture alone is something to answer (the API
    answers it, and the Agents SDK asks a response after every message)."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.audio: list[np.ndarray] = []  # 16 kHz float samples, one array an item
        self.images = 0  # image items since the last response (their frames are in the buffer)

    def __bool__(self) -> bool:
        return bool(self.texts or self.audio or self.images)

    def check(self, texts: list[str], audio: list[np.ndarray], max_audio_s: float) -> None:
        """Raises EventError when an item's text and audio would make the question too long."""
        if sum(map(len, self.texts + texts)) > MAX_QUESTION_CHARS:
            raise EventError(f"the next response's question would pass {MAX_QUESTION_CHARS} characters",
                             "question_too_long", "item.content")
        if sum(a.size for a in self.audio + audio) > max_audio_s * AUDIO_RATE:
            raise EventError(f"the next response's spoken question would pass {max_audio_s:g} s of audio",
                             "question_too_long", "item.content")

    def add(self, texts: list[str], audio: list[np.ndarray], images: int = 0) -> None:
        self.texts += texts
        self.audio += audio
        self.images += images

    def take_text(self) -> str:
        """The text for a response (its image items are answered with it)."""
        text, self.texts, self.images = "\n".join(self.texts), [], 0
        return text

    def take_answered_text(self) -> str:
        """The text an assistant history message answered: the question of
        that exchange. Image items stay pending: their frames are the
        buffer's, not the exchange's, and still ask for the next response."""
        text, self.texts = "\n".join(self.texts), []
        return text

    def take(self) -> tuple[str, np.ndarray | None]:
        """The question's text and its audio (None without any), and a fresh start."""
        audio, self.audio = self.audio, []
        return self.take_text(), np.concatenate(audio) if audio else None


# The Realtime door's responses: ``response.create`` checked and started
# one at a time, each the connection's answer task, said as response events.
#
# The connection (:class:`vidchat.doors.socket.realtime.RealtimeConnection`) takes
# the client's items into the pending question; a response takes that
# question, asks the conversation and streams the run as
# ``response.created`` … ``response.done`` (shapes: :mod:`vidchat.doors.socket.realtime_events`).

class Client(Protocol):
    """What the responses need of their connection (vidchat.doors.socket.realtime.RealtimeConnection)."""

    state: Server
    settings: DoorSettings
    entry: Any  # the session's conversation, None before the session opens
    options: asking.AnswerOptions
    question: Question  # the text and audio items since the last response
    record: bool
    peer: str
    closed: bool
    answering: bool  # its answer task streams (vidchat.doors.socket.session.SocketSession)

    async def emit(self, *events: dict[str, Any]) -> bool: ...

    async def refuse(self, message: str, code: str = ..., param: str | None = ..., kind: str = ...,
                     event_id: Any = ...) -> bool: ...

    def next_item(self, item_id: str) -> str | None: ...

    def audio_notice(self, fields: dict[str, Any]) -> dict[str, Any]: ...

    def stream_answer(self, answer: Any, name: str) -> None: ...

    async def finish_answer(self) -> None: ...


class RealtimeResponses:
    """One connection's responses, one at a time, each the connection's
    answer task: it asks the conversation and says the run as response
    events (:class:`RealtimeResponse`). Every ``response.created`` is followed by
    exactly one ``response.done``; a new response starts only after the
    previous one's, whoever starts it (the client, server VAD)."""

    def __init__(self, conn: Client) -> None:
        self.conn = conn
        # Starting a response waits (for the previous one to wind down) with
        # no answer task to show for it: the lock is what says one is starting.
        self._lock = asyncio.Lock()
        self.current: RealtimeResponse | None = None  # the newest response started

    @property
    def busy(self) -> bool:
        """A response is under way, or being started: a client's response.create is refused."""
        return self.conn.answering or self._lock.locked()

    async def cancel(self, why: str) -> None:
        if self.current is not None:
            await self.current.cancel(why)

    async def create(self, request: Any) -> None:
        """A client's response.create (``request``: its ``response``), checked,
        then started on the pending question; raises rt.EventError."""
        conn = self.conn
        if self.busy:
            raise rt.EventError("a response is in progress: cancel it first, or wait for its response.done",
                                "conversation_already_has_active_response")
        fields, metadata = rt.response_fields(request), rt.response_metadata(request)
        continues_chat = rt.in_conversation(request)
        options = rt.answer_options(conn.options, fields, conn.state.answer_defaults().max_tokens)
        try:
            asking.check_options(options, conn.state.engine_now())
        except ValueError as exc:
            raise rt.setting_refused(exc, "response", fields) from None
        if not conn.question:
            raise rt.EventError("nothing to answer: add an input_text, input_audio or input_image item (or commit "
                                "the audio buffer) since the last response before response.create",
                                "empty_conversation")
        # Image items alone: answered on the frames, with no text question.
        text, audio = conn.question.take()
        await self.start(text, options, conn.audio_notice(fields), metadata, question_audio=audio,
                         continues_chat=continues_chat)

    async def cancel_asked(self) -> None:
        """A client's response.cancel: its response.done says cancelled."""
        if not self.busy:
            raise rt.EventError("no response is in progress", "response_cancel_not_active")
        await self.cancel("client_cancelled")

    async def start(self, question: str, options: asking.AnswerOptions, notice: dict[str, Any] | None = None,
                    metadata: dict[str, str] | None = None, **how: Any) -> None:
        """Start a response, once the previous one has sent its response.done
        (cancelled, if it still runs); ``notice`` rides on its response.created,
        ``metadata`` (response.create's) on its response.created and response.done."""
        conn = self.conn
        async with self._lock:
            previous = self.current
            if previous is not None and conn.answering:
                await previous.cancel()
            await conn.finish_answer()
            if conn.entry is None or conn.closed:
                return
            response = self.current = RealtimeResponse(conn, options.max_tokens, metadata)
            conn.stream_answer(response.answer(question, options, notice or {}, how), f"realtime-{response.say.id}")


class RealtimeResponse:
    """One response: its ids, its answer run once asked, and the run's
    Words (vidchat.conversation.Words). Bound to this response, so its
    events carry its own ids whatever starts after it."""

    def __init__(self, conn: Client, max_output_tokens: int | None, metadata: dict[str, str] | None = None) -> None:
        self.conn = conn
        self.say = rt.ResponseEvents(rt.new_id("resp"), max_output_tokens, metadata)
        self.run: runs.AnswerRun | None = None
        # Cancelled while it was set up (no run yet): the run is cancelled once there is one.
        self.cancelled = False
        self.cancel_reason: str | None = None
        self.ended = False  # its response.done was sent

    async def cancel(self, why: str | None = None) -> None:
        if not self.cancelled:
            self.cancelled, self.cancel_reason = True, why
        if self.run is not None:
            await self.run.cancel(why)

    async def answer(self, question: str, options: asking.AnswerOptions, notice: dict[str, Any],
                     how: dict[str, Any]) -> None:
        """The response from its response.created to its response.done, whatever breaks between."""
        conn, say = self.conn, self.say
        await conn.emit({**say.created(), **notice})
        try:
            await self._answer(question, options, how)
        except EngineError as exc:
            await self._failed(str(exc))
        except Exception as exc:  # noqa: BLE001 - the client still gets its response.done, and the session goes on
            log.exception("realtime %s: response %s failed", conn.peer, say.id)
            await self._failed(f"Query processing failed ({type(exc).__name__})")  # the log has the traceback

    async def _answer(self, question: str, options: asking.AnswerOptions, how: dict[str, Any]) -> None:
        conn = self.conn
        await conn.state.engine_for()
        try:
            # The Realtime conversation's items are the conversation's chat,
            # kept on the server: each response is asked with the exchanges
            # before it and joins them, unless it was made outside the
            # conversation (response.conversation "none").
            how = dict(how)
            self.run = await conn.entry.ask(
                question, options, record=conn.record, frames_optional=True,
                continues_chat=how.pop("continues_chat", True), **how)
        except asking.Superseded:
            await self._end(self.say.done("cancelled", text=None, reason=self.cancel_reason))
            return
        if self.cancelled:
            await self.run.cancel(self.cancel_reason)
        await self.run.say(self)

    async def _end(self, events: list[dict[str, Any]]) -> None:
        """Send the events that end the response (the last is its response.done), once."""
        if not self.ended:
            self.ended = True
            await self.conn.emit(*events)

    async def _failed(self, why: str) -> None:
        if self.ended:
            return  # it broke after its response.done: the client has its end
        await self.conn.refuse(why, "answer_failed", kind="server_error")
        # Why, as the API says it: status_details.error (its reason is for cancelled and incomplete ones).
        await self._end(self.say.done("failed", text=None, error=why))

    # -- the run's Words ---------------------------------------------------------------

    async def queued(self, ahead: int) -> None:
        pass  # the response was created; it starts when it has its place

    async def started(self, answer: Any) -> None:
        await self.conn.emit(*self.say.started(self.conn.next_item(self.say.item_id)))

    async def delta(self, text: str) -> bool:
        return await self.conn.emit(self.say.delta(text))

    async def done(self, done: runs.Done) -> None:
        conn = self.conn
        if done.error:
            await conn.refuse(done.error, "answer_failed", kind="server_error")
        # Why it was cancelled, if it was (the first cause): the client's
        # response.cancel, or speech (server VAD's barge-in, talk.BARGED_IN).
        record = record_links(done, conn.record, conn.settings.record_dir)
        ending = self.say.finished(done, done.answer.cancelled_by, record)
        await self._end(ending)
        log.info("realtime %s: response %s: %s", conn.peer, self.say.id, ending[-1]["response"]["status"])


class RealtimeTurns(SocketTurns):
    """Server VAD as the seed door runs it; said as OpenAI Realtime says it."""

    async def speech_started(self, event: SpeechStarted) -> None:
        conn = self.conn
        conn.speech_item = rt.new_id("item")
        await conn.emit({"type": "input_audio_buffer.speech_started", "item_id": conn.speech_item,
                         "audio_start_ms": self.timeline_ms(event.start)})

    async def utterance(self, event: Utterance) -> None:
        """Server VAD heard an utterance: committed as an item, then (create_response) answered."""
        conn, turns = self.conn, self.turns
        item_id, conn.speech_item = conn.speech_item or rt.new_id("item"), None
        await conn.emit({"type": "input_audio_buffer.speech_stopped", "item_id": item_id,
                         "audio_end_ms": self.timeline_ms(event.end)})
        conn.audio.clear()
        await conn.committed(item_id)
        if turns is not None and turns.create_response:
            await self.answer_streams_on()
            # Shielded: the session's end waits for the response being set up.
            await asyncio.shield(conn.responses.start(conn.question.take_text(), conn.options, spoken=event))


class RealtimeConnection(SocketSession):
    """One SDK client: the socket session's event loop and answer task, said as Realtime events."""

    door, noun = "realtime", "event"

    def __init__(self, state: Server, websocket: "WebSocket") -> None:
        super().__init__(state, websocket)
        self.model = websocket.query_params.get("model") or state.model_path
        self.session_id = rt.new_id("sess")
        self.event_ids = (f"event_{n}" for n in itertools.count(1))  # numbered: the log of one connection
        self.media = SocketMedia(self)  # the frame intake; its client clock places pts_ms
        self.turns = RealtimeTurns(self, None)
        self.audio = AudioInput(self.settings.ws_max_audio_seconds, rt.INPUT_RATES[0])  # input_audio_buffer
        self.record = runs.records_by_default(self.settings)
        self.told_no_audio = False
        self.question = Question()  # the text and audio items since the last response
        self.last_item: str | None = None  # the next item's previous_item_id
        self.speech_item: str | None = None  # the item server VAD is hearing
        self.responses = RealtimeResponses(self)

    async def emit(self, *events: dict[str, Any]) -> bool:
        """Send server events, in order, each with its event_id; False once the client is gone."""
        sent = True
        for event in events:
            sent = await self.send({"event_id": next(self.event_ids), **event})
        return sent

    async def refuse(self, message: str, code: str = "invalid_value", param: str | None = None,
                     kind: str = "invalid_request_error", event_id: Any = None) -> bool:
        """An ``error`` event (``event_id``: the client event refused); the session goes on."""
        return await super().error(message, lambda cut: rt.error_event(
            next(self.event_ids), rt.EventError(cut, code, param, kind), event_id))

    error = refuse  # a shared part's bare error message is an error event here too

    def describe(self) -> dict[str, Any]:
        """The effective session, as session.created/updated carry it (the
        settings table's fields, of the session and its answers, are ``vidchat``)."""
        options = self.options
        return {"type": "realtime", "object": "realtime.session", "id": self.session_id, "model": self.model,
                "instructions": options.system_prompt or "", "output_modalities": ["text"],
                "max_output_tokens": options.max_tokens, "tools": [], "tool_choice": "auto",
                "audio": {"input": {"format": rt.input_format(self.audio.rate),
                                    "turn_detection": self.turns.describe(), "transcription": None}},
                "vidchat": {**current_values(self.entry.session.settings, options), "record": self.record,
                            "stream": None if self.entry.stream is None else self.entry.stream.name,
                            # What GET /sessions/<id>/memory takes (vidchat.doors.memory_routes).
                            "session_id": self.entry.session.id}}

    def next_item(self, item_id: str) -> str | None:
        """``item_id`` joins the conversation: the previous_item_id it follows."""
        previous, self.last_item = self.last_item, item_id
        return previous

    # -- the session's life (the rest is vidchat.doors.socket.session's) ------------------

    async def open(self) -> bool:
        down = self.model_down()
        if down is not None:
            return await self.refuse_session(down, "engine not running")
        try:
            self.start_session()
        except (TooManySessions, ValueError) as exc:
            return await self.refuse_session(str(exc), "session refused")
        await self.emit({"type": "session.created", "session": self.describe()})
        log.info("realtime %s: session %s… started (model %r)", self.peer, self.entry.session.id[:6], self.model)
        return True

    async def stop_asking(self) -> None:
        await self.turns.stop()

    # -- session.update -----------------------------------------------------------

    async def _on_session_update(self, msg: dict[str, Any], arrived: float) -> None:
        """Every change is checked before any is made; then session.updated with the effective session."""
        update, state = rt.parse_session(msg.get("session")), self.state
        options = rt.answer_options(self.options.updated(**update.settings["answer"]), update.answer,
                                    state.answer_defaults().max_tokens)
        if update.stream not in (rt.UNSET, None):
            try:
                state.streams.check(update.stream)
            except UnknownStream as exc:
                raise rt.EventError(f"session.vidchat.stream: {exc}", param="session.vidchat.stream") from None
        try:
            self.turns.check(None if update.turn_detection is rt.UNSET else update.turn_detection)
        except ConfigError as exc:
            raise rt.EventError(str(exc), "audio_not_supported", "session.audio.input.turn_detection") from None
        try:
            check_record(self.settings, update.record is True)
        except ConfigError as exc:
            raise rt.EventError(str(exc), param="session.vidchat.record") from None
        try:
            asking.apply_settings(self.entry.session, state.engine_now(), options, update.settings["session"],
                                       self.entry.event_hub)
        except ValueError as exc:  # OptionError or the settings' own check: nothing was changed
            raise rt.setting_refused(exc, "session", update.answer) from None
        self.options = options
        self.memory_set(update.settings["session"])
        if update.input_rate is not rt.UNSET:
            self.audio.set_rate(update.input_rate)
        if update.record is not rt.UNSET:
            self.record = update.record
        if update.stream is not rt.UNSET:
            self._watch_stream(update.stream)
        if update.turn_detection is not rt.UNSET:
            await self.turns.request(update.turn_detection)
        extra = self.audio_notice(update.answer).get("vidchat", {})
        if update.left_out:  # what was asked and not honoured; the rest took effect
            extra = {**extra, "left_out": update.left_out}
        await self.emit({"type": "session.updated", **({"vidchat": extra} if extra else {}),
                         "session": self.describe()})

    def _watch_stream(self, name: str | None) -> None:
        """The session watches the server's stream ``name`` (checked to exist), or none."""
        if name is None:
            detach_stream(self.entry, self.state.streams)
        else:
            attach_stream(self.entry, self.state.streams, name)

    def audio_notice(self, fields: dict[str, Any]) -> dict[str, Any]:
        """The first session.update or response.create whose output_modalities
        asks for audio is told, in a vidchat extra, that answers are text."""
        if "audio" not in fields.get("output_modalities", ()) or self.told_no_audio:
            return {}
        self.told_no_audio = True
        return {"vidchat": {"notice": NO_AUDIO_OUTPUT_NOTICE}}

    # -- conversation.item.create: frames, text and spoken questions ------------------

    async def _on_item(self, msg: dict[str, Any], arrived: float) -> None:
        """A user message: its text and audio are the next response's question;
        its images are frames on the timeline (filtered, or kept in the buffer).
        The question's limits are checked before any frame is taken in."""
        item = msg.get("item")
        if message_role(item) != "user":
            await self._history_item(item)
            return
        parts = user_parts(item)
        item_id = _item_id(item)
        texts = [p.value for p in parts if p.kind == "input_text" and p.value.strip()]
        max_s = self.settings.ws_max_audio_seconds
        spoken = [await _audio({"audio": p.value}, "input_audio", f"item.content[{p.index}].audio",
                               Pcm16Resampler(self.audio.rate), max_s) for p in parts if p.kind == "input_audio"]
        self.question.check(texts, spoken, max_s)
        frames = [await _frame(self.media, p, arrived) for p in parts if p.kind == "input_image"]
        self.question.add(texts, spoken, len(frames))
        # Every item is added, then done, as the GA event sequence has it:
        # SDK clients wait for each item's .done, frames-only ones included.
        added, done = rt.item_events(acked_item(item_id, parts), self.next_item(item_id), "added", "done")
        if frames:
            added["vidchat"] = {"frames": frames}
        await self.emit(added, done)

    async def _history_item(self, item: dict[str, Any]) -> None:
        """An assistant's or a system message: the chat as the client has it
        (replayed after a reconnect, or at a hand-off), kept as the
        conversation's history the next responses are asked with. An
        assistant message answers the text items before it: the two are one
        exchange. A system message is a system turn of the chat."""
        role = message_role(item)
        text, item_id = history_text(item, role), _item_id(item)
        if role == "assistant":
            self.entry.history.add(None, self.question.take_answered_text(), text)
        else:
            self.entry.history.add_note(text)
        await self.emit(*rt.item_events(history_item(item_id, role, text), self.next_item(item_id),
                                        "added", "done"))

    # -- input_audio_buffer ----------------------------------------------------------

    async def _on_append(self, msg: dict[str, Any], arrived: float) -> None:
        samples = await _audio(msg, "input_audio_buffer.append", "audio", self.audio.stream,
                               self.settings.ws_max_audio_seconds)
        self.entry.session.add_audio(samples)  # what the listener hears, and frames' audio
        self.audio.append(samples)

    async def _on_commit(self, msg: dict[str, Any], arrived: float) -> None:
        try:
            self.question.add([], [self.audio.take()])
        except ClipTooShort as exc:
            raise rt.EventError(str(exc), "input_audio_buffer_commit_empty") from None
        await self.committed(rt.new_id("item"))

    async def committed(self, item_id: str) -> None:
        """Audio from the buffer (committed, or heard by server VAD) is an item of the question."""
        previous = self.next_item(item_id)
        await self.emit({"type": "input_audio_buffer.committed", "item_id": item_id, "previous_item_id": previous},
                        *rt.item_events(acked_item(item_id, [Part("input_audio", None)]), previous,
                                        "added", "done"))

    async def _on_clear(self, msg: dict[str, Any], arrived: float) -> None:
        self.audio.clear()
        await self.emit({"type": "input_audio_buffer.cleared"})

    # -- responses (RealtimeResponses) ---------------------------------------------------

    async def _on_response_create(self, msg: dict[str, Any], arrived: float) -> None:
        await self.responses.create(msg.get("response"))

    async def _on_response_cancel(self, msg: dict[str, Any], arrived: float) -> None:
        await self.responses.cancel_asked()

    async def _not_served(self, msg: dict[str, Any], arrived: float) -> None:
        raise rt.not_served(msg["type"])

    handlers = {
        "session.update": _on_session_update,
        "conversation.item.create": _on_item,
        "input_audio_buffer.append": _on_append,
        "input_audio_buffer.commit": _on_commit,
        "input_audio_buffer.clear": _on_clear,
        "response.create": _on_response_create,
        "response.cancel": _on_response_cancel,
        **dict.fromkeys(rt.NOT_SERVED, _not_served),  # each named in an error, never silence
    }


def _item_id(item: dict[str, Any]) -> str:
    """The client's id for its item, or one of ours."""
    return item["id"] if isinstance(item.get("id"), str) and item["id"] else rt.new_id("item")


async def _frame(media: SocketMedia, part: Part, arrived: float) -> dict[str, Any]:
    """An input_image part as a frame on the timeline, and what became of it (the vidchat extra)."""
    t = media.place(part.pts_ms, arrived)
    try:
        seq = await media.take_image({"image_url": part.value}, "input_image", t, key="image_url")
    except Refused as refused:
        code = "invalid_image" if refused.reason == "invalid_data" else refused.reason
        raise rt.EventError(refused.message, code, f"item.content[{part.index}].image_url") from None
    # None: a near-duplicate of the frame before, not stored.
    return media.outcome(seq is not None, None if seq is not None else "filtered")


async def _audio(values: dict[str, Any], kind: str, param: str, stream: Pcm16Resampler,
                 max_seconds: float) -> np.ndarray:
    """``values["audio"]``, base64 PCM16 at the input rate, as 16 kHz float
    samples (``stream``: the input buffer's, or one of a clip's own)."""
    try:
        return await pcm16_audio(values, kind, "audio", max_seconds, stream)
    except Refused as refused:
        raise rt.EventError(refused.message, refused.reason, param) from None
