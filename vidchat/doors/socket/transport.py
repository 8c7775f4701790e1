"""One WebSocket client's transport: JSON messages in and out, whole and in order.

Kept apart from what the messages mean (vidchat.doors.socket.seed): this is only
how a message gets across, what happens when the client is gone mid-send,
and how a large message is parsed without stalling the event loop.
Sending is a class of its own (:class:`SocketSender`: a bounded queue, its
writer task, the close), so what keeps a reader that stalls from blocking
the code that sends reads apart from receiving, which
:class:`SocketTransport` adds with the errors.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import fcntl
import json
import logging
import re
import socket
import struct
import termios
import time
from typing import TYPE_CHECKING, Any, Callable

from vidchat.media.workers import run_media

if TYPE_CHECKING:
    from fastapi import WebSocket

log = logging.getLogger(__name__)

# Messages longer than this are parsed and decoded in a worker thread, in
# slices that yield the interpreter lock (vidchat.doors.socket.transport): a 640×480 frame's
# JSON+base64 costs ~0.3 ms, an 8 MB one ~55 ms, which would stall every other
# session's frames and streamed tokens.
INLINE_PARSE_CHARS = 64 * 1024


# Large WebSocket messages without stalling the event loop.
#
# A ``video.frame`` may be an 8 MB JPEG: ~11 MB of base64 inside JSON. Moving
# ``json.loads`` and ``base64.b64decode`` to a worker thread is not enough,
# because both hold the interpreter lock for their whole run (measured here:
# ~10 ms and ~46 ms for such a frame), so the event loop waits as if they ran
# on it. Instead the worker does the same work in slices of about a
# millisecond each and yields the lock between them:
#
# * :func:`parse` finds the big ``"data"`` string in the raw text and parses
#   only the rest of the message; the string stays where it is, as a
#   :class:`BigText` view (never copied whole).
# * :func:`b64decode` decodes base64 from a ``str`` or a ``BigText`` slice by slice.

# ~1 ms of base64 decoding or string scanning per slice on these machines;
# a multiple of 4 so every slice but the last is whole base64 quanta.
SLICE_CHARS = 256 * 1024

_DATA_KEY = re.compile(r'"data"\s*:\s*"')


class BigText:
    """A span of the raw message holding a JSON string without escapes."""

    def __init__(self, raw: str, start: int, end: int) -> None:
        self.raw, self.start, self.end = raw, start, end

    def __len__(self) -> int:
        return self.end - self.start

    def head(self, n: int) -> str:
        return self.raw[self.start:min(self.end, self.start + n)]

    def skip(self, n: int) -> "BigText":
        return BigText(self.raw, min(self.end, self.start + n), self.end)

    def slices(self):
        for s in range(self.start, self.end, SLICE_CHARS):
            yield self.raw[s:min(self.end, s + SLICE_CHARS)]

    def __str__(self) -> str:
        return self.raw[self.start:self.end]


def _find(raw: str, sub: str, start: int, end: int) -> int:
    """str.find in slices, yielding the lock between them."""
    for s in range(start, end, SLICE_CHARS):
        hit = raw.find(sub, s, min(end, s + SLICE_CHARS + len(sub) - 1))
        if hit != -1:
            return hit
        time.sleep(0)
    return -1


def parse(raw: str) -> Any:
    """json.loads, leaving a large ``"data"`` string in place as a BigText.

    Falls back to a plain json.loads when the message has no such field, the
    field is not most of the message, or it holds escapes (raises ValueError
    for invalid JSON, as json.loads does)."""
    key = raw.find('"data"', 0, 4096)
    match = _DATA_KEY.match(raw, key) if key != -1 else None
    if match is None:
        return json.loads(raw)
    start = match.end()
    end = _find(raw, '"', start, len(raw))
    if end == -1 or end - start < len(raw) // 2 or _find(raw, "\\", start, end) != -1:
        return json.loads(raw)
    msg = json.loads(raw[:key] + '"data": null' + raw[end + 1:])
    if isinstance(msg, dict) and msg.get("data", "") is None:
        msg["data"] = BigText(raw, start, end)
    return msg


def _decode_slices(slices) -> bytes:
    parts = []
    for piece in slices:
        parts.append(base64.b64decode(piece, validate=True))
        time.sleep(0)  # let the event loop in between slices
    return b"".join(parts)


def b64decode(text: str | BigText) -> bytes:
    """Strict base64 (whitespace tolerated), decoded slice by slice."""
    if isinstance(text, str):
        text = BigText(text, 0, len(text))
    try:
        return _decode_slices(text.slices())
    except binascii.Error:
        # Line breaks or spaces shift the 4-character quanta across slices:
        # take them out, then decode as before.
        compact = "".join(str(text).split())
        return _decode_slices(compact[s:s + SLICE_CHARS] for s in range(0, len(compact), SLICE_CHARS))


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

    def decode(big: bool) -> Any:
        try:
            msg = parse(raw) if big else json.loads(raw)
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
        return await run_media(decode, True)
    return decode(False)


# What may wait for a slow client, in serialised bytes: a few answers'
# worth of deltas. Past it, acks are dropped and other messages wait.
MAX_QUEUED_BYTES = 1 << 20

# How long close() waits for the queued messages and the close frame.
CLOSE_FLUSH_S = 2.0

# How often a close looks whether the client has taken what was sent to it.
DELIVERY_POLL_S = 0.05

# How often an idle writer looks whether the client takes what waits for it.
READ_CHECK_S = 0.5


class _CloseFrame:
    def __init__(self, code: int, reason: str) -> None:
        self.code, self.reason = code, reason


class SocketSender:
    """Sends one client's messages.

    Sends go through a bounded queue that one writer task empties, so a
    client that stops reading never blocks the code that sends to it: its
    frame acks are dropped once the queue is full, other messages wait for
    room, and a client that reads nothing for ``send_timeout`` seconds is
    closed with 1008 (:attr:`stuck`): one whose TCP acknowledges none of
    what waits for it (:class:`ClientReads`), one that stays behind (acks
    dropped, or a message waiting for room) with no half of the queue read
    meanwhile, or one whose single send takes that long. Without that, one
    stalled reader held its session's handler in a send for good, and with
    it the reaper that tried to tell it its session had ended."""

    door = "ws"  # the logs' name for the door (each socket door's session says its own)

    def __init__(self, websocket: "WebSocket", send_timeout: float = 10.0) -> None:
        self.ws = websocket
        self.peer = f"{websocket.client.host}:{websocket.client.port}" if websocket.client else "?"
        self.send_timeout = send_timeout
        self._queue: collections.deque[tuple[str | _CloseFrame, bool]] = collections.deque()
        self._queued_bytes = 0
        self._has_work = asyncio.Event()
        self._has_room = asyncio.Event()
        self._has_room.set()
        self._full_since: float | None = None  # since when the client has been behind (acks dropped, or a send waits)
        self._sent_while_full = 0  # bytes the writer has got out since then
        self._reads = ClientReads(_find_transport(websocket))
        self._acked: int | None = None  # the client's TCP's count of bytes taken, at the last check
        self._unread_since: float | None = None  # since when it has taken none of what waits for it
        self._writer: asyncio.Task | None = None
        self._gone = asyncio.Event()  # no more sends: the client left, was closed, or is stuck
        self._closed = False
        self.dropped_acks = 0
        self.stuck: str | None = None  # why the server gave up on a client that reads nothing
        # The server is ending the session: what is said now goes if there is
        # room for it at once, and no send waits (a full queue drops it).
        self.ending = False
        self._closing: asyncio.Task | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    async def send(self, msg: dict[str, Any], droppable: bool = False) -> bool:
        """Queue one message; False if the client is gone.

        ``droppable``: a message the client can do without (a frame's ack),
        dropped rather than queued while the client reads too slowly. Other
        messages wait for room, at most until the client is given up on.
        Whatever is queued is sent whole and in order, even if the caller
        is cancelled meanwhile."""
        if self._closed:
            return False
        self._check_reading()
        if self._closed:  # just given up on
            return False
        text = _serialised(msg)
        if self._queued_bytes + len(text) > MAX_QUEUED_BYTES and self._queue:
            # Behind from here on, whether dropped acks make room or this
            # waits for it (dropped acks once did not count, so a client that
            # read nothing was never closed).
            if self._evict_droppable():
                self._mark_full()
            while self._queued_bytes + len(text) > MAX_QUEUED_BYTES and self._queue and not self._closed:
                if self.ending:
                    return False
                if droppable:
                    self.dropped_acks += 1
                    self._mark_full()
                    return not self._closed
                self._mark_full()
                self._has_room.clear()
                await self._wait_for_room()
            if self._closed:
                return False
        self._put(text, droppable)
        return True

    def _check_reading(self) -> None:
        """Give up on a client whose TCP has taken none of what waits for it
        for ``send_timeout`` seconds. The writer alone cannot tell: the
        kernel's send buffer (autotuned up to megabytes) takes acks for
        minutes from a client that reads nothing, so no send ever waited."""
        sample = self._reads.sample()
        if sample is None:
            return
        acked, waiting = sample
        now = time.monotonic()
        if waiting == 0 or acked != self._acked:
            self._acked, self._unread_since = acked, None
        elif self._unread_since is None:
            self._unread_since = now
        elif now - self._unread_since >= self.send_timeout:
            self._give_up(f"the client read nothing for {self.send_timeout:g} s (--ws-send-timeout)")

    def _put(self, item: str | _CloseFrame, droppable: bool) -> None:
        self._queue.append((item, droppable))
        self._queued_bytes += len(item) if isinstance(item, str) else 0
        self._has_work.set()
        if self._writer is None:
            self._writer = asyncio.create_task(self._write(), name=f"ws-writer {self.peer}")

    def _evict_droppable(self) -> int:
        """Drop the queued acks; how many there were."""
        kept = collections.deque(item for item in self._queue if not item[1])
        evicted = len(self._queue) - len(kept)
        if evicted:
            self.dropped_acks += evicted
            self._queue = kept
            self._queued_bytes = sum(len(i) for i, _ in kept if isinstance(i, str))
        return evicted

    def _mark_full(self) -> None:
        now = time.monotonic()
        if self._full_since is None:
            self._full_since = now
        elif now - self._full_since >= self.send_timeout:
            self._give_up(f"the client read nothing for {self.send_timeout:g} s (--ws-send-timeout)")

    async def _wait_for_room(self) -> None:
        left = self.send_timeout - (time.monotonic() - (self._full_since or time.monotonic()))
        waits = {asyncio.ensure_future(self._has_room.wait()), asyncio.ensure_future(self._gone.wait())}
        try:
            await asyncio.wait(waits, timeout=max(left, 0.0), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def _watch_while_idle(self) -> None:
        """Wait for something to send, looking every READ_CHECK_S whether the
        client still takes what the kernel holds for it. A client that stops
        reading can stop sending too (its full receive buffer makes its TCP
        drop the segments that acknowledge its own data, so its sends stall):
        then nothing arrives that the server would answer, no send looks, and
        without this the connection sat open until the keepalive pings gave up."""
        while not self._has_work.is_set():
            try:
                await asyncio.wait_for(self._has_work.wait(), READ_CHECK_S)
            except asyncio.TimeoutError:
                self._check_reading()

    async def _write(self) -> None:
        """The writer task: sends what is queued, in order, each send bounded by ``send_timeout``."""
        while True:
            if not self._queue:
                if self._closed:
                    return  # the client left: nothing more will be queued
                self._has_work.clear()
                await self._watch_while_idle()
                continue
            item, _ = self._queue.popleft()
            if isinstance(item, _CloseFrame):
                await self._send_close(item)
                return
            self._queued_bytes -= len(item)
            if self._queued_bytes <= MAX_QUEUED_BYTES // 2:
                self._has_room.set()
            try:
                # uvicorn's send waits for the transport to take more before it
                # writes anything, so a timed-out send leaves no half frame.
                await asyncio.wait_for(self.ws.send_text(item), self.send_timeout)
            except asyncio.TimeoutError:
                self._give_up(f"the client read nothing for {self.send_timeout:g} s (--ws-send-timeout)")
                return
            except Exception as exc:  # the client went away mid-send
                log.debug("ws %s: send failed: %r", self.peer, exc)
                self._mark_gone()
                return
            if self._full_since is not None:
                # Nothing left to send, or half a queue sent since it fell
                # behind: it reads again (room alone says nothing: evicting
                # acks makes room too).
                self._sent_while_full += len(item)
                if not self._queue or self._sent_while_full >= MAX_QUEUED_BYTES // 2:
                    self._full_since, self._sent_while_full = None, 0

    def _mark_gone(self) -> None:
        """The client is gone: nothing more is sent, and whoever waits to send or to receive is let go."""
        self._closed = True
        self._gone.set()
        self._has_room.set()
        self._has_work.set()

    def _give_up(self, why: str) -> None:
        """Close a client that reads nothing: 1008 with the reason if the
        close frame gets through at once, else the connection is cut."""
        if self.stuck is not None:
            return
        self.stuck = why
        log.warning("%s %s: closing with 1008: %s (%d acks dropped)", self.door, self.peer, why, self.dropped_acks)
        self._queue.clear()
        self._queued_bytes = 0
        self._mark_gone()
        if self._writer is not None and self._writer is not asyncio.current_task():
            self._writer.cancel()
        self._closing = asyncio.create_task(self._send_close(_CloseFrame(CLOSE_POLICY, why), flush_s=0.5))

    async def _send_close(self, frame: _CloseFrame, flush_s: float = CLOSE_FLUSH_S) -> None:
        """Send the close frame, then cut the connection unless the client's
        TCP has taken all that waits for it within ``flush_s``: a close frame
        the kernel took is not one the client reads, and a client that reads
        nothing would keep its connection (and the server its buffers) for good."""
        deadline = time.monotonic() + flush_s
        try:
            await asyncio.wait_for(self.ws.close(code=frame.code, reason=frame.reason[:120]), flush_s)
            if not await self._delivered(deadline - time.monotonic()):
                self._cut(f"the client took nothing of the close for {flush_s:g} s")
        except asyncio.TimeoutError:
            self._cut(f"the close frame could not be sent within {flush_s:g} s")
        except Exception:
            pass
        finally:
            self._gone.set()

    async def _delivered(self, timeout: float) -> bool:
        """Whether the client's TCP takes all that waits for it within
        ``timeout`` seconds (True where that cannot be told)."""
        deadline = time.monotonic() + timeout
        while True:
            sample = self._reads.sample()
            if sample is None or sample[1] == 0:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(DELIVERY_POLL_S)

    async def close(self, code: int = CLOSE_NORMAL, reason: str = "", flush_s: float | None = None) -> None:
        """Close the socket once (later calls do nothing), after what is queued
        is sent: at most ``flush_s`` for both (CLOSE_FLUSH_S past a send
        under way, which may take ``send_timeout``), then the connection is cut.
        Nothing more is received from the moment it starts."""
        if self._closed:
            if self._writer is not None and self.stuck is None and not await self._finished_writing(CLOSE_FLUSH_S):
                self._writer.cancel()
            return
        self._closed = True
        self._has_room.set()
        self._gone.set()  # the message loop stops taking the client's messages now, not after the flush
        self._put(_CloseFrame(code, reason), False)
        flush_s = CLOSE_FLUSH_S + self.send_timeout if flush_s is None else flush_s
        if not await self._finished_writing(flush_s):
            self._writer.cancel()
            self._cut(f"what was queued and the close were not sent within {flush_s:g} s")

    def _cut(self, why: str) -> None:
        log.info("%s %s: connection cut: %s", self.door, self.peer, why)
        _abort_transport(self.ws)

    async def _finished_writing(self, timeout: float) -> bool:
        writer = self._writer
        if writer is None or writer.done():
            return True
        done, _ = await asyncio.wait({writer}, timeout=timeout)
        return bool(done)


class SocketTransport(SocketSender):
    """Sends and receives one client's messages: errors cut to size go out
    through the sender's queue, and one receive at a time comes in, kept
    across timeouts and let go as the client is given up on."""

    def __init__(self, websocket: "WebSocket", send_timeout: float = 10.0) -> None:
        super().__init__(websocket, send_timeout)
        self.client_host = websocket.client.host if websocket.client else None
        self._recv: asyncio.Future | None = None
        self._last_error: str | None = None  # the last error logged, and how often it was sent again since
        self._error_repeats = 0

    async def error(self, message: str, event: Callable[[str], dict[str, Any]] | None = None) -> bool:
        """Send an error, its message cut to MAX_ERROR_CHARS: the seed's
        ``error {message}``, or the door's ``event`` for the message; False
        if the client is gone."""
        if len(message) > MAX_ERROR_CHARS:
            message = message[:MAX_ERROR_CHARS - 3] + "..."
        sent = await self.send({"type": "error", "message": message} if event is None else event(message))
        if sent and message == self._last_error:
            self._error_repeats += 1  # one line, not thousands, for a client that repeats its mistake
        elif sent:
            repeated = f" (the one before sent {self._error_repeats} more times)" if self._error_repeats else ""
            log.info("%s %s: error sent: %s%s", self.door, self.peer, message, repeated)
            self._last_error, self._error_repeats = message, 0
        return sent

    async def receive(self, timeout: float) -> str | _Timeout:
        """The next text message, or TIMEOUT. A pending receive is kept across timeouts."""
        if self._recv is None:
            self._recv = asyncio.ensure_future(self.ws.receive())
        gone = asyncio.ensure_future(self._gone.wait())
        try:
            done, _ = await asyncio.wait({self._recv, gone}, timeout=max(timeout, 0.0),
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if self._recv not in done:
            if self.stuck is not None:
                raise Disconnected(CLOSE_POLICY)
            return TIMEOUT
        recv, self._recv = self._recv, None
        message = recv.result()
        if message["type"] == "websocket.disconnect":
            self._mark_gone()
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


def _serialised(msg: dict[str, Any]) -> str:
    text = json.dumps(msg, ensure_ascii=False)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate from the client, echoed back
            text = json.dumps(msg)  # escaped as \ud800: still valid JSON
    return text


def _abort_transport(websocket: "WebSocket") -> None:
    """Cut the TCP connection of a client whose close frame cannot get
    through: a closed asyncio transport waits for its buffer to drain, which
    a peer that reads nothing never lets happen, so the socket would stay
    open for nobody. Does nothing on a server where the transport cannot be found."""
    transport = _find_transport(websocket)
    if transport is not None:
        try:
            # A reset, not a FIN queued behind what the client never read: the
            # kernel then frees that data at once instead of retrying it for minutes.
            transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except (AttributeError, OSError):
            pass  # not a socket's transport, or closed meanwhile: a plain abort
        transport.abort()


def _find_transport(websocket: "WebSocket") -> Any:
    """The asyncio transport under a WebSocket, or None. ASGI has no call
    for it: this finds uvicorn's protocol behind the send callable
    (Starlette wraps it in closures on the way)."""
    return _transport_behind(getattr(websocket, "_send", None), depth=6)


def _transport_behind(send: Any, depth: int) -> Any:
    if send is None or depth == 0:
        return None
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if callable(getattr(transport, "abort", None)):
        return transport
    for cell in getattr(send, "__closure__", None) or ():
        try:
            inner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(inner):
            found = _transport_behind(inner, depth - 1)
            if found is not None:
                return found
    return None


# Linux's struct tcp_info: tcpi_bytes_acked, a __u64 at this offset since Linux 4.1.
_TCPI_BYTES_ACKED = 120


class ClientReads:
    """What the client's TCP has taken of what was sent to it, as the kernel
    counts it: the bytes it has acknowledged so far, and the bytes still
    waiting for it (the kernel's send queue and the transport's buffer). A
    client that reads nothing soon acknowledges nothing (its receive buffer
    full, its window shut) while the server's send buffer still takes writes.
    Linux TCP only; elsewhere (or a transport that is not a socket's)
    :meth:`sample` says nothing and the queue's rules alone apply."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        get = getattr(transport, "get_extra_info", None)
        sock = get("socket") if callable(get) else None
        usable = (sock is not None and hasattr(socket, "TCP_INFO")
                  and getattr(sock, "family", None) in (socket.AF_INET, socket.AF_INET6))
        self._sock = sock if usable else None

    def sample(self) -> tuple[int, int] | None:
        """(bytes acknowledged, bytes waiting), or None when it cannot be told."""
        sock = self._sock
        if sock is None:
            return None
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
            queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4)  # Linux's SIOCOUTQ
        except (OSError, ValueError):  # closed meanwhile
            self._sock = None
            return None
        if len(info) < _TCPI_BYTES_ACKED + 8:  # a kernel before 4.1
            self._sock = None
            return None
        acked = struct.unpack_from("=Q", info, _TCPI_BYTES_ACKED)[0]
        buffered = self._transport.get_write_buffer_size()
        return acked, struct.unpack("=i", queued)[0] + buffered
