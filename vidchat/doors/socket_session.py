"""A socket door's session from the handshake to the close: what the seed
protocol (vidchat.doors.protocol.Connection) and the OpenAI Realtime door
(vidchat.doors.realtime.RealtimeConnection) share, written once.

The lifecycle: a place in --max-sessions from the handshake on (a client
that never opens a session still counts), the door's own opening, the
message loop, and one shutdown that stops what asks, closes the session (the
running answer is aborted in vLLM) and waits for the answer's last event. The
loop: the idle timer (it does not run out while an answer streams), large
JSON parsed off the event loop, one handler per message type, and every
refusal told to the client while the session goes on.

What a door says is its own: its handlers, and the shape of its errors
(:meth:`SocketSession.refuse`: the seed protocol's are a message, the
Realtime API's carry a code and the client's event_id).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from vidchat.conversation import log_context
from vidchat.conversation import Conversation
from vidchat.conversation.registry import TooManySessions
from vidchat.doors.server_contract import login_of
from vidchat.doors.socket_transport import (CLOSE_ERROR, CLOSE_FLUSH_S, CLOSE_NORMAL, CLOSE_TRY_LATER, TIMEOUT,
                                            Disconnected, SocketTransport, parse_message)

if TYPE_CHECKING:
    from fastapi import WebSocket


log = logging.getLogger(__name__)


class Refusal(Exception):
    """A client message refused by its handler; the loop tells the client
    (:meth:`SocketSession.refuse`) and the session goes on."""

    def __init__(self, message: str, code: str = "invalid_value", param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.code, self.param, self.kind = message, code, param, kind


# A handler gets the message and when it arrived; what it returns, if
# anything, ends the session with that reason (the seed's video.done).
Handler = Callable[[Any, dict[str, Any], float], Awaitable[str | None]]


class SocketSession(SocketTransport):
    """One socket client's session; a door subclasses it with its handlers."""

    door = "ws"  # the registry's session kind, and the logs' name for the door
    noun = "message"  # what the door's clients send, as its errors say it
    # What a question before any frame should have done, in the seed
    # protocol's words, which its clients may match on.
    no_frames_hint = "Send video.frame before video.query."
    handlers: dict[str, Handler] = {}

    def __init__(self, state: Any, websocket: "WebSocket") -> None:
        super().__init__(websocket, send_timeout=state.settings.ws_send_timeout)
        self.state, self.settings = state, state.settings
        self.entry: Conversation | None = None
        self.reservation = None  # the place taken at the handshake, until the session holds it
        self.options = state.answer_defaults()
        self.last_input = time.monotonic()
        self.answer_task: asyncio.Task | None = None  # the answer streaming (stream_answer), one at a time

    @classmethod
    async def serve(cls, state: Any, websocket: "WebSocket") -> None:
        """Serve one client until it leaves, fails or times out."""
        try:
            await cls(state, websocket).run()
        except asyncio.CancelledError:
            raise
        except Exception:  # never let one client take the server down
            log.exception("%s session crashed", cls.door)

    # -- what a door provides ----------------------------------------------------

    async def open(self) -> bool:
        """Open the session (start_session); False when it was refused and closed."""
        raise NotImplementedError

    async def refuse(self, message: str, code: str = "invalid_value", param: str | None = None,
                     kind: str = "invalid_request_error", event_id: Any = None) -> bool:
        """Tell the client what was refused: the seed protocol's ``error
        {message}``; a door whose errors carry more overrides this."""
        return await self.error(message)

    async def stop_asking(self) -> None:
        """At the session's end, before it closes: nothing asks any more (turn detection, watch)."""

    # -- the answer streaming ----------------------------------------------------

    @property
    def answering(self) -> bool:
        """An answer streams: the idle timer waits for its end."""
        return self.answer_task is not None and not self.answer_task.done()

    def stream_answer(self, answer: Awaitable[None], name: str) -> None:
        """Stream an answer (the door's coroutine that says its run) as a task,
        so the client's messages go on meanwhile; the idle timer counts from its end.
        A door starts one only after :meth:`finish_answer`: its events never interleave."""

        async def streamed() -> None:
            try:
                await answer
            finally:
                self.last_input = time.monotonic()

        self.answer_task = asyncio.create_task(streamed(), name=name)

    async def finish_answer(self) -> None:
        """Wait for the answer task to send its last event (its reply aborted, or ending)."""
        task, self.answer_task = self.answer_task, None
        if task is not None:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                log.debug("%s %s: answer task ended with an error", self.door, self.peer, exc_info=True)

    # -- the lifecycle -----------------------------------------------------------

    async def run(self) -> None:
        """Serve the client from the handshake to the end of its session."""
        await self.ws.accept()
        try:
            self.reservation = self.state.registry.reserve(self.client_host)
        except TooManySessions as exc:
            await self.refuse_session(str(exc), "too many sessions")
            return
        reason = "refused"
        try:
            if await self.open():
                reason = await self._loop()
        except Disconnected:
            reason = self.stuck or "client disconnected"
        except asyncio.CancelledError:
            reason = "server shutting down"
            raise
        except Exception:
            log.exception("%s %s: session failed", self.door, self.peer)
            reason = "internal error"
            await self.refuse("Internal server error", "internal_error", kind="server_error")
            await self.close(CLOSE_ERROR, "internal error")
        finally:
            await self._shutdown(reason)

    async def refuse_session(self, message: str, why: str) -> bool:
        """No session now (too many, the model failed): say so, close with "try later"; False for open()."""
        await self.refuse(message, "session_refused", kind="server_error")
        await self.close(CLOSE_TRY_LATER, why)
        return False

    def model_down(self) -> str | None:
        """Why no session may open: the model failed to load or stays down.
        None while it runs, and while it loads or restarts: a session opened
        then is already a session (it takes frames; its questions wait for the model)."""
        ready, why = self.state.readiness()
        return why if not ready and self.state.engine_down else None

    def start_session(self, **settings: Any) -> Conversation:
        """The session, in the place taken at the handshake (raises TooManySessions)."""
        self.entry = self.state.new_session(self.door, reservation=self.reservation,
                                            owner=login_of(self.ws.headers), **settings)
        self.reservation = None
        log_context.bind(self.entry.session.id, self.door)  # the rest of this connection's log lines
        self.entry.closers.append(self.closed_by_server)
        return self.entry

    async def closed_by_server(self) -> None:
        """The registry ended this session (time limit, shutdown): say why, then
        close, whatever the socket is doing: the reason goes only if there is
        room for it, and the close waits at most CLOSE_FLUSH_S, none of it on a
        send (a client that floods and reads nothing once kept its session
        past its --session-time-limit for good)."""
        if self.closed:
            return  # it ended from this side (the client left, video.done, idle): nothing to say
        sid = self.entry.session.id if self.entry is not None else ""
        reason = self.state.registry.closed_reason(sid) or "closed by the server"
        self.ending = True
        await self.refuse(f"Session ended: {reason}", "session_ended", kind="server_error")
        await self.close(1001, reason, flush_s=CLOSE_FLUSH_S)

    async def _shutdown(self, reason: str) -> None:
        if self.reservation is not None:
            self.reservation.release()
        self.stop_receiving()
        await self.stop_asking()
        if self.entry is not None:
            # Aborts the running answer's vLLM request and runs the closers.
            await self.state.registry.close(self.entry.session.id, reason)
        await self.finish_answer()  # the aborted answer's last event is sent
        self.entry = None
        await self.close(CLOSE_NORMAL, reason)

    # -- the message loop --------------------------------------------------------

    async def _parse(self, raw: str) -> Any:
        return await parse_message(raw)

    async def _loop(self) -> str:
        idle = self.settings.ws_idle_timeout
        self.last_input = time.monotonic()
        while not self.closed:
            # The idle timer counts from the last message or the end of the last
            # answer; a session watching a stream (--stream) has media without
            # its client saying anything, so it is not idle (a dead client is
            # still noticed by the WebSocket's own pings).
            answering = self.answering or getattr(self.entry, "stream", None) is not None
            raw = await self.receive(idle if answering else idle - (time.monotonic() - self.last_input))
            if raw is TIMEOUT:
                if answering or time.monotonic() - self.last_input < idle:
                    continue
                await self.refuse(f"Idle timeout: no {self.noun} received for {idle:g} s", "idle_timeout")
                await self.close(CLOSE_NORMAL, "idle timeout")
                return "idle timeout"
            arrived = self.last_input = time.monotonic()
            try:
                msg = await self._parse(raw)
            except ValueError as exc:
                await self.refuse(f"Invalid JSON: {exc}", "invalid_json")
                continue
            if not isinstance(msg, dict):
                await self.refuse(f"{self.noun.capitalize()}s must be JSON objects", "invalid_event")
                continue
            ended = await self._dispatch(msg, arrived)
            if ended:
                return ended
        return self.stuck or "client gone"

    async def _dispatch(self, msg: dict[str, Any], arrived: float) -> str | None:
        kind = msg.get("type")
        handler = self.handlers.get(kind) if isinstance(kind, str) else None
        try:
            if handler is None:
                raise Refusal(f"Unknown {self.noun} type: {kind}", "unknown_event", "type")
            return await handler(self, msg, arrived)
        except Refusal as exc:
            await self.refuse(exc.message, exc.code, exc.param, exc.kind, msg.get("event_id"))
        except (Disconnected, asyncio.CancelledError):
            raise
        except Exception as exc:  # one bad message never ends the session
            log.exception("%s %s: handling %s failed", self.door, self.peer, kind)
            await self.refuse(f"Internal error while handling {kind}: {type(exc).__name__}", "internal_error",
                              kind="server_error", event_id=msg.get("event_id"))
        return None
