"""Live streams as sources (``--stream NAME=URL``): an IP camera over RTSP,
an HLS or HTTP video, or a file under --media-dir, pulled once by the
server and shared by every session that watches it (docs/streams.md).

One :class:`StreamReader` per stream: a thread (PyAV, off the event loop)
started when the first session attaches and stopped ``linger_s`` after the
last one leaves. It decodes at most ``fps`` frames a second (the frames
between are decoded, as H.264 needs, but never converted), and offers each
kept one, stamped on the server's clock (vidchat.media.clock.TrackClock
maps the stream's own time onto it), to every attached session, whose own
filter and buffer take it as they take a camera frame: eight sessions on one
camera cost one decode. Audio, where the stream has it, goes to them as
16 kHz mono, stamped on the same clock. Each session's source is the
stream, positioned on the stream's own clock, so its records say which
moment of the feed each frame was (``frame_source_times``).

A stream that fails (refused, dropped, or ``STALL_S`` without a frame) is
opened again after a backoff (0.5 s, doubling, at most 8 s); attached
sessions stay attached and keep what they have. Each connection's stall
timer starts when it opens: its first packets are often audio or parameter
sets, never a picture. Each stream opens only the FFmpeg protocols its
scheme needs (vidchat.media.streams). URLs may carry credentials
(``rtsp://user:pass@cam/…``): only :func:`redact`'s form is ever logged,
shown or sent.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import threading
import time
import urllib.parse
import urllib.request
from typing import Any, Callable

import av
import numpy as np

from vidchat.media import AUDIO_RATE
from vidchat.media.clock import TrackClock
from vidchat.media.evs import FrameError
from vidchat.media.session import Session, offer_decoded

log = logging.getLogger(__name__)


# Which FFmpeg protocols a ``--stream`` may open (issue 57, review 12).
#
# Left alone, FFmpeg lets a stream open further URLs on its own: an HLS
# playlist names its segments and keys, an SDP file fetched over HTTP names
# RTP/UDP ports. Those names come from the remote end, not from the operator,
# so each stream is opened with ``protocol_whitelist`` set to what its scheme
# needs: a camera on the network may never make the server read its files or
# listen on a port. A file under --media-dir is the operator's own: a local
# HLS playlist may name segments there or on the network.
#
# A refused segment surfaces from FFmpeg only as "Invalid data found"; for a
# playlist, :func:`playlist_refusal` reads it again and names the URL that was
# refused, so the stream's ``error`` says what happened.

RTSP = "tcp"  # the RTSP demuxer's own connection; media comes interleaved on it (rtsp_transport=tcp)

RTSPS = "tcp,tls"

HTTP = "http,https,tcp,tls,crypto"  # HLS over the network: segments and keys over http(s), never file:

LOCAL_HLS = "file,http,https,tcp,tls,crypto"

LOCAL = "file"

PLAYLIST_SUFFIXES = (".m3u8", ".m3u")

MAX_PLAYLIST_BYTES = 1 << 20


def _is_playlist(url: str) -> bool:
    return urllib.parse.urlsplit(url).path.lower().endswith(PLAYLIST_SUFFIXES)


def protocol_whitelist(url: str) -> str:
    """FFmpeg's ``protocol_whitelist`` for a stream's URL (or a local path)."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme == "rtsp":
        return RTSP
    if scheme == "rtsps":
        return RTSPS
    if scheme in ("http", "https"):
        return HTTP
    return LOCAL_HLS if _is_playlist(url) else LOCAL


def _url_schemes(whitelist: str) -> set[str]:
    """The URL schemes a playlist may name under ``whitelist`` (tcp and tls carry them, never named)."""
    return {p for p in whitelist.split(",") if p not in ("tcp", "tls")}


def _shown(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=host))


def _read_playlist(url: str, timeout: float) -> str:
    parts = urllib.parse.urlsplit(url)
    host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    request = urllib.request.Request(urllib.parse.urlunsplit(parts._replace(netloc=host)))
    if parts.username is not None:
        pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        request.add_header("Authorization", "Basic " + base64.b64encode(pair.encode()).decode())
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - the operator's own URL
        data: bytes = response.read(MAX_PLAYLIST_BYTES)
    return data.decode("utf-8", "replace")


def _named_urls(text: str) -> list[str]:
    """The URLs a playlist names: its lines that are not tags, and tags' ``URI="…"`` (keys, maps, renditions)."""
    urls = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            urls.append(line)
        elif 'URI="' in line:
            urls.append(line.split('URI="', 1)[1].split('"', 1)[0])
    return urls


