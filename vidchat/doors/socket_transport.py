"""One WebSocket client's transport: JSON messages in and out, whole and in order.

Kept apart from what the messages mean (vidchat.doors.protocol): this is only
how a message gets across, what happens when the client is gone mid-send,
and how a large message is parsed without stalling the event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any, Callable

from vidchat.doors import wire
from vidchat.doors.socket_media import INLINE_PARSE_CHARS
from vidchat.media.workers import run_media

if TYPE_CHECKING:
    from fastapi import WebSocket

log = logging.getLogger(__name__)

# Close codes: normal end, a protocol violation, server busy, server error.
CLOSE_NORMAL, CLOSE_POLICY, CLOSE_TRY_LATER, CLOSE_ERROR = 1000, 1008, 1013, 1011

# An error longer than this is cut: an engine error may quote its whole input.
MAX_ERROR_CHARS = 500


class Disconnected(Exception):
    pass


class _Timeout:
    pass


TIMEOUT = _Timeout()


async def parse_message(raw: str) -> Any:
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


class SocketTransport:
    """Sends and receives one client's messages. One lock serialises all
    sends; once the socket is closed or broken nothing more is sent."""

    door = "ws"  # the logs' name for the door (each socket door's session says its own)

    def __init__(self, websocket: "WebSocket") -> None:
        self.ws = websocket
        self.peer = f"{websocket.client.host}:{websocket.client.port}" if websocket.client else "?"
        self.client_host = websocket.client.host if websocket.client else None
        self._send_lock = asyncio.Lock()
        self._closed = False
        self._recv: asyncio.Future | None = None

    @property
    def closed(self) -> bool:
        return self._closed

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

    async def error(self, message: str, event: Callable[[str], dict[str, Any]] | None = None) -> bool:
        """Send an error, its message cut to MAX_ERROR_CHARS: the seed's
        ``error {message}``, or the door's ``event`` for the message; False
        if the client is gone."""
        if len(message) > MAX_ERROR_CHARS:
            message = message[:MAX_ERROR_CHARS - 3] + "..."
        sent = await self.send({"type": "error", "message": message} if event is None else event(message))
        if sent:
            log.info("%s %s: error sent: %s", self.door, self.peer, message)
        return sent

    async def close(self, code: int = CLOSE_NORMAL, reason: str = "") -> None:
        """Close the socket once (later calls do nothing)."""
        async with self._send_lock:
            if self._closed:
                return
            self._closed = True
            try:
                await self.ws.close(code=code, reason=reason[:120])
            except Exception:
                pass

    async def receive(self, timeout: float) -> str | _Timeout:
        """The next text message, or TIMEOUT. A pending receive is kept across timeouts."""
        if self._recv is None:
            self._recv = asyncio.ensure_future(self.ws.receive())
        done, _ = await asyncio.wait({self._recv}, timeout=max(timeout, 0.0))
        if not done:
            return TIMEOUT
        recv, self._recv = self._recv, None
        message = recv.result()
        if message["type"] == "websocket.disconnect":
            self._closed = True
            raise Disconnected(message.get("code"))
        if message.get("text") is not None:
            return message["text"]
        data = message.get("bytes") or b""
        try:
            return data.decode("utf-8")  # tolerate JSON sent as a binary message
        except UnicodeDecodeError:
            return "\x00"  # not JSON: reported as such by the caller

    def stop_receiving(self) -> None:
        if self._recv is not None:
            self._recv.cancel()
