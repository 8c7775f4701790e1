"""The harness the tests and the benchmarks share to start vidchat (app.py in
a subprocess, exactly as users run it) and stop it.

Its companions: :mod:`vidchat.devtools.harness` (waiting for a condition with a
deadline), :mod:`vidchat.devtools.harness` (free ports) and
:mod:`vidchat.devtools.vllm_servers` (``vllm serve`` and vllm-router).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, TypeVar

# Free TCP ports for the servers the tests and the benchmarks start.
#
# Ports come from below Linux's ephemeral range (32768-60999 by default), so no
# outgoing connection of this or any other process is given the port between
# the check here and the server's own bind; each process walks its own
# stretch, and a port is never handed out twice in one process.

_PORT_LOW, _PORT_HIGH = 20_000, 32_000

_port_lock = threading.Lock()

_port_counter = itertools.count((os.getpid() * 211) % (_PORT_HIGH - _PORT_LOW))


def allocate_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on and that the kernel
    does not hand out by itself."""
    with _port_lock:
        for _ in range(_PORT_HIGH - _PORT_LOW):
            port = _PORT_LOW + next(_port_counter) % (_PORT_HIGH - _PORT_LOW)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            return port
    raise RuntimeError(f"no free port in {_PORT_LOW}-{_PORT_HIGH} on {host}")


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


# Waiting for a condition with a deadline, never for a fixed time.
#
# A wait that runs out says what never happened and what it saw last, so a
# failure reads as a sentence instead of a bare ``assert False``. The tests,
# the benchmarks and :mod:`vidchat.devtools.vllm_servers` share these waits.

T = TypeVar("T")


class NeverHappened(AssertionError):
    """A condition did not hold within its deadline."""


def _describe(what: str, within: float, last: Any) -> str:
    shown = repr(last)
    if len(shown) > 600:
        shown = shown[:600] + "…"
    return f"within {within:g} s, never: {what} (last seen: {shown})"


class _Tries:
    """The bookkeeping both waits share: the deadline and the last thing seen."""

    def __init__(self, within: float, what: str) -> None:
        self.within, self.what = within, what
        self.deadline = time.monotonic() + within
        self.last: Any = None

    def saw(self, value: Any) -> bool:
        self.last = value
        return bool(value) and not isinstance(value, Exception)

    def give_up_if_late(self) -> None:
        if time.monotonic() >= self.deadline:
            raise NeverHappened(_describe(self.what, self.within, self.last))


def eventually(predicate: Callable[[], T], within: float, what: str, interval: float = 0.05) -> T:
    """Call ``predicate`` until it returns something truthy and return that;
    raise :class:`NeverHappened` naming ``what`` once ``within`` seconds pass.
    An exception the predicate raises counts as "not yet" (a server still
    starting refuses connections) and is shown if the deadline passes; an
    AssertionError is final (the predicate says it can never come true)."""
    tries = _Tries(within, what)
    while True:
        try:
            value = predicate()
        except AssertionError:
            raise
        except Exception as exc:  # noqa: BLE001 - "not yet", reported at the deadline
            value = exc
        if tries.saw(value):
            return value
        tries.give_up_if_late()
        time.sleep(interval)


async def eventually_async(predicate: Callable[[], T | Awaitable[T]], within: float, what: str,
                           interval: float = 0.05) -> T:
    """:func:`eventually` for a running event loop: ``predicate`` may be a
    plain function or return an awaitable; the loop keeps running between
    tries. A blocking predicate (HTTP with urllib) belongs in
    ``asyncio.to_thread`` inside it."""
    tries = _Tries(within, what)
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
        except AssertionError:
            raise
        except Exception as exc:  # noqa: BLE001
            value = exc
        if tries.saw(value):
            return value
        tries.give_up_if_late()
        await asyncio.sleep(interval)
