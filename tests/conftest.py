"""Shared fixtures: the tiny models and one real vLLM engine per family,
started once per test session (each start costs ~20 s on CPU)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vidchat import tinymodel
from vidchat.engine import Engine, EngineOptions

CACHE_DIR = Path(os.environ.get("VIDCHAT_CACHE_DIR", Path.home() / ".cache" / "vidchat"))
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"

# Small enough to start fast on 2 cores, large enough for 16 frames + audio.
TEST_MAX_MODEL_LEN = 4096
TEST_MAX_IMAGES = 16


def tiny_options(path: Path, **overrides) -> EngineOptions:
    opts = dict(
        model=str(path),
        dtype="float32",
        max_model_len=TEST_MAX_MODEL_LEN,
        kv_cache_gb=0.25,
        max_images=TEST_MAX_IMAGES,
        max_image_pixels=tinymodel.MAX_PIXELS,
        max_audios=16,  # room for --audio-segments, which tests switch on where they need it
    )
    opts.update(overrides)
    return EngineOptions(**opts)


@pytest.fixture(scope="session")
def tiny_omni_path() -> Path:
    return tinymodel.ensure(CACHE_DIR, "omni")


@pytest.fixture(scope="session")
def tiny_vl_path() -> Path:
    return tinymodel.ensure(CACHE_DIR, "vl")


@pytest.fixture(scope="session")
def omni_engine(tiny_omni_path):
    engine = Engine.start(tiny_options(tiny_omni_path))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


# ---- the app, served by uvicorn in a subprocess exactly as users run it ----

import asyncio as _asyncio
import socket
import subprocess
import sys
import time as _time
import urllib.request

ROOT = Path(__file__).resolve().parent.parent
# Short protocol timeouts so the idle/config timeout tests run in seconds.
SERVER_ARGS = ["--ws-idle-timeout", "4", "--ws-config-timeout", "2", "--session-idle-timeout", "8"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, proc: subprocess.Popen, port: int, log_path: Path):
        self.proc, self.port, self.log_path = proc, port, log_path
        self.url = f"http://127.0.0.1:{port}"
        self.ws_url = f"ws://127.0.0.1:{port}/v1/video/chat/stream"

    def get_json(self, path: str) -> dict:
        import json

        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            return json.loads(e.read())

    def post_json(self, path: str, body: dict) -> dict:
        import json

        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def running_requests(self) -> int:
        return self.get_json("/api/health")["running_requests"]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_server(args: list[str], log_path: Path, timeout: float = 180, env_extra: dict | None = None) -> Server:
    port = free_port()
    env = dict(os.environ, VIDCHAT_CACHE_DIR=str(CACHE_DIR), **(env_extra or {}))
    log_file = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "app.py"), "--port", str(port), "--cache-dir", str(CACHE_DIR), *args],
        cwd=ROOT,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=env,
    )
    server = Server(proc, port, log_path)
    deadline = _time.monotonic() + timeout
    while _time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()[-3000:]}")
        try:
            if server.get_json("/api/health").get("ok"):
                return server
        except OSError:
            pass
        _time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"server not ready in {timeout} s:\n{server.log()[-3000:]}")


def stop_server(server: Server) -> int:
    server.proc.send_signal(2)  # Ctrl-C
    try:
        return server.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        return -9


@pytest.fixture(scope="session")
def server(tiny_omni_path, artifacts_dir) -> Server:
    srv = start_server(
        ["--model", "tiny", "--max-images", str(TEST_MAX_IMAGES), "--max-model-len", str(TEST_MAX_MODEL_LEN),
         "--kv-cache-gb", "0.25", *SERVER_ARGS],
        artifacts_dir / "server.log",
    )
    yield srv
    stop_server(srv)


def thumbnail_colours(inputs_html: str) -> list:
    """Mean colour of the top band (background only) of each thumbnail the
    page shows under 'What the model got'."""
    import base64
    import io
    import re

    import numpy as np
    from PIL import Image

    colours = []
    for b64 in re.findall(r"data:image/jpeg;base64,([A-Za-z0-9+/=]+)", inputs_html):
        img = np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"), dtype=np.float32)
        colours.append(img[: img.shape[0] // 6].reshape(-1, 3).mean(0))
    return colours


async def until_idle(server, within: float = 1.0) -> int:
    """Poll until the engine runs nothing (or `within` seconds pass); returns what still runs."""
    deadline = _time.monotonic() + within
    while (running := await _asyncio.to_thread(server.running_requests)) and _time.monotonic() < deadline:
        await _asyncio.sleep(0.05)
    return running
