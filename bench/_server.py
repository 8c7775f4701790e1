"""Shared by bench/load.py and bench/cycles.py: start and stop a real vidchat
server (app.py in a subprocess, the tiny model), talk HTTP to it with an
optional token, and read its CPU and memory (the process and its children,
i.e. vLLM's engine core)."""

from __future__ import annotations

import collections
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
# As bench/ingest.py: the tiny model and a small KV cache, so start-up stays short on 2 cores.
BASE_ARGS = ["--model", "tiny", "--kv-cache-gb", "0.25", "--max-model-len", "4096", "--max-images", "16"]
log = logging.getLogger("bench.server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    url: str  # http://127.0.0.1:PORT
    token: str | None
    log_path: Path

    @property
    def ws_url(self) -> str:
        """The seed protocol's URL; the token goes in the query (browsers cannot set WebSocket headers)."""
        url = self.url.replace("http://", "ws://", 1) + "/v1/video/chat/stream"
        return url + "?" + urllib.parse.urlencode({"token": self.token}) if self.token else url

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def http_json(self, path: str, body: dict | None = None, timeout: float = 10) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        headers = self.headers()
        if data is not None:
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.url + path, data, headers)
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())

    def health(self) -> dict:
        return self.http_json("/api/health")

    @property
    def process(self) -> psutil.Process:
        return psutil.Process(self.proc.pid)

    def log_problems(self) -> list[str]:
        """Warning, error and traceback lines of the server's log."""
        return [ln for ln in self.log_path.read_text(errors="replace").splitlines()
                if " WARNING " in ln or " ERROR " in ln or "Traceback" in ln]


def start_server(log_path: Path, extra: list[str], token: str | None = None, timeout: float = 300) -> Server:
    """app.py --model tiny on a free port; returns once /api/health says ok."""
    port = free_port()
    cmd = [sys.executable, str(ROOT / "app.py"), "--host", "127.0.0.1", "--port", str(port), *BASE_ARGS, *extra]
    if token:
        cmd += ["--token", token]
    if os.environ.get("VIDCHAT_CACHE_DIR"):
        cmd += ["--cache-dir", os.environ["VIDCHAT_CACHE_DIR"]]
    log.info("starting server: %s", " ".join(cmd[1:]).replace(token or "\0", "***"))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT)
    server = Server(proc, f"http://127.0.0.1:{port}", token, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            if server.http_json("/api/health", timeout=2).get("ok"):
                return server
        except (OSError, ValueError):  # not listening yet, or 503 while the model loads
            pass
        time.sleep(0.5)
    stop_server(server)
    raise RuntimeError(f"server not ready in {timeout:.0f} s:\n{log_path.read_text()[-3000:]}")


def stop_server(server: Server) -> None:
    proc = server.proc
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


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
