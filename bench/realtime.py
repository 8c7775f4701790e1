"""Benchmark: the OpenAI Realtime door (/v1/realtime) with the official SDK
as its clients, beside the seed protocol in the same run on the same server.

Run: .venv/bin/python bench/realtime.py                   (server start ~30 s, then ~60 s)
     .venv/bin/python bench/realtime.py --sessions 2 --seed-sessions 1 --seconds 10   (a quick look)

What it does, on a fresh server (app.py --model tiny, bench/_server.py):
  --sessions (8) SDK clients (``AsyncOpenAI(base_url=…/v1).realtime.connect``)
      each stream --size (320x240) JPEG frames at --fps (5) as input_image
      items (with pts_ms), frames of bench/load.py's clip, each stamped so no
      picture repeats; every --ask-every (4) s, staggered, each adds an
      input_text item and sends response.create (max_output_tokens
      --max-tokens), waiting for its response.done before asking again.
  --seed-sessions (2) seed-protocol clients (bench/load.py's WsClient) do the
      same at the same time over /v1/video/chat/stream: the ratio of the two
      doors' first-token times is what the adapter costs.
  Questions start after --warmup (3) s and are asked for --seconds (30).

Measured: time to first token as the client sees it (response.create sent ->
first response.output_text.delta; video.query -> first response.text.delta),
p50 and p95; errors: every `error` event, every response not completed
(cancelled, failed, timed out), every client that failed to connect. The
numbers go to bench/results/realtime.json; the last line is
  realtime: sessions=<n> p50_ttft_ms=<x> p95_ttft_ms=<y> seed_p50_ttft_ms=<z> errors=<e>
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

# Imported here, not lazily by the first `api.realtime`: a lazy import on the event loop while a worker thread
# imports gradio_client raced in CI ("partially initialized module 'httpx'").
import openai.resources.realtime  # noqa: E402,F401
from _server import RESULTS, fmt, percentile, quiet_loggers, start_server, stop_server  # noqa: E402
from load import Answer, Frames, Tally, WsClient, ask_while_streaming, run_ws  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

log = logging.getLogger("bench.realtime")


class RealtimeClient:
    """One SDK session: frames as input_image items in the background, questions as text items + response.create."""

    def __init__(self, url: str, frames: Frames, fps: float, offset: int, token: str | None) -> None:
        self.url, self.frames, self.fps, self.offset, self.token = url, frames, fps, offset, token
        self.manager: Any = None
        self.conn: Any = None
        self.answer: Answer | None = None
        self.errors: collections.Counter[str] = collections.Counter()
        self.frames_sent = self.filtered = 0
        self.opened_at = 0.0
        self.reader: asyncio.Task | None = None

    async def open(self, settings: dict[str, Any]) -> None:
        api = AsyncOpenAI(base_url=f"{self.url}/v1", api_key=self.token or "none")
        self.manager = api.realtime.connect(model="tiny")
        self.conn = await self.manager.enter()
        self.opened_at = time.monotonic()
        await self.conn.send({"type": "session.update", "session": {"type": "realtime", "vidchat": settings}})
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for event in self.conn:
                self._handle(event)
        except Exception as exc:  # noqa: BLE001 - the connection ended
            if self.answer is not None and not self.answer.done.is_set():
                self.answer.failure = f"connection ended: {exc!r}"[:160]
                self.answer.done.set()

    def _handle(self, event: Any) -> None:
        a = self.answer
        pending = a is not None and not a.done.is_set()
        if event.type == "response.output_text.delta" and pending:
            if a.first is None:
                a.first = time.monotonic()
            a.deltas += 1
        elif event.type == "response.done" and pending:
            a.stats = dict(getattr(event, "vidchat", None) or {})
            if event.response.status not in ("completed", "incomplete"):
                a.failure = f"response {event.response.status}"
            a.finished = time.monotonic()
            a.done.set()
        elif event.type == "conversation.item.added":
            extra = getattr(event, "vidchat", None) or {}
            self.filtered += sum(not f["accepted"] for f in extra.get("frames", []))
        elif event.type == "error":
            self.errors[event.error.code or event.error.message[:80]] += 1
            if pending:
                a.errors.append(event.error.message)

    async def stream(self, stop: asyncio.Event) -> None:
        """Frames at self.fps until ``stop`` (a late frame is skipped, as a camera would)."""
        period, t0 = 1.0 / self.fps, time.monotonic()
        while not stop.is_set():
            b64 = self.frames.b64(self.offset + self.frames_sent)
            pts = round(1000 * (time.monotonic() - self.opened_at))
            await self.conn.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user",
                "content": [{"type": "input_image", "image_url": "data:image/jpeg;base64," + b64, "pts_ms": pts}]}})
            self.frames_sent += 1
            delay = t0 + self.frames_sent * period - time.monotonic()
            try:
                await asyncio.wait_for(stop.wait(), max(delay, 0.0))
            except asyncio.TimeoutError:
                pass

    async def ask(self, text: str, max_tokens: int, timeout: float) -> Answer:
        a = self.answer = Answer("realtime")
        await self.conn.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
        a.sent = time.monotonic()
        await self.conn.send({"type": "response.create", "response": {"max_output_tokens": max_tokens}})
        return await a.wait(timeout, "response.done")

    async def close(self) -> None:
        if self.manager is not None:
            await self.manager.__aexit__(None, None, None)
        if self.reader is not None:
            await asyncio.gather(self.reader, return_exceptions=True)


async def run_realtime(i: int, c: RealtimeClient, args: argparse.Namespace, tally: Tally, start_at: float,
                       end_at: float) -> RealtimeClient:
    await ask_while_streaming(c, "realtime", lambda: c.open({"num_sample_frames": args.frames, "temperature": 0.7}),
                              f"rt{i}", lambda q: c.ask(q, args.max_tokens, args.answer_timeout), c.close, args,
                              tally, start_at, end_at)
    return c


async def measure(args: argparse.Namespace, url: str, server: Any) -> dict[str, Any]:
    frames = Frames(args.width, args.height, args.fps)
    rt_tally, seed_tally = Tally(), Tally()
    now = time.monotonic()
    start_at = now + args.warmup
    end_at = start_at + args.seconds
    n = args.sessions + args.seed_sessions
    stagger = args.ask_every / max(1, n)
    rt_clients = [RealtimeClient(url, frames, args.fps, i * 7, args.token) for i in range(args.sessions)]
    seed_config = {"num_sample_frames": args.frames, "max_tokens": args.max_tokens, "temperature": 0.7}
    seed_clients = [WsClient(server, frames, args.fps, seed_config, offset=1000 + i * 7)
                    for i in range(args.seed_sessions)]
    await asyncio.gather(
        *[run_realtime(i, c, args, rt_tally, start_at + i * stagger, end_at) for i, c in enumerate(rt_clients)],
        *[run_ws(i, c, args, seed_tally, start_at + (args.sessions + i) * stagger, end_at)
          for i, c in enumerate(seed_clients)])

    def ttfts(tally: Tally) -> list[float]:
        return [a.ttft_ms for a in tally.answers if a.ttft_ms is not None and a.problem() is None]

    rt_ms, seed_ms = ttfts(rt_tally), ttfts(seed_tally)
    errors = (sum(a.problem() is not None for a in rt_tally.answers + seed_tally.answers)
              + sum(rt_tally.problems.values()) + sum(seed_tally.problems.values())
              + sum(sum(c.errors.values()) for c in rt_clients) + sum(sum(c.errors.values()) for c in seed_clients))
    return {
        "sessions": args.sessions, "seed_sessions": args.seed_sessions, "answers": len(rt_tally.answers),
        "seed_answers": len(seed_tally.answers), "p50_ttft_ms": percentile(rt_ms, 50),
        "p95_ttft_ms": percentile(rt_ms, 95), "seed_p50_ttft_ms": percentile(seed_ms, 50),
        "seed_p95_ttft_ms": percentile(seed_ms, 95), "errors": errors,
        "frames_sent": sum(c.frames_sent for c in rt_clients), "frames_filtered": sum(c.filtered for c in rt_clients),
        "error_kinds": dict(sum((c.errors for c in rt_clients), collections.Counter())),
        "problems": dict(rt_tally.problems + seed_tally.problems), "overdue": rt_tally.overdue + seed_tally.overdue,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sessions", type=int, default=8, help="SDK clients on /v1/realtime")
    p.add_argument("--seed-sessions", type=int, default=2, help="seed-protocol clients beside them")
    p.add_argument("--size", default="320x240")
    p.add_argument("--fps", type=float, default=5.0)
    p.add_argument("--ask-every", type=float, default=4.0)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--frames", type=int, default=8, help="frames sampled per question")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--answer-timeout", type=float, default=60.0)
    p.add_argument("--token", default=None, help="start the server with --token and use it in every client")
    args = p.parse_args(argv)
    args.width, args.height = (int(v) for v in args.size.lower().split("x"))
    return args


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    quiet_loggers()
    logging.getLogger("openai").setLevel(logging.WARNING)
    args = parse_args()
    n = args.sessions + args.seed_sessions
    server = start_server(RESULTS / "realtime-server.log", ["--max-sessions", str(n + 2)], token=args.token)
    try:
        result = asyncio.run(measure(args, server.url, server))
    finally:
        stop_server(server)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "realtime.json").write_text(json.dumps(result, indent=1))
    log.info("answers %d (seed %d), frames sent %d (filtered %d), overdue %d, problems %s, error kinds %s",
             result["answers"], result["seed_answers"], result["frames_sent"], result["frames_filtered"],
             result["overdue"], result["problems"], result["error_kinds"])
    print(f"realtime: sessions={result['sessions']} p50_ttft_ms={fmt(result['p50_ttft_ms'])} "
          f"p95_ttft_ms={fmt(result['p95_ttft_ms'])} seed_p50_ttft_ms={fmt(result['seed_p50_ttft_ms'])} "
          f"errors={result['errors']}")
    return 0 if result["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
