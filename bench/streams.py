"""Streams (--stream): what one stream costs, and that more sessions on it cost
(almost) nothing more.

Run: .venv/bin/python bench/streams.py            (~3 min on 2 cores)

1. Decode cost: one real RTSP camera (GStreamer's RTSP server,
   vidchat/devtools/rtsp_camera.py) at 320x240, 640x480 and 1280x720, 10 fps,
   read by vidchat's StreamReader in this process into one session for
   --seconds; the CPU this process spends per frame offered (decode, the
   filter, the kept frames' conversion), in ms. The camera's own encoding
   runs in its own process and is not counted.
2. Sessions on one stream: a vidchat server (tiny model) with the 320x240
   camera as --stream cam; 1, 4 and 8 seed-socket sessions attached to it;
   the server process's CPU (cores, 1.0 = one core) over --seconds each. It
   should stay near one session's: one reader decodes for all of them.
3. Latency: the median time from a frame's arrival at the reader to its place
   in the sessions' buffers (the server's /api/streams ``latency_ms``), with 8.

The last line:
  streams: cpu_1=<cores> cpu_4=<cores> cpu_8=<cores> per_stream_720p_ms=<ms> latency_p50_ms=<ms>
with the ratios cpu_4/cpu_1 and cpu_8/cpu_1 on the line before (the machine is
shared and noisy: the ratios, measured in the same run, are what to compare).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path

import psutil
import websockets

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from _server import RESULTS, start_server, stop_server  # noqa: E402

from vidchat.devtools.harness import allocate_port, eventually, eventually_async
from vidchat.devtools.stream_sources import start_rtsp_camera  # noqa: E402
from vidchat.media.session import Session  # noqa: E402
from vidchat.media.streams import LIVE, StreamReader  # noqa: E402

log = logging.getLogger("bench.streams")
SIZES = ("320x240", "640x480", "1280x720")


def decode_cost(size: str, seconds: float) -> float:
    """CPU ms this process spends per frame offered, one session, one camera at ``size``."""
    camera = start_rtsp_camera(allocate_port(), size=size, fps=10)
    reader = StreamReader(size, camera.url, fps=10.0, linger_s=0.5)
    session = Session(f"bench-{size}")
    try:
        reader.attach(session)
        eventually(lambda: reader.state == LIVE and reader.offered >= 10, 60, f"{size}: live")
        cpu0, offered0 = time.process_time(), reader.offered
        time.sleep(seconds)  # the measured interval: the reader works in its thread meanwhile
        cpu, offered = time.process_time() - cpu0, reader.offered - offered0
    finally:
        reader.detach(session)
        reader.close()
        camera.stop()
    ms = 1000 * cpu / max(offered, 1)
    log.info("%s: %d frames offered in %.0f s, %.2f ms of CPU each", size, offered, seconds, ms)
    return ms


async def sessions_cost(seconds: float) -> tuple[dict[int, float], float | None]:
    """Server CPU (cores) with 1, 4 and 8 socket sessions on one stream, and the reader's latency p50."""
    camera = start_rtsp_camera(allocate_port(), size="320x240", fps=10)
    server = start_server(RESULTS / "streams-server.log", ["--stream", f"cam={camera.url}", "--max-sessions", "10"])
    proc = psutil.Process(server.process.pid)
    sockets: list = []
    cpu: dict[int, float] = {}
    latency = None
    try:
        for n in (1, 4, 8):
            while len(sockets) < n:
                ws = await websockets.connect(server.ws_url, max_size=None)
                await ws.send(json.dumps({"type": "session.config", "source": {"stream": "cam"}}))
                sockets.append(ws)
            await eventually_async(lambda: asyncio.to_thread(lambda: _stream(server)["sessions"] == n
                                                             and _stream(server)["state"] == LIVE),
                                   60, f"{n} sessions on a live stream")
            await asyncio.sleep(2.0)  # settle: the new sessions' first frames
            t0, c0 = time.monotonic(), sum(proc.cpu_times()[:2])
            await asyncio.sleep(seconds)  # the measured interval
            cpu[n] = (sum(proc.cpu_times()[:2]) - c0) / (time.monotonic() - t0)
            log.info("%d session(s) on one stream: server %.3f cores", n, cpu[n])
        latency = _stream(server).get("latency_ms")
    finally:
        for ws in sockets:
            await ws.close()
        stop_server(server)
        camera.stop()
    return cpu, latency


def _stream(server) -> dict:
    return next(s for s in server.get_json("/api/streams") if s["name"] == "cam")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=15.0, help="each measured interval")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    for name in ("vidchat", "websockets"):
        logging.getLogger(name).setLevel(logging.WARNING)
    RESULTS.mkdir(parents=True, exist_ok=True)
    per_frame = {size: decode_cost(size, args.seconds) for size in SIZES}
    cpu, latency = asyncio.run(sessions_cost(args.seconds))
    result = {"per_frame_ms": per_frame, "server_cores": cpu, "latency_p50_ms": latency}
    (RESULTS / "streams.json").write_text(json.dumps(result, indent=1))
    print(f"ratios: cpu_4/cpu_1={cpu[4] / cpu[1]:.2f} cpu_8/cpu_1={cpu[8] / cpu[1]:.2f}; per frame "
          + " ".join(f"{s}={v:.2f}ms" for s, v in per_frame.items()))
    print(f"streams: cpu_1={cpu[1]:.3f} cpu_4={cpu[4]:.3f} cpu_8={cpu[8]:.3f} "
          f"per_stream_720p_ms={per_frame['1280x720']:.2f} "
          f"latency_p50_ms={'n/a' if latency is None else f'{latency:.1f}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
