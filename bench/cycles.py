"""Benchmark: endurance. Many short sessions come and go through both doors,
some hanging up mid-answer; the server's memory must stay flat and no vLLM
request may be left running.

Run: .venv/bin/python bench/cycles.py                    (server start ~30 s, then a few minutes)
     .venv/bin/python bench/cycles.py --cycles 10 --warmup 2 --sample-every 2   (a quick look)
     .venv/bin/python bench/cycles.py --token s3cret     (the server requires a token)

One cycle is connect -> stream -> ask -> disconnect, alternating the doors
(--doors, both by default):
  even cycles  the WebSocket door: session.config, --size JPEG frames at --fps
               (bench/load.py's clip, every frame unique) for --stream-seconds,
               a `video.query`, then video.done and a clean close;
  odd cycles   the page's door: an aiortc peer (vidchat.devtools.rtc_client) sending
               live VP8, the question through the page's `/ask` chat endpoint
               (gradio_client, one per worker, as tests/test_webrtc.py does),
               then `/webrtc/close` (a tab giving up its session; the page's Stop pauses instead).
Every third cycle hangs up while the answer streams (a long answer:
--long-tokens at temperature 1), as soon as the first token shows, in turns
one of two ways per door:
  WebSocket    a close handshake / the TCP connection simply dropped;
  page         `/webrtc/close` (a tab giving up its session) / the tab killed: the
               gradio job cancelled and the peer closed without telling the
               server (the session then ends when the server sees the peer
               gone, or by its idle reaper, --session-idle-timeout, 30 s).
--concurrency (4) cycles run at once.

Measured: the RSS of the server and its children (vLLM's engine core) after
the first --warmup (10) cycles (rss_start), every --sample-every (10) cycles,
and at the end (rss_end, after the drain below); the least-squares slope over
those samples in MB per 100 cycles. After the last cycle the script polls
/api/health until no request runs and no session is left (at most
--drain-timeout, 60 s): leaked_requests is what still runs then,
sessions_left the sessions still open. errors: `error` messages, questions
without a complete answer (the normal cycles), failed connects, sessions that
did not end; an answer we hung up on is not an error.

The server's output goes to bench/results/cycles-server.log, the numbers to
bench/results/cycles.json, and the last line is:
  cycles: n=<n> rss_start_mb=<a> rss_end_mb=<b> leaked_requests=<k> slope_mb_per_100=<s> sessions_left=<l> errors=<e>
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

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
from load import QUESTIONS, Answer, Frames, PageClient, WsClient, gradio_client  # noqa: E402

log = logging.getLogger("cycles")
LONG_QUESTION = "Talk at length about everything you see."


@dataclass
class Cycle:
    i: int
    door: str  # "ws" or "page"
    hangup: str | None  # None: a full answer; else how we hang up mid-answer
    seconds: float = 0.0
    ttft_ms: float | None = None
    problems: list[str] = field(default_factory=list)
    interrupted: bool = False  # we did hang up while tokens streamed


def plan(i: int, doors: tuple[str, ...] = ("ws", "page")) -> Cycle:
    door = doors[i % len(doors)]
    hangup = None
    if i % 3 == 2:
        soft = (i // 6) % 2 == 0  # each door gets both ways in turn
        hangup = {("ws", True): "close", ("ws", False): "drop",
                  ("page", True): "stop", ("page", False): "kill"}[door, soft]
    return Cycle(i, door, hangup)


class Worker:
    """Runs cycles one after another; owns one gradio client (its own "tab" session hash, so a
    cancel never touches another worker's answers)."""

    def __init__(self, server: Server, frames: Frames, args: argparse.Namespace):
        self.server, self.frames, self.args = server, frames, args
        self.gradio = None
        self.lingering: list[asyncio.Task] = []  # page jobs we walked away from, still finishing

    async def run(self, c: Cycle) -> Cycle:
        t0 = time.monotonic()
        try:
            if c.door == "ws":
                await self.ws_cycle(c)
            else:
                await self.page_cycle(c)
        except Exception as exc:  # noqa: BLE001 - one failed cycle is a finding, not the end of the run
            c.problems.append(f"{c.door} cycle failed: {exc!r}"[:160])
        c.seconds = time.monotonic() - t0
        return c

    async def ws_cycle(self, c: Cycle) -> None:
        a = self.args
        long = c.hangup is not None
        config = {"max_tokens": a.long_tokens if long else a.max_tokens, "num_sample_frames": a.frames,
                  "max_frames": 64, **({"temperature": 1.0} if long else {})}
        ws = WsClient(self.server, self.frames, a.fps, config, offset=c.i * 7)
        await ws.open()
        stop = asyncio.Event()
        sender = asyncio.create_task(ws.stream(stop))
        ans: Answer | None = None
        try:
            await asyncio.sleep(a.stream_seconds)
            if not long:
                ans = await ws.ask(QUESTIONS[c.i % len(QUESTIONS)], a.answer_timeout)
                self._answered(c, ans)
                stop.set()
                await sender
                await ws.finish()
            else:
                ans = await ws.send_question(LONG_QUESTION)
                await self._until_token(c, ans)
                c.interrupted = ans.first is not None and not ans.done.is_set()
                stop.set()
                await ws.close(hard=c.hangup == "drop")
                await sender
        finally:
            stop.set()
            if not sender.done():
                sender.cancel()
            if not ws.closing:
                await ws.close(hard=True)
            # Server `error` messages; the one an answer already failed with is in c.problems.
            counted = collections.Counter(ans.errors[:1] if ans and ans.problem() else [])
            c.problems += [f"error: {t}" for t, n in (ws.errors - counted).items() for _ in range(n)]
            c.problems += [p for p, n in ws.problems.items() for _ in range(n)]

    async def _until_token(self, c: Cycle, ans: Answer) -> None:
        got = asyncio.create_task(ans.got_token.wait())
        done = asyncio.create_task(ans.done.wait())
        await asyncio.wait({got, done}, timeout=self.args.answer_timeout, return_when=asyncio.FIRST_COMPLETED)
        got.cancel()
        done.cancel()
        c.ttft_ms = ans.ttft_ms
        if ans.first is None:
            c.problems.append(ans.problem() or "no token to hang up on (the answer ended or never started)")

    def _answered(self, c: Cycle, ans: Answer) -> None:
        c.ttft_ms = ans.ttft_ms
        if ans.problem():
            c.problems.append(ans.problem())

    async def page_cycle(self, c: Cycle) -> None:
        a = self.args
        if self.gradio is None:
            self.gradio = await asyncio.to_thread(gradio_client, self.server)
        page = PageClient(self.server, a.width, a.height, a.fps, gradio=self.gradio)
        told = False
        try:
            await page.open()
            await asyncio.sleep(a.stream_seconds)
            if c.hangup is None:
                ans, _ = await page.ask(QUESTIONS[c.i % len(QUESTIONS)], k=a.frames, max_tokens=a.max_tokens,
                                        temperature=0.7, timeout=a.answer_timeout)
                self._answered(c, ans)
                await page.rtc.close(tell_server=True)
                told = True
                return
            ans, job = await page.ask(LONG_QUESTION, k=a.frames, max_tokens=a.long_tokens, temperature=1.0,
                                      timeout=a.answer_timeout, until_first_token=True)
            c.ttft_ms = ans.ttft_ms
            if ans.first is None or job.done():
                c.problems.append(ans.problem() or "no token to hang up on (the answer ended first)")
            c.interrupted = ans.first is not None and not job.done()
            if c.hangup == "stop":  # a tab giving up its session: the server ends it
                await page.rtc.close(tell_server=True)
                told = True
            else:  # the tab killed: its event stream goes (the job is cancelled) and the peer with it
                await asyncio.to_thread(job.cancel)
                await page.rtc.close(tell_server=False)
                told = True
            self.lingering.append(asyncio.create_task(self._settle(c, job)))
        finally:
            if not told:
                await page.rtc.close(tell_server=True)

    async def _settle(self, c: Cycle, job) -> None:
        """A job we hung up on must still end, and not with an error page notice."""
        deadline = time.monotonic() + self.args.answer_timeout
        while not job.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if not job.done():
            log.warning("cycle %d: the /ask job still runs %.0f s after hanging up", c.i, self.args.answer_timeout)
            c.problems.append("the /ask job did not end after hanging up")


def slope_per_100(samples: list[tuple[int, float]]) -> float | None:
    if len(samples) < 2 or len({x for x, _ in samples}) < 2:
        return None
    x = np.array([s[0] for s in samples], float)
    y = np.array([s[1] for s in samples], float)
    return float(np.polyfit(x, y, 1)[0] * 100)


async def health(server: Server) -> dict[str, Any]:
    try:
        return await asyncio.to_thread(server.health)
    except OSError as exc:
        return {"error": repr(exc)}


async def measure(args: argparse.Namespace, server: Server, frames: Frames) -> dict[str, Any]:
    proc = server.process
    rss_boot = rss_mb(proc)
    cpu0, t0 = cpu_seconds(proc), time.monotonic()
    queue = iter(range(args.cycles))
    done: list[Cycle] = []
    samples: list[tuple[int, float]] = []  # (cycles done, RSS MB)
    workers = [Worker(server, frames, args) for _ in range(args.concurrency)]
    if args.warmup == 0:
        samples.append((0, rss_boot))

    async def work(w: Worker) -> None:
        for i in queue:
            c = await w.run(plan(i, args.doors))
            done.append(c)
            if c.problems:
                log.warning("cycle %d (%s%s): %s", c.i, c.door, f", {c.hangup}" if c.hangup else "",
                            "; ".join(c.problems))
            n = len(done)
            if n == args.warmup or (n > args.warmup and (n - args.warmup) % args.sample_every == 0):
                rss = rss_mb(proc)
                samples.append((n, rss))
                h = await health(server)
                log.info("%d/%d cycles: RSS %.0f MB, %s sessions, %s requests running", n, args.cycles, rss,
                         h.get("sessions"), h.get("running_requests"))

    await asyncio.gather(*(work(w) for w in workers))
    elapsed = time.monotonic() - t0
    lingering = [t for w in workers for t in w.lingering]
    await asyncio.gather(*lingering, return_exceptions=True)
    at_end = await health(server)
    log.info("all %d cycles done in %.0f s; right after: %s sessions, %s requests running", len(done), elapsed,
             at_end.get("sessions"), at_end.get("running_requests"))

    # Drain: nothing may still generate; hung-up tabs end by the idle reaper.
    t_drain = time.monotonic()
    h, running_zero_after = at_end, None
    while True:
        h = await health(server)
        if h.get("running_requests") == 0 and running_zero_after is None:
            running_zero_after = time.monotonic() - t_drain
        if (h.get("running_requests") == 0 and h.get("sessions") == 0) or \
                time.monotonic() - t_drain > args.drain_timeout:
            break
        await asyncio.sleep(0.5)
    drain_s = time.monotonic() - t_drain
    rss_end = rss_mb(proc)
    samples.append((len(done), rss_end))
    cpu_pct = 100 * (cpu_seconds(proc) - cpu0) / elapsed

    problems = collections.Counter(p[:160] for c in done for p in c.problems)
    hung = [c for c in done if c.hangup]
    ttfts = [c.ttft_ms for c in done if c.ttft_ms is not None]
    return {
        "n": len(done), "warmup": args.warmup, "concurrency": args.concurrency, "seconds": round(elapsed, 1),
        "by_door": dict(collections.Counter(c.door for c in done)),
        "hangups": dict(collections.Counter(c.hangup for c in hung)),
        "interrupted_mid_answer": sum(c.interrupted for c in hung),
        "rss_boot_mb": round(rss_boot), "rss_start_mb": round(samples[0][1]) if len(samples) > 1 else None,
        "rss_end_mb": round(rss_end), "rss_max_mb": round(max(r for _, r in samples)),
        "slope_mb_per_100": None if (s := slope_per_100(samples[:])) is None else round(s, 1),
        "samples": [(n, round(r, 1)) for n, r in samples],
        "running_right_after": at_end.get("running_requests"), "sessions_right_after": at_end.get("sessions"),
        "leaked_requests": h.get("running_requests"), "sessions_left": h.get("sessions"),
        "sessions_left_by_kind": h.get("sessions_by_kind"),
        "running_zero_after_s": None if running_zero_after is None else round(running_zero_after, 1),
        "drain_s": round(drain_s, 1),
        "errors": sum(problems.values()), "error_kinds": dict(problems.most_common()),
        "ttft_ms_p50": percentile(ttfts, 50), "ttft_ms_p95": percentile(ttfts, 95),
        "cycle_s_median": round(float(np.median([c.seconds for c in done])), 2) if done else None,
        "server_cpu_pct": round(cpu_pct), "cpus": psutil.cpu_count(),
        "load_average": [round(x, 1) for x in os.getloadavg()], "args": vars(args),
    }


def report(r: dict[str, Any], server: Server) -> str:
    log.info("cycles           : %d (%s), %d at once, %.0f s, median %.1f s a cycle", r["n"], r["by_door"],
             r["concurrency"], r["seconds"], r["cycle_s_median"] or 0)
    log.info("hang-ups         : %s, %d of them while tokens streamed", r["hangups"], r["interrupted_mid_answer"])
    log.info("time to 1st token: p50 %s / p95 %s ms", fmt(r["ttft_ms_p50"]), fmt(r["ttft_ms_p95"]))
    log.info("server RSS       : boot %d MB, after %d warm-up cycles %s MB, end %d MB, max %d MB; slope %s MB "
             "per 100 cycles; CPU %d%% of a core", r["rss_boot_mb"], r["warmup"], fmt(r["rss_start_mb"]),
             r["rss_end_mb"], r["rss_max_mb"], fmt(r["slope_mb_per_100"], ".1f"), r["server_cpu_pct"])
    log.info("after the cycles : right after %s running / %s sessions; after %.1f s: %s running, %s sessions %s",
             r["running_right_after"], r["sessions_right_after"], r["drain_s"], r["leaked_requests"],
             r["sessions_left"], r["sessions_left_by_kind"] or "")
    for text, n in r["error_kinds"].items():
        log.warning("error            : %d x %s", n, text)
    log_problem_summary(server, log)
    return (f"cycles: n={r['n']} rss_start_mb={fmt(r['rss_start_mb'])} rss_end_mb={r['rss_end_mb']} "
            f"leaked_requests={fmt(r['leaked_requests'])} slope_mb_per_100={fmt(r['slope_mb_per_100'], '.1f')} "
            f"sessions_left={fmt(r['sessions_left'])} errors={r['errors']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cycles", type=int, default=200, help="connect-stream-ask-disconnect cycles (default 200)")
    p.add_argument("--concurrency", type=int, default=4, help="cycles at once (default 4)")
    p.add_argument("--warmup", type=int, default=10, help="cycles before the first RSS sample (default 10)")
    p.add_argument("--sample-every", type=int, default=10, help="cycles between RSS samples (default 10)")
    p.add_argument("--fps", type=float, default=15.0, help="frames per second sent (default 15)")
    p.add_argument("--size", default="320x240", help="frame size WxH (default 320x240)")
    p.add_argument("--stream-seconds", type=float, default=1.0,
                   help="seconds of streaming before the question (default 1)")
    p.add_argument("--max-tokens", type=int, default=16, help="max_tokens of a full answer (default 16)")
    p.add_argument("--long-tokens", type=int, default=1024,
                   help="max_tokens of an answer we hang up on (default 1024)")
    p.add_argument("--frames", type=int, default=8, help="frames sampled per question (default 8)")
    p.add_argument("--answer-timeout", type=float, default=60.0, help="seconds an answer may take (default 60)")
    p.add_argument("--drain-timeout", type=float, default=60.0,
                   help="seconds to wait after the last cycle for no request running and no session left "
                   "(default 60; hung-up tabs end by the server's idle reaper, 30 s by default)")
    p.add_argument("--unique-frames", action=argparse.BooleanOptionalAction, default=True,
                   help="every frame sent is a new picture, as from a camera (default on); --no-unique-frames "
                   "loops one clip, so vLLM's multimodal cache (LRU, mm_processor_cache_gb, 4 GiB by default) "
                   "stops growing once it holds the clip: tells that cache's growth from a leak")
    p.add_argument("--doors", default="ws,page",
                   help="doors to alternate, comma-separated: ws (WebSocket), page (WebRTC + /ask); default both")
    token_args(p)
    args = p.parse_args(argv)
    args.doors = tuple(d.strip() for d in args.doors.split(",") if d.strip())
    if not args.doors or set(args.doors) - {"ws", "page"}:
        p.error("--doors takes ws, page or ws,page")
    try:
        args.width, args.height = (int(x) for x in args.size.lower().split("x"))
    except ValueError:
        p.error("--size must be WxH, e.g. 320x240")
    if args.cycles < 1 or args.concurrency < 1 or args.sample_every < 1 or not 0 <= args.warmup < args.cycles:
        p.error("--cycles, --concurrency and --sample-every must be positive, 0 <= --warmup < --cycles")
    return args


def main() -> int:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    quiet_loggers()
    logging.getLogger("load").setLevel(logging.ERROR)  # per-question notes: the cycle's own line says it
    RESULTS.mkdir(parents=True, exist_ok=True)
    frames = Frames(args.width, args.height, args.fps, unique=args.unique_frames)
    server = start_server(RESULTS / "cycles-server.log", ["--max-sessions", "64", *args.server_arg],
                          token=args.token)
    log.info("server ready at %s (pid %d)", server.url, server.proc.pid)
    try:
        result = asyncio.run(measure(args, server, frames))
    finally:
        stop_server(server)
    line = report(result, server)
    result["args"].pop("token", None)
    (RESULTS / "cycles.json").write_text(json.dumps(result, indent=2) + "\n")
    print(line, flush=True)
    return 0 if result["errors"] == 0 and not result["leaked_requests"] else 1


if __name__ == "__main__":
    sys.exit(main())
