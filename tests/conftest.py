"""Shared fixtures: the tiny models, the engines and the server.

Engines and servers are started once per test session and shared: isolation
comes from a new vidchat session (each has its own cache salt), not a new
process. The suite's rules (tiers and their guard, timeouts, the count of
engine starts) are the plugin vidchat.devtools.tiers, loaded by pyproject's
addopts.
"""

from __future__ import annotations

import asyncio as _asyncio
import importlib.util
import json
import os
import time
from pathlib import Path

import pytest

from vidchat.devtools import harness, tinymodel, vllm_servers
from vidchat.devtools.harness import ROOT, NeverHappened, Server, allocate_port, eventually, eventually_async  # noqa: F401 - re-exported for the test modules
from vidchat.devtools.tiers import (
    MachineShare,
    count_engine_start,  # noqa: F401 - re-exported
)
from vidchat.engine import EngineOptions
from vidchat.engine.local import LocalEngine

CACHE_DIR = Path(os.environ.get("VIDCHAT_CACHE_DIR", Path.home() / ".cache" / "vidchat"))
ARTIFACTS = ROOT / "test-artifacts"


def load_script(relative: str):
    """A script of this repository (``bench/page.py``, ``scripts/timeline.py``) as a module, so a test
    runs its parts, a benchmark's rows on the suite's own engine or server."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(f"{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Small enough to start fast on 2 cores, large enough for 16 frames + audio.
TEST_MAX_MODEL_LEN = 4096
TEST_MAX_IMAGES = 16
# Short protocol timeouts so the idle/config timeout tests run in seconds.
# A WebRTC session outlives 20 s without media, not 8: with two workers on
# 2 cores, a tab's Chromium starved beside the other worker's engines once
# sent nothing for 8 s and its session expired mid-test.
SESSION_IDLE_TIMEOUT = 20
SERVER_ARGS = ["--ws-idle-timeout", "4", "--ws-config-timeout", "2",
               "--session-idle-timeout", str(SESSION_IDLE_TIMEOUT)]

free_port = allocate_port  # the name the older test modules use

# How `make test` spreads the suite over xdist workers (--dist loadfile, with
# the scheduler below): a module is a unit of work, except that modules
# sharing an expensive session fixture travel together, so one worker starts
# it once instead of each worker starting its own.
SHARED_FIXTURE_GROUPS = {
    # the suite's `vllm serve` (tiny_vllm_serve)
    "test_hosting": "vllm-serve", "test_hosting_page": "vllm-serve", "test_space": "vllm-serve",
    "test_remote_engine": "vllm-serve", "test_realtime": "vllm-serve", "test_router": "vllm-serve",
    "test_suite_add": "vllm-serve", "test_slow_client": "vllm-serve",
    # the in-process tiny engines (omni_engine, vl_engine)
    "test_engine": "tiny-engines", "test_answer_path": "tiny-engines", "test_video_timing": "tiny-engines",
    "test_conversation": "tiny-engines", "test_prewarm": "tiny-engines", "test_talk": "tiny-engines",
    "test_bench_talk": "tiny-engines", "test_bench_gpu": "tiny-engines", "test_memory": "tiny-engines",
    # the server whose engine is killed and comes back (restarting_server)
    "test_operations": "restarting-server", "test_suite_server": "restarting-server",
}
# Units of work, longest first (seconds of a serial run, measured; the
# rest are shorter): workers take them in this order as they free up, so no
# long unit is left for the end while the other worker idles.
LONGEST_FIRST = ["vllm-serve", "test_page", "test_compare", "test_page_polish", "test_preset_qwen", "test_webrtc",
                 "test_access", "test_page_watch", "test_suite", "test_replay", "tiny-engines",
                 "test_app", "restarting-server", "test_page_layout", "test_types", "test_bench_soak",
                 "test_preset_smolvlm", "test_page_chat", "test_page_suite",
                 "test_page_cpu_default", "test_page_talk", "test_bench_page", "test_page_pause", "test_protocol",
                 "test_streams", "test_realtime_clients", "test_encoder_cache", "test_bundle_limits",
                 "test_protocol_talk", "test_stream_outage", "test_fuzz"]


def work_unit(nodeid: str) -> str:
    module = Path(nodeid.split("::")[0]).stem
    return SHARED_FIXTURE_GROUPS.get(module, module)


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "stops_shared_server: runs last in its work unit (it stops a server that "
                                       "the unit's other modules share)")


def pytest_collection_modifyitems(config, items) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(work_unit(item.nodeid), len(rank)),
                                 item.get_closest_marker("stops_shared_server") is not None, order[id(item)]))


def pytest_xdist_make_scheduler(config, log):
    """With --dist loadfile: hand out work units (a module, or the modules of
    one group) in collection order. xdist's own loadgroup can't be used: it
    renames test ids, which pytest 9 no longer allows."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # keep the longest-first order
    return ByWorkUnit(config, log)


# Each test, set-up to teardown, shares the machine with the other workers'
# tests; a step that must have it to itself asks MACHINE.alone().
MACHINE = MachineShare.for_this_process()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    MACHINE.test_starts()
    started = time.time()
    try:
        return (yield)
    finally:
        MACHINE.test_ends()
        _timeline_line(item.nodeid, started)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    if not hasattr(session.config, "workerinput"):  # the run's controller, before its workers start
        for old in ARTIFACTS.glob("timeline-*.jsonl"):
            old.unlink()


