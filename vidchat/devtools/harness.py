"""The harness the tests and the benchmarks share to start vidchat (app.py in
a subprocess, exactly as users run it) and stop it.

Its companions: :mod:`vidchat.devtools.waits` (waiting for a condition with a
deadline), :mod:`vidchat.devtools.free_ports` (free ports) and
:mod:`vidchat.devtools.vllm_servers` (``vllm serve`` and vllm-router).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vidchat.devtools.free_ports import allocate_port

ROOT = Path(__file__).resolve().parents[2]
log = logging.getLogger("vidchat.harness")

# The tiny omni model with a small KV cache and context: quick to start on 2
# cores, large enough for 16 frames and audio.
TINY_ARGS = ["--model", "tiny", "--max-images", "16", "--max-model-len", "4096", "--kv-cache-gb", "0.25"]


@dataclass
class Server:
    """A running app.py. HTTP helpers return parsed JSON, also for error
    statuses (FastAPI's ``{"detail": ...}``)."""

    proc: subprocess.Popen
    port: int
    log_path: Path
    token: str | None = None
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        """The seed protocol's URL, with the token in the query where one is
        set (browsers cannot set WebSocket headers)."""
        url = f"ws://127.0.0.1:{self.port}/v1/video/chat/stream"
        return url + "?" + urllib.parse.urlencode({"token": self.token}) if self.token else url

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def http_json(self, path: str, body: dict | None = None, timeout: float = 10) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        headers = self.headers()
        if data is not None:
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.url + path, data, headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            return json.loads(e.read())

    def get_json(self, path: str) -> dict:
        return self.http_json(path, timeout=5)

    def post_json(self, path: str, body: dict) -> dict:
        return self.http_json(path, body, timeout=10)

    def health(self) -> dict:
        return self.http_json("/api/health")

    def running_requests(self) -> int:
        return self.get_json("/api/health")["running_requests"]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_problems(self) -> list[str]:
        """Warning, error and traceback lines of the server's log."""
        return [ln for ln in self.log().splitlines() if " WARNING " in ln or " ERROR " in ln or "Traceback" in ln]

    @property
    def process(self) -> Any:
        """The server's process as psutil sees it (CPU and memory, with its children)."""
        import psutil

        return psutil.Process(self.proc.pid)



def _ready(server: Server) -> bool:
    if server.proc.poll() is not None:
        raise RuntimeError(f"server exited with {server.proc.returncode}:\n{server.log()[-3000:]}")
    try:
        return bool(server.http_json("/api/health", timeout=2).get("ok"))
    except (OSError, ValueError):  # not listening yet
        return False


def _listening(server: Server) -> bool:
    """The port answers (the model may still be loading: /api/health says so)."""
    if server.proc.poll() is not None:
        raise RuntimeError(f"server exited with {server.proc.returncode}:\n{server.log()[-3000:]}")
    try:
        server.http_json("/api/health", timeout=2)
        return True
    except (OSError, ValueError):
        return False


def per_worker(path: Path) -> Path:
    """``path`` as this xdist worker's own (``server.gw1.log``): the workers
    of one run start servers of the same name side by side."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return path.with_name(f"{path.stem}.{worker}{path.suffix}") if worker else path


def start_server(args: list[str], log_path: Path, timeout: float = 240, env_extra: dict | None = None,
                 token: str | None = None, cache_dir: Path | None = None, loaded: bool = True) -> Server:
    """Start app.py with ``args`` (plus ``--token`` when given) on a port of
    its own and return once ``/api/health`` says ok (``loaded`` false: as
    soon as the port answers, while the model may still be loading)."""
    log_path = per_worker(log_path)
    for attempt in range(3):
        port = allocate_port()
        cmd = [sys.executable, str(ROOT / "app.py"), "--host", "127.0.0.1", "--port", str(port), *args]
        if token:
            cmd += ["--token", token]
        cache_dir = cache_dir or (Path(os.environ["VIDCHAT_CACHE_DIR"]) if os.environ.get("VIDCHAT_CACHE_DIR")
                                  else None)
        env = dict(os.environ, **(env_extra or {}))
        if cache_dir:
            cmd += ["--cache-dir", str(cache_dir)]
            env["VIDCHAT_CACHE_DIR"] = str(cache_dir)
        log.info("starting server: %s", " ".join(cmd[2:]).replace(token or "\0", "***"))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w") as log_file:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        server = Server(proc, port, log_path, token, list(args))
        deadline = time.monotonic() + timeout
        try:
            while not (_ready if loaded else _listening)(server):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server not ready in {timeout:.0f} s:\n{server.log()[-3000:]}")
                time.sleep(0.2)
            return server
        except RuntimeError:
            stop_server(server)
            # Someone bound the port between allocate_port and the server:
            # take another one; any other failure is the server's own.
            if "address already in use" not in server.log().lower() or attempt == 2:
                raise
    raise AssertionError("unreachable")


def stop_server(server: Server, timeout: float = 30) -> int:
    """Ctrl-C, as a user stops it; killed if it has not exited in ``timeout`` s."""
    proc = server.proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            return -9
    return proc.returncode

