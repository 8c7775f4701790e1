"""Live streams for the tests and benchmarks of --stream (vidchat.media.streams):
a real RTSP camera (GStreamer's RTSP server, vidchat/devtools/rtsp_camera.py,
run by the system python3) and an HLS stream (a folder PyAV's HLS muxer
writes, served over HTTP on loopback)."""

from __future__ import annotations

import functools
import http.server
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import numpy as np

SYSTEM_PYTHON = "/usr/bin/python3"
CAMERA_SCRIPT = Path(__file__).with_name("rtsp_camera.py")


@dataclass
class RtspCamera:
    """A running RTSP camera: its URL and process."""

    port: int
    path: str
    process: subprocess.Popen
    user: str = ""
    password: str = ""
    audio: bool = False

    @property
    def url(self) -> str:
        auth = f"{self.user}:{self.password}@" if self.user else ""
        return f"rtsp://{auth}127.0.0.1:{self.port}{self.path}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


def start_rtsp_camera(port: int, path: str = "/cam", size: str = "320x240", fps: int = 10, user: str = "",
                      password: str = "", timeout: float = 20.0, audio: bool = False) -> RtspCamera:
    """Start the camera on 127.0.0.1:``port`` (with AAC audio beside the
    video if ``audio``); returns once it listens."""
    args = [SYSTEM_PYTHON, str(CAMERA_SCRIPT), "--port", str(port), "--path", path, "--size", size,
            "--fps", str(fps)]
    if user:
        args += ["--user", user, "--password", password]
    if audio:
        args.append("--audio")
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready: list[str] = []

    def read_first_line() -> None:
        ready.append(process.stdout.readline())

    reader = threading.Thread(target=read_first_line, daemon=True)
    reader.start()
    reader.join(timeout)
    if not ready or not ready[0].startswith("ready "):
        process.kill()
        err = process.stderr.read() if process.poll() is not None else ""
        raise RuntimeError(f"the RTSP camera did not start on port {port}: {ready[:1]} {err[-2000:]}")
    return RtspCamera(port, path, process, user, password, audio)


def write_hls(folder: Path, seconds: float = 6.0, size: tuple[int, int] = (320, 240), fps: int = 10,
              segment_s: float = 1.0) -> Path:
    """A moving test picture as an HLS stream (index.m3u8 and its segments) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    playlist = folder / "index.m3u8"
    with av.open(str(playlist), "w", format="hls", options={"hls_time": str(segment_s), "hls_list_size": "0",
                                                              "hls_playlist_type": "vod"}) as out:
        stream = out.add_stream("libx264" if "libx264" in av.codecs_available else "mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        stream.options = {"g": str(fps)}
        w, h = size
        for i in range(int(seconds * fps)):
            img = np.zeros((h, w, 3), np.uint8)
            img[:, :, 2] = 60
            x = int((i * 7) % max(1, w - 40))
            img[h // 3: h // 3 + 40, x: x + 40] = (230, 200, 40)
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return playlist


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


def serve_folder(folder: Path, port: int) -> http.server.ThreadingHTTPServer:
    """Serve ``folder`` on http://127.0.0.1:``port``/ in a thread (call .shutdown() to stop)."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), functools.partial(_Quiet, directory=str(folder)))
    threading.Thread(target=httpd.serve_forever, daemon=True, name="hls-server").start()
    return httpd
