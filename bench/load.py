"""Benchmark: many viewers at once on one server (tiny model), as a hosted
vidchat would see them: time to first token, errors, server CPU and memory.

Run: .venv/bin/python bench/load.py                      (server start ~30 s, then ~80 s)
     .venv/bin/python bench/load.py --sessions 3 --webrtc 1 --seconds 10   (a quick look)
     .venv/bin/python bench/load.py --token s3cret       (the server requires a token)

What it does, on a fresh server (app.py --model tiny --max-sessions enough):
  --sessions (16) WebSocket clients of the seed protocol, each streaming
      --size (320x240) JPEG frames at --fps (15) with pts_ms: a clip of an
      object moving across a room for 2 s, then 1 s of the still room, looped
      (each client from its own offset), so the frame filter keeps the moving
      frames and drops most still ones. Every frame is stamped with its own
      number and encoded as it is sent (~1 ms each), so no picture repeats, as
      from a camera; a looped clip would let vLLM's multimodal cache answer
      for frames it has seen (--no-unique-frames does that, for comparison).
  --webrtc (2) aiortc clients (vidchat.devtools.rtc_client) sending the same size and
      rate as live VP8, asking through the page's chat endpoint (the Gradio
      `/ask` event the page uses) with gradio_client, as tests/test_webrtc.py does.
  Every client asks a question every --ask-every (4) s, staggered across
  clients, with max_tokens --max-tokens (16) and --frames (16) sampled frames.
  A client waits for its answer before asking again (a new question would
  cancel the running one); a question that could not go out on time counts as
  `overdue`. Questions start after --warmup (5) s of streaming and are asked
  for --seconds (60); then the clients finish their answers, end their
  sessions (video.done / /webrtc/close) and disconnect.

Measured:
  ttft     time to first token as the client sees it: `video.query` sent ->
           first `response.text.delta` (WebSocket); `/ask` submitted -> first
           chat update with reply text (page). p50 and p95 over every answer.
  errors   every `error` message, every question without a complete answer
           (timeout, connection closed, cancelled, a page notice such as "⚠ …"),
           every client that failed to connect or to end its session. Must be 0.
  CPU      user+sys time of the server and its children (vLLM's engine core)
           over the question window, in % of one core; this bench's own CPU too.
  memory   RSS of the server and its children, sampled each second: the peak
           during the window (rss_mb) and the idle value before the clients.

The server's output goes to bench/results/load-server.log, the numbers to
bench/results/load.json, and the last line is:
  load: sessions=<n> p50_ttft_ms=<x> p95_ttft_ms=<y> errors=<e> rss_mb=<m> cpu_pct=<c> answers=<a> ...
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import json
import logging
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import numpy as np
import psutil
from aiortc import RTCSessionDescription
from gradio_client import Client as GradioClient
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from _server import (  # noqa: E402
    RESULTS,
    Server,
    cpu_seconds,
    fmt,
    log_problem_summary,
    percentile,
    quiet_loggers,
    rss_mb,
    start_server,
    stop_server,
    token_args,
)

from vidchat.devtools import synthetic  # noqa: E402
from vidchat.devtools.rtc_client import RtcClient, SyntheticVideo  # noqa: E402

log = logging.getLogger("load")
QUESTIONS = ["What is happening?", "Describe the scene.", "What moved just now?", "What colours do you see?"]
NOTICE_LOG = "vidchat notice"  # vidchat.doors.page.NOTICE: the page's own messages in the chat
STOPPED, NO_TEXT = "(stopped)", "(the model returned no text)"


# ---------------------------------------------------------------------------
# Frames: encoded once
# ---------------------------------------------------------------------------

class Frames:
    """The clip: 2 s of an object moving across a room, then 1 s of the still
    room (the same room), looped. Every frame sent is stamped with its own
    number (a row of black/white blocks along the bottom edge) and JPEG-encoded
    then (~1 ms at 320x240), so no two frames are the same picture, as from a
    real camera: a looped clip of identical JPEGs would let vLLM's multimodal
    caches answer from earlier frames and make the server look faster. The
    stamp changes far less than the filter's threshold, so it keeps and drops
    as it would without it. With unique=False the clip's frames are encoded
    once and sent again and again (no encoding while measuring, and vLLM's
    caches see the same pictures again)."""

    BITS = 24

    def __init__(self, width: int, height: int, fps: float, quality: int = 80, unique: bool = True):
        moving = synthetic.motion_clip(height, width, n=max(2, round(2 * fps)), seed=2).frames
        still = synthetic.static_clip(height, width, n=max(1, round(fps)), seed=2).frames  # same seed: same room
        self.base = moving + still
        self.quality = quality
        self.unique = unique
        self.block = max(1, min(8, width // self.BITS, height // 4))
        self.stamped = 0  # frames made so far, all clients together: the next stamp
        self.fixed = None if unique else [
            base64.b64encode(synthetic.encode_jpeg(f, quality)).decode("ascii") for f in self.base]

    def __len__(self) -> int:
        return len(self.base)

    def b64(self, i: int) -> str:
        """Clip frame i (looped), with a stamp no other frame carries, as base64 JPEG."""
        if self.fixed is not None:
            return self.fixed[i % len(self.fixed)]
        frame = self.base[i % len(self.base)].copy()
        bits = (self.stamped >> np.arange(self.BITS)) & 1
        self.stamped += 1
        b = self.block
        row = np.repeat(np.repeat((bits * 255).astype(np.uint8)[None, :], b, 0), b, 1)
        frame[-b:, : row.shape[1]] = row[..., None]
        return base64.b64encode(synthetic.encode_jpeg(frame, self.quality)).decode("ascii")


# ---------------------------------------------------------------------------
# One answer, as a client sees it
# ---------------------------------------------------------------------------

@dataclass
class Answer:
    door: str  # "ws" or "page"
    sent: float = field(default_factory=time.monotonic)
    first: float | None = None  # first token seen
    finished: float | None = None
    text: str = ""
    deltas: int = 0
    started: bool = False  # response.start seen
    stats: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # server `error` messages while it was pending
    failure: str | None = None  # why it did not complete
    done: asyncio.Event = field(default_factory=asyncio.Event)
    got_token: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first is None else 1000 * (self.first - self.sent)

    @property
    def ok(self) -> bool:
        return self.failure is None and not self.errors and not self.stats.get("cancelled")

    def problem(self) -> str | None:
        """Why this answer counts as an error, or None."""
        if self.failure:
            return self.failure
        if self.errors:
            return "error: " + self.errors[0]
        if self.stats.get("cancelled"):
            return "answer cancelled by the server"
        return None

    async def wait(self, timeout: float, awaited: str) -> Answer:
        """Wait up to ``timeout`` s for the answer to end; past that it fails
        as "no ``awaited`` in N s", ``awaited`` naming what would have ended it."""
        try:
            await asyncio.wait_for(self.done.wait(), timeout)
        except asyncio.TimeoutError:
            self.failure = f"no {awaited} in {timeout:.0f} s"
            self.done.set()
        return self


# ---------------------------------------------------------------------------
# The WebSocket door (seed protocol)
# ---------------------------------------------------------------------------

class WsClient:
    """One seed-protocol session: stream frames in the background, ask, finish or drop."""

    def __init__(self, server: Server, frames: Frames, fps: float, config: dict[str, Any], offset: int = 0):
        self.server, self.frames, self.fps, self.config, self.offset = server, frames, fps, config, offset
        self.ws: ClientConnection | None = None
        self.reader: asyncio.Task | None = None
        self.errors: collections.Counter[str] = collections.Counter()  # server `error` messages
        self.problems: collections.Counter[str] = collections.Counter()  # client-side failures
        self.frames_sent = self.late_frames = self.queued = 0
        self.answer: Answer | None = None
        self.session_done = asyncio.Event()
        self.evs: dict[str, Any] | None = None
        self.closing = False  # we end the connection on purpose from now on
        self.opened_at = 0.0

    async def open(self, timeout: float = 30) -> None:
        # No proxy (127.0.0.1), no pings (a loaded server must not make the client hang up), no deflate.
        self.ws = await connect(self.server.ws_url, max_size=None, proxy=None, ping_interval=None,
                                open_timeout=timeout, compression=None)
        self.opened_at = time.monotonic()
        await self.ws.send(json.dumps({"type": "session.config", **self.config}))
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.ws is not None
        try:
            async for raw in self.ws:
                if isinstance(raw, str):
                    self._handle(json.loads(raw))
        except ConnectionClosed:
            pass
        finally:
            a = self.answer
            if a is not None and not a.done.is_set():
                a.failure = a.failure or "connection closed during the answer"
                a.done.set()
            if not self.closing and not self.session_done.is_set():
                self.problems[f"connection closed by the server ({self.ws.close_code} {self.ws.close_reason})"] += 1

    def _handle(self, msg: dict[str, Any]) -> None:
        kind, a = msg.get("type"), self.answer
        pending = a is not None and not a.done.is_set()
        if kind == "response.text.delta" and pending:
            if a.first is None:
                a.first = time.monotonic()
                a.got_token.set()
            a.deltas += 1
            a.text += str(msg.get("delta", ""))
        elif kind == "response.start" and pending:
            a.started = True
        elif kind == "response.text.done" and pending:
            a.stats = msg.get("stats") or {}
            a.finished = time.monotonic()
            a.done.set()
        elif kind == "response.queued":  # a vidchat extra: waiting for a generation slot
            self.queued += 1
        elif kind == "error":
            text = str(msg.get("message"))[:160]
            self.errors[text] += 1
            if pending:
                a.errors.append(text)
                if not a.started:  # refused before it started: no response.text.done will follow
                    a.failure = "refused: " + text
                    a.done.set()
        elif kind == "session.done":
            self.session_done.set()
        elif kind == "response.evs_stats":
            self.evs = msg

    async def stream(self, stop: asyncio.Event) -> None:
        """Send frames at self.fps until `stop`; never bursts to catch up."""
        assert self.ws is not None
        period = 1.0 / self.fps
        t0, i = time.monotonic(), 0
        try:
            while not stop.is_set():
                delay = t0 + i * period - time.monotonic()
                if delay > 0:
                    try:
                        await asyncio.wait_for(stop.wait(), delay)
                        break
                    except asyncio.TimeoutError:
                        pass
                elif -delay > period:  # behind by more than a frame: skip ahead, as a camera would
                    self.late_frames += 1
                    t0 = time.monotonic() - i * period
                b64 = self.frames.b64(self.offset + self.frames_sent)
                pts = 1000.0 * (time.monotonic() - self.opened_at)
                await self.ws.send('{"type":"video.frame","pts_ms":%.1f,"data":"%s"}' % (pts, b64))
                self.frames_sent += 1
                i += 1
        except ConnectionClosed:
            pass

    async def send_question(self, text: str) -> Answer:
        assert self.ws is not None
        a = self.answer = Answer("ws")
        try:
            await self.ws.send(json.dumps({"type": "video.query", "text": text}))
        except ConnectionClosed:
            a.failure = "connection closed before the question"
            a.done.set()
        return a

    async def ask(self, text: str, timeout: float) -> Answer:
        a = await self.send_question(text)
        return await a.wait(timeout, "complete answer")

    async def finish(self, timeout: float = 15) -> None:
        """video.done, wait for session.done, close."""
        assert self.ws is not None
        self.closing = True
        try:
            await self.ws.send(json.dumps({"type": "video.done"}))
            await asyncio.wait_for(self.session_done.wait(), timeout)
        except ConnectionClosed:
            pass
        except asyncio.TimeoutError:
            pass
        if not self.session_done.is_set():
            self.problems["no session.done after video.done"] += 1
        await self.close()

    async def close(self, hard: bool = False) -> None:
        """End the connection: a close handshake, or with `hard` the TCP connection just goes away."""
        self.closing = True
        if self.ws is None:
            return
        if hard:
            self.ws.transport.abort()
        else:
            try:
                await asyncio.wait_for(self.ws.close(), 10)
            except (asyncio.TimeoutError, OSError):
                self.ws.transport.abort()
        if self.reader is not None:
            await asyncio.gather(self.reader, return_exceptions=True)


# ---------------------------------------------------------------------------
# The page's door: an aiortc peer + the page's chat endpoint through gradio_client
# ---------------------------------------------------------------------------

class TokenRtcClient(RtcClient):
    """RtcClient whose HTTP calls carry the server's token (Authorization: Bearer)."""

    def __init__(self, server: Server, *tracks):
        super().__init__(server.url, *tracks)
        self.server = server

    async def connect(self, resume: bool = False) -> str:
        for track in self.tracks:
            self.pc.addTrack(track)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        offer = {"sdp": self.pc.localDescription.sdp, "type": "offer"}
        answer = await asyncio.to_thread(self.server.http_json, "/webrtc/offer", offer, 30)
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        self.session_id = answer["session_id"]
        self.resume_token = answer.get("resume_token")
        self.resumed = answer.get("resumed")
        return self.session_id

    async def stats(self) -> dict:
        return await asyncio.to_thread(self.server.http_json, f"/webrtc/stats?session_id={self.session_id}")

    async def close(self, tell_server: bool = True) -> None:
        if tell_server and self.session_id:
            try:
                await asyncio.to_thread(self.server.http_json, "/webrtc/close", {"session_id": self.session_id})
            except OSError as exc:
                log.warning("/webrtc/close failed: %r", exc)
        await self.pc.close()


