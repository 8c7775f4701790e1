"""Soak: hours of sessions coming and going must leave memory, file
descriptors and tasks flat.

Run: .venv/bin/python bench/soak.py --minutes 30 --sessions 4     (the target run, ~31 min)
     .venv/bin/python bench/soak.py --minutes 0.5 --sessions 3 --sample-every 2   (a quick look)

On a fresh server (app.py --model tiny, bench/_server.py), --sessions (4)
sessions run at once, through the three doors in turn: the scripted WebRTC
peer with questions through the page's /ask (bench/load.py's PageClient),
the seed socket (bench/load.py's WsClient) and the Realtime door with the
openai SDK (bench/realtime.py's RealtimeClient). Each streams --size
(320x240) JPEG frames at --fps (10), every frame a new picture, and asks
every --ask-every (10) s; the first socket session asks nothing and watches
instead (watch mode, a standing question at each scene change). Every
--churn-every (120) s the oldest session disconnects and a new one of the
next door opens in its place.

Every --sample-every (10) s it samples the server's and the engine core's
RSS, open file descriptors and threads (psutil), the server's asyncio tasks
(/api/health, with what each runs, and how often Python's full collection
ran) and vidchat_session_buffer_bytes (/metrics). The server runs with a
small --mm-cache-gb (see its help): vLLM's processed-frame cache is bounded
and fills on live video. At the end every
session is closed, the server drained (no session, nothing running), its
asyncio tasks given up to --settle-tasks (30) s to come back to their start
(a closed peer's last tasks end a moment after its session), and a last
sample taken. rss_slope_mb_per_h is the least-squares slope of the
samples after the first --settle-minutes (5; all of them in a shorter run);
fds_end_minus_start and tasks_end_minus_start compare the last sample (all
sessions ended) with the first one before any session opened.

The server's log goes to bench/results/soak-server.log, the samples to
bench/results/soak.json, and the last line is:
  soak: minutes=<m> sessions=<n> answers=<a> errors=<e> rss_slope_mb_per_h=<s> engine_rss_slope_mb_per_h=<s2> fds_end_minus_start=<f> tasks_end_minus_start=<t>
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import logging
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from _server import RESULTS, Server, fmt, quiet_loggers, start_server, stop_server, token_args  # noqa: E402
from load import QUESTIONS, Answer, Frames, PageClient, WsClient  # noqa: E402
from realtime import RealtimeClient  # noqa: E402

from vidchat.devtools.harness import eventually_async

log = logging.getLogger("bench.soak")
DOORS = ("page", "socket", "realtime")


# ---------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------

def _proc_figures(proc: psutil.Process | None) -> dict[str, float | None]:
    if proc is None:
        return {"rss_mb": None, "fds": None, "threads": None}
    try:
        with proc.oneshot():
            return {"rss_mb": proc.memory_info().rss / 2**20, "fds": proc.num_fds(), "threads": proc.num_threads()}
    except psutil.Error:
        return {"rss_mb": None, "fds": None, "threads": None}


def engine_core(server: Server) -> psutil.Process | None:
    """vLLM's EngineCore child of the server (None if not found)."""
    try:
        children = server.process.children(recursive=True)
    except psutil.Error:
        return None
    for child in children:
        try:
            if "EngineCore" in child.name() or any("EngineCore" in p for p in child.cmdline()):
                return child
        except psutil.Error:
            continue
    return None


