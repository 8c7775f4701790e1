"""Benchmark: the server's event-loop lag under media load.

Every session's signalling, RTP packets, WebSocket frames and streamed answer
tokens go through one asyncio loop. Work that holds that loop (a decode, a big
JSON parse, a base64 decode, a lock wait) delays all of them at once, so the
loop's lag is what every user feels as jitter. The server measures it itself
(vidchat/app/metrics.py: a task that asks to wake every 10 ms and records how
late it woke) and reports it in `GET /api/health` under `loop_lag`; this
script only loads the server and reads that.

Run: .venv/bin/python bench/looplag.py                (server start ~30 s, then ~25 s)
     .venv/bin/python bench/looplag.py --seconds 5    (a quick look)

What it does, in one run of a fresh server (app.py --model tiny):
  baseline  the idle server for --baseline-seconds (5): the loop's own noise.
  load      after a --warmup (2 s) of streaming, for --seconds (15):
            --rtc-clients (4) aiortc clients sending 640x480 VP8 at --fps (30),
              a clip encoded once in memory and looped (bench/ingest.py's
              EncodedVideo), so this process does no video encoding; with
              --live-encode they send SyntheticVideo frames, encoded live.
            --ws-clients (2) WebSocket clients of the seed protocol sending an
              ~8 MB JPEG (noise, two alternating tints so the frame filter keeps
              them) as `video.frame` back to back, as fast as the server reads.
            --ask (on): a `video.query` every --ask-every (3) s on the first
              WebSocket client, so answers stream while the frames arrive.
The loop-lag window is reset at the start of each phase. The frames/s the
server actually received per WebRTC client (`/webrtc/stats`
media.video_frames_seen) and the 8 MB frames/s sent are printed so the load
is visible, as is the CPU of the server and of this process.

Target: p99 loop lag <= 20 ms under this load. The server's output goes to
bench/results/looplag-server.log, the numbers to bench/results/looplag.json,
and the last line is:
  loop: p99_lag_ms=<x> max_lag_ms=<y> baseline_p99_ms=<b> p99_ratio=<x/b> rtc_fps=<f> ws_frames_s=<w>
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import io
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from PIL import Image
from websockets.asyncio.client import ClientConnection, connect

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from ingest import SERVER_ARGS, BenchClient, EncodedVideo, encode_clip, http_json, start_server, stop_server  # noqa: E402

from vidchat.devtools.rtc_client import RtcClient, SyntheticVideo  # noqa: E402

RESULTS = ROOT / "bench" / "results"
# On top of bench/ingest.py's server arguments (the tiny model, a small KV cache).
EXTRA_SERVER_ARGS = ["--max-images", "16"]
WIDTH, HEIGHT = 640, 480
JPEG_MIN, JPEG_MAX = int(7.5e6), int(8.5e6)  # the server's default cap is 10 MB
log = logging.getLogger("looplag")


def noise_jpegs(variants: int = 2) -> list[bytes]:
    """JPEGs of 7.5-8.5 MB: noise is nearly incompressible, so size ~ pixels.
    Each variant has its own mean brightness, else the filter would drop all but
    the first as duplicates and the server would never decode one in full."""
    rng = np.random.default_rng(1)
    w, h, out = 3000, 2600, []
    for v in range(variants):
        for _ in range(6):
            lo = 95 * (v % 2)
            img = rng.integers(0, 160, (h, w, 3), dtype=np.uint8) + np.uint8(lo)
            buf = io.BytesIO()
            Image.fromarray(img).save(buf, "JPEG", quality=95)
            size = buf.tell()
            if JPEG_MIN <= size <= JPEG_MAX:
                out.append(buf.getvalue())
                break
            scale = (8e6 / size) ** 0.5
            w, h = int(w * scale), int(h * scale)
        else:
            raise RuntimeError(f"could not make a {JPEG_MIN}-{JPEG_MAX} byte JPEG (last {size} bytes)")
    return out


class WsClient:
    """One seed-protocol client pushing big frames; optionally asking questions."""

    def __init__(self, url: str, messages: list[str], deflate: bool) -> None:
        self.url, self.messages, self.deflate = url, messages, deflate
        self.sent = 0
        self.errors: collections.Counter[str] = collections.Counter()
        self.asked = self.answered = self.cancelled = 0
        self.answer_s: list[float] = []
        self._asked_at = 0.0

    async def run(self, stop: asyncio.Event, ask_every: float | None) -> None:
        # No proxy (the bench talks to 127.0.0.1) and no pings, so a slow loop
        # under test cannot make the client hang up; deflate only when asked,
        # as compressing 11 MB messages would make this process the bottleneck.
        async with connect(self.url, max_size=64 << 20, compression="deflate" if self.deflate else None,
                           proxy=None, ping_interval=None, open_timeout=30) as ws:
            await ws.send(json.dumps({"type": "session.config"}))
            tasks = [asyncio.create_task(self._read(ws))]
            if ask_every:
                tasks.append(asyncio.create_task(self._ask(ws, stop, ask_every)))
            try:
                while not stop.is_set():
                    await ws.send(self.messages[self.sent % len(self.messages)])
                    self.sent += 1
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)  # a reader's own failure is not news here

    async def _ask(self, ws: ClientConnection, stop: asyncio.Event, every: float) -> None:
        while self.sent < 1:  # a question before any frame would only get a "no frames" error
            await asyncio.sleep(0.05)
        while not stop.is_set():
            self._asked_at = time.monotonic()
            await ws.send(json.dumps({"type": "video.query", "text": "Describe."}))
            self.asked += 1
            await asyncio.sleep(every)

    async def _read(self, ws: ClientConnection) -> None:
        async for raw in ws:
            msg = json.loads(raw)
            kind = msg.get("type")
            if kind == "error":
                self.errors[str(msg.get("message"))[:100]] += 1
            elif kind == "response.text.done":
                self.answered += 1
                if msg.get("stats", {}).get("cancelled"):  # replaced by the next question: no latency
                    self.cancelled += 1
                else:
                    self.answer_s.append(time.monotonic() - self._asked_at)


async def loop_lag(url: str) -> dict[str, Any]:
    return (await asyncio.to_thread(http_json, url + "/api/health"))["loop_lag"]


async def reset_lag(url: str) -> None:
    await asyncio.to_thread(http_json, url + "/api/loop-lag/reset", {})


async def frames_seen(clients: list[RtcClient]) -> list[int]:
    stats = await asyncio.gather(*(c.stats() for c in clients), return_exceptions=True)
    for s in stats:
        if isinstance(s, Exception):  # e.g. 404: the server ended the session; it then counts 0 fps
            log.warning("WebRTC stats failed: %r", s)
    return [0 if isinstance(s, Exception) else s.get("media", {}).get("video_frames_seen", 0) for s in stats]


def cpu_seconds(proc: psutil.Process) -> float:
    """User+sys seconds of a process and its children (vLLM's engine core)."""
    total = sum(proc.cpu_times()[:2])
    for child in proc.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


async def measure(args: argparse.Namespace, url: str, server: psutil.Process, packets: list[bytes],
                  jpegs: list[bytes]) -> dict[str, Any]:
    await reset_lag(url)
    await asyncio.sleep(args.baseline_seconds)
    baseline = await loop_lag(url)
    log.info("baseline (idle %.0f s): %s", args.baseline_seconds, baseline)

    if args.live_encode:
        rtc: list[RtcClient] = [RtcClient(url, SyntheticVideo(WIDTH, HEIGHT, args.fps))
                                for _ in range(args.rtc_clients)]
    else:
        rtc = [BenchClient(url, EncodedVideo(packets, args.fps)) for _ in range(args.rtc_clients)]
    messages = [json.dumps({"type": "video.frame", "data": base64.b64encode(j).decode()}) for j in jpegs]
    ws_url = url.replace("http://", "ws://") + "/v1/video/chat/stream"
    ws = [WsClient(ws_url, messages, args.ws_deflate) for _ in range(args.ws_clients)]

    stop = asyncio.Event()
    await asyncio.gather(*(c.connect() for c in rtc))
    ws_tasks = [asyncio.create_task(c.run(stop, args.ask_every if args.ask and i == 0 else None))
                for i, c in enumerate(ws)]
    log.info("%d WebRTC + %d WebSocket clients connected; warming up %.0f s",
             len(rtc), len(ws), args.warmup)
    await asyncio.sleep(args.warmup)

    me = psutil.Process()
    seen0, sent0 = await frames_seen(rtc), [c.sent for c in ws]
    cpu0, me0, t0 = cpu_seconds(server), sum(me.cpu_times()[:2]), time.monotonic()
    await reset_lag(url)
    await asyncio.sleep(args.seconds)
    lag = await loop_lag(url)
    seen1, sent1 = await frames_seen(rtc), [c.sent for c in ws]
    dt = time.monotonic() - t0
    server_pct, bench_pct = 100 * (cpu_seconds(server) - cpu0) / dt, 100 * (sum(me.cpu_times()[:2]) - me0) / dt

    stop.set()
    for t in ws_tasks:  # a client blocked in send() under backpressure would not see `stop`
        t.cancel()
    done = await asyncio.gather(*ws_tasks, return_exceptions=True)
    await asyncio.gather(*(c.close() for c in rtc), return_exceptions=True)
    failed = [repr(r) for r in done if isinstance(r, Exception)]

    answers = [s for c in ws for s in c.answer_s]
    return {
        "baseline": baseline, "load": lag, "seconds": round(dt, 1),
        "rtc_fps_per_client": [round((b - a) / dt, 1) for a, b in zip(seen0, seen1)],
        "ws_frames_per_client": [b - a for a, b in zip(sent0, sent1)],
        "ws_frames_s": round((sum(sent1) - sum(sent0)) / dt, 2),
        "ws_frame_bytes": [len(j) for j in jpegs],
        "ws_errors": dict(sum((c.errors for c in ws), collections.Counter())),
        "ws_client_failures": failed,
        "questions": sum(c.asked for c in ws), "answers": sum(c.answered for c in ws),
        "answers_cancelled": sum(c.cancelled for c in ws),
        "answer_s_median": round(statistics.median(answers), 2) if answers else None,
        "server_cpu_pct": round(server_pct), "bench_cpu_pct": round(bench_pct),
        "load_average": [round(x, 1) for x in os.getloadavg()], "args": vars(args),
    }


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "n/a" if x is None else format(x, spec)


def report(r: dict[str, Any], log_path: Path) -> str:
    base, load = r["baseline"], r["load"]
    rtc = r["rtc_fps_per_client"]
    rtc_fps = statistics.mean(rtc) if rtc else 0.0
    ratio = load["p99_ms"] / base["p99_ms"] if load["p99_ms"] is not None and base["p99_ms"] else None
    r["summary"] = {"p99_lag_ms": load["p99_ms"], "max_lag_ms": load["max_ms"], "baseline_p99_ms": base["p99_ms"],
                    "p99_ratio": ratio and round(ratio, 2), "rtc_fps": round(rtc_fps, 1),
                    "ws_frames_s": r["ws_frames_s"], "target_p99_ms": 20, "target_met": bool(
                        load["p99_ms"] is not None and load["p99_ms"] <= 20)}
    print(f"\nloop lag, idle   : p50 {fmt(base['p50_ms'])} ms  p99 {fmt(base['p99_ms'])} ms  "
          f"max {fmt(base['max_ms'])} ms  ({base['samples']} samples)")
    print(f"loop lag, loaded : p50 {fmt(load['p50_ms'])} ms  p99 {fmt(load['p99_ms'])} ms  "
          f"max {fmt(load['max_ms'])} ms  ({load['samples']} samples over {r['seconds']} s; "
          f"{load['samples'] / r['seconds']:.0f}/s of 100 asked)")
    args = r["args"]
    print(f"WebRTC load      : {len(rtc)} clients at {args['fps']} fps sent; server received "
          f"{', '.join(f'{x:.1f}' for x in rtc)} fps")
    print(f"WebSocket load   : {args['ws_clients']} clients, {r['ws_frames_s']} frames/s of ~"
          f"{statistics.mean(r['ws_frame_bytes']) / 1e6:.1f} MB (per client {r['ws_frames_per_client']} frames)")
    print(f"questions        : {r['questions']} asked, {r['answers']} answered ({r['answers_cancelled']} cancelled "
          f"by the next), median {fmt(r['answer_s_median'], '.2f')} s from question to last token")
    errors = "; ".join(f"{n} x {m}" for m, n in r["ws_errors"].items()) or "none"
    print(f"errors           : {errors}{'; client failures: ' + ', '.join(r['ws_client_failures']) if r['ws_client_failures'] else ''}")
    print(f"CPU              : server (with engine) {r['server_cpu_pct']}% of a core, "
          f"this bench {r['bench_cpu_pct']}%; {psutil.cpu_count()} CPUs, load average {r['load_average']}")
    warn = [ln for ln in log_path.read_text(errors="replace").splitlines()
            if " WARNING " in ln or " ERROR " in ln or "Traceback" in ln]
    print(f"server log       : {log_path.relative_to(ROOT)} ({len(warn)} warning/error lines)")
    for text, n in collections.Counter(ln.split(" ", 1)[-1][:140] for ln in warn).most_common(3):
        print(f"  {n} x {text}")
    s = r["summary"]
    return (f"loop: p99_lag_ms={fmt(s['p99_lag_ms'])} max_lag_ms={fmt(s['max_lag_ms'])} "
            f"baseline_p99_ms={fmt(s['baseline_p99_ms'])} p99_ratio={fmt(s['p99_ratio'])} "
            f"rtc_fps={s['rtc_fps']:.1f} ws_frames_s={s['ws_frames_s']:.2f}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=15.0, help="loaded measurement window (default 15)")
    p.add_argument("--baseline-seconds", type=float, default=5.0, help="idle measurement window (default 5)")
    p.add_argument("--warmup", type=float, default=2.0, help="streaming before the loaded window (default 2)")
    p.add_argument("--rtc-clients", type=int, default=4, help="WebRTC clients (default 4)")
    p.add_argument("--fps", type=int, default=30, help="WebRTC frame rate, 640x480 (default 30)")
    p.add_argument("--live-encode", action="store_true",
                   help="send SyntheticVideo frames encoded live instead of a pre-encoded clip")
    p.add_argument("--ws-clients", type=int, default=2, help="WebSocket clients sending ~8 MB frames (default 2)")
    p.add_argument("--ws-deflate", action="store_true", help="let WebSocket clients negotiate permessage-deflate")
    p.add_argument("--ask", action=argparse.BooleanOptionalAction, default=True,
                   help="ask a question every --ask-every seconds on the first WebSocket client (default on)")
    p.add_argument("--ask-every", type=float, default=3.0, help="seconds between questions (default 3)")
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.rtc_clients < 0 or args.ws_clients < 0 or args.fps <= 0:
        p.error("--seconds and --fps must be positive, client counts >= 0")
    return args


def main() -> int:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("aioice", "aiortc", "websockets"):  # per-candidate ICE chatter at INFO
        logging.getLogger(noisy).setLevel(logging.WARNING)
    RESULTS.mkdir(parents=True, exist_ok=True)
    # Made before the server starts, so neither start-up nor the baseline shares the CPU with them.
    t0 = time.monotonic()
    packets = [] if args.live_encode else encode_clip(WIDTH, HEIGHT, args.fps, 4)
    jpegs = noise_jpegs()
    log.info("load prepared in %.0f s: %d VP8 packets; WebSocket frames of %s bytes",
             time.monotonic() - t0, len(packets), ", ".join(str(len(j)) for j in jpegs))
    log_path = RESULTS / "looplag-server.log"
    log.info("starting server: app.py %s", " ".join(SERVER_ARGS + EXTRA_SERVER_ARGS))
    t0 = time.monotonic()
    proc, url = start_server(log_path, EXTRA_SERVER_ARGS)
    log.info("server ready at %s in %.0f s (pid %d); log in %s", url, time.monotonic() - t0, proc.pid, log_path)
    try:
        result = asyncio.run(measure(args, url, psutil.Process(proc.pid), packets, jpegs))
    finally:
        stop_server(proc)
    line = report(result, log_path)
    (RESULTS / "looplag.json").write_text(json.dumps(result, indent=2) + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