def gradio_client(server: Server):
    """A client of the page's Gradio app. With a token it also logs in to the page (with --token and no
    --auth the page's login takes the token as its password, any user name)."""
    auth = ("bench", server.token) if server.token else None
    return GradioClient(server.url + "/", verbose=False, headers=server.headers() or None, auth=auth)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return str(content.get("text") or content.get("value") or "")
    if isinstance(content, (list, tuple)):
        return "".join(_content_text(c) for c in content)
    return ""


def _last_reply(output: Any) -> tuple[str, bool] | None:
    """(text, is_page_notice) of the chat's last assistant message in one /ask output, or None."""
    try:
        history = output[0]
        msg = history[-1]
    except (TypeError, IndexError, KeyError):
        return None
    if not isinstance(msg, dict) or msg.get("role") != "assistant":
        return None
    notice = (msg.get("metadata") or {}).get("log") == NOTICE_LOG
    return _content_text(msg.get("content")), notice


class PageClient:
    """A browser tab without a browser: WebRTC media + questions through `/ask`."""

    def __init__(self, server: Server, width: int, height: int, fps: float, gradio=None):
        self.server = server
        self.rtc = TokenRtcClient(server, SyntheticVideo(width, height, fps))
        self.gradio = gradio
        self.problems: collections.Counter[str] = collections.Counter()

    async def open(self, min_frames: int = 3, timeout: float = 30) -> None:
        if self.gradio is None:
            self.gradio = await asyncio.to_thread(gradio_client, self.server)
        await self.rtc.connect()
        deadline = time.monotonic() + timeout
        while True:  # questions before the first frames would only get "the camera isn't running"
            try:
                if (await self.rtc.stats()).get("frames_received", 0) >= min_frames:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {min_frames} frames over WebRTC in {timeout:.0f} s")
            await asyncio.sleep(0.1)

    def submit(self, text: str, *, k: int, max_tokens: int, temperature: float):
        # The page's inputs in respond()'s order: question, history, session id, then the settings panel
        # (frames, sampling, window s, filter on, threshold, max frames, frames_as, audio, max tokens,
        # temperature, seed).
        return self.gradio.submit(text, [], self.rtc.session_id, k, "uniform", 10, True, 0.95, 64, "images", True,
                                  max_tokens, temperature, "", api_name="/ask")

    async def ask(self, text: str, *, k: int, max_tokens: int, temperature: float, timeout: float,
                  until_first_token: bool = False) -> tuple[Answer, Any]:
        """Ask through /ask; returns (answer, gradio job). With `until_first_token` it returns as soon
        as reply text shows (the job still runs), else when the job is done."""
        a = Answer("page")
        job = await asyncio.to_thread(self.submit, text, k=k, max_tokens=max_tokens, temperature=temperature)
        a.sent = time.monotonic()  # gradio_client queues the request in its own thread: count from here
        await asyncio.to_thread(watch_job, job, a, timeout, until_first_token)
        return a, job