def buffer_bytes(server: Server) -> float | None:
    req = urllib.request.Request(server.url + "/metrics", headers=server.headers())
    with urllib.request.urlopen(req, timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("vidchat_session_buffer_bytes "):
                return float(line.split()[1])
    return None


def server_process(server: Server) -> tuple[dict[str, Any], dict[str, Any]]:
    """/api/health, and its ``process`` figures (tasks, threads, collections)."""
    health = server.get_json("/api/health")
    return health, health.get("process") or {}


def sample(server: Server, started: float) -> dict[str, Any]:
    health, process = server_process(server)
    return {"t_s": round(time.monotonic() - started, 1),
            "server": _proc_figures(server.process), "engine": _proc_figures(engine_core(server)),
            "asyncio_tasks": process.get("asyncio_tasks"),
            "tasks_by_coroutine": process.get("asyncio_tasks_by_coroutine"),
            "threads_by_name": process.get("threads_by_name"),
            "gc_full_collections": process.get("gc_full_collections"),
            "sessions": health.get("sessions"), "buffer_bytes": buffer_bytes(server)}


async def sampler(server: Server, started: float, every: float, out: list[dict], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            out.append(await asyncio.to_thread(sample, server, started))
        except OSError as exc:
            log.warning("sample failed: %r", exc)
        try:
            await asyncio.wait_for(stop.wait(), every)
        except asyncio.TimeoutError:
            pass


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MB) points, in MB per hour."""
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    den = sum((t - mx) ** 2 for t, _ in points)
    return None if den == 0 else sum((t - mx) * (v - my) for t, v in points) / den * 3600


# ---------------------------------------------------------------------------
# Sessions
# ---------------------------------------------------------------------------

class WatchingClient(WsClient):
    """A seed session with watch on: it asks nothing, and counts the answers watching brings."""

    watched = 0

    def _handle(self, msg: dict[str, Any]) -> None:
        if msg.get("type") == "response.text.done":
            self.watched += 1
        super()._handle(msg)


class Soak:
    def __init__(self, args: argparse.Namespace, server: Server) -> None:
        self.args, self.server = args, server
        self.frames = Frames(args.width, args.height, args.fps)
        self.answers: list[Answer] = []
        self.problems: collections.Counter[str] = collections.Counter()
        self.watched = 0
        self.offsets = itertools.count(0, 100_000)  # each session's frames are its own pictures
        self.opened = collections.Counter()

    async def session(self, door: str, watch: bool, stop: asyncio.Event) -> None:
        """One session of ``door``, streaming and asking until ``stop``."""
        args = self.args
        self.opened[door] += 1
        client: Any
        if door == "page":
            client = PageClient(self.server, args.width, args.height, args.fps)
            try:
                await client.open()
            except Exception as exc:  # noqa: BLE001
                self.problems[f"page connect failed: {exc!r}"[:160]] += 1
                await client.rtc.close()
                return

            async def ask(q: str) -> Answer:
                return (await client.ask(q, k=args.frames, max_tokens=args.max_tokens, temperature=0.7,
                                         timeout=args.answer_timeout))[0]

            async def end() -> None:
                await client.rtc.close(tell_server=True)
                # The tab goes: its Gradio client closes (its open stream would hold server tasks).
                await asyncio.to_thread(client.gradio.close)
            streaming = None  # the peer's own track streams
        elif door == "socket":
            config = {"num_sample_frames": args.frames, "max_tokens": args.max_tokens, "temperature": 0.7}
            if watch:
                config["watch"] = {"question": "What changed?", "every_s": args.ask_every}
            client = (WatchingClient if watch else WsClient)(self.server, self.frames, args.fps, config,
                                                             next(self.offsets))
            try:
                await client.open()
            except Exception as exc:  # noqa: BLE001
                self.problems[f"socket connect failed: {exc!r}"[:160]] += 1
                return

            async def ask(q: str) -> Answer:
                return await client.ask(q, args.answer_timeout)

            async def end() -> None:
                await client.finish()
                self.problems.update(client.problems)
                self.problems.update({f"socket error: {k}": v for k, v in client.errors.items()})
                self.watched += getattr(client, "watched", 0)
            streaming = client
        else:
            client = RealtimeClient(self.server.url, self.frames, args.fps,
                                    next(self.offsets), self.server.token)
            try:
                await client.open({"num_sample_frames": args.frames, "temperature": 0.7})
            except Exception as exc:  # noqa: BLE001
                self.problems[f"realtime connect failed: {exc!r}"[:160]] += 1
                return

            async def ask(q: str) -> Answer:
                return await client.ask(q, args.max_tokens, args.answer_timeout)

            async def end() -> None:
                await client.close()
                self.problems.update({f"realtime error: {k}": v for k, v in client.errors.items()})
            streaming = client
        sending = asyncio.create_task(streaming.stream(stop)) if streaming is not None else None
        try:
            for i in itertools.count():
                if watch:
                    await stop.wait()
                    break
                try:
                    await asyncio.wait_for(stop.wait(), args.ask_every if i else args.ask_every / 2)
                    break
                except asyncio.TimeoutError:
                    pass
                answer = await ask(QUESTIONS[i % len(QUESTIONS)])
                self.answers.append(answer)
                if answer.problem():
                    self.problems[f"{door}: {answer.problem()}"[:160]] += 1
        finally:
            if sending is not None:
                await sending
            await end()

    async def run(self) -> list[dict]:
        args = self.args
        started = time.monotonic()
        samples: list[dict] = []
        stop_sampling = asyncio.Event()
        samples.append(await asyncio.to_thread(sample, self.server, started))  # before any session
        sampling = asyncio.create_task(sampler(self.server, started, args.sample_every, samples, stop_sampling))
        end_at = started + args.minutes * 60
        doors = itertools.cycle(args.doors)
        running: collections.deque[tuple[asyncio.Event, asyncio.Task]] = collections.deque()

        def open_one(watch: bool = False) -> None:
            stop = asyncio.Event()
            running.append((stop, asyncio.create_task(self.session(next(doors), watch, stop))))

        for i in range(args.sessions):
            # The first socket session watches.
            open_one(watch="socket" in args.doors and i == args.doors.index("socket"))
        next_churn = started + args.churn_every
        while time.monotonic() < end_at:
            await asyncio.sleep(min(1.0, max(0.0, end_at - time.monotonic())))
            if next_churn <= time.monotonic() < end_at:
                next_churn += args.churn_every
                stop, task = running.popleft()  # the oldest leaves, a new one of the next door comes
                stop.set()
                await task
                open_one()
        for stop, _ in running:
            stop.set()
        await asyncio.gather(*(task for _, task in running), return_exceptions=True)

        def drained() -> bool:
            health = self.server.get_json("/api/health")
            return health["sessions"] == 0 and health["running_requests"] == 0

        try:
            await eventually_async(lambda: asyncio.to_thread(drained), args.drain_timeout,
                                   "every session ended and nothing runs")
        except AssertionError as exc:
            self.problems[str(exc)[:160]] += 1

        # A closed peer's or socket's last tasks (aiortc's closing handles, a
        # writer's last flush) end a moment after its session; wait for the
        # count to come back, and report what is left after --settle-tasks.
        def tasks_back() -> bool:
            return (server_process(self.server)[1].get("asyncio_tasks") or 0) <= (samples[0]["asyncio_tasks"] or 0)

        try:
            await eventually_async(lambda: asyncio.to_thread(tasks_back), args.settle_tasks,
                                   "the server's tasks back to their start", interval=0.5)
        except AssertionError:
            pass  # tasks_end_minus_start says how many are left
        stop_sampling.set()
        await sampling
        samples.append(await asyncio.to_thread(sample, self.server, started))  # all sessions ended
        return samples


def report(args: argparse.Namespace, soak: Soak, samples: list[dict]) -> dict[str, Any]:
    settle_s = args.settle_minutes * 60 if args.minutes > args.settle_minutes else 0.0

    def series(process: str) -> list[tuple[float, float]]:
        return [(s["t_s"], s[process]["rss_mb"]) for s in samples
                if s["t_s"] >= settle_s and s[process]["rss_mb"] is not None]

    first, last = samples[0], samples[-1]

    def diff(get) -> float | None:
        a, b = get(first), get(last)
        return None if a is None or b is None else b - a

    errors = sum(soak.problems.values())
    return {
        "minutes": args.minutes, "sessions": args.sessions, "answers": sum(1 for a in soak.answers if not a.problem()),
        "watched_answers": soak.watched, "errors": errors, "problems": dict(soak.problems),
        "opened": dict(soak.opened),
        "rss_slope_mb_per_h": slope_per_hour(series("server")),
        "engine_rss_slope_mb_per_h": slope_per_hour(series("engine")),
        "fds_end_minus_start": diff(lambda s: s["server"]["fds"]),
        "engine_fds_end_minus_start": diff(lambda s: s["engine"]["fds"]),
        "threads_end_minus_start": diff(lambda s: s["server"]["threads"]),
        "tasks_end_minus_start": diff(lambda s: s["asyncio_tasks"]),
        "samples": samples,
    }


def summary(r: dict[str, Any]) -> str:
    return (f"soak: minutes={r['minutes']:g} sessions={r['sessions']} answers={r['answers']} errors={r['errors']} "
            f"rss_slope_mb_per_h={fmt(r['rss_slope_mb_per_h'], '.1f')} "
            f"engine_rss_slope_mb_per_h={fmt(r['engine_rss_slope_mb_per_h'], '.1f')} "
            f"fds_end_minus_start={fmt(r['fds_end_minus_start'], '.0f')} "
            f"tasks_end_minus_start={fmt(r['tasks_end_minus_start'], '.0f')}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--doors", default=",".join(DOORS), type=lambda v: tuple(d for d in v.split(",") if d),
                   help="the doors sessions come through, in turn (default: all three); one door alone "
                        "tells which door a growth comes with")
    p.add_argument("--sessions", type=int, default=4)
    p.add_argument("--size", default="320x240")
    p.add_argument("--fps", type=float, default=10.0)
    p.add_argument("--ask-every", type=float, default=10.0)
    p.add_argument("--churn-every", type=float, default=120.0, help="seconds between one session leaving and a "
                   "new one opening")
    p.add_argument("--sample-every", type=float, default=10.0)
    p.add_argument("--settle-minutes", type=float, default=5.0)
    p.add_argument("--frames", type=int, default=4, help="frames per question")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--answer-timeout", type=float, default=120.0)
    p.add_argument("--mm-cache-gb", type=float, default=0.05, help="the server's --mm-cache-gb: vLLM's cache of "
                   "processed frames is bounded, but on live video every frame is new, so at the server's default "
                   "(1 GiB) it fills for about 27 minutes with 4 sessions, in both processes, and a soak would read "
                   "that as a leak; small, it is full within the settle minutes")
    p.add_argument("--drain-timeout", type=float, default=60.0)
    p.add_argument("--settle-tasks", type=float, default=30.0, help="seconds the server's asyncio tasks get to "
                   "come back to their start once every session ended, before the last sample")
    token_args(p)
    args = p.parse_args(argv)
    args.width, args.height = (int(x) for x in args.size.lower().split("x"))
    unknown = sorted(set(args.doors) - set(DOORS))
    if unknown or not args.doors:
        p.error(f"--doors takes some of {', '.join(DOORS)}, got {','.join(args.doors) or 'none'}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    quiet_loggers()
    RESULTS.mkdir(parents=True, exist_ok=True)
    server = start_server(RESULTS / "soak-server.log",
                          ["--max-sessions", str(args.sessions + 4), "--max-sessions-per-client", "0",
                           "--mm-cache-gb", str(args.mm_cache_gb), *args.server_arg],
                          token=args.token)
    try:
        soak = Soak(args, server)
        samples = asyncio.run(soak.run())
    finally:
        stop_server(server)
    r = report(args, soak, samples)
    (RESULTS / "soak.json").write_text(json.dumps(r, indent=1))
    if r["problems"]:
        log.warning("problems: %s", json.dumps(r["problems"], indent=1))
    print(summary(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
