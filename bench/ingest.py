"""Benchmark: WebRTC ingest capacity of one vidchat server.

Run: .venv/bin/python bench/ingest.py            (server start ~30 s, then ~35 s per N)
     .venv/bin/python bench/ingest.py --sessions 1,2 --seconds 5    (a quick look)
     .venv/bin/python bench/ingest.py --url http://127.0.0.1:7860   (a server already running)

For each N in --sessions (default 1, 2, 4, 8, 12, 16) it connects N aiortc
clients, each sending 640x480 VP8 video at 30 fps, like N browser tabs, keeps
them streaming for --seconds (default 20) after a short warm-up, then closes
them all and checks the server is back to 0 sessions before the next N.

What the clients send. A ~10 s clip of moving content (a room with sensor
noise; a hand-sized object that sweeps, pauses, circles; a lighting drift) is
VP8-encoded ONCE in memory at startup (libvpx realtime, ~1.5 Mbit/s, a
keyframe every 2 s) and looped. Each client's track yields the encoded
`av.Packet`s on a 30 fps clock, and aiortc's sender only packetizes them
(`RTCRtpSender` calls `encoder.pack()` for packets, `encode()` only for raw
frames), so the bench process does no video encoding while measuring. Its own
CPU is printed so you can check it stayed small. Nothing is written to disk.
The clients' ICE uses 127.0.0.1 host candidates only and no STUN server.

What is measured, per N (only inside the measurement window):
  lag        the server's newest-frame lag: for each processed frame, the time
             from when it was due by its RTP timestamp clock to when the
             filter had taken it (`media.lag_ms_*` of /webrtc/stats; the
             server keeps each session's last 600 lags = 20 s at 30 fps).
             p50 = median over sessions of each session's p50;
             p95 = the WORST session's p95 (every tab must be fine);
             max = the largest lag seen in any session.
  seen/sent  frames the server's track delivered / frames the clients sent.
             Below 100 %: frames lost or not decoded in time.
  skipped    frames replaced by a newer one before the processor got to them
             (newest-frame-only consumption; a sign the processor is behind).
  proc fps   frames processed (converted to RGB and offered to the filter)
             per second per session.
  kept       frames the EVS filter kept (the rest were near-duplicates).
  CPU        psutil user+sys time of the server process (all its threads;
             child processes such as a vLLM engine core are printed apart)
             over the window, as % of one core: total, per session, and per
             session net of the idle server measured before the first N.
             `loop` is the share of the server's main (event-loop) thread:
             RTP/SRTP, jitter buffer, HTTP; the rest is decoder threads,
             to_thread workers (RGB conversion, filter) and the engine.
             `machine` is the busy time of all CPUs (other users' work too),
             to tell a saturated machine from a server-side limit.
A row passes when p95 < --max-p95-ms (250). The result is the largest
passing N; by default the run stops after the first failing N (--all goes on).

A baseline comparison follows the table: each N against N=1 of the same run
(p95 ratio, CPU per session ratio). Finally an offline per-frame cost of the
server's stages on the same clip (VP8 decode, YUV->RGB, session.add_frame),
to show where a session's CPU goes.

The last line is one summary line:
  ingest: sessions=<largest N with p95 < 250 ms> p95_lag_ms=<its p95> cpu_per_session=<% of a core> ...
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import fractions
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aioice.ice  # noqa: E402
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCRtpSender  # noqa: E402
from aiortc.mediastreams import MediaStreamError  # noqa: E402

from vidchat.devtools import harness, synthetic  # noqa: E402
from vidchat.devtools.rtc_client import VIDEO_CLOCK, RtcClient  # noqa: E402

WIDTH, HEIGHT, FPS = 640, 480, 30
CLIP_SECONDS = 10
BITRATE = 1_500_000
GOP = 60
SERVER_ARGS = ["--model", "tiny", "--kv-cache-gb", "0.25", "--max-model-len", "4096", "--max-sessions", "64"]

# Client peers offer only 127.0.0.1 host candidates (aioice skips loopback by
# default), so the bench's media goes to and from 127.0.0.1.
aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"] if use_ipv4 else []


# ---------------------------------------------------------------------------
# The clip: generated and VP8-encoded once, in memory
# ---------------------------------------------------------------------------

def clip_frames(width: int, height: int, n: int, seed: int = 7):
    """Yield n RGB frames: a noisy room, a hand-sized blob that sweeps (0-40 %),
    holds still (40-60 %), then circles (60-100 %), and a slow lighting drift."""
    rng = np.random.default_rng(seed)
    scene = synthetic.make_scene(height, width, seed)
    pad = 64
    noise = rng.standard_normal((height + pad, width + pad, 3), dtype=np.float32) * 3.0
    r = int(0.13 * height)
    yy, xx = np.mgrid[-r:r, -int(r / 1.3):int(r / 1.3)]
    mask = (yy / r) ** 2 + (xx / (r / 1.3)) ** 2 < 1.0
    skin = np.array([205, 150, 120], np.float32) * (1.0 - 0.2 * (xx / r) - 0.1 * (yy / r))[..., None]
    ph, pw = mask.shape
    for i in range(n):
        p = i / n
        if p < 0.4:  # sweep left-right
            cx = 0.5 + 0.35 * np.sin(2 * np.pi * p / 0.4)
            cy = 0.55 + 0.03 * np.sin(i / 3)
        elif p < 0.6:  # hold still: only sensor noise changes
            cx, cy = 0.5, 0.55
        else:  # circle
            a = 2 * np.pi * (p - 0.6) / 0.4
            cx, cy = 0.5 + 0.25 * np.sin(a), 0.55 - 0.2 * (1 - np.cos(a)) / 2
        x0 = int(min(max(cx * width - pw / 2, 0), width - pw))
        y0 = int(min(max(cy * height - ph / 2, 0), height - ph))
        img = scene * np.float32(1.0 + 0.05 * np.sin(2 * np.pi * i / (n / 2)))
        region = img[y0:y0 + ph, x0:x0 + pw]
        region[mask] = skin[mask]
        dy, dx = rng.integers(0, pad, 2)
        img += noise[dy:dy + height, dx:dx + width]
        np.clip(img, 0, 255, out=img)
        yield img.astype(np.uint8)


def encode_clip(width: int, height: int, fps: int, seconds: float) -> list[bytes]:
    """VP8 packets, one per frame (no alt-ref / hidden frames), first one a keyframe."""
    ctx = av.CodecContext.create("libvpx", "w")
    ctx.width, ctx.height, ctx.pix_fmt = width, height, "yuv420p"
    ctx.framerate = fractions.Fraction(fps, 1)
    ctx.time_base = fractions.Fraction(1, fps)
    ctx.bit_rate = BITRATE
    ctx.gop_size = GOP
    ctx.options = {"deadline": "realtime", "cpu-used": "8", "lag-in-frames": "0", "auto-alt-ref": "0",
                   "error-resilient": "1"}
    packets: list[bytes] = []
    n = int(seconds * fps)
    for i, arr in enumerate(clip_frames(width, height, n)):
        frame = av.VideoFrame.from_ndarray(arr, format="rgb24").reformat(format="yuv420p")
        frame.pts = i
        packets += [bytes(p) for p in ctx.encode(frame)]
    packets += [bytes(p) for p in ctx.encode(None)]
    if len(packets) != n:
        raise RuntimeError(f"encoder gave {len(packets)} packets for {n} frames")
    return packets


class EncodedVideo(MediaStreamTrack):
    """A camera track yielding pre-encoded VP8 packets at a fixed frame rate,
    looping the clip; aiortc's sender passes them through without encoding."""

    kind = "video"

    def __init__(self, packets: list[bytes], fps: float):
        super().__init__()
        self.packets, self.fps = packets, fps
        self.sent = 0
        self.late = 0  # frames handed over more than one frame interval after they were due
        self._start: float | None = None

    async def recv(self) -> av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        due = self._start + self.sent / self.fps
        if due > now:
            await asyncio.sleep(due - now)
        elif now - due > 1 / self.fps:
            self.late += 1
        pkt = av.Packet(self.packets[self.sent % len(self.packets)])
        pkt.pts = int(self.sent * VIDEO_CLOCK / self.fps)
        pkt.time_base = fractions.Fraction(1, VIDEO_CLOCK)
        self.sent += 1
        return pkt