def watch_job(job, a: Answer, timeout: float, until_first_token: bool = False) -> None:
    """Follow a gradio /ask job from a worker thread: first reply text, then the final outcome."""
    deadline = a.sent + timeout
    while True:
        outs = job.outputs()
        if a.first is None and outs:
            reply = _last_reply(outs[-1])
            if reply and reply[0] and not reply[1]:
                a.first = time.monotonic()
                if until_first_token:
                    return
        if job.done():
            break
        if time.monotonic() > deadline:
            a.failure = f"no complete answer in {timeout:.0f} s"
            return
        time.sleep(0.005)
    a.finished = time.monotonic()
    try:
        job.result(timeout=0)
    except Exception as exc:  # noqa: BLE001 - any failure of the event is the answer's failure
        a.failure = f"/ask failed: {exc!r}"[:160]
        return
    outs = job.outputs()
    final = outs[-1] if outs else None
    reply = _last_reply(final) if final is not None else None
    if reply is None:
        a.failure = "/ask returned no reply"
        return
    text, notice = reply
    if isinstance(final, (list, tuple)) and len(final) > 2 and isinstance(final[2], dict):
        a.stats = final[2]
    if not notice:
        a.text = text
    elif text == STOPPED:
        a.stats["cancelled"] = True
    elif text != NO_TEXT:  # "⚠ …", "The camera isn't running yet", settings refused
        a.failure = "page notice: " + text[:140]


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------

