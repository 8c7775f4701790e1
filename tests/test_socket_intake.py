"""A socket session's frame intake is bounded (--ws-max-fps, issue 57 point
1): frames over the rate are dropped before they are decoded, the seed's ack
says reason "rate" (with no error message each: a client that sends too many
would get thousands), the Realtime door's refusal carries the code "rate",
and the session's stats count them. Driven on the real intake
(vidchat.doors.socket.intake) with a real session, no server; the real
server's part is tests/test_slow_client.py."""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import pytest

from vidchat.conversation.registry import SessionRegistry
from vidchat.devtools import synthetic
from vidchat.doors.socket.intake import FrameRate, Refused, SocketMedia

pytestmark = pytest.mark.unit

# All different, so the near-duplicate filter keeps every frame the rate lets in.
FRAMES = [base64.b64encode(j).decode() for j in synthetic.cuts_clip(48, 64, cuts=100, hold=1).jpegs()]


class Conn:
    """What the intake needs of its connection: the session, the settings, and what it sends."""

    def __init__(self, max_fps: float) -> None:
        self.entry = SessionRegistry(max_sessions=2).create("ws")
        self.settings = SimpleNamespace(ws_max_fps=max_fps, ws_max_frame_bytes=1 << 20)
        self.sent: list[dict[str, Any]] = []
        self.errors: list[str] = []

    async def send(self, msg: dict[str, Any], droppable: bool = False) -> bool:
        self.sent.append(msg)
        return True

    async def error(self, message: str) -> bool:
        self.errors.append(message)
        return True


async def test_frames_over_the_rate_are_acked_rate_and_counted_but_never_decoded():
    conn = Conn(max_fps=10)
    media = SocketMedia(conn)
    # 30 frames in the same instant: the burst (a second's worth, 10) is taken, the rest dropped.
    for n, data in enumerate(FRAMES[:30]):
        await media.on_frame({"type": "video.frame", "data": data, "frame_id": n}, arrived=100.0)
    reasons = [ack.get("reason") for ack in conn.sent]
    assert reasons == [None] * 10 + ["rate"] * 20, reasons
    assert all(not ack["accepted"] for ack in conn.sent[10:])
    assert not conn.errors  # an ack says it, not an error per frame
    stats = conn.entry.session.stats
    assert stats["frames_rate_dropped"] == 20
    assert stats["frames_received"] == 10  # the dropped ones never reached the decoder
    # A second later the rate has room for another second's worth.
    await media.on_frame({"type": "video.frame", "data": FRAMES[30], "frame_id": 30}, arrived=101.0)
    assert conn.sent[-1]["accepted"] is True and conn.entry.session.stats["frames_rate_dropped"] == 20


async def test_the_realtime_doors_frames_are_refused_with_the_code_rate():
    conn = Conn(max_fps=2)
    media = SocketMedia(conn)
    for data in FRAMES[:2]:
        assert await media.take_image({"image_url": data}, "input_image", None, key="image_url", arrived=5.0) \
            is not None
    with pytest.raises(Refused) as refused:
        await media.take_image({"image_url": FRAMES[2]}, "input_image", None, key="image_url", arrived=5.0)
    assert refused.value.reason == "rate" and "--ws-max-fps" in refused.value.message
    assert conn.entry.session.stats["frames_rate_dropped"] == 1


def test_the_rate_is_an_average_with_a_second_of_burst():
    rate = FrameRate(60)
    taken = sum(rate.admit(0.0) for _ in range(1000))
    assert taken == 60
    # Then 60 a second, however fast they come: 10 s of a thousand a second.
    taken = sum(rate.admit(t / 1000) for t in range(1, 10_001))
    assert 599 <= taken <= 600  # float steps of a millisecond may leave the last one short
