"""Shared by bench/load.py and bench/cycles.py: a real vidchat server (the
tiny model) through the harness the tests use (vidchat.devtools.harness), and
its CPU and memory (the process and its children, i.e. vLLM's engine core)."""

from __future__ import annotations

import collections
import logging
import os
import sys
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vidchat.devtools import harness  # noqa: E402

RESULTS = ROOT / "bench" / "results"
# As bench/ingest.py: the tiny model and a small KV cache, so start-up stays short on 2 cores.
BASE_ARGS = ["--model", "tiny", "--kv-cache-gb", "0.25", "--max-model-len", "4096", "--max-images", "16"]
log = logging.getLogger("bench.server")


Server = harness.Server


def start_server(log_path: Path, extra: list[str], token: str | None = None, timeout: float = 300) -> Server:
    """app.py --model tiny (BASE_ARGS) + ``extra`` through the shared harness; returns once it is ready."""
    return harness.start_server([*BASE_ARGS, *extra], log_path, timeout=timeout, token=token)


def stop_server(server: Server) -> None:
    harness.stop_server(server)


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return [proc]


def rss_mb(proc: psutil.Process) -> float:
    """Resident memory of the server and its children (vLLM's engine core), MB.
    A sum of RSS: pages shared between them count twice, the same every sample."""
    total = 0
    for p in _tree(proc):
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def cpu_seconds(proc: psutil.Process) -> float:
    """User+sys seconds of the server and its children (the engine core)."""
    total = 0.0
    for p in _tree(proc):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def quiet_loggers() -> None:
    for noisy in ("aioice", "aiortc", "websockets", "httpx", "gradio_client"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def percentile(xs: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100), None for no data."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def fmt(x: Any, spec: str = ".0f") -> str:
    return "n/a" if x is None else format(x, spec)


def token_args(parser) -> None:
    parser.add_argument("--token", default=os.environ.get("VIDCHAT_BENCH_TOKEN") or None,
                        help="start the server with --token TOKEN and use it in every client "
                        "(Authorization: Bearer for HTTP, ?token= for the WebSocket); default none")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="extra app.py argument (repeatable, e.g. --server-arg=--kv-cache-gb=0.5)")


def log_problem_summary(server: Server, out: logging.Logger) -> None:
    """Log (to the benchmark's own logger) where the server's log is and its
    three most frequent warning/error lines."""
    problems = server.log_problems()
    out.info("server log       : %s (%d warning/error lines)", server.log_path, len(problems))
    for text, n in collections.Counter(ln.split(" ", 1)[-1][:140] for ln in problems).most_common(3):
        out.info("  %d x %s", n, text)
