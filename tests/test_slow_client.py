"""A socket client that never reads, against the real server (real vLLM on
the tiny model): it must not hold its session, its place or the server's
reaper. Beside it another client's frames are acked, its question answered
and its --session-time-limit enforced; the one that reads nothing is closed
once it has stayed full for --ws-send-timeout (issue 43, item 1).

The client the issue made (issue 57, point 1: the `websockets` library,
max_queue=1, a 4 KB receive buffer, frames in a loop, nothing read), on both
socket doors: closed after --ws-send-timeout although the kernel takes every
ack the server sends it, and ended at --session-time-limit when the send
timeout is longer; and frames over --ws-max-fps acked with reason "rate"."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
import time

import psutil
import pytest
import websockets
import websockets.asyncio.client
from conftest import SERVER_ARGS, TINY_SERVER_ARGS, eventually_async
from websockets.client import ClientProtocol
from websockets.uri import parse_uri

from vidchat.devtools import synthetic
from vidchat.devtools.harness import start_server, stop_server

pytestmark = pytest.mark.engine

SEND_TIMEOUT_S = 3
TIME_LIMIT_S = 20
FRAME = base64.b64encode(synthetic.encode_jpeg(synthetic.static_clip(48, 64, n=1).frames[0])).decode()


@pytest.fixture(scope="module")
def slow_server(tiny_vllm_serve, artifacts_dir):
    # A long idle timeout: only the send timeout may end the client that reads nothing.
    # The model is the suite's shared `vllm serve`: what is tested is the socket, not the engine.
    args = [*TINY_SERVER_ARGS, "--engine-url", tiny_vllm_serve, *SERVER_ARGS, "--ws-idle-timeout", "120", "--ws-send-timeout", str(SEND_TIMEOUT_S),
            "--session-time-limit", str(TIME_LIMIT_S)]
    srv = start_server(args, artifacts_dir / "server-slow-client.log")
    yield srv
    stop_server(srv)


class NeverReads:
    """A WebSocket client with a 4 KB receive buffer that sends frames, each
    asking for an ack, and never reads one."""

    def __init__(self, url: str) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        uri = parse_uri(url)
        self.sock.connect((uri.host, uri.port))
        self.protocol = ClientProtocol(uri)
        self.protocol.send_request(self.protocol.connect())
        self._flush()
        while self.protocol.handshake_exc is None and not self.protocol.events_received():
            self.protocol.receive_data(self.sock.recv(4096))  # the 101 response: the last read
        self.cut = threading.Event()  # the server closed the connection
        self.sent = 0

    def _flush(self) -> None:
        self.sock.sendall(b"".join(self.protocol.data_to_send()))

    def send(self, msg: dict) -> None:
        self.protocol.send_text(json.dumps(msg).encode())
        self._flush()

    def send_frames_until_cut(self, within: float) -> None:
        deadline = time.monotonic() + within
        try:
            while time.monotonic() < deadline:
                self.send({"type": "video.frame", "data": FRAME, "frame_id": self.sent})
                self.sent += 1
        except OSError:  # reset or broken pipe: the server cut the connection
            self.cut.set()

    def close(self) -> None:
        self.sock.close()


async def recv(ws, timeout: float = 30.0) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def sessions_are(srv, count: int) -> bool:
    health = await asyncio.to_thread(srv.get_json, "/api/health")
    return health["sessions_by_kind"].get("ws", 0) == count


async def test_a_client_that_never_reads_is_closed_and_holds_nobody_up(slow_server):
    stuck = NeverReads(slow_server.ws_url)
    stuck.send({"type": "session.config"})
    blast_started = time.monotonic()
    blaster = threading.Thread(target=stuck.send_frames_until_cut, args=(SEND_TIMEOUT_S + 30,), daemon=True)
    blaster.start()
    try:
        ws = await websockets.connect(slow_server.ws_url, max_size=None)
        opened = time.monotonic()
        await ws.send(json.dumps({"type": "session.config", "max_tokens": 6, "temperature": 0}))
        moving = [base64.b64encode(j).decode() for j in synthetic.cuts_clip(120, 160, cuts=6, hold=1).jpegs()]
        for n, data in enumerate(moving):
            await ws.send(json.dumps({"type": "video.frame", "data": data, "frame_id": f"f{n}"}))
            ack = await recv(ws)
            assert ack["type"] == "video.frame.ack" and ack["frame_id"] == f"f{n}", ack
        await ws.send(json.dumps({"type": "video.query", "text": "What is happening?"}))
        kinds = []
        while not kinds or kinds[-1] != "response.text.done":
            kinds.append((await recv(ws))["type"])
        assert kinds[0] == "response.start" and set(kinds[1:-1]) <= {"response.text.delta", "video.frames.consumed"}, kinds

        # The stuck one is cut, and its place given back, within the send timeout and a few seconds.
        await asyncio.to_thread(stuck.cut.wait, SEND_TIMEOUT_S + 20)
        assert stuck.cut.is_set(), f"still connected after {time.monotonic() - blast_started:.1f} s, " \
                                   f"{stuck.sent} frames sent"
        await eventually_async(lambda: sessions_are(slow_server, 1), 10, "only the client that reads is left")
        assert "--ws-send-timeout" in slow_server.log()

        # The reader's time limit is still enforced: the reaper was never held up.
        messages = []
        with pytest.raises(websockets.ConnectionClosed):
            while True:
                messages.append(await recv(ws, timeout=TIME_LIMIT_S + 15))
        ended = time.monotonic() - opened
        kinds = [m["type"] for m in messages]
        assert kinds[-1] == "error" and "time limit" in messages[-1]["message"], messages
        assert ended <= TIME_LIMIT_S + 8, ended
        await eventually_async(lambda: sessions_are(slow_server, 0), 10, "no session left")
    finally:
        stuck.close()
        blaster.join(timeout=10)


# ---- the reviewer's client (issue 57, point 1), on both socket doors --------------------------

TINY_JPEG = base64.b64encode(synthetic.encode_jpeg(synthetic.static_clip(16, 16, n=1).frames[0])).decode()
DOORS = {
    # door: (its path, what opens its session, one frame as it sends them)
    "ws": ("/v1/video/chat/stream", {"type": "session.config"},
           lambda n: {"type": "video.frame", "data": TINY_JPEG, "frame_id": n}),
    "realtime": ("/v1/realtime?model=tiny", None,
                 lambda n: {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
                     {"type": "input_image", "image_url": "data:image/jpeg;base64," + TINY_JPEG}]}}),
}


async def flood_never_reading(srv, door: str, within: float) -> tuple[int, int, bool]:
    """The client as the issue made it: the `websockets` library with
    max_queue=1 and ping_interval=None, over a socket with a 4 KB receive
    buffer, sending frames in a loop and reading nothing. (its local port,
    frames sent, whether the server ended the connection within ``within`` s)."""
    path, opening, frame = DOORS[door]
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", srv.port))
    port = sock.getsockname()[1]
    ws = await websockets.asyncio.client.connect(f"ws://127.0.0.1:{srv.port}{path}", max_queue=1,
                                                 ping_interval=None, sock=sock)
    sent = 0

    async def flood() -> None:
        nonlocal sent
        if opening is not None:
            await ws.send(json.dumps(opening))
        while True:
            await ws.send(json.dumps(frame(sent)))
            sent += 1

    try:
        await asyncio.wait_for(flood(), within)
    except websockets.ConnectionClosed:
        return port, sent, True
    except asyncio.TimeoutError:
        return port, sent, False
    finally:
        ws.transport.abort()
    raise AssertionError("unreachable")


async def sessions_of(srv, kind: str) -> int:
    health = await asyncio.to_thread(srv.get_json, "/api/health")
    return health["sessions_by_kind"].get(kind, 0)


@pytest.mark.parametrize("door", DOORS)
async def test_a_flooding_client_that_never_reads_is_closed_after_the_send_timeout(slow_server, door):
    # Within its time limit: only the send timeout may end it (the log says which did). Such a
    # client soon stops sending too (its full receive buffer makes its TCP drop the server's
    # acknowledgements): nothing then arrives that the server would answer, and the server
    # must notice without a send of its own (it once waited for the time limit to do it).
    ended_by = {reason: slow_server.log().count(reason) for reason in (SENT_NOTHING_CLOSE, TIME_LIMIT_CLOSE)}
    port, sent, ended = await flood_never_reading(slow_server, door, TIME_LIMIT_S + 15)
    assert ended, f"{sent} frames sent and never closed"
    assert f"{door} 127.0.0.1:{port}: closing with 1008: the client read nothing for {SEND_TIMEOUT_S:g} s " \
           f"(--ws-send-timeout)" in slow_server.log(), slow_server.log()[-3000:]
    await eventually_async(lambda: _no_sessions(slow_server, door), 10, f"its {door} session closed")
    log_text = slow_server.log()
    assert log_text.count(SENT_NOTHING_CLOSE) == ended_by[SENT_NOTHING_CLOSE] + 1, log_text[-3000:]
    assert log_text.count(TIME_LIMIT_CLOSE) == ended_by[TIME_LIMIT_CLOSE], "ended by its time limit, not the send timeout"


# The registry's line as a session closes, by why it closed.
SENT_NOTHING_CLOSE = f"the client read nothing for {SEND_TIMEOUT_S:g} s (--ws-send-timeout), "
TIME_LIMIT_CLOSE = "reached the session time limit"


async def _no_sessions(srv, kind: str) -> bool:
    return await sessions_of(srv, kind) == 0


async def test_frames_over_max_fps_are_acked_rate_and_the_rest_taken(slow_server):
    ws = await websockets.connect(slow_server.ws_url, max_size=None)
    try:
        await ws.send(json.dumps({"type": "session.config"}))
        count = 200  # sent at once: far more than a second's worth at the default 60 a second
        for n in range(count):
            await ws.send(json.dumps({"type": "video.frame", "data": TINY_JPEG, "frame_id": n}))
        messages = [await recv(ws) for _ in range(count)]
    finally:
        await ws.close()
    assert all(m["type"] == "video.frame.ack" for m in messages), [m for m in messages if m["type"] != "video.frame.ack"]
    reasons = [m.get("reason") for m in messages]
    assert "rate" in reasons and reasons[0] is None, reasons  # the first are taken (kept or filtered), the excess not
    assert all(not m["accepted"] for m in messages if m.get("reason") == "rate")
    assert sum(r != "rate" for r in reasons) < count


@pytest.fixture(scope="module")
def limit_server(tiny_omni_path, artifacts_dir):
    """A send timeout far past the time limit: the limit is what must end a client that reads nothing.
    No model runs: a socket session is a session while the model loads, and this one never
    finishes loading (its --engine-url takes the connection and never answers)."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(8)
    args = ["--model", str(tiny_omni_path), "--engine-url", f"http://127.0.0.1:{held.getsockname()[1]}",
            "--engine-connect-timeout", "600", *SERVER_ARGS, "--ws-idle-timeout", "300", "--ws-send-timeout", "300",
            "--session-time-limit", str(SHORT_LIMIT_S)]
    srv = start_server(args, artifacts_dir / "server-time-limit.log", loaded=False)
    try:
        yield srv
    finally:
        held.close()  # the held request fails, so the load ends and the server stops at once
        stop_server(srv)


