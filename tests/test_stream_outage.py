"""An IP camera with audio through an outage (issue 57, point 5), at the
reader (vidchat.media.streams.StreamReader) with a real GStreamer RTSP
camera sending H.264 and AAC, as most IP cameras do. No server and no model:
what is judged is whether the reader comes back and stays, which
/api/streams only reports (tests/test_streams.py covers the server's side
with a video-only camera).

The reader's stall limit and backoff are shortened so the test takes
seconds; the outage still lasts longer than the stall limit, which is what
once kept the reader from ever coming back: it judged a new connection
against the old one's last frame, and a new connection's first packets are
audio more often than not."""

from __future__ import annotations

import pytest

from vidchat.devtools.harness import allocate_port, eventually
from vidchat.devtools.stream_sources import start_rtsp_camera
from vidchat.media.session import Session
from vidchat.media.streams import LIVE, RECONNECTING, StreamReader

pytestmark = [pytest.mark.unit, pytest.mark.timeout(150)]

STALL_S = 2.0
BACKOFF_S = (0.5, 4.0)


def test_a_camera_with_audio_comes_back_after_an_outage_longer_than_the_stall_limit():
    port = allocate_port()
    camera = start_rtsp_camera(port, audio=True)
    reader = StreamReader("door", camera.url, stall_s=STALL_S, backoff_s=BACKOFF_S)
    session = Session("d" * 8, max_frame_bytes=1 << 22, max_frame_pixels=1 << 22)
    reader.attach(session)
    try:
        eventually(lambda: reader.state == LIVE, 60, "the camera live")
        # The camera sends sound as well as pictures, and the reader passes it on.
        eventually(lambda: session.stats["audio_seconds"] > 0.5, 30, "the camera's audio in the session")
        camera.stop()
        eventually(lambda: reader.state == RECONNECTING and (reader.snapshot()["last_frame_age_s"] or 0) > STALL_S,
                   30, "an outage longer than the stall limit", interval=0.2)
        camera = start_rtsp_camera(port, audio=True)  # back on the same URL, while the reader waits to retry
        tries = reader.connects
        eventually(lambda: reader.state == LIVE, 60, "live again", interval=0.2)
        # The first connection opened after the camera came back is the one that went live.
        assert reader.connects <= tries + 1, reader.snapshot()
        connects, offered = reader.connects, reader.offered

        def stays_live() -> bool:
            assert reader.state == LIVE and reader.connects == connects, reader.snapshot()  # no reconnect while up
            return reader.offered >= offered + 30

        eventually(stays_live, 60, "30 more frames on the same connection", interval=0.1)
        assert reader.error is None
    finally:
        reader.detach(session)
        reader.close()
        camera.stop()