def playlist_refusal(url: str, timeout: float) -> str | None:
    """Why an http(s) playlist that failed to open was refused, if it names a
    URL its whitelist forbids (for example ``file:///…``); None otherwise or
    if it cannot be read again."""
    if urllib.parse.urlsplit(url).scheme.lower() not in ("http", "https") or not _is_playlist(url):
        return None
    whitelist = protocol_whitelist(url)
    try:
        text = _read_playlist(url, timeout)
    except (OSError, ValueError) as exc:
        log.debug("could not read the playlist again to say why it failed: %s", exc)
        return None
    allowed = _url_schemes(whitelist)
    for named in _named_urls(text):
        target = urllib.parse.urljoin(url, named)
        scheme = urllib.parse.urlsplit(target).scheme.lower()
        if not set(scheme.split("+")) <= allowed:
            return (f"the playlist names a {scheme}: URL ({_shown(target)}), which a stream from "
                    f"{urllib.parse.urlsplit(url).scheme.lower()}:// may not open (protocols allowed: {whitelist})")
    return None


CONNECTING, LIVE, RECONNECTING, IDLE = "connecting", "live", "reconnecting", "idle"

STALL_S = 5.0  # no frame for this long: the stream is reopened

BACKOFF_S = (0.5, 8.0)  # the first wait before reopening, and the longest

LINGER_S = 10.0  # a stream nobody watches is stopped this long after the last session leaves

REPORT_EVERY_S = 10.0  # how often each session's source position is said again (the clocks drift apart)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")

NETWORK_SCHEMES = ("rtsp", "rtsps", "http", "https")


class UnknownStream(KeyError):
    """No stream of that name (the error names it and the streams there are)."""

    def __str__(self) -> str:
        return str(self.args[0])


