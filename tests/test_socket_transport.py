"""The socket doors' transport (vidchat.doors.socket.transport) against a
fake WebSocket whose sends can be held: a client that reads nothing never
blocks the code that sends to it, its acks are dropped first, it is closed
with 1008 once it stays full for the send timeout, and a normal close sends
what was queued, in order, before the close frame."""

from __future__ import annotations

import asyncio
import socket
import time
from types import SimpleNamespace

import pytest

from vidchat.conversation.registry import SessionRegistry
from vidchat.devtools.harness import eventually_async
from vidchat.doors.socket import transport as socket_transport
from vidchat.doors.socket.transport import CLOSE_POLICY, Disconnected, SocketTransport

pytestmark = pytest.mark.unit


class HeldSocket:
    """A WebSocket whose client reads only while ``reading`` is set."""

    def __init__(self) -> None:
        self.client = SimpleNamespace(host="127.0.0.1", port=5000)
        self.reading = asyncio.Event()
        self.reading.set()
        self.sent: list[str] = []
        self.closed_with: tuple[int, str] | None = None
        self.aborted = asyncio.Event()
        self.incoming: asyncio.Queue = asyncio.Queue()
        # What uvicorn's protocol offers behind the send callable (found by _abort_transport).
        self.transport = SimpleNamespace(abort=self.aborted.set)
        self._send = self.asgi_send

    async def asgi_send(self, message: dict) -> None:
        await self.reading.wait()

    async def send_text(self, text: str) -> None:
        await self.reading.wait()
        self.sent.append(text)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.close_asked = (code, reason)
        await self.reading.wait()
        self.closed_with = (code, reason)

    async def receive(self) -> dict:
        return await self.incoming.get()


async def test_sends_go_out_in_order_and_close_flushes_them_first():
    ws = HeldSocket()
    transport = SocketTransport(ws, send_timeout=5)
    for n in range(50):
        assert await transport.send({"n": n})
    await transport.close(1000, "bye")
    assert [int(t.split(":")[1].strip(" }")) for t in ws.sent] == list(range(50))
    assert ws.closed_with == (1000, "bye")
    assert not await transport.send({"n": "late"})  # nothing after the close


