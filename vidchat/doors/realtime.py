"""The OpenAI Realtime door at ``/v1/realtime``: apps written against the
official SDK (``AsyncOpenAI(base_url=…/v1).realtime.connect(model=…)``) get
live video with the local model.

An adapter, like the seed door (vidchat.doors.protocol), over the same
parts: frames go through the session's filter into its buffer
(``input_image`` items are frames on the timeline), audio onto its timeline
(``input_audio_buffer.append``, resampled to 16 kHz), questions through the
conversation (:meth:`vidchat.conversation.Conversation.ask`), server VAD is
the conversation's listener (vidchat.doors.socket_turns), settings are
checked by the one settings table. This module only translates events; their
shapes are :mod:`vidchat.doors.realtime_events`, the table of them is the
README's "Realtime API".

Access is the other doors': the guard's token (``Authorization: Bearer``,
the SDK's api_key), Origin/Host checks, a place in --max-sessions from the
handshake on. Every ``response.created`` is followed by exactly one
``response.done``; a new response starts only after the previous one's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from vidchat import conversation
from vidchat.app.access import login_of
from vidchat.conversation import chat
from vidchat.conversation.sessions import Entry, TooManySessions
from vidchat.doors import realtime_events as rt
from vidchat.doors.socket_answers import RECORD_OFF
from vidchat.doors.socket_config import NO_AUDIO_OUTPUT_NOTICE
from vidchat.doors.socket_media import Refused, SocketMedia, decode_b64
from vidchat.doors.socket_transport import (CLOSE_ERROR, CLOSE_NORMAL, CLOSE_TRY_LATER, TIMEOUT, Disconnected,
                                            SocketTransport, parse_message)
from vidchat.doors.socket_turns import SocketTurns
from vidchat.engine import NO_SPOKEN_QUESTIONS, EngineError
from vidchat.media import AUDIO_RATE, MIN_AUDIO_SAMPLES
from vidchat.media.audio import Pcm16Resampler
from vidchat.media.evs import FrameError
from vidchat.media.vad import SpeechStarted, Utterance
from vidchat.media.workers import run_media

if TYPE_CHECKING:
    from fastapi import WebSocket

    from vidchat.app.state import AppState

log = logging.getLogger(__name__)


class RealtimeTurns(SocketTurns):
    """Server VAD as the seed door runs it; said as OpenAI Realtime says it."""

    async def speech_started(self, event: SpeechStarted) -> None:
        conn = self.conn
        conn.speech_item = rt.Ids.new("item")
        await conn.emit({"type": "input_audio_buffer.speech_started", "item_id": conn.speech_item,
                         "audio_start_ms": self.timeline_ms(event.start)})

    async def utterance(self, event: Utterance) -> None:
        await self.conn.heard(event, self.timeline_ms(event.end), self.turns)


class RealtimeConnection(SocketTransport):
    """One SDK client: a reader loop and at most one response task."""

    def __init__(self, state: "AppState", websocket: "WebSocket") -> None:
        super().__init__(websocket)
        self.state, self.settings = state, state.settings
        self.model = websocket.query_params.get("model") or state.model_path
        self.entry: Entry | None = None
        self.reservation = None
        self.options = state.answer_defaults()
        self.ids = rt.Ids()
        self.session_id = rt.Ids.new("sess")
        self.media = SocketMedia(self)  # its client clock places pts_ms
        self.turns = RealtimeTurns(self, None)
        self.input_rate = rt.INPUT_RATES[0]
        self.resampler = Pcm16Resampler(self.input_rate)
        self.record = False
        self.told_no_audio = False
        self.buffer: list[np.ndarray] = []  # input_audio_buffer since its last commit or clear
        self.pending_text: list[str] = []  # the next response's question
        self.pending_audio: list[np.ndarray] = []
        self.last_item: str | None = None
        self.speech_item: str | None = None
        self.task: asyncio.Task | None = None
        self.run: conversation.AnswerRun | None = None
        self.cancel_reason: str | None = None
        self.last_input = time.monotonic()

    # -- sending ------------------------------------------------------------------

    async def emit(self, event: dict[str, Any]) -> bool:
        return await self.send({"event_id": self.ids.event(), **event})

    async def error(self, message: str, code: str = "invalid_value", param: str | None = None,
                    kind: str = "invalid_request_error", event_id: Any = None) -> bool:
        """An ``error`` event (``event_id``: the client event refused); the session goes on."""
        exc = rt.EventError(message[:500], code, param, kind)
        log.info("realtime %s: error sent: %s (%s)", self.peer, exc.message, code)
        return await self.send(rt.error_event(self.ids.event(), exc, event_id))

    def describe(self) -> dict[str, Any]:
        """The effective session, as session.created/updated carry it."""
        return rt.session_object(self.session_id, self.model, self.entry.session.settings, self.options,
                                 self.input_rate, self.turns.describe(), self.record)

    # -- lifecycle ----------------------------------------------------------------

    async def run_session(self) -> None:
        await self.ws.accept()
        reason = "ended"
        try:
            if not await self._open():
                return
            reason = await self._loop()
        except Disconnected:
            reason = "client disconnected"
        except asyncio.CancelledError:
            reason = "server shutting down"
            raise
        except Exception:
            log.exception("realtime %s: session failed", self.peer)
            reason = "internal error"
            await self.error("Internal server error", "internal_error", kind="server_error")
            await self.close(CLOSE_ERROR, "internal error")
        finally:
            await self._shutdown(reason)

    async def _open(self) -> bool:
        state = self.state
        ready, why = state.readiness()
        try:
            if not ready and (state.engine_error or state.engine is not None):
                raise TooManySessions(why)  # refused the same way: try later
            # Counts from the handshake, as the seed door's places do.
            self.reservation = state.registry.reserve(self.client_host)
            self.entry = state.new_session("realtime", reservation=self.reservation, owner=login_of(self.ws.headers))
        except (TooManySessions, ValueError) as exc:
            await self.error(str(exc), "session_refused", kind="server_error")
            await self.close(CLOSE_TRY_LATER, "session refused")
            return False
        self.reservation = None
        self.entry.closers.append(self.closed_by_server)
        await self.emit({"type": "session.created", "session": self.describe()})
        log.info("realtime %s: session %s… started (model %r)", self.peer, self.entry.session.id[:6], self.model)
        return True

    async def _shutdown(self, reason: str) -> None:
        if self.reservation is not None:
            self.reservation.release()
        self.stop_receiving()
        await self.turns.stop()
        entry = self.entry
        if entry is not None:
            await self.state.registry.close(entry.session.id, reason)  # aborts the running answer in vLLM
        await self._end_response()
        self.entry = None
        await self.close(CLOSE_NORMAL, reason)

    async def closed_by_server(self) -> None:
        """The registry ended this session (time limit, shutdown): say why, then close."""
        if self.closed:
            return
        reason = self.state.registry.closed_reason(self.entry.session.id) or "closed by the server"
        await self.error(f"Session ended: {reason}", "session_ended", kind="server_error")
        await self.close(1001, reason)

    async def _loop(self) -> str:
        idle = self.settings.ws_idle_timeout
        while not self.closed:
            answering = self.task is not None and not self.task.done()
            raw = await self.receive(idle if answering else idle - (time.monotonic() - self.last_input))
            if raw is TIMEOUT:
                if answering or time.monotonic() - self.last_input < idle:
                    continue
                await self.error(f"Idle timeout: no event received for {idle:g} s", "idle_timeout")
                await self.close(CLOSE_NORMAL, "idle timeout")
                return "idle timeout"
            arrived = self.last_input = time.monotonic()
            try:
                msg = await parse_message(raw)
            except ValueError as exc:
                await self.error(f"Invalid JSON: {exc}", "invalid_json")
                continue
            kind = msg.get("type") if isinstance(msg, dict) else None
            event_id = msg.get("event_id") if isinstance(msg, dict) else None
            handler = self._handlers.get(kind) if isinstance(kind, str) else None
            try:
                if handler is None:
                    raise rt.EventError(f"Unknown or unsupported event type: {kind!r}", "unknown_event", "type")
                await handler(self, msg, arrived)
            except rt.EventError as exc:
                await self.error(exc.message, exc.code, exc.param, exc.kind, event_id)
            except (Disconnected, asyncio.CancelledError):
                raise
            except Exception as exc:  # one bad event never ends the session
                log.exception("realtime %s: handling %s failed", self.peer, kind)
                await self.error(f"Internal error while handling {kind}: {type(exc).__name__}", "internal_error",
                                 kind="server_error", event_id=event_id)
        return "client gone"

    # -- session.update -----------------------------------------------------------

    async def _on_session_update(self, msg: dict[str, Any], arrived: float) -> None:
        """Every change is checked before any is made; then session.updated with the effective session."""
        update = rt.parse_session(msg.get("session"))
        state, options = self.state, self.options.updated(**update.settings["answer"])
        if update.instructions is not rt.UNSET:
            options = options.updated(system_prompt=update.instructions)
        if update.max_output_tokens is not rt.UNSET:
            options = options.updated(max_tokens=update.max_output_tokens or state.answer_defaults().max_tokens)
        if update.turn_detection not in (rt.UNSET, None):
            if state.engine is None:
                raise rt.EventError("turn_detection: the model is still loading; set it once it runs", "not_ready")
            if not self.turns.hears():
                raise rt.EventError(f"turn_detection: {NO_SPOKEN_QUESTIONS}", "audio_not_supported")
        if update.record is True and not self.settings.record_dir:
            raise rt.EventError(RECORD_OFF, param="session.vidchat.record")
        try:
            chat.apply_settings(self.entry.session, state.engine, options, update.settings["session"])
        except ValueError as exc:  # OptionError or the settings' own check: nothing was changed
            raise rt.EventError(str(exc), param="session") from None
        self.options = options
        if update.input_rate is not rt.UNSET and update.input_rate != self.input_rate:
            self.input_rate, self.resampler = update.input_rate, Pcm16Resampler(update.input_rate)
        if update.record is not rt.UNSET:
            self.record = update.record
        event: dict[str, Any] = {"type": "session.updated"}
        if update.output_modalities is not rt.UNSET and "audio" in update.output_modalities and not self.told_no_audio:
            self.told_no_audio = True  # said once (vidchat extra), as the seed door says it
            event["vidchat"] = {"notice": NO_AUDIO_OUTPUT_NOTICE}
        if update.turn_detection is not rt.UNSET:
            await self.turns.set(update.turn_detection)
        await self.emit({**event, "session": self.describe()})

    # -- conversation.item.create: frames, text and spoken questions ------------------

    async def _on_item(self, msg: dict[str, Any], arrived: float) -> None:
        """A user message: its text and audio are the next response's question;
        its images are frames on the timeline (filtered, or kept in the buffer)."""
        item = msg.get("item")
        parts = rt.user_parts(item)
        item_id = item["id"] if isinstance(item.get("id"), str) and item["id"] else rt.Ids.new("item")
        texts = [p.value for p in parts if p.kind == "input_text" and p.value.strip()]
        if sum(map(len, self.pending_text + texts)) > rt.MAX_QUESTION_CHARS:
            raise rt.EventError(f"the next response's question would pass {rt.MAX_QUESTION_CHARS} characters",
                                "question_too_long", "item.content")
        spoken = [await self._audio(p.value, f"item.content[{p.index}].audio", fresh=True)
                  for p in parts if p.kind == "input_audio"]
        if sum(a.size for a in self.pending_audio + spoken) > self.settings.ws_max_audio_seconds * AUDIO_RATE:
            raise rt.EventError(f"the next response's spoken question would pass {self.settings.ws_max_audio_seconds:g}"
                                " s of audio", "question_too_long", "item.content")
        frames = [await self._frame(p, arrived) for p in parts if p.kind == "input_image"]
        self.pending_text += texts
        self.pending_audio += spoken
        previous, self.last_item = self.last_item, item_id
        added: dict[str, Any] = {"type": "conversation.item.added", "previous_item_id": previous,
                                 "item": rt.acked_item(item_id, parts)}
        if frames:
            added["vidchat"] = {"frames": frames}
        await self.emit(added)
        if len(frames) < len(parts):  # frames only: acknowledged by .added alone (5 fps stays light)
            await self.emit({"type": "conversation.item.done", "previous_item_id": previous,
                             "item": rt.acked_item(item_id, parts)})

    async def _frame(self, part: rt.Part, arrived: float) -> dict[str, Any]:
        param = f"item.content[{part.index}].image_url"
        try:
            data = await decode_b64({"image_url": part.value}, "input_image", self.settings.ws_max_frame_bytes,
                                    key="image_url")
        except Refused as refused:
            raise rt.EventError(refused.message, "invalid_image" if refused.reason == "invalid_data" else
                                refused.reason, param) from None
        t = None if part.pts_ms is None else self.media.clock.place(float(part.pts_ms), arrived, "video")
        session = self.entry.session
        try:
            seq = await run_media(session.offer_jpeg, data, t)  # decoding and filtering: never on the loop
        except FrameError as exc:
            raise rt.EventError(f"Invalid image: {exc}", "invalid_image", param) from None
        frame: dict[str, Any] = {"accepted": seq is not None, "buffered_frames": session.frame_count}
        if seq is None:
            frame["reason"] = "filtered"  # a near-duplicate of the frame before: not stored
        return frame

    async def _audio(self, b64: Any, param: str, fresh: bool = False) -> np.ndarray:
        """PCM16 at the session's input rate as 16 kHz float samples (``fresh``: a clip of its own)."""
        limit = int(self.settings.ws_max_audio_seconds * self.input_rate) * 2
        try:
            data = await decode_b64({"audio": b64}, param, limit, key="audio", what="Audio")
            return (Pcm16Resampler(self.input_rate) if fresh else self.resampler).feed(data)
        except Refused as refused:
            raise rt.EventError(refused.message, refused.reason, param) from None
        except ValueError as exc:
            raise rt.EventError(str(exc), "invalid_audio", param) from None

    # -- input_audio_buffer ----------------------------------------------------------

    async def _on_append(self, msg: dict[str, Any], arrived: float) -> None:
        samples = await self._audio(msg.get("audio"), "audio")
        self.entry.session.add_audio(samples)  # what the listener hears, and frames' audio
        self.buffer.append(samples)
        cap = int(self.settings.ws_max_audio_seconds * AUDIO_RATE)
        while sum(b.size for b in self.buffer) - self.buffer[0].size > cap:
            self.buffer.pop(0)

    async def _on_commit(self, msg: dict[str, Any], arrived: float) -> None:
        audio = np.concatenate(self.buffer) if self.buffer else np.zeros(0, np.float32)
        self.buffer.clear()
        if audio.size < MIN_AUDIO_SAMPLES:
            raise rt.EventError(f"buffer too small: {audio.size / AUDIO_RATE * 1000:.0f} ms of audio, at least "
                                f"{MIN_AUDIO_SAMPLES * 1000 // AUDIO_RATE} ms", "input_audio_buffer_commit_empty")
        self.pending_audio.append(audio)
        await self._committed(rt.Ids.new("item"))

    async def _committed(self, item_id: str) -> None:
        previous, self.last_item = self.last_item, item_id
        await self.emit({"type": "input_audio_buffer.committed", "item_id": item_id, "previous_item_id": previous})
        item = rt.acked_item(item_id, [rt.Part("input_audio", None)])
        for kind in ("conversation.item.added", "conversation.item.done"):
            await self.emit({"type": kind, "previous_item_id": previous, "item": item})

    async def _on_clear(self, msg: dict[str, Any], arrived: float) -> None:
        self.buffer.clear()
        await self.emit({"type": "input_audio_buffer.cleared"})

    async def heard(self, event: Utterance, end_ms: int | None, turns: Any) -> None:
        """Server VAD heard an utterance: committed as an item, then (create_response) answered."""
        item_id, self.speech_item = self.speech_item or rt.Ids.new("item"), None
        await self.emit({"type": "input_audio_buffer.speech_stopped", "item_id": item_id, "audio_end_ms": end_ms})
        self.buffer.clear()
        await self._committed(item_id)
        if turns is not None and turns.create_response:
            if not turns.interrupt_response and self.task is not None:
                await asyncio.wait({self.task})  # the answer streaming goes on to its end first
            text, self.pending_text = "\n".join(self.pending_text), []
            # Shielded: the session's end waits for the response being set up.
            await asyncio.shield(self._respond(text, self.options, spoken=event))

    # -- responses --------------------------------------------------------------------

    async def _on_response_create(self, msg: dict[str, Any], arrived: float) -> None:
        if self.task is not None and not self.task.done():
            raise rt.EventError("a response is in progress: cancel it first, or wait for its response.done",
                                "conversation_already_has_active_response")
        options = rt.response_options(msg.get("response"), self.options, self.state.answer_defaults().max_tokens)
        try:
            chat.check_options(options, self.state.engine)
        except ValueError as exc:
            raise rt.EventError(str(exc), param="response") from None
        if not self.pending_text and not self.pending_audio:  # frames alone are no question for the model
            raise rt.EventError("no question: add an input_text or input_audio item (or commit the audio buffer) "
                                "before response.create", "empty_conversation")
        text, self.pending_text = "\n".join(self.pending_text), []
        audio, self.pending_audio = self.pending_audio, []
        await self._respond(text, options, question_audio=np.concatenate(audio) if audio else None)

    async def _on_response_cancel(self, msg: dict[str, Any], arrived: float) -> None:
        if self.task is None or self.task.done():
            raise rt.EventError("no response is in progress", "response_cancel_not_active")
        self.cancel_reason = "client_cancelled"
        if self.run is not None:
            await self.run.cancel()  # its response.done says cancelled

    async def _respond(self, question: str, options: chat.AnswerOptions, **how: Any) -> None:
        """Start a response as a task, once the previous one has sent its response.done."""
        await self._end_response()
        if self.entry is None or self.closed:
            return
        self.cancel_reason, self.run = None, None
        say = rt.ResponseEvents(rt.Ids.new("resp"), options.max_tokens)
        self.task = asyncio.create_task(self._answer(say, question, options, how), name=f"realtime-{say.id}")

    async def _end_response(self) -> None:
        task, run = self.task, self.run
        if task is None:
            return
        if not task.done() and run is not None:
            await run.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    async def _answer(self, say: rt.ResponseEvents, question: str, options: chat.AnswerOptions,
                      how: dict[str, Any]) -> None:
        await self.emit(say.created())
        try:
            await self.state.wait_engine()
            run = await conversation.of(self.state, self.entry).ask(question, options, record=self.record,
                                                                   frames_optional=True, **how)
        except chat.Superseded:
            await self._emit_all(say.done("cancelled", text=None))
            return
        except EngineError as exc:
            await self.error(str(exc), "answer_failed", kind="server_error")
            await self._emit_all(say.done("failed", text=None, error=str(exc)))
            return
        self.run = run
        if self.cancel_reason is not None:  # cancelled while it was set up
            await run.cancel()
        try:
            await self._stream(say, run)
        finally:
            self.last_input = time.monotonic()  # the idle timer counts from the end of the answer

    async def _emit_all(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            await self.emit(event)

    async def _stream(self, say: rt.ResponseEvents, run: conversation.AnswerRun) -> None:
        """The run's events as the Realtime API's response events."""
        listener = getattr(self.entry, "talk", None)
        heard_before = listener.speech_starts if listener is not None else 0
        async with contextlib.aclosing(run.events()) as events:
            async for event in events:
                if isinstance(event, conversation.Started):
                    previous, self.last_item = self.last_item, say.item_id
                    await self._emit_all(say.started(previous))
                elif isinstance(event, conversation.Delta):
                    if not await self.emit(say.delta(event.text)):
                        await run.cancel()  # the client is gone: stop generating
                elif isinstance(event, conversation.Done):
                    barged = listener is not None and listener.speech_starts > heard_before
                    await self._done(say, event, "turn_detected" if barged else None)

    async def _done(self, say: rt.ResponseEvents, done: conversation.Done, barged: str | None) -> None:
        summary = done.answer.summary()
        status, reason = done.status, None
        if status == conversation.CANCELLED:
            reason = self.cancel_reason or barged
        elif status == conversation.COMPLETED and summary.get("finish_reason") == "length":
            status, reason = "incomplete", "max_output_tokens"
        if done.error:
            await self.error(done.error, "answer_failed", kind="server_error")
        record = rt.answer_record(summary, done.answer_id)
        if done.bundle is not None:
            record["bundle_url"] = f"/inputs/{done.answer_id}/bundle.zip"
        elif self.record and done.started:
            record["record_error"] = done.record_error
        await self._emit_all(say.done(status, text=done.text if done.started else None, reason=reason,
                                      error=done.error, stats=summary if done.started else None, record=record))
        log.info("realtime %s: response %s: %s, %d tokens, %d frames", self.peer, say.id, status,
                 summary.get("completion_tokens", 0), summary.get("frames", 0))

    _handlers = {
        "session.update": _on_session_update,
        "conversation.item.create": _on_item,
        "input_audio_buffer.append": _on_append,
        "input_audio_buffer.commit": _on_commit,
        "input_audio_buffer.clear": _on_clear,
        "response.create": _on_response_create,
        "response.cancel": _on_response_cancel,
    }


async def serve(state: "AppState", websocket: "WebSocket") -> None:
    """Serve one Realtime API client until it leaves, fails or times out."""
    try:
        await RealtimeConnection(state, websocket).run_session()
    except asyncio.CancelledError:
        raise
    except Exception:  # never let one client take the server down
        log.exception("realtime session crashed")