def redact(url: str) -> str:
    """``url`` with its password (or a lone user token) replaced by ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<a URL that can't be read>"
    if not parts.username and not parts.password:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***" if parts.password is not None else "***"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}@{host}"))


def parse_streams(entries: list[str], media_dir: str = "") -> dict[str, str]:
    """``NAME=URL`` pairs as {name: url}; raises ValueError naming the bad
    one (redacted). A path is a file under ``media_dir``."""
    streams: dict[str, str] = {}
    for entry in entries:
        name, sep, url = entry.partition("=")
        name, url = name.strip(), url.strip()
        if not sep or not url:
            raise ValueError(f"--stream takes NAME=URL, got {redact(entry)!r}")
        if not NAME_RE.match(name):
            raise ValueError(f"--stream: a name is letters, digits, '.', '_' or '-' (at most 40), got {name!r}")
        if name in streams:
            raise ValueError(f"--stream: the name {name!r} is given twice")
        scheme = urllib.parse.urlsplit(url).scheme.lower()
        if scheme in NETWORK_SCHEMES:
            streams[name] = url
            continue
        if scheme and len(scheme) > 1:
            raise ValueError(f"--stream {name}: the URL must be rtsp://, rtsps://, http(s):// or a file under "
                             f"--media-dir, got {redact(url)!r}")
        root = os.path.realpath(media_dir) if media_dir else ""
        path = os.path.realpath(os.path.join(root, url)) if root else ""
        if not root or not path.startswith(root + os.sep) or not os.path.isfile(path):
            raise ValueError(f"--stream {name}: {url!r} is not a file under --media-dir")
        streams[name] = path
    return streams


def _seconds(frame: av.frame.Frame) -> float | None:
    if frame.pts is None or frame.time_base is None:
        return None
    return float(frame.pts * frame.time_base)


class StreamReader:
    """One stream, read once for every session attached to it."""

    def __init__(self, name: str, url: str, fps: float = 10.0, linger_s: float = LINGER_S,
                 opener: Callable[[str], Any] | None = None, stall_s: float = STALL_S,
                 backoff_s: tuple[float, float] = BACKOFF_S) -> None:
        self.name, self.url, self.fps, self.linger_s = name, url, fps, linger_s
        self.stall_s, self.backoff_s = stall_s, backoff_s
        self.shown_url = redact(url)
        self._open = opener or self._open_url
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._placed: dict[str, float] = {}  # session id -> when its source position was last said
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._empty_since: float | None = None
        self.state = IDLE
        self.error: str | None = None
        self.width: int | None = None
        self.height: int | None = None
        self.last_frame_at: float | None = None
        self.decoded = 0  # frames decoded (every one the stream sent)
        self.offered = 0  # frames offered to the sessions (at most fps a second)
        self.connects = 0
        self._recent: list[float] = []  # offer times of the last frames (the fps figure)
        self._latencies: list[float] = []  # ms from a frame's time to the sessions' buffers, the newest 200

    # -- sessions --------------------------------------------------------------

    def attach(self, session: Session) -> None:
        with self._lock:
            self._sessions[session.id] = session
            self._placed.pop(session.id, None)
            self._empty_since = None
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self.state = CONNECTING
                self._thread = threading.Thread(target=self._run, name=f"stream {self.name}", daemon=True)
                self._thread.start()
        log.info("stream %s: a session attached (%d now)", self.name, len(self._sessions))

    def detach(self, session: Session) -> None:
        with self._lock:
            if self._sessions.pop(session.id, None) is None:
                return
            self._placed.pop(session.id, None)
            if not self._sessions:
                self._empty_since = time.monotonic()
        log.info("stream %s: a session left (%d now)", self.name, len(self._sessions))

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def snapshot(self) -> dict[str, Any]:
        now = time.monotonic()
        recent = [t for t in self._recent if now - t <= 2.0]
        return {"name": self.name, "state": self.state,
                "fps": round((len(recent) - 1) / (recent[-1] - recent[0]), 1) if len(recent) > 1 and
                recent[-1] > recent[0] else 0.0,
                "width": self.width, "height": self.height,
                "last_frame_age_s": None if self.last_frame_at is None else round(now - self.last_frame_at, 2),
                "sessions": len(self._sessions), "error": self.error,
                # How the one reader went: its connections to the source, frames decoded, frames offered.
                "connects": self.connects, "decoded": self.decoded, "offered": self.offered,
                # Median of the newest frames' time from their arrival to the sessions' buffers.
                "latency_ms": self.latency_p50_ms()}

    def latency_p50_ms(self) -> float | None:
        """Median of the newest frames' delay from the stream's frame time to the sessions' buffers."""
        lags = sorted(self._latencies)
        return round(lags[len(lags) // 2], 1) if lags else None

    # -- the reader thread -----------------------------------------------------

    def _open_url(self, url: str) -> Any:
        options = {"protocol_whitelist": protocol_whitelist(url)}
        if url.lower().startswith(("rtsp://", "rtsps://")):
            options["rtsp_transport"] = "tcp"
        try:
            return av.open(url, options=options, timeout=(self.stall_s, self.stall_s))
        except av.error.InvalidDataError as exc:
            # A segment outside the whitelist reads as bad data; say which URL it was.
            refusal = playlist_refusal(url, self.stall_s)
            if refusal is None:
                raise
            raise PermissionError(refusal) from exc

    def _retire(self) -> bool:
        """Whether the thread is to end now: stopped, or nobody watched for
        ``linger_s``. A thread that retires gives up ``_thread`` under the
        lock attach takes, so an attach from then on starts a new reader; so
        the caller ends at the first True and never asks again (a second ask
        could see the new session and carry on beside the new reader)."""
        if self._stop.is_set():
            return True
        with self._lock:
            if self._sessions or self._empty_since is None:
                return False
            if time.monotonic() - self._empty_since < self.linger_s:
                return False
            self.state = IDLE
            self._thread = None
            return True

    def _run(self) -> None:
        wait = self.backoff_s[0]
        while not self._retire():
            self.connects += 1
            try:
                if self._read_once():
                    break
                self.error = "the stream ended"
            except Exception as exc:  # noqa: BLE001 - any failure reopens the stream
                self.error = str(exc).replace(self.url, self.shown_url) or type(exc).__name__
            if self._retire():
                break
            if self.state == LIVE:
                wait = self.backoff_s[0]  # it ran: start the backoff again
            self.state = RECONNECTING
            log.warning("stream %s (%s): %s; reopening in %.1f s", self.name, self.shown_url, self.error, wait)
            if self._stop.wait(wait):
                break
            wait = min(wait * 2, self.backoff_s[1])
        if self._stop.is_set():
            self.state = IDLE
        log.info("stream %s: stopped (nobody watches)", self.name)

    def _read_once(self) -> bool:
        """Read one connection until it fails (raises), ends (False) or the reader retires (True)."""
        container = self._open(self.url)
        try:
            video = container.streams.video[0] if container.streams.video else None
            if video is None:
                raise FrameError("the stream has no video")
            audio = container.streams.audio[0] if container.streams.audio else None
            resampler = av.AudioResampler(format="flt", layout="mono", rate=AUDIO_RATE) if audio else None
            clock, interval = TrackClock(), 1.0 / self.fps
            due = 0.0
            with self._lock:
                self._placed.clear()  # a new connection: each session's position is said again
            started = picture_at = time.monotonic()  # the stall timer starts with the connection
            paced: tuple[float, float] | None = None  # (first media time, when it played)
            for packet in container.demux(*(s for s in (video, audio) if s is not None)):
                if self._retire():
                    return True
                for frame in packet.decode():
                    now = time.monotonic()
                    media_t = _seconds(frame)
                    if media_t is not None:  # a file (or an HLS VOD) plays at its own speed, not as fast as it decodes
                        if paced is None:
                            paced = (media_t, now)
                        ahead = paced[1] + (media_t - paced[0]) - now
                        if 0 < ahead < self.stall_s:
                            self._stop.wait(ahead)
                            now = time.monotonic()
                    if isinstance(frame, av.AudioFrame):
                        if resampler is not None:  # always: audio is demuxed only where there is one
                            self._offer_audio(frame, resampler, clock.place(media_t, now))
                        continue
                    self.decoded += 1
                    picture_at = now  # one skipped below still shows the source is alive
                    # Over --stream-fps: skipped before any conversion. Offers keep to a
                    # grid (a quarter interval early still counts: a source at exactly
                    # that rate jitters), restarted after a gap rather than caught up in a burst.
                    if now < due - interval / 4:
                        continue
                    due = due + interval if now - due < interval else now + interval
                    stream_t = media_t if media_t is not None else now - started
                    self._offer_video(frame, clock.place(media_t, now), stream_t, now)
                if time.monotonic() - picture_at > self.stall_s:
                    raise TimeoutError(f"no frame for {self.stall_s:g} s")
            return False
        finally:
            container.close()

    def _offer_video(self, frame: av.VideoFrame, t: float, stream_t: float, now: float) -> None:
        if self.state != LIVE:
            log.info("stream %s: live, %dx%d", self.name, frame.width, frame.height)
        self.state, self.error = LIVE, None
        self.width, self.height, self.last_frame_at = frame.width, frame.height, now
        self.offered += 1
        self._recent = [x for x in self._recent[-30:] if now - x <= 2.0] + [now]
        with self._lock:
            sessions = list(self._sessions.values())
            due = [s for s in sessions if now - self._placed.get(s.id, -1e9) >= REPORT_EVERY_S]
            for s in due:
                self._placed[s.id] = now
        for session in due:
            # The frame's moment on the stream's own clock, for the records.
            session.set_source("stream", self.name, position_s=stream_t, playing=True, rate=1.0, t=t)
        for session in sessions:
            try:
                offer_decoded(session, frame, t)
            except FrameError as exc:
                log.warning("stream %s: dropped a bad frame: %s", self.name, exc)
                return
        self._latencies = self._latencies[-199:] + [(time.monotonic() - t) * 1000]

    def _offer_audio(self, frame: av.AudioFrame, resampler: av.AudioResampler, t: float) -> None:
        with self._lock:
            sessions = list(self._sessions.values())
        at: float | None = t
        for out in resampler.resample(frame):
            samples = out.to_ndarray().reshape(-1).astype(np.float32, copy=False)
            for session in sessions:
                session.add_audio(samples, at)
            at = None  # a second output continues the first


class Streams:
    """The server's streams, by name (--stream)."""

    def __init__(self, urls: dict[str, str], fps: float = 10.0, linger_s: float = LINGER_S) -> None:
        self.readers = {name: StreamReader(name, url, fps, linger_s) for name, url in urls.items()}
        self._attached: dict[str, str] = {}  # session id -> stream name

    def names(self) -> list[str]:
        return list(self.readers)

    def check(self, name: str) -> StreamReader:
        """Stream ``name``'s reader; raises UnknownStream naming it and the streams there are."""
        reader = self.readers.get(name)
        if reader is None:
            known = ", ".join(self.readers) or "none (start vidchat with --stream NAME=URL)"
            raise UnknownStream(f"no stream named {name!r}; the streams here: {known}")
        return reader

    def attach(self, name: str, session: Session) -> StreamReader:
        """Attach ``session`` to stream ``name`` (leaving any other); raises UnknownStream."""
        reader = self.check(name)
        self.detach(session)
        reader.attach(session)
        self._attached[session.id] = name
        return reader

    def detach(self, session: Session) -> None:
        name = self._attached.pop(session.id, None)
        if name is not None:
            self.readers[name].detach(session)

    def snapshot(self) -> list[dict[str, Any]]:
        return [r.snapshot() for r in self.readers.values()]

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()