class BenchClient(RtcClient):
    """RtcClient with no STUN server and VP8 as the only video codec."""

    def __init__(self, base_url: str, track: EncodedVideo):
        super().__init__(base_url)  # tracks are added here, as a send-only VP8 transceiver
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.track = track

    async def connect(self) -> str:
        tr = self.pc.addTransceiver(self.track, direction="sendonly")
        tr.setCodecPreferences([c for c in RTCRtpSender.getCapabilities("video").codecs
                                if c.mimeType.lower() == "video/vp8"])
        return await super().connect()


# ---------------------------------------------------------------------------
# Server process
# ---------------------------------------------------------------------------

def http_json(url: str, body: dict | None = None, timeout: float = 10) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def start_server(log_path: Path, extra: list[str], timeout: float = 240) -> tuple[subprocess.Popen, str]:
    """app.py with SERVER_ARGS + ``extra`` through the shared harness; (its process, its URL)."""
    server = harness.start_server([*SERVER_ARGS, *extra], log_path, timeout=timeout)
    _started[server.proc.pid] = server
    return server.proc, server.url


_started: dict[int, harness.Server] = {}


def stop_server(proc: subprocess.Popen) -> None:
    server = _started.pop(proc.pid, None)
    if server is not None:
        harness.stop_server(server)


