"""Past one machine: N sessions over two `vllm serve` replicas, routed three
ways in one run, and what each way keeps of the replicas' prefix caches.

    .venv/bin/python bench/scale.py [--sessions 8] [--rounds 2] [--follow-ups 2] [--frames 4]

Two replicas of the tiny model (loopback), then, one after the other:

* ``hash``: vLLM's router, ``vllm-router --policy consistent_hash``, in front
  of both; vidchat ``--engine-url`` on the router (each request carries the
  session's key in ``X-Session-ID``);
* ``rr``: the same router restarted on the same port with ``--policy
  round_robin`` (the same vidchat server);
* ``own``: vidchat ``--engine-url A,B``, no router: vidchat's own
  consistent hashing.

Each session (WebSocket door) streams ``--frames`` new 640x480 frames a
round and asks a question, then ``--follow-ups`` more on the same frames
(what a user does: a follow-up, a re-ask). Per way: the share of prompt
tokens served from the prefix cache, p50/p95 time to first token (client
side, from the question to its first delta), errors. Last line:
``scale: sessions=… replicas=2 cached_share_hash=… cached_share_rr=…
p95_ttft_hash_ms=… p95_ttft_rr_ms=… errors=…`` (errors: all three ways).

The tiny model's prefill is cheap, so here the times barely differ: the
cached share is the figure that carries over. What it is worth with a real
model is the measured true-size prefill (SmolVLM2-256M, random weights, 2
CPU cores, DESIGN.md): a cold 16-frame question 14.6 s against 141 ms
warm, 4 frames 1,032 ms against 45 ms. Every question a policy serves from
cache instead of cold saves that difference; the script prints the
estimate per policy. On a GPU the absolute times are smaller but the ratio
of cold to warm prefill, and so what a lost cache costs, is of the same kind.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _server import percentile, quiet_loggers  # noqa: E402

from vidchat.devtools import harness, synthetic, tinymodel, vllm_servers  # noqa: E402

log = logging.getLogger("bench.scale")
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "bench-scale"
SERVER_ARGS = ["--model", "tiny", "--prewarm", "off", "--max-sessions", "64", "--max-concurrent-answers", "0",
               "--ws-idle-timeout", "300"]
# True-size prefill (SmolVLM2-256M, random weights, 2 CPU cores; DESIGN.md), ms.
TRUE_SIZE = {4: (1032.0, 45.0), 16: (14600.0, 141.0)}


@dataclass
class Way:
    """One routing way's answers."""

    name: str
    ttft_ms: list[float] = field(default_factory=list)
    cached: int = 0
    prompt: int = 0
    questions: int = 0
    warm_questions: int = 0  # questions with most of their prompt cached
    errors: int = 0

    @property
    def share(self) -> float:
        return self.cached / self.prompt if self.prompt else 0.0


async def ask(ws, text: str, way: Way) -> None:
    sent = time.perf_counter()
    await ws.send(json.dumps({"type": "video.query", "text": text}))
    first = None
    while True:
        msg = json.loads(await asyncio.wait_for(ws.recv(), 120))
        if msg["type"] == "response.text.delta" and first is None:
            first = time.perf_counter() - sent
        elif msg["type"] == "error":
            way.errors += 1
        elif msg["type"] == "response.text.done":
            stats = msg["stats"]
            way.questions += 1
            way.cached += stats.get("cached_tokens") or 0
            way.prompt += stats.get("prompt_tokens") or 0
            if stats.get("prompt_tokens") and (stats.get("cached_tokens") or 0) > stats["prompt_tokens"] / 2:
                way.warm_questions += 1
            if first is not None:
                way.ttft_ms.append(first * 1000)
            return


async def one_session(url: str, jpegs: list[str], args: argparse.Namespace, way: Way) -> None:
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", "num_frames": args.frames, "max_tokens": 4,
                                  "temperature": 0.0}))
        for r in range(args.rounds):
            for jpeg in jpegs[r * args.frames:(r + 1) * args.frames]:
                await ws.send(json.dumps({"type": "video.frame", "data": jpeg}))
            await ask(ws, f"Round {r + 1}: what changed?", way)
            for f in range(args.follow_ups):
                await ask(ws, f"Round {r + 1}, follow-up {f + 1}: and what else?", way)