@dataclass
class Tally:
    answers: list[Answer] = field(default_factory=list)
    problems: collections.Counter[str] = field(default_factory=collections.Counter)
    overdue: int = 0


async def asker(name: str, ask, tally: Tally, start_at: float, end_at: float, every: float) -> None:
    """Ask at start_at, start_at + every, … until end_at; each waits for the previous answer."""
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    next_at, i = start_at, 0
    while time.monotonic() < end_at:
        a = await ask(QUESTIONS[i % len(QUESTIONS)])
        i += 1
        tally.answers.append(a)
        if a.problem():
            log.warning("%s: question %d: %s", name, i, a.problem())
        next_at += every
        now = time.monotonic()
        if next_at < now:
            tally.overdue += 1
            next_at = now
        if next_at >= end_at:
            break
        await asyncio.sleep(next_at - now)


async def ask_while_streaming(client: Any, door: str, connect: Callable[[], Awaitable[Any]], name: str,
                              ask: Callable[[str], Awaitable[Answer]], end: Callable[[], Awaitable[None]],
                              args: argparse.Namespace, tally: Tally, start_at: float, end_at: float) -> None:
    """One streaming client's run: ``connect`` (a failure counts against
    ``door``), then its frames in the background while :func:`asker` asks,
    then ``end`` the session."""
    try:
        await connect()
    except Exception as exc:  # noqa: BLE001
        tally.problems[f"{door} connect failed: {exc!r}"[:160]] += 1
        return
    stop = asyncio.Event()
    sender = asyncio.create_task(client.stream(stop))
    try:
        await asker(name, ask, tally, start_at, end_at, args.ask_every)
    finally:
        stop.set()
        await sender
        await end()


