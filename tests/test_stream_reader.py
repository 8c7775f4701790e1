"""The stream reader (vidchat.media.streams) without a server or a model:
the --stream option's rules, credentials kept out of what is shown, and one
reader feeding several real sessions from a file under --media-dir (PyAV
decodes it as it would a camera), stopping a while after the last leaves.
The RTSP and HLS streams through the server are tests/test_streams.py."""

from __future__ import annotations

import pytest

from vidchat.devtools.waits import eventually
from vidchat.media.session import Session
from vidchat.media.streams import IDLE, LIVE, StreamReader, Streams, UnknownStream, parse_streams, redact

from test_protocol import make_video

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
