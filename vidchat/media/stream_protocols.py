"""Which FFmpeg protocols a ``--stream`` may open (issue 57, review 12).

Left alone, FFmpeg lets a stream open further URLs on its own: an HLS
playlist names its segments and keys, an SDP file fetched over HTTP names
RTP/UDP ports. Those names come from the remote end, not from the operator,
so each stream is opened with ``protocol_whitelist`` set to what its scheme
needs: a camera on the network may never make the server read its files or
listen on a port. A file under --media-dir is the operator's own: a local
HLS playlist may name segments there or on the network.

A refused segment surfaces from FFmpeg only as "Invalid data found"; for a
playlist, :func:`playlist_refusal` reads it again and names the URL that was
refused, so the stream's ``error`` says what happened."""

from __future__ import annotations

import base64
import logging
import urllib.parse
import urllib.request

log = logging.getLogger(__name__)

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
        return response.read(MAX_PLAYLIST_BYTES).decode("utf-8", "replace")


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