SHORT_LIMIT_S = 6


@pytest.mark.parametrize("door", DOORS)
async def test_a_flooding_client_that_never_reads_is_ended_at_its_time_limit(limit_server, door):
    port, sent, ended = await flood_never_reading(limit_server, door, SHORT_LIMIT_S + 60)
    assert ended, f"{sent} frames sent and never closed"
    log_text = limit_server.log()
    assert f"{door} 127.0.0.1:{port}: error sent: Session ended: reached the session time limit" in log_text, \
        log_text[-3000:]
    assert f"{door} 127.0.0.1:{port}: closing with 1008" not in log_text  # not the send timeout
    await eventually_async(lambda: _no_sessions(limit_server, door), 10, f"its {door} session closed")


async def test_a_client_that_stops_sending_and_never_reads_is_closed_after_the_send_timeout(slow_server):
    """A client that sends a burst of frames, then neither reads nor sends
    (what a never-reading flood comes to once its own TCP stalls): nothing
    arrives that the server would answer, so no send of the server's looks
    at the client, and it was left open until its time limit. The server
    sees on its own that its acks stay unread, and closes it after
    --ws-send-timeout, well within the limit."""
    ended_by = {reason: slow_server.log().count(reason) for reason in (SENT_NOTHING_CLOSE, TIME_LIMIT_CLOSE)}
    path, opening, frame = DOORS["ws"]
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", slow_server.port))
    ws = await websockets.asyncio.client.connect(f"ws://127.0.0.1:{slow_server.port}{path}", max_queue=1,
                                                 ping_interval=None, sock=sock)
    try:
        await ws.send(json.dumps(opening))
        for n in range(500):  # each asks for an ack: far more than a 4 KB buffer holds
            await ws.send(json.dumps(frame(n)))

        def closed_for_reading_nothing() -> bool:
            return slow_server.log().count(SENT_NOTHING_CLOSE) == ended_by[SENT_NOTHING_CLOSE] + 1

        await eventually_async(closed_for_reading_nothing, TIME_LIMIT_S + 10, "closed for reading nothing")
        # Cut with a reset: the server's end of the connection is gone at once, not left
        # sending a FIN behind the acks the client never read (it stayed for minutes).
        client_port = sock.getsockname()[1]

        def server_end_gone() -> bool:
            return not any(c.laddr and c.laddr.port == slow_server.port and c.raddr and c.raddr.port == client_port
                           for c in psutil.net_connections(kind="tcp"))

        await eventually_async(server_end_gone, 10, "the server's end of the connection closed")
    finally:
        ws.transport.abort()
    await eventually_async(lambda: _no_sessions(slow_server, "ws"), 10, "its session closed")
    assert slow_server.log().count(TIME_LIMIT_CLOSE) == ended_by[TIME_LIMIT_CLOSE], "ended by its time limit"