def find_server_pid(url: str) -> int | None:
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                return c.pid
    except (psutil.AccessDenied, OSError):
        pass
    return None


class CpuMeter:
    """CPU seconds of a process (all threads), its main thread, its children, and this bench."""

    def __init__(self, pid: int | None):
        self.proc = psutil.Process(pid) if pid else None
        self.me = psutil.Process()

    def sample(self) -> dict[str, float]:
        me = self.me.cpu_times()
        allc = psutil.cpu_times()
        out = {"t": time.monotonic(), "bench": me.user + me.system,
               "machine": sum(allc) - allc.idle - getattr(allc, "iowait", 0.0)}
        if self.proc is None:
            return out
        try:
            ct = self.proc.cpu_times()
            out["server"] = ct.user + ct.system
            main = [t for t in self.proc.threads() if t.id == self.proc.pid]
            out["loop"] = main[0].user_time + main[0].system_time if main else 0.0
            kids = 0.0
            for ch in self.proc.children(recursive=True):
                try:
                    k = ch.cpu_times()
                    kids += k.user + k.system
                except psutil.Error:
                    pass
            out["children"] = kids
        except psutil.Error:
            pass
        return out

    @staticmethod
    def pct(a: dict, b: dict, key: str) -> float | None:
        if key not in a or key not in b:
            return None
        return 100.0 * (b[key] - a[key]) / max(b["t"] - a["t"], 1e-6)


# ---------------------------------------------------------------------------
# One step: N clients
# ---------------------------------------------------------------------------

@dataclass
class Row:
    n: int
    p50: float | None = None
    p95: float | None = None
    p95_median: float | None = None
    lag_max: float | None = None
    sent: int = 0
    seen: int = 0
    skipped: int = 0
    processed: int = 0
    kept: int = 0
    seconds: float = 0.0
    server_pct: float | None = None
    loop_pct: float | None = None
    children_pct: float | None = None
    bench_pct: float | None = None
    machine_pct: float | None = None
    connect_s: float | None = None
    late: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.p95 is not None and self.p95 < ARGS.max_p95_ms and not self.errors

    def per_session(self, idle: float | None) -> tuple[float | None, float | None]:
        if self.server_pct is None:
            return None, None
        net = (self.server_pct - idle) / self.n if idle is not None else None
        return self.server_pct / self.n, net


