"""The OpenAI Realtime door at ``/v1/realtime``: apps written against the
official SDK (``AsyncOpenAI(base_url=…/v1).realtime.connect(model=…)``) get
live video with the local model.

An adapter over the parts the seed door (vidchat.doors.protocol) uses: the
socket session's access, lifecycle and event loop (vidchat.doors.socket_session),
frames through the session's filter into its buffer (``input_image`` items
are frames on the timeline, vidchat.doors.socket_media), audio onto its
timeline (``input_audio_buffer.append``, resampled to 16 kHz), questions
through the conversation (:meth:`vidchat.conversation.Conversation.ask`),
server VAD as the conversation's listener (vidchat.doors.socket_turns),
settings checked by the one settings table, responses one at a time
(vidchat.doors.realtime_responses). This module only translates events;
their shapes are :mod:`vidchat.doors.realtime_events`, the table of them is
docs/realtime.md.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from vidchat.conversation import answer_path
from vidchat.conversation.settings_table import current_values
from vidchat.conversation.registry import TooManySessions
from vidchat.conversation.stream_source import UnknownStream, attach_stream, detach_stream
from vidchat.doors import realtime_events as rt
from vidchat.doors import realtime_items as items
from vidchat.doors.protocol_config import ConfigError
from vidchat.doors.realtime_responses import RealtimeResponses
from vidchat.doors.socket_answers import check_record
from vidchat.doors.socket_config import NO_AUDIO_OUTPUT_NOTICE
from vidchat.doors.socket_media import Refused, SocketMedia, pcm16_audio
from vidchat.doors.socket_session import SocketSession
from vidchat.doors.socket_turns import SocketTurns
from vidchat.media.audio import AudioInput, ClipTooShort, Pcm16Resampler
from vidchat.media.vad import SpeechStarted, Utterance

if TYPE_CHECKING:
    from fastapi import WebSocket


log = logging.getLogger(__name__)


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

    def __init__(self, state: Any, websocket: "WebSocket") -> None:
        super().__init__(state, websocket)
        self.model = websocket.query_params.get("model") or state.model_path
        self.session_id = rt.new_id("sess")
        self.event_ids = (f"event_{n}" for n in itertools.count(1))  # numbered: the log of one connection
        self.media = SocketMedia(self)  # the frame intake; its client clock places pts_ms
        self.turns = RealtimeTurns(self, None)
        self.audio = AudioInput(self.settings.ws_max_audio_seconds, rt.INPUT_RATES[0])  # input_audio_buffer
        self.record = self.told_no_audio = False
        self.question = items.Question()  # the text and audio items since the last response
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
                            "stream": None if self.entry.stream is None else self.entry.stream.name}}

    def next_item(self, item_id: str) -> str | None:
        """``item_id`` joins the conversation: the previous_item_id it follows."""
        previous, self.last_item = self.last_item, item_id
        return previous

    # -- the session's life (the rest is vidchat.doors.socket_session's) ------------------

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
            answer_path.apply_settings(self.entry.session, state.engine, options, update.settings["session"],
                                       self.entry.event_hub)
        except ValueError as exc:  # OptionError or the settings' own check: nothing was changed
            raise rt.setting_refused(exc, "session", update.answer) from None
        self.options = options
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
        if items.message_role(item) != "user":
            await self._history_item(item)
            return
        parts = items.user_parts(item)
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
        added, done = rt.item_events(items.acked_item(item_id, parts), self.next_item(item_id), "added", "done")
        if frames:
            added["vidchat"] = {"frames": frames}
        await self.emit(added, done)

    async def _history_item(self, item: dict[str, Any]) -> None:
        """An assistant's or a system message: the chat as the client has it
        (replayed after a reconnect, or at a hand-off), kept as the
        conversation's history the next responses are asked with. An
        assistant message answers the text items before it: the two are one
        exchange. A system message is a system turn of the chat."""
        role = items.message_role(item)
        text, item_id = items.history_text(item, role), _item_id(item)
        if role == "assistant":
            self.entry.history.add(None, self.question.take_answered_text(), text)
        else:
            self.entry.history.add_note(text)
        await self.emit(*rt.item_events(items.history_item(item_id, role, text), self.next_item(item_id),
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
                        *rt.item_events(items.acked_item(item_id, [items.Part("input_audio", None)]), previous,
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


async def _frame(media: SocketMedia, part: items.Part, arrived: float) -> dict[str, Any]:
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