async def test_a_client_that_reads_nothing_never_blocks_acks_and_is_closed_after_the_timeout():
    ws = HeldSocket()
    ws.reading.clear()  # the client stops reading: every send of the socket would wait
    transport = SocketTransport(ws, send_timeout=0.5)
    ack = {"type": "video.frame.ack", "frame_id": 1, "pad": "x" * 1000}
    # More acks than the queue holds: each returns at once (the excess dropped).
    for _ in range(socket_transport.MAX_QUEUED_BYTES // 1000 + 200):
        assert await asyncio.wait_for(transport.send(ack, droppable=True), 1.0)
    assert transport.dropped_acks > 0
    # The session's message loop waits in receive; it is let go once the client is given up on.
    with pytest.raises(Disconnected):
        await asyncio.wait_for(transport.receive(timeout=60), 10)
    assert transport.stuck and "--ws-send-timeout" in transport.stuck
    assert transport.closed
    await asyncio.wait_for(ws.aborted.wait(), 5)  # the close frame could not get through: the connection is cut
    assert ws.close_asked[0] == CLOSE_POLICY and "--ws-send-timeout" in ws.close_asked[1]
    assert not await transport.send({"type": "error", "message": "too late"})


async def test_a_message_that_must_go_waits_for_room_then_is_refused_once_the_client_is_given_up():
    ws = HeldSocket()
    ws.reading.clear()
    transport = SocketTransport(ws, send_timeout=0.5)
    delta = {"type": "response.text.delta", "delta": "y" * 4000}
    results = []
    for _ in range(socket_transport.MAX_QUEUED_BYTES // 4000 + 50):
        results.append(await asyncio.wait_for(transport.send(delta), 5.0))
    assert results[0] is True and results[-1] is False  # the later ones found the client given up
    assert transport.stuck is not None


async def test_queued_acks_give_way_to_a_message_that_must_go():
    ws = HeldSocket()
    ws.reading.clear()
    transport = SocketTransport(ws, send_timeout=30)
    ack = {"type": "video.frame.ack", "pad": "x" * 1000}
    while transport._queued_bytes + 1100 <= socket_transport.MAX_QUEUED_BYTES:
        await transport.send(ack, droppable=True)
    assert await asyncio.wait_for(transport.send({"type": "response.text.done", "text": "t" * 5000}), 1.0)
    assert transport.dropped_acks > 0 and transport.stuck is None
    ws.reading.set()  # the client reads again: the answer's end arrives, after what was sent first
    await transport.close()
    assert '"response.text.done"' in ws.sent[-1]


async def test_the_reaper_goes_on_while_one_session_closer_hangs():
    registry = SessionRegistry(max_sessions=4, time_limit_s=60)
    hung, other = registry.create("ws"), registry.create("ws")
    hung.deadline = other.deadline = time.monotonic() - 1  # both past their limit
    never = asyncio.Event()
    released = asyncio.Event()

    async def hangs() -> None:
        try:
            await never.wait()
        finally:
            released.set()

    closed_other = asyncio.Event()

    async def closes() -> None:
        closed_other.set()

    hung.closers.append(hangs)
    other.closers.append(closes)
    overdue = await asyncio.wait_for(registry.end_overdue(), 1.0)  # returns at once: closes run in tasks
    assert set(overdue) == {hung.session.id, other.session.id}
    await asyncio.wait_for(closed_other.wait(), 5)
    assert len(registry) == 0
    await asyncio.wait_for(registry.close_all(timeout=0.2), 5)  # shutdown gives up on the hung closer
    await asyncio.wait_for(released.wait(), 5)



# ---- a client whose kernel takes what the server sends, and which reads none of it (issue 57, point 1) ----

class KernelSocket:
    """A WebSocket over a real TCP connection whose sends always go through
    at once, as uvicorn's do while the kernel's send buffer takes them: the
    client at the other end (a 4 KB receive buffer) reads nothing."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.client = SimpleNamespace(host="127.0.0.1", port=5001)
        self.transport = transport  # found behind _send, as uvicorn's protocol is
        self._send = self.asgi_send
        self.incoming: asyncio.Queue = asyncio.Queue()

    async def asgi_send(self, message: dict) -> None:
        pass

    async def send_text(self, text: str) -> None:
        self.transport.write(text.encode())

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.transport.write(b"close")

    async def receive(self) -> dict:
        return await self.incoming.get()


async def never_reading_client() -> tuple[KernelSocket, socket.socket, asyncio.AbstractServer]:
    accepted: asyncio.Queue = asyncio.Queue()

    async def on_client(reader, writer) -> None:
        await accepted.put(writer.transport)

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await asyncio.to_thread(client.connect, server.sockets[0].getsockname())
    return KernelSocket(await asyncio.wait_for(accepted.get(), 10)), client, server


async def test_a_client_whose_kernel_takes_acks_but_that_reads_none_is_closed_after_the_timeout():
    ws, client, server = await never_reading_client()
    transport = SocketTransport(ws, send_timeout=0.5)
    ack = {"type": "video.frame.ack", "frame_id": 1, "pad": "x" * 200}
    deadline = time.monotonic() + 30
    try:
        # A client that sends frames at a camera's pace: an ack each. No send ever waits (the
        # kernel takes them all), yet the client reads nothing: it is closed all the same.
        while await transport.send(ack, droppable=True) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # the camera's pace, not a wait for anything
        assert transport.stuck and "--ws-send-timeout" in transport.stuck, "never closed"
        assert transport._queued_bytes < socket_transport.MAX_QUEUED_BYTES  # no queue filled: the kernel said it
        # Its close could not reach it: the connection is cut (KernelSocket.close closes nothing).
        await eventually_async(ws.transport.is_closing, 10, "the connection cut")
    finally:
        client.close()
        server.close()


async def test_a_close_does_not_wait_on_a_client_that_reads_nothing():
    ws, client, server = await never_reading_client()
    transport = SocketTransport(ws, send_timeout=600)  # far longer than the test: the send timeout never acts
    try:
        for _ in range(200):  # more than its receive buffer holds
            assert await transport.send({"type": "response.text.delta", "delta": "y" * 1000})
        transport.ending = True  # the session's time limit: the last word goes only if there is room
        await asyncio.wait_for(transport.close(1001, "reached the session time limit", flush_s=0.5), 10)
        assert transport.stuck is None
        await eventually_async(ws.transport.is_closing, 10, "the connection cut")
    finally:
        client.close()
        server.close()