async def wait_sessions(url: str, want: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    n = -1
    while time.monotonic() < deadline:
        try:
            n = (await asyncio.to_thread(http_json, url + "/api/health", None, 5))["sessions"]
            if n == want:
                return n
        except (OSError, ValueError, KeyError):
            pass
        await asyncio.sleep(0.5)
    return n


async def session_stats(url: str, sid: str) -> dict:
    return await asyncio.to_thread(http_json, f"{url}/webrtc/stats?session_id={sid}", None, 10)


async def run_step(url: str, n: int, packets: list[bytes], meter: CpuMeter) -> Row:
    row = Row(n)
    clients = [BenchClient(url, EncodedVideo(packets, FPS)) for _ in range(n)]
    try:
        t0 = time.monotonic()
        results = await asyncio.wait_for(asyncio.gather(*(c.connect() for c in clients), return_exceptions=True),
                                         timeout=60 + 5 * n)
        bad = [r for r in results if isinstance(r, BaseException)]
        if bad:
            row.errors.append(f"{len(bad)} of {n} clients failed to connect: {bad[0]!r}")
            return row
        row.connect_s = time.monotonic() - t0
        # Every session must be receiving frames before the window opens.
        deadline = time.monotonic() + 30
        while True:
            stats = await asyncio.gather(*(session_stats(url, c.session_id) for c in clients))
            if all(s.get("media", {}).get("video_frames_seen", 0) > 0 for s in stats):
                break
            if time.monotonic() > deadline:
                row.errors.append("not every session received video within 30 s")
                return row
            await asyncio.sleep(0.5)
        await asyncio.sleep(ARGS.warmup)

        before = await asyncio.gather(*(session_stats(url, c.session_id) for c in clients))
        sent0 = [c.track.sent for c in clients]
        late0 = sum(c.track.late for c in clients)
        cpu0 = meter.sample()
        await asyncio.sleep(ARGS.seconds)
        cpu1 = meter.sample()
        sent1 = [c.track.sent for c in clients]
        row.late = sum(c.track.late for c in clients) - late0
        after = await asyncio.gather(*(session_stats(url, c.session_id) for c in clients))

        row.seconds = cpu1["t"] - cpu0["t"]
        row.sent = sum(sent1) - sum(sent0)
        p50s, p95s, maxes = [], [], []
        for b, a in zip(before, after):
            mb, ma = b["media"], a["media"]
            row.seen += ma["video_frames_seen"] - mb["video_frames_seen"]
            row.skipped += ma["video_frames_skipped"] - mb["video_frames_skipped"]
            row.processed += a["frames_received"] - b["frames_received"]
            row.kept += a["frames_kept"] - b["frames_kept"]
            if ma["lag_ms_p95"] is not None:
                p50s.append(ma["lag_ms_p50"])
                p95s.append(ma["lag_ms_p95"])
                maxes.append(ma["lag_ms_max"])
        if p95s:
            row.p50, row.p95 = statistics.median(p50s), max(p95s)
            row.p95_median, row.lag_max = statistics.median(p95s), max(maxes)
        row.server_pct = CpuMeter.pct(cpu0, cpu1, "server")
        row.loop_pct = CpuMeter.pct(cpu0, cpu1, "loop")
        row.children_pct = CpuMeter.pct(cpu0, cpu1, "children")
        row.bench_pct = CpuMeter.pct(cpu0, cpu1, "bench")
        row.machine_pct = CpuMeter.pct(cpu0, cpu1, "machine")
        return row
    except asyncio.TimeoutError:
        row.errors.append("timed out connecting")
        return row
    finally:
        async def close(c: BenchClient) -> None:
            try:
                await asyncio.wait_for(c.close(), timeout=15)
            except Exception:
                pass

        await asyncio.gather(*(close(c) for c in clients))
        left = await wait_sessions(url, 0, timeout=30)
        if left != 0:
            row.errors.append(f"server still has {left} sessions 30 s after closing")


# ---------------------------------------------------------------------------
# Offline cost of the server's per-frame stages, on the same clip
# ---------------------------------------------------------------------------

def stage_costs(packets: list[bytes], frames: int = 150) -> dict[str, float]:
    """ms per frame for: VP8 decode (as aiortc's receiver does it), YUV->RGB
    (frame.to_ndarray(format="rgb24") as webrtc.py does), session.add_frame
    (EVS thumbnail + decision + stored copy at 320x240)."""
    from vidchat.media.session import Session

    dec = av.CodecContext.create("libvpx", "r")
    session = Session("bench")
    t_dec = t_rgb = t_add = 0.0
    count = 0
    for i in range(frames):
        pkt = av.Packet(packets[i % len(packets)])
        t0 = time.perf_counter()
        out = dec.decode(pkt)
        t1 = time.perf_counter()
        t_dec += t1 - t0
        for f in out:
            t1 = time.perf_counter()
            arr = f.to_ndarray(format="rgb24")
            t2 = time.perf_counter()
            session.add_frame(arr, t=i / FPS)
            t3 = time.perf_counter()
            t_rgb += t2 - t1
            t_add += t3 - t2
            count += 1
    return {"decode": 1000 * t_dec / frames, "rgb": 1000 * t_rgb / max(count, 1),
            "add_frame": 1000 * t_add / max(count, 1), "kept": session.stats["frames_kept"] / max(count, 1)}


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------

def fmt(v: float | None, spec: str = ".0f") -> str:
    return "-" if v is None else format(v, spec)


def print_table(rows: list[Row], idle: float | None) -> None:
    head = (f"{'N':>3} {'p50 ms':>7} {'p95 ms':>7} {'p95med':>7} {'max ms':>7} {'seen/sent':>10} {'skipped':>7} "
            f"{'proc fps':>8} {'kept':>6} {'CPU/sess':>8} {'net/sess':>8} {'CPU tot':>8} {'loop':>5} {'kids':>5} "
            f"{'bench':>6} {'machine':>7} {'late':>5}  ok")
    print(head)
    print("-" * len(head))
    for r in rows:
        if r.errors:
            print(f"{r.n:>3}  error: {'; '.join(r.errors)}")
            if r.p95 is None:
                continue
        per, net = r.per_session(idle)
        seen = f"{r.seen}/{r.sent}"
        proc_fps = r.processed / r.n / r.seconds if r.seconds else None
        kept = f"{100 * r.kept / r.processed:.0f}%" if r.processed else "-"
        loop = f"{100 * r.loop_pct / r.server_pct:.0f}%" if r.loop_pct is not None and r.server_pct else "-"
        print(f"{r.n:>3} {fmt(r.p50):>7} {fmt(r.p95):>7} {fmt(r.p95_median):>7} {fmt(r.lag_max):>7} {seen:>10} "
              f"{r.skipped:>7} {fmt(proc_fps, '.1f'):>8} {kept:>6} {fmt(per, '.1f'):>7}% {fmt(net, '.1f'):>7}% "
              f"{fmt(r.server_pct):>7}% {loop:>5} {fmt(r.children_pct):>4}% {fmt(r.bench_pct):>5}% {fmt(r.machine_pct):>6}% {r.late:>5}  "
              f"{'yes' if r.ok else 'NO'}")
    print(f"CPU is % of one core (this machine has {psutil.cpu_count()}); net/sess subtracts the idle server "
          f"({fmt(idle, '.1f')}%); loop = share of the server's main thread; kids = its child processes; "
          f"bench = this process; machine = all processes (max {100 * psutil.cpu_count()}%); "
          "late = client frames sent > 1 frame interval late.")


def print_baseline(rows: list[Row], idle: float | None) -> None:
    good = [r for r in rows if r.p95 is not None]
    base = next((r for r in good if r.n == 1), good[0] if good else None)
    if base is None or base.p95 is None:
        return
    bper, _ = base.per_session(idle)
    print(f"\nBaseline: N={base.n} of this run (p95 {base.p95:.0f} ms, CPU/session {fmt(bper, '.1f')}%)")
    for r in good:
        per, _ = r.per_session(idle)
        ratio_cpu = f"{per / bper:.2f}x" if per is not None and bper else "-"
        print(f"  N={r.n:<3} p95 lag {r.p95 / max(base.p95, 1e-9):5.2f}x   CPU/session {ratio_cpu:>6}   "
              f"seen/sent {100 * r.seen / max(r.sent, 1):5.1f}% (N={base.n}: {100 * base.seen / max(base.sent, 1):.1f}%)")


def parse_sessions(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("expected a comma-separated list of integers")
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("session counts must be >= 1")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See the module docstring (top of bench/ingest.py) for how to read the table.")
    p.add_argument("--sessions", type=parse_sessions, default=[1, 2, 4, 8, 12, 16],
                   help="comma-separated client counts to try (default 1,2,4,8,12,16)")
    p.add_argument("--seconds", type=float, default=20.0, help="measurement window per N (default 20)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of streaming before each window (default 2)")
    p.add_argument("--max-p95-ms", type=float, default=250.0, help="p95 lag limit for a passing N (default 250)")
    p.add_argument("--target", type=int, default=8, help="the N the issue asks for (default 8)")
    p.add_argument("--all", action="store_true", help="try every N even after one fails the lag limit")
    p.add_argument("--url", help="use this running server (http://127.0.0.1:PORT) instead of starting one")
    p.add_argument("--pid", type=int, help="server pid for the CPU columns with --url (default: found by port)")
    p.add_argument("--idle-seconds", type=float, default=5.0, help="idle server CPU window before the first N")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra app.py argument for the started server (repeatable, e.g. --server-arg=--log-level=warning)")
    args = p.parse_args(argv)
    if args.url and not args.url.startswith(("http://127.0.0.1", "http://localhost")):
        p.error("--url must point at 127.0.0.1 / localhost")
    if args.seconds <= 0 or args.seconds > 600:
        p.error("--seconds must be in (0, 600]")
    return args


ARGS: argparse.Namespace


async def bench(url: str, pid: int | None, packets: list[bytes]) -> list[Row]:
    meter = CpuMeter(pid)
    rows: list[Row] = []
    if await wait_sessions(url, 0, timeout=30) != 0:
        raise RuntimeError("the server has sessions open; the numbers would be wrong")
    a = meter.sample()
    await asyncio.sleep(ARGS.idle_seconds)
    b = meter.sample()
    idle = CpuMeter.pct(a, b, "server")
    print(f"idle server: {fmt(idle, '.1f')}% of a core (children {fmt(CpuMeter.pct(a, b, 'children'), '.1f')}%)",
          flush=True)
    for n in ARGS.sessions:
        t0 = time.monotonic()
        row = await run_step(url, n, packets, meter)
        rows.append(row)
        print(f"  N={n}: p50 {fmt(row.p50)} ms, p95 {fmt(row.p95)} ms, server CPU {fmt(row.server_pct)}%, "
              f"bench CPU {fmt(row.bench_pct)}%, connect {fmt(row.connect_s, '.1f')} s{' ' + '; '.join(row.errors) if row.errors else ''} "
              f"({time.monotonic() - t0:.0f} s)", flush=True)
        if not row.ok and not ARGS.all:
            rest = [m for m in ARGS.sessions if m > n]
            if rest:
                print(f"  stopping: N={n} failed; not trying {rest} (use --all)", flush=True)
            break
    rows.append(Row(0, server_pct=idle))  # carries the idle figure to main
    return rows


def main() -> int:
    global ARGS
    ARGS = parse_args()
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vidchat-ingest-") as tmp:
        t0 = time.perf_counter()
        packets = encode_clip(WIDTH, HEIGHT, FPS, CLIP_SECONDS)
        kbps = 8 * sum(map(len, packets)) / CLIP_SECONDS / 1000
        print(f"clip: {len(packets)} VP8 frames {WIDTH}x{HEIGHT} @ {FPS} fps, {kbps:.0f} kbit/s, "
              f"encoded once in {time.perf_counter() - t0:.1f} s (in memory)", flush=True)
        proc, log_from = None, 0
        try:
            if ARGS.url:
                url, pid = ARGS.url.rstrip("/"), ARGS.pid or find_server_pid(ARGS.url)
            else:
                print("starting server: app.py " + " ".join(SERVER_ARGS + ARGS.server_arg), flush=True)
                t0 = time.perf_counter()
                proc, url = start_server(Path(tmp) / "server.log", ARGS.server_arg)
                pid = proc.pid
                log_from = (Path(tmp) / "server.log").stat().st_size
                print(f"server ready at {url} in {time.perf_counter() - t0:.0f} s (pid {pid})", flush=True)
            rows = asyncio.run(bench(url, pid, packets))
        finally:
            if proc is not None:
                stop_server(proc)
                with open(Path(tmp) / "server.log", "rb") as f:
                    f.seek(log_from)
                    log = f.read().decode(errors="replace").splitlines()
                warn = [ln for ln in log if "WARNING" in ln or "ERROR" in ln or "Traceback" in ln]
                kinds = collections.Counter(ln.split(" ", 1)[-1][:150] for ln in warn)
                print(f"server log after start-up: {len(warn)} warning/error lines", flush=True)
                for text, count in kinds.most_common(4):
                    print(f"  {count} x {text}", flush=True)
        idle = rows.pop().server_pct
        costs = stage_costs(packets)

    print()
    print_table(rows, idle)
    print_baseline(rows, idle)
    total = costs["decode"] + costs["rgb"] + costs["add_frame"]
    print(f"\nOffline per-frame cost of the server's stages on this clip (one thread): VP8 decode "
          f"{costs['decode']:.2f} ms, YUV->RGB {costs['rgb']:.2f} ms, session.add_frame {costs['add_frame']:.2f} ms "
          f"(kept {100 * costs['kept']:.0f}%) = {total:.2f} ms -> {total * FPS / 10:.1f}% of a core per session "
          f"at {FPS} fps; the rest of a session's measured CPU is RTP/SRTP/jitter buffer/asyncio.")
    passing = [r for r in rows if r.ok]
    best = max(passing, key=lambda r: r.n) if passing else None
    per = best.per_session(idle)[0] if best else None
    bench_pct = max((r.bench_pct or 0) for r in rows) if rows else None
    print(f"(total run time {time.monotonic() - t_start:.0f} s)")
    print(f"ingest: sessions={best.n if best else 0} p95_lag_ms={fmt(best.p95 if best else None)} "
          f"cpu_per_session={fmt(per, '.1f')} target={ARGS.target} "
          f"target_met={'yes' if best and best.n >= ARGS.target else 'no'} "
          f"tried={','.join(str(r.n) for r in rows)} bench_cpu_max={fmt(bench_pct)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