async def run_ws(idx: int, c: WsClient, args: argparse.Namespace, tally: Tally, start_at: float,
                 end_at: float) -> WsClient:
    async def end() -> None:
        await c.finish()
        tally.problems.update(c.problems)

    await ask_while_streaming(c, "WebSocket", c.open, f"ws{idx}", lambda q: c.ask(q, args.answer_timeout), end,
                              args, tally, start_at, end_at)
    return c


async def run_page(idx: int, server: Server, args: argparse.Namespace, tally: Tally,
                   start_at: float, end_at: float) -> PageClient | None:
    p = PageClient(server, args.width, args.height, args.fps)
    try:
        await p.open()
    except Exception as exc:  # noqa: BLE001
        tally.problems[f"WebRTC connect failed: {exc!r}"[:160]] += 1
        await p.rtc.close()
        return None

    async def ask(q: str) -> Answer:
        a, _ = await p.ask(q, k=args.frames, max_tokens=args.max_tokens, temperature=0.7,
                           timeout=args.answer_timeout)
        return a

    try:
        await asker(f"page{idx}", ask, tally, start_at, end_at, args.ask_every)
    finally:
        await p.rtc.close(tell_server=True)
    return p


async def sample_rss(proc: psutil.Process, out: list[float], stop: asyncio.Event, every: float = 1.0) -> None:
    while not stop.is_set():
        out.append(await asyncio.to_thread(rss_mb, proc))
        try:
            await asyncio.wait_for(stop.wait(), every)
        except asyncio.TimeoutError:
            pass


