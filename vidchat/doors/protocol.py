"""The seed WebSocket protocol at ``/v1/video/chat/stream``, and vllm-omni's newer fields.

A client written for vllm-omni's streaming video endpoint works here
unchanged, the seed's clients and the newer ones alike: every newer message
goes only to clients that use the newer fields. This module only translates
the wire format; frames, audio, filtering and sampling live in
:mod:`vidchat.conversation.session`, questions in :mod:`vidchat.conversation.chat`, turn detection in
:mod:`vidchat.conversation.talk`, what session.config may set in :mod:`vidchat.doors.protocol_config`. Origins: [seed], [omni] (vllm-omni's newer streaming
video handler), [rt] (vllm-omni's /v1/realtime server VAD, OpenAI Realtime's
names), [vc] (vidchat's own).

The messages, their fields and each one's origin are tabled once, in the
README's "The WebSocket protocol" (what session.config may set is
:mod:`vidchat.doors.protocol_config`, read from the one settings table).

Access (see vidchat.app.access): with --token set, the handshake needs
``Authorization: Bearer <token>`` or ``?token=<token>``, else HTTP 401/403; a
browser page from another origin gets 403 unless --allowed-origins lists it.
The connection counts against --max-sessions from the handshake on.

Guarantees: every ``response.start`` is followed by exactly one
``response.text.done`` (also on errors and cancellation, then preceded by an
``error``); a new question's ``response.start`` comes after the previous
answer's ``response.text.done``, whether it was typed, spoken or heard (one
question is set up at a time). One lock serialises all sends.

Differences from the seed, on purpose: a frame that is not an image, bad
base64 or an oversize frame is reported and the session goes on; the answer
runs as a task, so frames keep arriving while it streams (they count for the
next question); a disconnect, a new question or the session's end aborts the
running generation in vLLM; the idle timer does not run out while an answer
is streaming; audio reaches the model as float samples, aligned with the
sampled frames (not cleared after each question).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from vidchat import conversation
from vidchat.app.access import login_of
from vidchat.conversation import chat, talk
from vidchat.conversation.chat import AnswerOptions
from vidchat.doors import inputs as answer_inputs, wire
from vidchat.engine import EngineError, NO_SPOKEN_QUESTIONS, Turn
from vidchat.media import AUDIO_RATE
from vidchat.doors.protocol_config import (UPDATABLE_INFO, ConfigError, TurnDetection, WatchRequest, parse_config,
                                     wants_vidchat_events)
from vidchat.conversation.session import MAX_AUDIO_SECONDS, SessionSettings
from vidchat.conversation.sessions import Entry, TooManySessions
from vidchat.conversation.watch import SceneWatch
from vidchat.doors.socket_media import INLINE_PARSE_CHARS, Refused, SocketMedia, decode_b64
from vidchat.media.vad import SpeechStarted, Utterance
from vidchat.media.workers import run_media

if TYPE_CHECKING:
    from fastapi import WebSocket

    from vidchat.app.state import AppState

log = logging.getLogger(__name__)

# How long before --session-time-limit the client is told (session.expiring).
SESSION_END_WARNING_S = 30.0

# Close codes: normal end, a protocol violation, server busy, server error.
CLOSE_NORMAL, CLOSE_POLICY, CLOSE_TRY_LATER, CLOSE_ERROR = 1000, 1008, 1013, 1011

# The one-time notice for clients that asked for spoken answers (modalities
# with "audio"): this server answers in text only.
NO_AUDIO_OUTPUT_NOTICE = "spoken output is not available: answers come as text"
RECORD_OFF = "record: the server was started without --record-dir (nothing is written to disk without it)"
# What a socket session keeps of its chat (history: true); what is sent is
# trimmed further to the model's context.
MAX_HISTORY_TURNS = 400
WATCH_NEEDS_EVS = "watch needs evs_enabled: the frame filter is what sees scene changes"

# ---------------------------------------------------------------------------
# One connection
# ---------------------------------------------------------------------------

class _Disconnected(Exception):
    pass


class _Timeout:
    pass


_TIMEOUT = _Timeout()


class Connection:
    """Drives one WebSocket client: a reader loop plus at most one answer task."""

    def __init__(self, state: "AppState", websocket: "WebSocket") -> None:
        self.state = state
        self.ws = websocket
        self.settings = state.settings
        self.entry: Entry | None = None
        self.options: AnswerOptions = state.answer_defaults()
        self.peer = f"{websocket.client.host}:{websocket.client.port}" if websocket.client else "?"
        self.media = SocketMedia(self)
        self._answer_task: asyncio.Task | None = None
        self._send_lock = asyncio.Lock()
        self._closed = False  # the socket is closed or broken: nothing more is sent
        self._recv: asyncio.Future | None = None
        self._last_input = time.monotonic()
        self.client_host = websocket.client.host if websocket.client else None
        self._reservation = None
        self._expiry_task: asyncio.Task | None = None
        # The client knows vidchat (protocol_config.wants_vidchat_events): only
        # then is it sent response.queued and session.expiring.
        self._vidchat_events = False
        self._notice: str | None = None  # said once, in the next response.start
        # Server-side turn detection (turn_detection): its settings, the
        # session's listener and the task that asks each utterance.
        self._turns: TurnDetection | None = None
        self._listener: talk.Listener | None = None
        self._talk_task: asyncio.Task | None = None
        # One question is set up at a time (typed, spoken in the query, or
        # heard by the listener); closed when the session ends.
        self._ask_lock = asyncio.Lock()
        self._asking_closed = False
        # watch (session.config/update): the standing question and the task
        # asking it at scene changes; record: each answer saved as a bundle.
        self._watch: WatchRequest | None = None
        self._watch_task: asyncio.Task | None = None
        self._record = False
        # history (session.config/update): earlier questions and answers go
        # with each question, within the model's context (Engine.fit_history).
        self._keep_history = False
        self._history: list[Turn] = []
        self._answer_watched = False  # the running answer was asked by the watch
        # Opened while the model loaded: what runs once it is ready, and a
        # question waiting for it.
        self._loading_task: asyncio.Task | None = None
        self._waiting_query: asyncio.Task | None = None
        self._turns_after_load: TurnDetection | None = None

    # -- transport -----------------------------------------------------------

    async def send(self, msg: dict[str, Any]) -> bool:
        """Send one message; False if the client is gone.

        Shielded, so a message whose sending began is sent whole even if the
        caller is cancelled meanwhile."""
        return await asyncio.shield(self._send(msg))

    async def _send(self, msg: dict[str, Any]) -> bool:
        async with self._send_lock:
            if self._closed:
                return False
            text = json.dumps(msg, ensure_ascii=False)
            if not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:  # a lone surrogate from the client, echoed back
                    text = json.dumps(msg)  # escaped as \ud800: still valid JSON
            try:
                await self.ws.send_text(text)
                return True
            except Exception as exc:  # the client went away mid-send
                log.debug("ws %s: send failed: %r", self.peer, exc)
                self._closed = True
                return False

    async def error(self, message: str) -> bool:
        if len(message) > 500:  # e.g. an engine error quoting its whole input
            message = message[:497] + "..."
        sent = await self.send({"type": "error", "message": message})
        if sent:
            log.info("ws %s: error sent: %s", self.peer, message)
        return sent

    async def close(self, code: int = CLOSE_NORMAL, reason: str = "") -> None:
        async with self._send_lock:
            if self._closed:
                return
            self._closed = True
            try:
                await self.ws.close(code=code, reason=reason[:120])
            except Exception:
                pass

    async def receive(self, timeout: float) -> str | _Timeout:
        """The next text message, or _TIMEOUT. A pending receive is kept across timeouts."""
        if self._recv is None:
            self._recv = asyncio.ensure_future(self.ws.receive())
        done, _ = await asyncio.wait({self._recv}, timeout=max(timeout, 0.0))
        if not done:
            return _TIMEOUT
        recv, self._recv = self._recv, None
        message = recv.result()
        if message["type"] == "websocket.disconnect":
            self._closed = True
            raise _Disconnected(message.get("code"))
        if message.get("text") is not None:
            return message["text"]
        data = message.get("bytes") or b""
        try:
            return data.decode("utf-8")  # tolerate JSON sent as a binary message
        except UnicodeDecodeError:
            return "\x00"  # not JSON: reported as such by the caller

    # -- lifecycle -----------------------------------------------------------

    async def run(self) -> None:
        await self.ws.accept()
        reason = "ended"
        try:
            # The place counts from the handshake: clients that never send
            # session.config still count against --max-sessions.
            self._reservation = self.state.registry.reserve(self.client_host)
        except TooManySessions as exc:
            await self.error(str(exc))
            await self.close(CLOSE_TRY_LATER, "too many sessions")
            return
        try:
            if not await self._configure():
                reason = "refused at configuration"
                return
            reason = await self._loop()
        except _Disconnected:
            reason = "client disconnected"
        except asyncio.CancelledError:
            reason = "server shutting down"
            raise
        except Exception:
            log.exception("ws %s: session failed", self.peer)
            reason = "internal error"
            await self.error("Internal server error")
            await self.close(CLOSE_ERROR, "internal error")
        finally:
            await self._shutdown(reason)

    async def _shutdown(self, reason: str) -> None:
        if self._reservation is not None:
            self._reservation.release()
        if self._expiry_task is not None:
            self._expiry_task.cancel()
        if self._recv is not None:
            self._recv.cancel()
        for task in (self._loading_task, self._waiting_query):
            if task is not None:
                task.cancel()
        await self._stop_asking()
        entry, self.entry = self.entry, None
        if entry is not None:
            # Aborts the answer's vLLM request and runs the closers.
            await self.state.registry.close(entry.session.id, reason)
            await self._finish_answer_task()
        await self.close(CLOSE_NORMAL, reason)

    async def _finish_answer_task(self) -> None:
        """Wait for the answer task to send its response.text.done (its reply is already aborted)."""
        task, self._answer_task = self._answer_task, None
        if task is not None:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                log.debug("ws %s: answer task ended with an error", self.peer, exc_info=True)

    async def _configure(self) -> bool:
        """Wait for session.config and open the session; False if the session must end."""
        raw = await self.receive(self.settings.ws_config_timeout)
        if raw is _TIMEOUT:
            await self.error(f"Timeout waiting for session.config "
                             f"(send it within {self.settings.ws_config_timeout:g} s of connecting)")
            await self.close(CLOSE_POLICY, "no session.config")
            return False
        try:
            msg = await self._parse(raw)
        except ValueError as exc:
            await self.error(f"Invalid JSON in session.config: {exc}")
            await self.close(CLOSE_POLICY, "invalid session.config")
            return False
        if not isinstance(msg, dict) or msg.get("type") != "session.config":
            got = msg.get("type") if isinstance(msg, dict) else type(msg).__name__
            await self.error(f"Expected session.config, got: {got}")
            await self.close(CLOSE_POLICY, "expected session.config")
            return False
        try:
            changes = parse_config(msg)
            settings = self._session_settings(changes.session)
        except ValueError as exc:  # ConfigError, SessionSettings.validate, the memory budget
            await self.error(str(exc))
            await self.close(CLOSE_POLICY, "invalid session.config")
            return False
        # While the model loads the session is already a session: it takes
        # and acks frames, and a question waits for the model (_ask_when_ready).
        # Only a model that failed to load, or has stopped, turns it away.
        ready, reason = self.state.readiness()
        if not ready and (self.state.engine_error or self.state.engine is not None):
            await self.error(reason)
            await self.close(CLOSE_TRY_LATER, "engine not running")
            return False
        try:
            # Checked against the engine's limits once it runs (see _after_load).
            options = self._answer_options(changes.answer, settings)
        except ValueError as exc:  # OptionError
            await self.error(str(exc))
            await self.close(CLOSE_POLICY, "invalid session.config")
            return False
        try:
            self.entry = self.state.new_session("ws", settings=settings, reservation=self._reservation,
                                                owner=login_of(self.ws.headers))
        except TooManySessions as exc:
            await self.error(str(exc))
            await self.close(CLOSE_TRY_LATER, "too many sessions")
            return False
        self._reservation = None
        self.options = options
        self._vidchat_events = wants_vidchat_events(msg)
        self.entry.closers.append(self._closed_by_server)
        modalities = changes.info.get("modalities") or []
        if "audio" in modalities:
            self._notice = NO_AUDIO_OUTPUT_NOTICE
        try:
            self._set_record(changes.info.get("record", False))
            self._set_history(changes.info.get("history", False))
            await self._set_watch(changes.info.get("watch"))
        except ValueError as exc:  # the session goes on, as with turn_detection
            await self.error(str(exc))
        turns = changes.info.get("turn_detection")
        if self.state.engine is None:  # what the model hears is known once it runs
            self._turns_after_load = turns
            self._loading_task = asyncio.create_task(self._after_load())
        else:
            await self._start_turns(turns)
        if self.entry.deadline is not None and self._vidchat_events:
            self._expiry_task = asyncio.create_task(self._announce_end(self.entry))
        log.info("ws %s: session %s… started: model=%r max_frames=%d sample=%d(%s) evs=%s/%.2f frames_as=%s",
                 self.peer, self.entry.session.id[:6], changes.info.get("model", ""), settings.max_frames,
                 settings.num_sample_frames, settings.sampling, settings.evs_enabled, settings.evs_threshold,
                 options.frames_as)
        return True

    async def _start_turns(self, turns: TurnDetection | None) -> None:
        if turns is None:
            return
        if self._hears():
            await self._set_turns(turns)
        else:  # typed questions still work: the session goes on
            await self.error(f"turn_detection is off: {NO_SPOKEN_QUESTIONS}")

    async def _after_load(self) -> None:
        """A session opened while the model loaded: once it runs, the
        options are checked against its limits and turn detection starts."""
        try:
            engine = await self.state.wait_engine()
        except EngineError as exc:
            await self.error(str(exc))
            await self.close(CLOSE_TRY_LATER, "engine not running")
            return
        try:
            chat.check_options(self.options, engine, self.entry.session.settings)
        except ValueError as exc:  # the session goes on: its questions get the same error
            await self.error(f"session.config: {exc}")
        if not self._asking_closed:
            await self._start_turns(self._turns_after_load)

    async def _closed_by_server(self) -> None:
        """The registry ended this session (time limit, shutdown): say why, then close."""
        if self._closed:
            return  # the session ended from this side (video.done, the client left): nothing to say
        sid = self.entry.session.id if self.entry is not None else ""
        reason = self.state.registry.closed_reason(sid) or "closed by the server"
        await self.error(f"Session ended: {reason}")
        await self.close(1001, reason)

    async def _announce_end(self, entry: Entry) -> None:
        """Warn before --session-time-limit ends the session (the reaper ends it)."""
        left = entry.time_left() or 0.0
        warn_at = min(SESSION_END_WARNING_S, left / 2)
        await asyncio.sleep(max(0.0, left - warn_at))
        await self.send({"type": "session.expiring", "seconds_left": round(entry.time_left() or 0.0, 1)})

    def _session_settings(self, changes: dict[str, Any]) -> SessionSettings:
        cap = min(self.settings.ws_max_audio_seconds, MAX_AUDIO_SECONDS)
        settings = dataclasses.replace(SessionSettings(audio_seconds=cap), **changes)
        settings.validate()
        self.state.check_frame_budget(settings.max_frames)
        return settings

    def _answer_options(self, changes: dict[str, Any], sampling: SessionSettings) -> AnswerOptions:
        options = self.options.updated(**changes)
        chat.check_options(options, self.state.engine, sampling)
        return options

    # -- the message loop ------------------------------------------------------

    @property
    def _answering(self) -> bool:
        return self._answer_task is not None and not self._answer_task.done()

    async def _parse(self, raw: str) -> Any:
        """json.loads, in a worker thread for large messages (raises ValueError,
        also for JSON nested too deeply for the parser, and for a top-level
        string holding a lone UTF-16 surrogate such as "\\ud800": valid JSON
        syntax, but not text, and it breaks the tokenizer and our replies)."""

        def parse(big: bool) -> Any:
            try:
                msg = wire.parse(raw) if big else json.loads(raw)
            except RecursionError:
                raise ValueError("nested too deeply") from None
            if isinstance(msg, dict):
                for key, value in msg.items():
                    # isascii() is O(1) in CPython: only non-ASCII strings are encoded.
                    for text in (key, value):
                        if isinstance(text, str) and not text.isascii():
                            try:
                                text.encode("utf-8")
                            except UnicodeEncodeError:
                                raise ValueError(f"{key!r} is not valid Unicode (a lone surrogate)") from None
            return msg

        if len(raw) > INLINE_PARSE_CHARS:
            return await run_media(parse, True)
        return parse(False)

    async def _loop(self) -> str:
        idle_timeout = self.settings.ws_idle_timeout
        self._last_input = time.monotonic()
        while not self._closed:
            # The idle timer counts from the last message or the end of the last answer.
            wait = idle_timeout if self._answering else idle_timeout - (time.monotonic() - self._last_input)
            raw = await self.receive(wait)
            if raw is _TIMEOUT:
                if self._answering or time.monotonic() - self._last_input < idle_timeout:
                    continue
                await self.error(f"Idle timeout: no message received for {idle_timeout:g} s")
                await self.close(CLOSE_NORMAL, "idle timeout")
                return "idle timeout"
            arrived = self._last_input = time.monotonic()
            try:
                msg = await self._parse(raw)
            except ValueError as exc:
                await self.error(f"Invalid JSON: {exc}")
                continue
            if not isinstance(msg, dict):
                await self.error("Messages must be JSON objects")
                continue
            kind = msg.get("type")
            try:
                if kind == "video.done":
                    await self._on_done()
                    return "finished (video.done)"
                handler = self._handlers.get(kind) if isinstance(kind, str) else None
                if handler is None:
                    await self.error(f"Unknown message type: {kind}")
                    continue
                if kind in ("video.frame", "audio.chunk"):
                    await handler(self, msg, arrived)
                else:
                    await handler(self, msg)
            except (_Disconnected, asyncio.CancelledError):
                raise
            except Exception as exc:  # one bad message never ends the session
                log.exception("ws %s: handling %s failed", self.peer, kind)
                await self.error(f"Internal error while handling {kind}: {type(exc).__name__}")
        return "client gone"

    async def _on_query(self, msg: dict[str, Any]) -> None:
        if self.state.engine is None:  # the model is still loading
            await self._query_when_ready(msg)
            return
        text = msg.get("text", "")
        spoken = msg.get("audio_data")
        if spoken is None or spoken == "":  # the seed's typed question (vllm-omni also ignores an empty one)
            if not isinstance(text, str) or not text.strip():
                await self.error("video.query requires a non-empty 'text' field")
                return
            await self._ask(text)
            return
        # A spoken question: the audio is the question; text, if any, follows it in the prompt.
        if text is None:
            text = ""
        if not isinstance(text, str):
            await self.error(f"video.query 'text' must be a string, got {type(text).__name__}")
            return
        audio = await self._question_audio(msg)
        if audio is not None:
            await self._ask(text if text.strip() else "", question_audio=audio)

    async def _query_when_ready(self, msg: dict[str, Any]) -> None:
        """A question asked while the model loads waits for it, in a task of
        its own (frames keep arriving and are acked meanwhile); a newer
        question replaces it. A client that opted into vidchat's events is
        told it waits (response.waiting)."""
        previous, self._waiting_query = self._waiting_query, None
        if previous is not None:
            previous.cancel()
        if self._vidchat_events:
            await self.send({"type": "response.waiting", "reason": "model_loading",
                             "message": self.state.readiness()[1]})

        async def when_ready() -> None:
            try:
                await self.state.wait_engine()
            except EngineError as exc:
                await self.error(str(exc))
                return
            await self._on_query(msg)

        self._waiting_query = asyncio.create_task(when_ready(), name="query-waits-for-the-model")

    async def _question_audio(self, msg: dict[str, Any]) -> Any:
        """video.query's audio_data as float32 samples; None (error sent) when unusable."""
        import numpy as np

        max_s = min(self.settings.ws_max_audio_seconds, MAX_AUDIO_SECONDS)
        limit = int(max_s * AUDIO_RATE) * 2
        try:
            data = await decode_b64(msg, "video.query", limit, key="audio_data")
        except Refused as refused:
            message = refused.message
            if refused.size is not None:
                message = (f"video.query 'audio_data' is too long: about {refused.size / (2 * AUDIO_RATE):.1f} s "
                           f"of audio (at most {max_s:g} s of PCM16 mono 16 kHz)")
            await self.error(message)
            return None
        if len(data) % 2:
            await self.error(f"video.query 'audio_data' must be PCM16 (2 bytes a sample), got {len(data)} bytes")
            return None
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0

    async def _ask(self, text: str, watched: bool = False, **how: Any) -> None:
        """Ask a question about the session (typed, or spoken: ``how`` is
        the conversation's question_audio= or spoken=) and stream its answer
        as a task. One question is set up at a time; the conversation's
        preemption rule ends the running answer, with its
        response.text.done, before the new one's response.start."""
        async with self._ask_lock:
            entry = self.entry
            if self._asking_closed or entry is None:
                return
            try:
                # Samples the buffer now: frames arriving from here on count for the next question.
                run = await conversation.of(self.state, entry).ask(
                    text, self.options, history=tuple(self._history), record=self._record, **how)
            except chat.Superseded:
                return  # a newer question from elsewhere took over this session
            except EngineError as exc:  # NoFrames and NO_SPOKEN_QUESTIONS included
                await self.error(str(exc))
                return
            await self._finish_answer_task()  # its Done is delivered: the task only logs now
            consumed = self.media.consumed(run.answer.sample) if self.media.names_frames else None
            self._answer_watched = watched
            self._answer_task = asyncio.create_task(self._answer(run, consumed, watched),
                                                    name=f"answer-{entry.session.id[:6]}")

    async def _answer(self, run: conversation.AnswerRun, consumed: dict[str, Any] | None = None,
                      watched: bool = False) -> None:
        """The run's events as the seed protocol's messages. Done is handled
        inside the loop: the run counts as delivered (a newer question may
        start) only once its response.text.done is sent."""
        try:
            async with contextlib.aclosing(run.events()) as events:
                async for event in events:
                    if isinstance(event, conversation.Queued):
                        await self._tell_queued(event.ahead)
                    elif isinstance(event, conversation.Started):
                        start: dict[str, Any] = {"type": "response.start"}
                        if watched:  # asked by the standing question, not by the client
                            start["watch"] = True
                        if self._notice is not None:
                            start["notice"], self._notice = self._notice, None
                        await self.send(start)
                    elif isinstance(event, conversation.Delta):
                        if consumed is not None:  # as vllm-omni: at the model's first output
                            consumed, message = None, consumed
                            await self.send(message)
                        if not await self.send({"type": "response.text.delta", "delta": event.text}):
                            await run.cancel()  # the client is gone: stop generating
                    elif event.started:  # Done; one that never started (replaced while it waited) says nothing
                        if consumed is not None:  # no output at all (cancelled, failed): still said once
                            await self.send(consumed)
                        await self._answered(event)
        except asyncio.CancelledError:
            pass  # the session's end: the run has aborted its reply

    async def _answered(self, done: conversation.Done) -> None:
        if done.error:
            await self.error(done.error)
        stats = done.answer.summary()
        stats["answer_id"] = done.answer_id
        if self._record:
            if done.bundle is not None:
                stats["bundle"] = done.bundle.relative_to(self.settings.record_dir).as_posix()
                stats["bundle_url"] = f"{answer_inputs.PATH_PREFIX}{done.answer_id}/bundle.zip"
            else:
                await self.error(done.record_error or "Could not save the recording.")
                stats["bundle"] = None
        text = done.text
        if self._keep_history and text.strip() and done.status == conversation.COMPLETED:
            self._history[:] = [*self._history, Turn("user", chat.spoken_text(done.answer)),
                                Turn("assistant", text.strip())][-MAX_HISTORY_TURNS:]
        await self.send({"type": "response.text.done", "text": text, "stats": stats})
        self._last_input = time.monotonic()
        log.info("ws %s: answered: %d tokens, %d frames, %.1f s audio%s", self.peer,
                 stats.get("completion_tokens", 0), stats.get("frames", 0), stats.get("audio_seconds", 0.0),
                 " (cancelled)" if stats.get("cancelled") else "")

    async def _tell_queued(self, ahead: int) -> None:
        if not self._vidchat_events:
            return  # a seed or vllm-omni client just waits for its response.start
        await self.send({"type": "response.queued", "position": ahead + 1, "ahead": ahead})

    # -- turn detection ------------------------------------------------------

    def _hears(self) -> bool:
        return bool(getattr(self.state.engine, "accepts_audio", False))

    async def _set_turns(self, turns: TurnDetection | None) -> None:
        """Start, change or stop server-side turn detection."""
        self._turns = turns
        entry = self.entry
        if turns is None:
            await self._stop_talk()
            if entry is not None:
                await talk.stop(entry)
            return
        listener = talk.listener(entry, turns.settings, turns.interrupt_response,
                                 on_speech=talk.speech_warms(self.state, entry))
        if listener is not self._listener or self._talk_task is None or self._talk_task.done():
            await self._stop_talk()
            self._listener = listener
            self._talk_task = asyncio.create_task(self._talk(listener), name=f"talk-ws-{entry.session.id[:6]}")

    async def _stop_talk(self) -> None:
        task, self._talk_task = self._talk_task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})

    def _timeline_ms(self, t: float) -> int | None:
        start = self.entry.session.timeline_start if self.entry is not None else None
        return None if start is None else round((t - start) * 1000)

    async def _talk(self, listener: talk.Listener) -> None:
        """Tell the client where its speech starts and stops, and ask each
        finished utterance, the way video.query asks a question."""
        try:
            async for event in conversation.of(self.state, self.entry).heard(listener, starts=True):
                if isinstance(event, SpeechStarted):
                    await self.send({"type": "input_audio_buffer.speech_started",
                                     "audio_start_ms": self._timeline_ms(event.start)})
                    continue
                if not isinstance(event, Utterance):
                    continue
                await self.send({"type": "input_audio_buffer.speech_stopped",
                                 "audio_start_ms": self._timeline_ms(event.start),
                                 "audio_end_ms": self._timeline_ms(event.end), "cut": event.cut})
                turns = self._turns
                if turns is not None and turns.create_response:
                    # Shielded: the session's end waits for a question being
                    # set up (_stop_asking) instead of cutting it in half.
                    await asyncio.shield(self._ask_logged("", spoken=event))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("ws %s: turn detection failed", self.peer)

    async def _ask_logged(self, text: str, **how: Any) -> None:
        try:
            await self._ask(text, **how)
        except Exception:
            log.exception("ws %s: asking a spoken question failed", self.peer)

    async def _stop_asking(self) -> None:
        """No more questions: turn detection stops, and a question being set up finishes first."""
        await self._stop_talk()
        self._watch = None
        if self._watch_task is not None:
            self._watch_task.cancel()
        async with self._ask_lock:
            self._asking_closed = True
        if self.entry is not None:
            await talk.stop(self.entry)

    async def _on_done(self) -> None:
        waiting = self._waiting_query
        if waiting is not None:  # a question asked while the model loaded is still answered
            await asyncio.wait({waiting})
        await self._stop_asking()
        # Like the seed, an answer still streaming is finished before the stats.
        task = self._answer_task
        if task is not None:
            try:
                await asyncio.shield(task)
            except Exception:  # already logged by the task
                pass
        evs_stats = self.entry.session.stats.get("evs")
        if evs_stats is not None:
            keys = ("retained_count", "dropped_count", "total_count", "drop_rate")
            await self.send({"type": "response.evs_stats", **{k: evs_stats[k] for k in keys}})
        await self.send({"type": "session.done"})
        await self.close(CLOSE_NORMAL, "session done")

    async def _on_ping(self, msg: dict[str, Any]) -> None:
        await self.send({"type": "pong"})

    async def _on_update(self, msg: dict[str, Any]) -> None:
        try:
            changes = parse_config(msg)
            fixed = sorted(set(changes.info) - set(UPDATABLE_INFO))
            if fixed:
                raise ConfigError(f"{', '.join(fixed)} can only be set in session.config")
            turns_given = "turn_detection" in changes.info
            turns = changes.info.get("turn_detection")
            loading = self.state.engine is None
            if turns is not None and not loading and not self._hears():
                raise ConfigError(f"turn_detection: {NO_SPOKEN_QUESTIONS}")
            if changes.info.get("record") and not self.settings.record_dir:
                raise ConfigError(RECORD_OFF)
            watch = changes.info["watch"] if "watch" in changes.info else self._watch
            if watch is not None and not changes.session.get("evs_enabled", self.entry.session.settings.evs_enabled):
                raise ConfigError(WATCH_NEEDS_EVS)
            options = self.options.updated(**changes.answer)
            chat.apply_settings(self.entry.session, self.state.engine, options, changes.session)
        except ValueError as exc:  # ConfigError, OptionError or the settings' own check: nothing was changed
            await self.error(f"session.update rejected: {exc}")
            return
        self.options = options
        if "record" in changes.info:
            self._set_record(changes.info["record"])
        if "history" in changes.info:
            self._set_history(changes.info["history"])
        if "watch" in changes.info and not self._asking_closed:
            await self._set_watch(changes.info["watch"])
        # session.update is vidchat's own message: its sender knows vidchat.
        known = self._vidchat_events
        self._vidchat_events = wants_vidchat_events(msg, already=True)
        if self._vidchat_events and not known and self.entry.deadline is not None and self._expiry_task is None:
            self._expiry_task = asyncio.create_task(self._announce_end(self.entry))
        if turns_given and loading:
            self._turns_after_load = turns  # started once the model runs (_after_load)
        elif turns_given and not self._asking_closed:
            await self._set_turns(turns)
        await self.send({"type": "session.updated", "settings": self.describe()})

    async def _on_second_config(self, msg: dict[str, Any]) -> None:
        await self.error("session.config was already received; send session.update to change settings")

    def describe(self) -> dict[str, Any]:
        settings = dataclasses.asdict(self.entry.session.settings)
        options = self.options
        settings.update(frames_as=options.frames_as, max_tokens=options.max_tokens,
                        temperature=options.temperature, include_audio=options.include_audio,
                        system_prompt=options.system_prompt, seed=options.seed,
                        turn_detection=self._turns.describe() if self._turns is not None else None,
                        watch=self._watch.describe() if self._watch is not None else None,
                        record=self._record, history=self._keep_history)
        return settings

    # -- watch and record ------------------------------------------------------

    def _set_history(self, on: bool) -> None:
        self._keep_history = bool(on)
        if not on:
            self._history.clear()  # off forgets: turned on again, the chat starts afresh

    def _set_record(self, on: bool) -> None:
        if on and not self.settings.record_dir:
            raise ConfigError(RECORD_OFF)
        self._record = bool(on)

    async def _set_watch(self, watch: WatchRequest | None) -> None:
        """Start, change or stop asking the standing question at scene
        changes. A watched answer still streaming ends first (cancelled, its
        response.text.done sent), as unticking Watch on the page ends it."""
        if watch is not None and not self.entry.session.settings.evs_enabled:
            raise ConfigError(WATCH_NEEDS_EVS)
        self._watch = watch
        task, self._watch_task = self._watch_task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
            async with self._ask_lock:  # a watched question being set up is set up by now
                if self._answer_watched and self._answering:
                    await self.entry.cancel_answer()
                    await self._finish_answer_task()
        if watch is not None:
            watcher = SceneWatch(self.entry.session, watch.every_s)
            self._watch_task = asyncio.create_task(self._watching(watcher, watch),
                                                   name=f"watch-ws-{self.entry.session.id[:6]}")

    async def _watching(self, watcher: SceneWatch, watch: WatchRequest) -> None:
        """Ask the standing question at each (rate-limited) scene change. An
        answer already streaming (typed, spoken or watched) is never cut
        short by a scene change: the change is asked about once it ends."""
        try:
            talking = conversation.of(self.state, self.entry)
            async for _ in talking.scene_changes(watcher, lambda: self._watch is not watch or self._asking_closed):
                await asyncio.shield(self._ask_logged(watch.question, watched=True))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("ws %s: watching failed", self.peer)

    _handlers = {
        "video.frame": lambda self, msg, arrived: self.media.on_frame(msg, arrived),
        "audio.chunk": lambda self, msg, arrived: self.media.on_audio(msg, arrived),
        "video.query": _on_query,
        "ping": _on_ping,
        "session.update": _on_update,
        "session.config": _on_second_config,
    }


async def serve(state: "AppState", websocket: "WebSocket") -> None:
    """Serve one client of the seed protocol until it ends, fails or times out."""
    try:
        await Connection(state, websocket).run()
    except asyncio.CancelledError:
        raise
    except Exception:  # never let one client take the server down
        log.exception("ws session crashed")