async def run_way(server: harness.Server, name: str, jpegs: list[str], args: argparse.Namespace) -> Way:
    way = Way(name)
    results = await asyncio.gather(*(one_session(server.ws_url, jpegs, args, way) for _ in range(args.sessions)),
                                   return_exceptions=True)
    for failed in [r for r in results if isinstance(r, BaseException)]:
        way.errors += 1
        log.warning("%s: a session failed: %r", name, failed)
    p50, p95 = percentile(way.ttft_ms, 50), percentile(way.ttft_ms, 95)
    print(f"{name:4s} questions {way.questions:3d}  cached share {way.share:.3f} ({way.cached}/{way.prompt} "
          f"prompt tokens; {way.warm_questions} questions mostly cached)  ttft p50 {p50 or 0:7.1f} ms  "
          f"p95 {p95 or 0:7.1f} ms  errors {way.errors}", flush=True)
    return way


def true_size_note(ways: list[Way], frames: int) -> None:
    """What the cached share would save with a real model (TRUE_SIZE)."""
    cold, warm = TRUE_SIZE[16 if frames > 8 else 4]
    basis = 16 if frames > 8 else 4
    for way in ways:
        saved = way.warm_questions * (cold - warm) / 1000
        print(f"{way.name:4s} with SmolVLM2-256M at true size ({basis} frames: cold {cold:.0f} ms, warm {warm:.0f} "
              f"ms): {way.warm_questions} of {way.questions} questions warm save ~{saved:.0f} s of prefill")


async def run_all(args: argparse.Namespace, urls: list[str], jpegs: list[str]) -> list[Way]:
    """The three ways, one after the other, against the same two replicas."""
    router = await asyncio.to_thread(vllm_servers.start_router, urls, "consistent_hash", ARTIFACTS / "router.log")
    own_server = server = None
    try:
        server = await asyncio.to_thread(harness.start_server, [*SERVER_ARGS, "--engine-url", router.url],
                                         ARTIFACTS / "server-router.log")
        hashed = await run_way(server, "hash", jpegs, args)
        await asyncio.to_thread(vllm_servers.stop_router, router)
        port = int(router.url.rsplit(":", 1)[1])
        router = await asyncio.to_thread(vllm_servers.start_router, urls, "round_robin", ARTIFACTS / "router-rr.log",
                                         port)
        spread = await run_way(server, "rr", jpegs, args)
        own_server = await asyncio.to_thread(harness.start_server, [*SERVER_ARGS, "--engine-url", ",".join(urls)],
                                             ARTIFACTS / "server-hashing.log")
        own = await run_way(own_server, "own", jpegs, args)
        return [hashed, spread, own]
    finally:
        for srv in (server, own_server):
            if srv is not None:
                await asyncio.to_thread(harness.stop_server, srv)
        await asyncio.to_thread(vllm_servers.stop_router, router)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of new frames per session")
    parser.add_argument("--follow-ups", type=int, default=2, help="questions on the same frames after each round's first")
    parser.add_argument("--frames", type=int, default=4, help="new frames a round, and frames per question")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    quiet_loggers()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    model = tinymodel.ensure(Path.home() / ".cache" / "vidchat", "omni")
    clip = synthetic.cuts_clip(480, 640, cuts=args.rounds * args.frames, hold=1)
    jpegs = [base64.b64encode(j).decode() for j in clip.jpegs()]
    replicas = []
    try:
        for i in range(2):
            replicas.append(vllm_servers.start_vllm_serve(model, ARTIFACTS / f"vllm-serve-{i + 1}.log",
                                                          vllm_servers.tiny_serve_args()))
        ways = asyncio.run(run_all(args, [r.url for r in replicas], jpegs))
    finally:
        for replica in replicas:
            vllm_servers.stop_vllm_serve(replica)
    hashed, spread, own = ways
    true_size_note(ways, args.frames)
    print(f"own hashing (no router): cached_share_own={own.share:.3f} "
          f"p95_ttft_own_ms={percentile(own.ttft_ms, 95) or 0:.1f}")
    print(f"scale: sessions={args.sessions} replicas=2 cached_share_hash={hashed.share:.3f} "
          f"cached_share_rr={spread.share:.3f} p95_ttft_hash_ms={percentile(hashed.ttft_ms, 95) or 0:.1f} "
          f"p95_ttft_rr_ms={percentile(spread.ttft_ms, 95) or 0:.1f} "
          f"errors={sum(w.errors for w in ways)}")


if __name__ == "__main__":
    main()