async def measure(args: argparse.Namespace, server: Server, frames: Frames) -> dict[str, Any]:
    proc = server.process
    rss_idle = rss_mb(proc)
    log.info("server idle: RSS %.0f MB (with children)", rss_idle)
    n_ws, n_rtc = args.sessions, args.webrtc
    total = n_ws + n_rtc
    t_start = time.monotonic() + args.warmup + 2.0  # connecting takes a moment too
    t_end = t_start + args.seconds
    ws_tally, page_tally = Tally(), Tally()
    # Each client's first question at its own offset within one --ask-every period.
    offsets = [args.ask_every * i / max(total, 1) for i in range(total)]
    config = {"max_tokens": args.max_tokens, "num_sample_frames": args.frames, "max_frames": 64}
    ws_clients = [WsClient(server, frames, args.fps, config, offset=i * 7) for i in range(n_ws)]
    tasks = [asyncio.create_task(run_ws(i, c, args, ws_tally, t_start + offsets[i], t_end))
             for i, c in enumerate(ws_clients)]
    tasks += [asyncio.create_task(run_page(i, server, args, page_tally, t_start + offsets[n_ws + i], t_end))
              for i in range(n_rtc)]
    log.info("%d WebSocket + %d WebRTC clients connecting; questions from %.0f s to %.0f s",
             n_ws, n_rtc, args.warmup + 2, args.warmup + 2 + args.seconds)

    await asyncio.sleep(max(0.0, t_start - time.monotonic()))
    try:
        health0 = await asyncio.to_thread(server.health)
    except OSError as exc:
        health0 = {"error": repr(exc)}
    me = psutil.Process()
    sent0 = sum(c.frames_sent for c in ws_clients)
    cpu0, me0, w0 = cpu_seconds(proc), sum(me.cpu_times()[:2]), time.monotonic()
    rss: list[float] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_rss(proc, rss, stop))
    await asyncio.sleep(max(0.0, t_end - time.monotonic()))
    dt = time.monotonic() - w0
    frames_sent = sum(c.frames_sent for c in ws_clients) - sent0
    server_pct, bench_pct = 100 * (cpu_seconds(proc) - cpu0) / dt, 100 * (sum(me.cpu_times()[:2]) - me0) / dt
    stop.set()
    await sampler
    log.info("window over (%.0f s): waiting for the last answers and closing the clients", dt)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    crashed = [f"client crashed: {r!r}"[:160] for r in results if isinstance(r, BaseException)]

    # Every session ended: the server should be back to none, with nothing generating.
    health1: dict[str, Any] = {}
    for _ in range(50):
        health1 = await asyncio.to_thread(server.health)
        if not health1.get("sessions") and not health1.get("running_requests"):
            break
        await asyncio.sleep(0.2)

    answers = ws_tally.answers + page_tally.answers
    problems = ws_tally.problems + page_tally.problems + collections.Counter(crashed)
    for a in answers:
        if a.problem():
            problems[a.problem()[:160]] += 1
    server_errors = sum((c.errors for c in ws_clients), collections.Counter())
    # Server `error` messages outside an answer (frames refused, …) count too; those inside one are
    # already in that answer's problem.
    in_answers = collections.Counter(e for a in answers for e in a.errors[:1])
    for text, n in (server_errors - in_answers).items():
        problems["error: " + text] += n

    def ttfts(xs: list[Answer]) -> list[float]:
        return [a.ttft_ms for a in xs if a.ttft_ms is not None and a.ok]

    all_ttft, ws_ttft, page_ttft = ttfts(answers), ttfts(ws_tally.answers), ttfts(page_tally.answers)
    evs = [c.evs for c in ws_clients if c.evs]
    kept, seen = sum(e["retained_count"] for e in evs), sum(e["total_count"] for e in evs)
    answer_s = [a.finished - a.sent for a in answers if a.ok and a.finished]
    return {
        "sessions": n_ws, "webrtc_sessions": n_rtc, "seconds": round(dt, 1),
        "questions": len(answers), "answers": sum(1 for a in answers if a.ok),
        "empty_answers": sum(1 for a in answers if a.ok and not (a.text or a.deltas)),
        "overdue_questions": ws_tally.overdue + page_tally.overdue,
        "queued_events": sum(c.queued for c in ws_clients),
        "errors": sum(problems.values()), "error_kinds": dict(problems.most_common()),
        "ttft_ms": {"p50": percentile(all_ttft, 50), "p95": percentile(all_ttft, 95),
                    "max": max(all_ttft, default=None), "n": len(all_ttft)},
        "ws_ttft_ms": {"p50": percentile(ws_ttft, 50), "p95": percentile(ws_ttft, 95), "n": len(ws_ttft)},
        "page_ttft_ms": {"p50": percentile(page_ttft, 50), "p95": percentile(page_ttft, 95), "n": len(page_ttft)},
        "answer_s_median": round(statistics.median(answer_s), 2) if answer_s else None,
        "server_tokens": sum(int(a.stats.get("completion_tokens") or 0) for a in answers if a.ok),
        "ws_frames_s": round(frames_sent / dt, 1),
        "ws_late_frames": sum(c.late_frames for c in ws_clients),
        "evs_kept_pct": round(100 * kept / max(1, seen), 1) if evs else None,
        "server_cpu_pct": round(server_pct), "bench_cpu_pct": round(bench_pct),
        "rss_idle_mb": round(rss_idle), "rss_peak_mb": round(max(rss, default=rss_idle)),
        "rss_end_of_window_mb": round(rss[-1]) if rss else None,
        "health_at_start": {k: health0.get(k) for k in ("sessions", "sessions_by_kind", "running_requests")},
        "health_after": {k: health1.get(k) for k in ("sessions", "running_requests")},
        "cpus": psutil.cpu_count(), "load_average": [round(x, 1) for x in os.getloadavg()], "args": vars(args),
    }


