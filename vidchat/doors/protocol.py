"""The seed WebSocket protocol at ``/v1/video/chat/stream``, and vllm-omni's newer fields.

A client written for vllm-omni's streaming video endpoint works here
unchanged, the seed's clients and the newer ones alike: every newer message
goes only to clients that use the newer fields. This module only translates
the wire format; frames, audio, filtering and sampling live in
:mod:`vidchat.conversation.session`, questions in :mod:`vidchat.conversation.chat`, turn detection in
:mod:`vidchat.conversation.talk`, what session.config may set in :mod:`vidchat.doors.protocol_config`.
The connection is the session's lifetime and its message loop; the rest of
the door is one module per idea: :mod:`~vidchat.doors.socket_transport`
(messages in and out), :mod:`~vidchat.doors.socket_media` (frames, audio,
acks), :mod:`~vidchat.doors.socket_answers` (questions and their answers),
:mod:`~vidchat.doors.socket_turns` (turn detection), :mod:`~vidchat.doors.socket_watch`
(the standing question), :mod:`~vidchat.doors.socket_config` (session.config
and session.update). Origins: [seed], [omni] (vllm-omni's newer streaming
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
import logging
import time
from typing import TYPE_CHECKING, Any

from vidchat.conversation import talk
from vidchat.conversation.chat import AnswerOptions
from vidchat.conversation.sessions import Entry, TooManySessions
from vidchat.doors.socket_answers import SocketAnswers
from vidchat.doors.socket_config import SessionConfig
from vidchat.doors.socket_media import SocketMedia
from vidchat.doors.socket_transport import (CLOSE_ERROR, CLOSE_NORMAL, CLOSE_TRY_LATER, TIMEOUT, Disconnected,
                                            SocketTransport, parse_message)
from vidchat.doors.socket_turns import SocketTurns
from vidchat.doors.socket_watch import SocketWatch

if TYPE_CHECKING:
    from fastapi import WebSocket

    from vidchat.app.state import AppState

log = logging.getLogger(__name__)

# How long before --session-time-limit the client is told (session.expiring).
SESSION_END_WARNING_S = 30.0


class Connection(SocketTransport):
    """Drives one WebSocket client: a reader loop plus at most one answer task."""

    def __init__(self, state: "AppState", websocket: "WebSocket") -> None:
        super().__init__(websocket)
        self.state = state
        self.settings = state.settings
        self.entry: Entry | None = None
        self.options: AnswerOptions = state.answer_defaults()
        self.media = SocketMedia(self)
        self.answers = SocketAnswers(self)
        self.turns = SocketTurns(self, self.answers)
        self.watch = SocketWatch(self, self.answers)
        self.config = SessionConfig(self)
        self.last_input = time.monotonic()
        self.reservation = None  # the place taken at the handshake, until the session holds it
        self._expiry_task: asyncio.Task | None = None
        # The client knows vidchat (protocol_config.wants_vidchat_events): only
        # then is it sent response.queued and session.expiring.
        self.vidchat_events = False

    # -- lifecycle -----------------------------------------------------------

    async def run(self) -> None:
        """Serve the client from the handshake to the end of its session."""
        await self.ws.accept()
        reason = "ended"
        try:
            # The place counts from the handshake: clients that never send
            # session.config still count against --max-sessions.
            self.reservation = self.state.registry.reserve(self.client_host)
        except TooManySessions as exc:
            await self.error(str(exc))
            await self.close(CLOSE_TRY_LATER, "too many sessions")
            return
        try:
            if not await self.config.open():
                reason = "refused at configuration"
                return
            reason = await self._loop()
        except Disconnected:
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
        if self.reservation is not None:
            self.reservation.release()
        if self._expiry_task is not None:
            self._expiry_task.cancel()
        self.stop_receiving()
        for task in (self.config.loading_task, self.answers.waiting):
            if task is not None:
                task.cancel()
        await self._stop_asking()
        entry, self.entry = self.entry, None
        if entry is not None:
            # Aborts the answer's vLLM request and runs the closers.
            await self.state.registry.close(entry.session.id, reason)
            await self.answers.finish()
        await self.close(CLOSE_NORMAL, reason)

    async def _stop_asking(self) -> None:
        """No more questions: turn detection and watch stop, and a question being set up finishes first."""
        await self.turns.stop()
        self.watch.stop()
        await self.answers.close()
        if self.entry is not None:
            await talk.stop(self.entry)

    async def closed_by_server(self) -> None:
        """The registry ended this session (time limit, shutdown): say why, then close."""
        if self.closed:
            return  # the session ended from this side (video.done, the client left): nothing to say
        sid = self.entry.session.id if self.entry is not None else ""
        reason = self.state.registry.closed_reason(sid) or "closed by the server"
        await self.error(f"Session ended: {reason}")
        await self.close(1001, reason)

    def announce_end(self) -> None:
        """Warn the client before --session-time-limit ends its session (once, if it has a limit)."""
        if self.entry.deadline is not None and self._expiry_task is None:
            self._expiry_task = asyncio.create_task(self._announce_end(self.entry))

    async def _announce_end(self, entry: Entry) -> None:
        left = entry.time_left() or 0.0
        warn_at = min(SESSION_END_WARNING_S, left / 2)
        await asyncio.sleep(max(0.0, left - warn_at))
        await self.send({"type": "session.expiring", "seconds_left": round(entry.time_left() or 0.0, 1)})

    # -- the message loop ------------------------------------------------------

    async def _parse(self, raw: str) -> Any:
        return await parse_message(raw)

    async def _loop(self) -> str:
        idle_timeout = self.settings.ws_idle_timeout
        self.last_input = time.monotonic()
        while not self.closed:
            # The idle timer counts from the last message or the end of the last answer.
            wait = idle_timeout if self.answers.answering else idle_timeout - (time.monotonic() - self.last_input)
            raw = await self.receive(wait)
            if raw is TIMEOUT:
                if self.answers.answering or time.monotonic() - self.last_input < idle_timeout:
                    continue
                await self.error(f"Idle timeout: no message received for {idle_timeout:g} s")
                await self.close(CLOSE_NORMAL, "idle timeout")
                return "idle timeout"
            arrived = self.last_input = time.monotonic()
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
            except (Disconnected, asyncio.CancelledError):
                raise
            except Exception as exc:  # one bad message never ends the session
                log.exception("ws %s: handling %s failed", self.peer, kind)
                await self.error(f"Internal error while handling {kind}: {type(exc).__name__}")
        return "client gone"

    async def _on_done(self) -> None:
        waiting = self.answers.waiting
        if waiting is not None:  # a question asked while the model loaded is still answered
            await asyncio.wait({waiting})
        await self._stop_asking()
        # Like the seed, an answer still streaming is finished before the stats.
        task = self.answers.task
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

    async def _on_second_config(self, msg: dict[str, Any]) -> None:
        await self.error("session.config was already received; send session.update to change settings")

    _handlers = {
        "video.frame": lambda self, msg, arrived: self.media.on_frame(msg, arrived),
        "audio.chunk": lambda self, msg, arrived: self.media.on_audio(msg, arrived),
        "video.query": lambda self, msg: self.answers.on_query(msg),
        "ping": _on_ping,
        "session.update": lambda self, msg: self.config.update(msg),
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
