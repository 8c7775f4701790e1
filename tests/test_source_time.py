"""A file source's own clock: the page reports where a file is (play, pause,
seek, loop, rate), the session gives every frame its position in the file,
and the answer record carries it. No model, no server process: the endpoint
runs on the real router behind the real access guard, in a TestClient."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient

from vidchat.app.access import Access
from vidchat.app.guard import Guard
from vidchat.conversation.answers import Answer, AnswerOptions
from vidchat.conversation.asking import frozen_sample
from vidchat.conversation.registry import SessionRegistry
from vidchat.doors.webrtc_routes import router
from vidchat.media.clock import NTP_TO_UNIX_S, SenderClock, SourceTimeline, ntp_to_unix
from vidchat.media.session import Session, SessionSettings

pytestmark = pytest.mark.unit


# ---- the timeline on its own ------------------------------------------------

def test_nothing_reported_means_no_position():
    tl = SourceTimeline()
    assert tl.position_at(5.0) is None and tl.source_at(5.0) is None and tl.source_at(None) is None


def test_play_pause_seek_and_rate():
    tl = SourceTimeline()
    tl.report(100.0, "file", "clip.webm", position=2.0, playing=True, rate=1.0)
    assert tl.position_at(99.9) is None  # before the first report
    assert tl.position_at(100.0) == 2.0
    assert tl.position_at(101.5) == pytest.approx(3.5)
    tl.report(103.0, "file", "clip.webm", position=5.0, playing=False)  # paused at 5 s
    assert tl.position_at(102.0) == pytest.approx(4.0)  # earlier times keep the older segment
    assert tl.position_at(110.0) == 5.0
    tl.report(111.0, "file", "clip.webm", position=1.0, playing=True, rate=2.0)  # seek back, double speed
    assert tl.position_at(112.0) == pytest.approx(3.0)
    assert tl.source_at(112.0) == {"kind": "file", "name": "clip.webm"}


def test_loop_wraps_before_the_next_report_and_a_file_that_does_not_loop_stops_at_its_end():
    tl = SourceTimeline()
    tl.report(0.0, "file", "a.webm", position=5.5, duration=6.0, loop=True)
    assert tl.position_at(1.0) == pytest.approx(0.5)
    tl.report(2.0, "file", "a.webm", position=1.5, duration=6.0, loop=True)  # the page's seeked report
    assert tl.position_at(2.5) == pytest.approx(2.0)
    tl.report(10.0, "file", "a.webm", position=5.5, duration=6.0, loop=False)
    assert tl.position_at(20.0) == 6.0


def test_switching_to_camera_ends_file_positions():
    tl = SourceTimeline()
    tl.report(0.0, "file", "a.webm", position=0.0)
    tl.report(4.0, "camera")
    assert tl.position_at(3.0) == pytest.approx(3.0)
    assert tl.position_at(5.0) is None
    assert tl.source_at(5.0) == {"kind": "camera", "name": None} == tl.source_at(None)
    with pytest.raises(ValueError, match="kind must be one of"):
        tl.report(6.0, "webcam")


def test_history_is_bounded_and_out_of_order_reports_land_in_time_order():
    tl = SourceTimeline(max_segments=4)
    for i in range(10):
        tl.report(float(i), "file", "a", position=100.0 + i, playing=False)
    assert tl.position_at(9.5) == 109.0 and tl.position_at(6.5) == 106.0
    assert tl.position_at(5.5) is None  # forgotten
    tl.report(7.5, "file", "a", position=0.0, playing=False)
    assert tl.position_at(7.7) == 0.0 and tl.position_at(8.0) == 108.0


def test_a_seek_is_a_jump_and_frames_captured_near_it_are_marked_but_drift_and_a_loop_are_not():
    tl = SourceTimeline()
    tl.report(0.0, "file", "a.webm", position=0.0, duration=8.0, loop=True)
    tl.report(1.0, "file", "a.webm", position=1.1, duration=8.0, loop=True)  # drift: 0.1 s off
    tl.report(8.0, "file", "a.webm", position=0.05, duration=8.0, loop=True)  # the loop, as extrapolated
    tl.report(10.0, "file", "a.webm", position=6.0, duration=8.0, loop=True)  # a seek from 2 s to 6 s
    assert [tl.at_jump(t) for t in (1.0, 8.0, 9.84, 9.86, 10.0, 10.14, 10.16)] == [
        False, False, False, True, True, True, False]
    tl.report(12.0, "file", "a.webm", position=8.0, playing=False)  # paused: where it stands, no jump
    tl.report(13.0, "file", "a.webm", position=3.0, playing=False)  # a seek while paused is one
    assert not tl.at_jump(12.0) and tl.at_jump(13.0)
    tl.report(20.0, "file", "b.webm", position=0.0)  # another file: a new source, not a seek
    tl.report(21.0, "camera")
    assert not tl.at_jump(20.0) and not tl.at_jump(21.0) and not tl.at_jump(None)


# ---- the session ------------------------------------------------------------

def frame(i: int) -> np.ndarray:
    """A picture unlike the one before, so the filter keeps every frame."""
    img = np.zeros((48, 64, 3), np.uint8)
    img[:] = (i * 53) % 256, (i * 97) % 256, (i * 31) % 256
    return img


def session() -> Session:
    return Session("s", SessionSettings(evs_enabled=False, num_sample_frames=64, max_frames=64))


def test_frames_carry_their_file_position_through_play_pause_seek_loop_and_a_switch():
    s = session()
    t0 = 1000.0
    s.add_frame(frame(0), t=t0 - 1)  # before the page said anything: a position nobody knows
    s.set_source("file", "clip.webm", 0.0, playing=True, rate=1.0, t=t0, duration_s=6.0, loop=True)
    for k in range(4):  # playing: 0.0, 0.5, 1.0, 1.5
        s.add_frame(frame(1 + k), t=t0 + 0.5 * k)
    s.set_source("file", "clip.webm", 2.0, playing=False, t=t0 + 2.0)  # pause at 2 s for 3 s
    s.add_frame(frame(5), t=t0 + 4.0)
    s.set_source("file", "clip.webm", 4.0, playing=True, t=t0 + 5.0, duration_s=6.0, loop=True)  # seek to 4 s
    s.add_frame(frame(6), t=t0 + 5.5)
    s.add_frame(frame(7), t=t0 + 7.5)  # past the end: the loop wrapped to 0.5 s
    s.set_source("camera", t=t0 + 8.0)
    s.add_frame(frame(8), t=t0 + 8.5)
    sample = s.sample()
    assert sample.source_times == [None, 0.0, 0.5, 1.0, 1.5, 2.0, 4.5, pytest.approx(0.5), None]
    assert sample.source == {"kind": "camera", "name": None}  # the newest frame's source
    s.reset()  # the buffer goes, the source stays
    s.add_frame(frame(9), t=t0 + 9.0)
    assert s.sample().source_times == [None]
    s.set_source("file", "b.webm", 10.0, t=t0 + 10.0)
    s.add_frame(frame(10), t=t0 + 10.25)
    assert s.sample().source_times == [None, 10.25]


def ntp(unix_s: float) -> int:
    whole = int(unix_s)
    return ((whole + NTP_TO_UNIX_S) << 32) | int((unix_s - whole) * 2**32)


def test_the_sender_clock_maps_rtp_time_to_the_senders_wall_clock_across_a_wrap():
    clock = SenderClock()
    assert clock.sender_time(1234) is None  # no sender report yet
    assert ntp_to_unix(ntp(1_700_000_000.25)) == pytest.approx(1_700_000_000.25, abs=1e-6)
    clock.observe_report(ntp(1_700_000_000.0), 2**32 - 9000)  # 0.1 s before the 32-bit wrap
    assert clock.sender_time(2**32 - 9000) == pytest.approx(1_700_000_000.0)
    assert clock.sender_time(9000) == pytest.approx(1_700_000_000.2)  # after the wrap
    assert clock.sender_time(2**32 - 18000) == pytest.approx(1_699_999_999.9)  # before the report


def test_a_report_lands_where_the_senders_clock_puts_it_and_re_dates_frames_that_beat_it():
    import time

    s = session()
    now = time.monotonic()
    s.set_source("file", "clip.webm", 5.0, playing=True, t=now - 2.0)
    # Frames stamped 40 ms apart up to now; the browser's clock runs 1000 s
    # behind the timeline (offset measured from its sender reports).
    for k in range(5):
        s.add_frame(frame(k), t=now - 0.16 + 0.04 * k)
    s.note_sender_clock(1000.0)
    # The seek to 1.0 s happened on the page at timeline time now - 0.07: the
    # two newest frames were captured after it but arrived before the report.
    placed, by_sender = s.set_source("file", "clip.webm", 1.0, playing=True, at_sender_s=now - 0.07 - 1000.0)
    assert placed == pytest.approx(now - 0.07) and by_sender
    times = s.sample().source_times
    assert times[:3] == [pytest.approx(6.84), pytest.approx(6.88), pytest.approx(6.92)]  # before the seek
    assert times[3:] == [pytest.approx(1.03), pytest.approx(1.07)]  # after it, dated again
    # A sender clock further than a second off the arrival is not believed.
    before = time.monotonic()
    placed, by_sender = s.set_source("file", "clip.webm", 2.0, playing=False, at_sender_s=now + 5.0 - 1000.0)
    assert before <= placed <= time.monotonic() and not by_sender
    # Without sender reports the arrival time is used.
    fresh = session()
    before = time.monotonic()
    placed, by_sender = fresh.set_source("camera", at_sender_s=12.0)
    assert before <= placed <= time.monotonic() and not by_sender


def test_set_source_refuses_what_makes_no_position():
    s = session()
    with pytest.raises(ValueError, match="position"):
        s.set_source("file", "a", None)
    with pytest.raises(ValueError, match="position"):
        s.set_source("file", "a", -1.0)
    with pytest.raises(ValueError, match="rate"):
        s.set_source("file", "a", 0.0, rate=0.0)


def test_set_source_defaults_to_now_on_the_frames_clock():
    import time

    s = session()
    s.set_source("file", "a", 30.0, playing=False)
    s.add_frame(frame(0))  # stamped now, as a producer without a media clock does
    assert s.sample().source_times == [30.0]
    assert s.source_timeline.position_at(time.monotonic() - 3600) is None


class _Stats:
    audio_seconds = 1.0
    ttft_s = None

    def as_dict(self):
        return {"audio_seconds": self.audio_seconds, "ttft_s": None}


class _Reply:
    stats = _Stats()
    from vidchat.engine import EngineOptions

    engine = type("E", (), {"model_path": "m", "options": EngineOptions(model="m")})()
    text = ""


def test_the_record_says_where_in_the_file_frames_and_audio_came_from():
    s = session()
    s.set_source("file", "clip.webm", 3.0, t=50.0)
    for k in range(4):
        s.add_frame(frame(k), t=50.0 + k)
    s.add_audio(np.zeros(16000 * 3, np.float32), t=50.0)
    sample = s.sample()
    rec = Answer("q", _Reply(), sample, AnswerOptions()).summary()
    assert rec["frame_source_times"] == [3.0, 4.0, 5.0, 6.0]
    assert rec["frame_source_at_jump"] == [False] * 4
    assert rec["frame_times"] == [0.0, 1.0, 2.0, 3.0]
    assert rec["audio_source_span"] == [3.0, 6.0]
    assert rec["source"] == {"kind": "file", "name": "clip.webm"}
    # A re-ask on fewer of the same frames keeps their positions.
    two = frozen_sample(Answer("q", _Reply(), sample, AnswerOptions()), frames=2)
    assert two.source_times == [3.0, 6.0] and two.timestamps == [50.0, 53.0]


def test_the_record_marks_the_frames_captured_at_a_seek_and_a_re_ask_keeps_the_marks():
    s = session()
    s.set_source("file", "clip.webm", 0.0, t=10.0)
    s.set_source("file", "clip.webm", 5.0, t=12.0)  # the seek: 2 s -> 5 s
    for t in (11.0, 11.9, 12.05, 12.5):
        s.add_frame(frame(int(t * 100)), t=t)
    sample = s.sample()
    rec = Answer("q", _Reply(), sample, AnswerOptions()).summary()
    assert rec["frame_source_times"] == [1.0, 1.9, 5.05, 5.5]
    assert rec["frame_source_at_jump"] == [False, True, True, False]
    two = frozen_sample(Answer("q", _Reply(), sample, AnswerOptions()), frames=2)
    assert two.source_at_jump == [False, False] and two.timestamps == [11.0, 12.5]
    three = frozen_sample(Answer("q", _Reply(), sample, AnswerOptions()), frames=3)
    assert three.frame_source_at_jump() == [False, True, False]  # frames 0, 1 and 3


def test_a_sample_without_positions_records_nulls():
    s = session()
    s.add_frame(frame(0), t=1.0)
    s.add_frame(frame(1), t=2.0)
    sample = s.sample()
    sample.source_times = []  # as a bundle read back from disk
    rec = Answer("q", _Reply(), sample, AnswerOptions()).summary()
    assert rec["frame_source_times"] == [None, None] and rec["source"] is None and rec["audio_source_span"] is None
    assert rec["frame_source_at_jump"] == [False, False]


# ---- the endpoint, behind the access guard -----------------------------------

TOKEN = "t0k-source"


@pytest.fixture
def api():
    registry = SessionRegistry(max_sessions=4)
    state = type("State", (), {"registry": registry})()
    app = FastAPI()
    app.include_router(router(state))
    guarded = Guard(app, Access(token=TOKEN), ["testserver"], [], 65536)
    client = TestClient(guarded, headers={"Authorization": f"Bearer {TOKEN}"})
    return client, registry.create("webrtc")


def test_the_page_reports_a_file_position_and_a_switch(api):
    client, entry = api
    sid = entry.session.id
    r = client.post("/webrtc/source", json={"session_id": sid, "kind": "file", "name": "C:\\clips\\a/b/clip.webm",
                                            "position": 4.0, "playing": False, "rate": 1.0})
    assert r.status_code == 200, r.text
    timeline = entry.session.source_timeline
    assert timeline.source_at(None) == {"kind": "file", "name": "clip.webm"}
    import time
    assert timeline.position_at(time.monotonic()) == 4.0
    long = "x" * 300 + ".webm"
    assert client.post("/webrtc/source", json={"session_id": sid, "kind": "file", "name": long,
                                               "position": 0}).status_code == 200
    assert timeline.source_at(None)["name"] == long[:200]
    assert client.post("/webrtc/source", json={"session_id": sid, "kind": "screen"}).status_code == 200
    assert timeline.position_at(time.monotonic()) is None and timeline.source_at(None)["kind"] == "screen"


@pytest.mark.parametrize("change, message", [
    ({"kind": "tape"}, "kind must be one of camera, screen, file"),
    ({"position": -1}, "position must be a number of seconds >= 0"),
    ({"position": "3"}, "position must be a number"),
    ({"position": None}, "position must be a number"),
    ({"rate": 0}, "rate must be a number in (0, 16]"),
    ({"rate": 17}, "rate must be a number in (0, 16]"),
    ({"rate": True}, "rate must be a number in (0, 16]"),
    ({"playing": "yes"}, "playing must be true or false"),
    ({"name": 5}, "name must be the file's name"),
    ({"duration": 0}, "duration must be a positive number"),
    ({"loop": 1}, "loop must be true or false"),
    ({"session_id": 7}, "session_id must be"),
    ({"at": "now"}, "at must be the page's time in ms since the Unix epoch"),
    ({"at": -5}, "at must be the page's time in ms since the Unix epoch"),
])
def test_bad_fields_get_a_400_naming_them(api, change, message):
    client, entry = api
    body = {"session_id": entry.session.id, "kind": "file", "name": "a.webm", "position": 1.0, "playing": True,
            "rate": 1.0, **change}
    r = client.post("/webrtc/source", json=body)
    assert r.status_code == 400 and message in r.json()["detail"], r.text
    assert entry.session.source_timeline.source_at(None) is None  # nothing recorded


def test_non_finite_numbers_and_bodies_that_are_not_objects_get_a_400(api):
    client, entry = api
    body = f'{{"session_id": "{entry.session.id}", "kind": "file", "position": NaN}}'
    r = client.post("/webrtc/source", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "position" in r.json()["detail"]
    r = client.post("/webrtc/source", content="[1]", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "JSON object" in r.json()["detail"]


def test_an_unknown_session_gets_a_404(api):
    client, _ = api
    r = client.post("/webrtc/source", json={"session_id": "not-a-session", "kind": "camera"})
    assert r.status_code == 404 and "no such session" in r.json()["detail"]


def test_the_access_guard_covers_the_endpoint(api):
    client, entry = api
    body = {"session_id": entry.session.id, "kind": "camera"}
    bare = TestClient(client.app)
    assert bare.post("/webrtc/source", json=body).status_code == 401
    assert bare.post("/webrtc/source", json=body, headers={"Authorization": "Bearer nope"}).status_code == 403
    assert client.post("/webrtc/source", json=body, headers={"Origin": "https://evil.example"}).status_code == 403
    big = {**body, "name": "x" * 70_000}
    assert client.post("/webrtc/source", json=big).status_code == 413
    assert client.post("/webrtc/source", json=body, headers={"Origin": "http://testserver"}).status_code == 200
