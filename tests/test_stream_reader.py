"""The stream reader (vidchat.media.streams) without a server or a model:
the --stream option's rules, credentials kept out of what is shown, and one
reader feeding several real sessions from a file under --media-dir (PyAV
decodes it as it would a camera), stopping a while after the last leaves;
one reader however an attach and the reader's end interleave; the protocols
each stream may open (an HLS playlist from HTTP naming a local file is
refused). The RTSP and HLS streams through the server are
tests/test_streams.py; a camera with audio through an outage,
tests/test_stream_outage.py."""

from __future__ import annotations

import contextlib
import threading
from types import SimpleNamespace
from typing import Callable, Iterator

import pytest
from test_protocol import make_video

from vidchat.devtools.harness import allocate_port, eventually
from vidchat.devtools.stream_sources import serve_folder, write_hls
from vidchat.media.session import Session
from vidchat.media.streams import (
    IDLE,
    LIVE,
    RECONNECTING,
    StreamReader,
    Streams,
    UnknownStream,
    parse_streams,
    protocol_whitelist,
    redact,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("url, shown", [
    ("rtsp://admin:hunter2@cam.local:554/stream1", "rtsp://admin:***@cam.local:554/stream1"),
    ("https://token@example.com/live.m3u8", "https://***@example.com/live.m3u8"),
    ("rtsp://cam.local/stream1", "rtsp://cam.local/stream1"),
])
def test_a_url_is_shown_without_its_password(url, shown):
    assert redact(url) == shown


def test_the_stream_option_names_what_is_wrong(tmp_path):
    (tmp_path / "clip.mp4").write_bytes(b"x")
    assert parse_streams(["door=rtsp://u:p@cam/1", "clip=clip.mp4"], str(tmp_path)) == {
        "door": "rtsp://u:p@cam/1", "clip": str((tmp_path / "clip.mp4").resolve())}
    for entries, said in [
        (["door"], "--stream takes NAME=URL"),
        (["a b=rtsp://cam/1"], "a name is letters"),
        (["door=rtsp://cam/1", "door=rtsp://cam/2"], "given twice"),
        (["door=ftp://u:secret@cam/1"], "ftp://u:***@cam/1"),
        (["clip=../etc/passwd"], "is not a file under --media-dir"),
        (["clip=clip.mp4"], "is not a file under --media-dir"),  # no --media-dir at all
    ]:
        with pytest.raises(ValueError, match=said.replace("*", r"\*").replace(".", r"\.")) as caught:
            parse_streams(entries, str(tmp_path) if entries[-1] != "clip=clip.mp4" else "")
        assert "secret" not in str(caught.value)


def test_the_streams_come_from_the_flags_or_the_variable(monkeypatch):
    from vidchat.app.settings import parse_settings

    monkeypatch.setenv("VIDCHAT_STREAM", "door=rtsp://cam/1 gate=https://cam/live.m3u8")
    assert parse_settings([]).stream == ("door=rtsp://cam/1", "gate=https://cam/live.m3u8")
    assert parse_settings(["--stream", "yard=rtsp://cam/9"]).stream == ("yard=rtsp://cam/9",)  # flags win
    assert parse_settings(["--stream-fps", "5"]).stream_fps == 5.0


def test_an_unknown_stream_is_named_with_the_streams_there_are():
    streams = Streams({"door": "rtsp://cam/1"})
    with pytest.raises(UnknownStream, match="no stream named 'gate'; the streams here: door"):
        streams.check("gate")


def _session(name: str) -> Session:
    return Session(name, max_frame_bytes=1 << 22, max_frame_pixels=1 << 22)


def test_one_reader_feeds_every_attached_session_and_stops_after_the_last_leaves(tmp_path):
    clip = make_video(tmp_path / "clip.mp4", seconds=3.0, fps=10)
    reader = StreamReader("clip", str(clip), fps=5.0, linger_s=0.2)
    first, second = _session("a" * 8), _session("b" * 8)
    reader.attach(first)
    reader.attach(second)
    try:
        eventually(lambda: reader.state == LIVE and reader.offered >= 5, 20, "five frames offered")
        for session in (first, second):
            eventually(lambda: session.stats["frames_received"] >= 5, 10, "frames in both sessions")
            # The clip's stereo 44.1 kHz tone reaches each session as 16 kHz mono, on the frames' clock.
            eventually(lambda: session.stats["audio_seconds"] > 0.5, 10, "the stream's audio in both sessions")
            source = session.source_timeline.source_at(None)
            assert source["kind"] == "stream" and source["name"] == "clip"
        # At most --stream-fps of the file's 10 fps are offered; the others are skipped unconverted.
        assert reader.offered < reader.decoded and reader.connects >= 1
        snap = reader.snapshot()
        assert (snap["width"], snap["height"], snap["sessions"]) == (320, 240, 2)
    finally:
        reader.detach(first)
        reader.detach(second)
    eventually(lambda: reader.state == IDLE and reader.snapshot()["sessions"] == 0, 20, "the reader stopped")


class _Packet:
    """A demuxed packet with no picture in it (the race needs none)."""

    def decode(self) -> list:
        return []


class _Container:
    """What the reader's opener returns, minus the media: ``packets`` is the demux."""

    def __init__(self, packets: Iterator[_Packet], on_close: Callable[[], None] = lambda: None) -> None:
        self.streams = SimpleNamespace(video=[object()], audio=[])
        self._packets, self._on_close = packets, on_close

    def demux(self, *streams: object) -> Iterator[_Packet]:
        return self._packets

    def close(self) -> None:
        self._on_close()


def test_an_attach_as_the_reader_retires_leaves_exactly_one_reader():
    """Issue 57, point 16: the reader decides to end (nobody watches), and a
    session attaches right then, before the thread is gone: the attach
    starts a new reader and the old one ends, never two reading at once.
    The attach is made from the first connection's close, the moment
    between the thread's decision and its end."""
    left, finish = threading.Event(), threading.Event()
    opened: list[threading.Thread] = []
    first, late = _session("f" * 8), _session("l" * 8)

    def first_connection() -> Iterator[_Packet]:
        yield _Packet()
        left.wait(10)  # until the only session has left
        yield _Packet()  # the reader looks again: nobody watches, linger 0, it retires

    def later_connection() -> Iterator[_Packet]:
        finish.wait(30)
        return
        yield

    def opener(url: str) -> _Container:
        opened.append(threading.current_thread())
        if len(opened) == 1:
            return _Container(first_connection(), on_close=lambda: reader.attach(late))
        return _Container(later_connection())

    reader = StreamReader("race", "rtsp://cam/race", linger_s=0.0, opener=opener)
    reader.attach(first)
    try:
        eventually(lambda: opened, 10, "the first reader opened the stream")
        reader.detach(first)
        left.set()
        eventually(lambda: len(opened) >= 2, 10, "the late session's reader opened the stream")
        old, new = opened[0], opened[1]
        # The old reader either ends, or (the bug) goes on to open the stream again beside the new one.
        eventually(lambda: not old.is_alive() or opened.count(old) > 1, 10, "the old reader ended")
        assert opened.count(old) == 1 and new is not old
        readers = [t for t in threading.enumerate() if t.name == "stream race"]
        assert readers == [new] and reader.snapshot()["sessions"] == 1
    finally:
        reader.detach(late)
        finish.set()
        reader.close()


@pytest.mark.parametrize("url, allowed", [
    ("rtsp://u:p@cam/1", "tcp"),
    ("rtsps://cam/1", "tcp,tls"),
    ("https://cam/live.m3u8", "http,https,tcp,tls,crypto"),
    ("http://cam/video.mjpg", "http,https,tcp,tls,crypto"),
    ("/media/door/index.m3u8", "file,http,https,tcp,tls,crypto"),
    ("/media/clip.mp4", "file"),
])
def test_each_stream_opens_only_the_protocols_its_scheme_needs(url, allowed):
    assert protocol_whitelist(url) == allowed


@pytest.fixture
def hls_site(tmp_path):
    """An HTTP server on loopback with a good HLS stream (``/good/index.m3u8``)
    and a playlist (``/bad/index.m3u8``) whose one segment is a ``file:`` URL
    of a real segment on this machine."""
    good = tmp_path / "site" / "good"
    write_hls(good, seconds=3)
    segment = sorted(good.glob("*.ts"))[0]
    (tmp_path / "site" / "bad").mkdir()
    (tmp_path / "site" / "bad" / "index.m3u8").write_text(
        "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:2\n#EXT-X-PLAYLIST-TYPE:VOD\n"
        f"#EXTINF:1.0,\n{segment.as_uri()}\n#EXT-X-ENDLIST\n")
    port = allocate_port()
    httpd = serve_folder(tmp_path / "site", port)
    yield f"http://127.0.0.1:{port}", segment
    httpd.shutdown()


@contextlib.contextmanager
def _watched(name: str, url: str) -> Iterator[tuple[StreamReader, Session]]:
    """A reader of ``url`` with one session attached, detached and closed after."""
    reader = StreamReader(name, url, linger_s=0.2)
    session = _session(name[0] * 8)
    reader.attach(session)
    try:
        yield reader, session
    finally:
        reader.detach(session)
        reader.close()


def test_a_playlist_from_http_may_not_make_the_server_read_its_files(hls_site):
    """Issue 57, point 17: the stream is refused, and its error names the URL refused."""
    site, segment = hls_site
    with _watched("bad", f"{site}/bad/index.m3u8") as (reader, session):
        eventually(lambda: reader.state == RECONNECTING and reader.error, 20, "the playlist refused")
        assert f"the playlist names a file: URL ({segment.as_uri()})" in reader.error, reader.error
        assert "may not open (protocols allowed: http,https,tcp,tls,crypto)" in reader.error
        assert reader.offered == 0 and session.stats["frames_received"] == 0


def test_a_playlist_of_http_segments_still_plays(hls_site):
    site, _ = hls_site
    with _watched("good", f"{site}/good/index.m3u8") as (reader, session):
        eventually(lambda: reader.state == LIVE and session.stats["frames_received"] >= 3, 20, "HLS frames")