def _timeline_line(nodeid: str, started: float) -> None:
    """Where a run's wall time went, test by test and worker by worker
    (scripts/timeline.py reads test-artifacts/timeline-*.jsonl)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    line = {"worker": worker, "unit": work_unit(nodeid), "test": nodeid, "start": started, "end": time.time()}
    with open(ARTIFACTS / f"timeline-{worker}.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


# ---- models and engines ----


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
    engine = LocalEngine.start(tiny_options(tiny_omni_path))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def vl_engine(tiny_vl_path):
    """The vision-only family (Qwen2-VL), shared by every module that needs it."""
    engine = LocalEngine.start(tiny_options(tiny_vl_path))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def tiny_vllm_serve(tiny_omni_path, artifacts_dir) -> str:
    """One `vllm serve` of the tiny omni model (loopback), shared by the
    remote-engine tests and by the servers whose tests are about access, not
    the engine (hosting modes, a Space's start): they run app.py with
    ``--engine-url`` on it instead of each loading a model of their own."""
    serve = vllm_servers.start_vllm_serve(tiny_omni_path, artifacts_dir / "vllm-serve.log",
                                          vllm_servers.tiny_serve_args(TEST_MAX_MODEL_LEN, TEST_MAX_IMAGES))
    count_engine_start("vllm serve")
    yield serve.url
    vllm_servers.stop_vllm_serve(serve)


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


# ---- the app, served by uvicorn in a subprocess exactly as users run it ----


def start_server(args: list[str], log_path: Path, timeout: float = 240, env_extra: dict | None = None,
                 token: str | None = None, loaded: bool = True) -> Server:
    """harness.start_server with the suite's model cache, and memory off
    unless the test names ``--memory``: the suite's `vllm serve` replicas run
    on this CPU, where --memory auto would pick off had it known, but at
    --engine-url auto assumes a GPU and captions in the background, which a
    test counting a replica's requests or its prefix cache would read as its own."""
    if "--memory" not in args:
        args = [*args, "--memory", "off"]
    return harness.start_server(args, log_path, timeout=timeout, env_extra=env_extra, token=token,
                                cache_dir=CACHE_DIR, loaded=loaded)


def stop_server(srv: Server) -> int:
    return harness.stop_server(srv)


STREAM_SECRET = "s3cret-pass"  # the password of the shared server's "locked" stream (tests/test_streams.py)
TINY_SERVER_ARGS = ["--model", "tiny", "--max-images", str(TEST_MAX_IMAGES), "--max-model-len",
                    str(TEST_MAX_MODEL_LEN), "--kv-cache-gb", "0.25"]


@pytest.fixture(scope="session")
def server(tiny_omni_path, artifacts_dir, tmp_path_factory) -> Server:
    """The loopback server every test shares unless it needs other flags."""
    # --prewarm auto: the start-up choice runs here (on the tiny model it comes out off).
    # --suite-dir: the page's Add to suite (tests/test_page_suite.py) writes its cases there.
    # --stream: tests/test_streams.py starts these sources (on these ports) when it runs; until
    # then, and for every other test, they are names in the Source menu that nobody watches.
    suite_dir = tmp_path_factory.mktemp("suite")
    ports = {"cam": allocate_port(), "locked": allocate_port(), "hls": allocate_port()}
    streams = {"cam": f"rtsp://127.0.0.1:{ports['cam']}/cam",
               "locked": f"rtsp://viewer:{STREAM_SECRET}@127.0.0.1:{ports['locked']}/cam",
               "hls": f"http://127.0.0.1:{ports['hls']}/index.m3u8"}
    srv = start_server([*TINY_SERVER_ARGS, *SERVER_ARGS, "--prewarm", "auto", "--suite-dir", str(suite_dir),
                        *(arg for name, url in streams.items() for arg in ("--stream", f"{name}={url}"))],
                       artifacts_dir / "server.log")
    srv.suite_dir = suite_dir
    srv.stream_ports = ports
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def restarting_server(tiny_omni_path, artifacts_dir, tmp_path_factory) -> Server:
    """A server whose engine the tests kill: test_operations kills it mid-answer,
    then test_suite_server mid-run (--engine-restarts 3 an hour allows both),
    whose last test stops the server at shutdown. One engine start and one
    restart fewer than a server each; its tests count restarts from what they
    find, not from zero. Default idle timeouts: a socket waits out a restart."""
    suite_dir = tmp_path_factory.mktemp("suite-edges")
    srv = start_server([*TINY_SERVER_ARGS, "--suite-dir", str(suite_dir), "--engine-restarts", "3",
                        "--suite-keep-runs", "2"], artifacts_dir / "server-restarting.log")
    srv.suite_dir = suite_dir
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def camera(tmp_path_factory):
    """A fake camera (a coloured room with a square sliding across) and microphone (a tone) for Chromium."""
    from vidchat.devtools.page import write_wav, write_y4m

    d = tmp_path_factory.mktemp("camera")
    write_y4m(d / "cam.y4m", (200, 120, 40))
    write_wav(d / "mic.wav")
    return d / "cam.y4m", d / "mic.wav"


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


async def until_running(server, count: int, within: float, what: str) -> bool:
    """Wait until vLLM holds exactly ``count`` requests; the failure names the count seen last."""
    async def holds() -> bool:
        running = await _asyncio.to_thread(server.running_requests)
        if running != count:
            raise LookupError(f"running_requests={running}")
        return True

    return await eventually_async(holds, within, what)


async def until_idle(server, within: float = 1.0) -> int:
    """Wait until the engine runs nothing; returns what still runs after ``within`` s (0 when it went idle)."""
    async def idle() -> bool:
        return await _asyncio.to_thread(server.running_requests) == 0

    try:
        await eventually_async(idle, within, "the engine has no running request")
        return 0
    except NeverHappened:
        return await _asyncio.to_thread(server.running_requests)