def report(r: dict[str, Any], server: Server) -> str:
    t, wt, pt = r["ttft_ms"], r["ws_ttft_ms"], r["page_ttft_ms"]
    log.info("clients          : %d WebSocket + %d WebRTC, questions for %.0f s", r["sessions"],
             r["webrtc_sessions"], r["seconds"])
    log.info("questions        : %d asked, %d answered (%d empty), %d overdue, %d queued events; median %s s to "
             "the last token", r["questions"], r["answers"], r["empty_answers"], r["overdue_questions"],
             r["queued_events"], fmt(r["answer_s_median"], ".2f"))
    log.info("time to 1st token: all p50 %s / p95 %s / max %s ms (n=%d); WebSocket p50 %s / p95 %s ms; "
             "page p50 %s / p95 %s ms", fmt(t["p50"]), fmt(t["p95"]), fmt(t["max"]), t["n"], fmt(wt["p50"]),
             fmt(wt["p95"]), fmt(pt["p50"]), fmt(pt["p95"]))
    log.info("frames           : %.1f/s sent over WebSocket (%d late), filter kept %s %%", r["ws_frames_s"],
             r["ws_late_frames"], fmt(r["evs_kept_pct"], ".1f"))
    log.info("server           : CPU %d%% of a core (this bench %d%%; %d CPUs, load %s), RSS idle %d MB, "
             "peak %d MB", r["server_cpu_pct"], r["bench_cpu_pct"], r["cpus"], r["load_average"],
             r["rss_idle_mb"], r["rss_peak_mb"])
    log.info("after the run    : %s", r["health_after"])
    for text, n in r["error_kinds"].items():
        log.warning("error            : %d x %s", n, text)
    log_problem_summary(server, log)
    return (f"load: sessions={r['sessions']} p50_ttft_ms={fmt(t['p50'])} p95_ttft_ms={fmt(t['p95'])} "
            f"errors={r['errors']} rss_mb={r['rss_peak_mb']} cpu_pct={r['server_cpu_pct']} "
            f"answers={r['answers']} webrtc_sessions={r['webrtc_sessions']} rss_idle_mb={r['rss_idle_mb']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, default=16, help="WebSocket sessions (default 16)")
    p.add_argument("--webrtc", type=int, default=2, help="WebRTC clients asking through the page's /ask (default 2)")
    p.add_argument("--fps", type=float, default=15.0, help="frames per second per client (default 15)")
    p.add_argument("--size", default="320x240", help="frame size WxH (default 320x240)")
    p.add_argument("--seconds", type=float, default=60.0, help="seconds of questions (default 60)")
    p.add_argument("--warmup", type=float, default=5.0,
                   help="seconds of streaming before the first question (default 5)")
    p.add_argument("--ask-every", type=float, default=4.0, help="seconds between a client's questions (default 4)")
    p.add_argument("--max-tokens", type=int, default=16, help="max_tokens per answer (default 16)")
    p.add_argument("--frames", type=int, default=16, help="frames sampled per question (default 16)")
    p.add_argument("--answer-timeout", type=float, default=60.0, help="seconds an answer may take (default 60)")
    p.add_argument("--unique-frames", action=argparse.BooleanOptionalAction, default=True,
                   help="stamp and encode every frame sent, so none repeats, as from a camera (default on); "
                   "--no-unique-frames loops a clip encoded once")
    token_args(p)
    args = p.parse_args(argv)
    try:
        args.width, args.height = (int(x) for x in args.size.lower().split("x"))
    except ValueError:
        p.error("--size must be WxH, e.g. 320x240")
    if args.sessions < 0 or args.webrtc < 0 or args.sessions + args.webrtc == 0:
        p.error("need at least one client")
    if args.fps <= 0 or args.seconds <= 0 or args.ask_every <= 0 or args.max_tokens < 1 or args.frames < 1:
        p.error("--fps, --seconds, --ask-every, --max-tokens and --frames must be positive")
    return args


def main() -> int:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    quiet_loggers()
    RESULTS.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    frames = Frames(args.width, args.height, args.fps, unique=args.unique_frames)
    log.info("clip: %d frames of %dx%d (about %.0f KB as JPEG), made in %.1f s", len(frames), args.width,
             args.height, len(frames.b64(0)) * 0.75 / 1024, time.monotonic() - t0)
    max_sessions = max(64, 2 * (args.sessions + args.webrtc))
    server = start_server(RESULTS / "load-server.log", ["--max-sessions", str(max_sessions), *args.server_arg],
                          token=args.token)
    log.info("server ready at %s (pid %d)", server.url, server.proc.pid)
    try:
        result = asyncio.run(measure(args, server, frames))
    finally:
        stop_server(server)
    line = report(result, server)
    result["args"].pop("token", None)
    (RESULTS / "load.json").write_text(json.dumps(result, indent=2) + "\n")
    print(line, flush=True)
    return 0 if result["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
