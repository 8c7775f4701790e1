"""Live sessions that remember (issue 60): the scene log, captions written
while the engine is idle, questions about the past, and what the record
and the doors show of it. The engine's captions are random words on the
tiny model: these tests check times, counts, order, bounds and priority."""

from __future__ import annotations

import asyncio
import contextlib
import time

import numpy as np
import pytest
from conftest import eventually_async

from vidchat.conversation.answers import AnswerOptions, AnswerQueue
from vidchat.conversation.memory import Captioner, MemoryOptions, picks, pointed, recall
from vidchat.conversation.registry import SessionRegistry, Standalone
from vidchat.conversation.runs import COMPLETED, Done
from vidchat.devtools.synthetic import long_stream
from vidchat.media.scene_log import Pointer
from vidchat.media.session import Session, SessionSettings

SCENE_S = 30.0
T0 = 1000.0  # the clip's first frame on the session's clock


def played(minutes: float, memory: bool = True, limit: int = 256, **settings) -> Session:
    session = Session("memory-test", SessionSettings(memory=memory, **settings))
    session.scene_log.limit = limit
    for t, frame, _ in long_stream(minutes, SCENE_S):
        session.add_frame(frame, t=T0 + t)
    return session


# ---- the scene log ------------------------------------------------------

@pytest.mark.unit
def test_one_keyframe_at_each_scene_change_and_none_with_memory_off():
    session = played(10)
    times = [k.t - T0 for k in session.scene_log.keyframes()]
    assert times == [SCENE_S * i for i in range(20)], times
    assert session.scene_log.keyframes()[0].pixels().shape == (120, 160, 3)  # the frame at the stored size
    assert len(played(3, memory=False).scene_log) == 0


@pytest.mark.unit
def test_the_log_is_bounded_and_thinned_so_it_still_spans_the_whole_session():
    session = played(30, limit=16)  # 60 scenes into 16 places
    frames = session.scene_log.keyframes()
    times = [k.t - T0 for k in frames]
    assert len(frames) == 16 and session.scene_log.added == 60 and session.scene_log.thinned == 44
    assert times[0] == 0.0 and times[-1] == 59 * SCENE_S, times  # the start and the newest are kept
    assert times == sorted(times)
    back = np.diff(times)[::-1]  # the gaps, newest first
    assert back[0] == SCENE_S and all(a <= b for a, b in zip(back, back[1:])), back  # sparser further back
    assert max(back) <= 0.3 * times[-1], back  # no hole: every stretch of the session has its keyframes
    # An hour and a half at 8 places: still the whole session, spaced by age.
    longer = [k.t - T0 for k in played(90, limit=8).scene_log.keyframes()]
    assert len(longer) == 8 and longer[0] == 0.0 and longer[-1] == 179 * SCENE_S
    gaps = np.diff(longer)[::-1]
    assert all(a <= b for a, b in zip(gaps, gaps[1:])), longer


@pytest.mark.unit
def test_a_question_pointing_at_a_time_gets_the_keyframes_of_that_scene():
    session = played(10)
    keyframes = session.scene_log.keyframes()
    now = session.newest_frame_time
    assert now == pytest.approx(T0 + 599)
    pointer = pointed("What was on screen 5 minutes ago?", now, T0)
    assert pointer is not None and pointer.t == pytest.approx(now - 300)
    chosen = picks(keyframes, pointer, 2)
    assert len(chosen) == 2 and [k.t for k in chosen] == sorted(k.t for k in chosen)
    assert all(abs(k.t - pointer.t) <= SCENE_S for k in chosen), [k.t - T0 for k in chosen]
    scene_then = max(k.t for k in keyframes if k.t <= pointer.t)
    assert scene_then in [k.t for k in chosen]  # the scene that was on screen then
    assert pointed("and at the start?", now, T0) == Pointer("the start", T0)
    earlier = pointed("What did I show you before?", now, T0)
    assert earlier is not None and earlier.t is None
    assert [k.t for k in picks(keyframes, earlier, 2)] == [T0 + 510, T0 + 540]  # the two scenes before this one
    assert pointed("What is this?", now, T0) is None
    assert pointed("two minutes ago, what was there?", now, T0).t == pytest.approx(now - 120)
    wall = time.mktime((2026, 12, 7, 10, 15, 0, 0, 0, -1))
    assert pointed("what happened at 10:08?", now, T0, now_wall=wall).t == pytest.approx(now - 420)
    assert pointed("and at 10:00?", now, T0, now_wall=wall).t == T0  # before the session: its start


@pytest.mark.unit
def test_the_memory_block_lists_captions_newest_first_within_its_tokens():
    session = played(10)
    log = session.scene_log
    for k in log.keyframes():
        log.set_caption(k.seq, f"scene {int((k.t - T0) // SCENE_S)} with a red chair and a lamp")
    words = lambda text: len(text.split())  # noqa: E731 - a tokenizer of whole words
    now = session.newest_frame_time
    use = recall(log.keyframes(), "What changed?", now, T0, MemoryOptions(tokens=60), words)
    assert 0 < use.tokens <= 60 and use.tokens == words(use.text)
    listed = [scene for scene, _, _ in use.captions]
    assert listed == sorted(listed, reverse=True) and len(listed) < 20  # newest first, cut by the budget
    assert "- 0:29 ago: scene 19" in use.text and not use.frames
    whole = recall(log.keyframes(), "What was there 2 minutes ago?", now, T0, MemoryOptions(tokens=4096), words)
    assert len(whole.captions) == 20 and len(whole.frames) == 2
    as_video = recall(log.keyframes(), "What was there 2 minutes ago?", now, T0, MemoryOptions(tokens=4096), words,
                      with_frames=False)  # frames sent as a video: the captions alone
    assert not as_video.frames and "images are from earlier" not in as_video.text
    assert "The first 2 images are from earlier in this session" in whole.text


# ---- through real vLLM -----------------------------------------------------

def remembering_host(engine, **options) -> Standalone:
    return Standalone(engine, answer_gate=AnswerQueue(), memory=MemoryOptions(**options),
                      registry=SessionRegistry())


async def captioned(host: Standalone, entry, within: float = 120.0) -> None:
    await eventually_async(lambda: not entry.session.scene_log.uncaptioned(), within, "every keyframe captioned")


def watching(host: Standalone, minutes: float, frames: int = 4, kind: str = "replay"):
    """A session of ``host`` with memory on that has watched ``minutes`` of the synthetic stream."""
    entry = host.registry.create(kind, SessionSettings(memory=True, num_sample_frames=frames))
    for t, frame, _ in long_stream(minutes, SCENE_S):
        entry.session.add_frame(frame, t=T0 + t)
    return entry


async def ask_and_finish(entry, question: str, options: AnswerOptions) -> Done:
    run = await entry.ask(question, options)
    return await run.finish()


@pytest.mark.engine
async def test_captions_are_written_while_idle_and_a_question_about_minute_5_gets_its_keyframes(omni_engine):
    host = remembering_host(omni_engine, caption_tokens=6, frames=2)
    entry = watching(host, 10, frames=4)
    captioner = Captioner(host, host.memory)
    captioner.start()
    try:
        await captioned(host, entry)
        assert captioner.stats.written == 20 and captioner.stats.aborted == 0
        done = await ask_and_finish(entry, "What did you see 5 minutes ago?", AnswerOptions(max_tokens=4,
                                                                                          temperature=0.0))
    finally:
        await captioner.stop()
    assert done.status == COMPLETED
    rec = done.answer.summary()
    times = [f["time_s"] for f in rec["memory_frames"]]
    assert len(times) == 2 and all(abs(t - 299) <= SCENE_S for t in times), times
    assert rec["memory_tokens"] > 0 and len(rec["memory"]["captions"]) >= 1
    assert rec["prompt_tokens"] <= omni_engine.options.max_model_len
    assert len(rec["frame_times"]) == 4  # the live frames; the keyframes came before them
    assert "Memory of this session" in rec["prompt"] and "The first 2 images" in rec["prompt"]


class ReplayingStandalone(Standalone):
    """A standalone host that opens sessions as replay and suites do (vidchat.qa.replay.ReplayHost)."""

    def new_session(self, kind: str):
        return self.registry.create(kind, SessionSettings())


@pytest.mark.engine
async def test_a_bundle_with_memory_is_replayed_identically_with_its_recorded_captions(omni_engine, tmp_path):
    from vidchat.conversation.bundles import read_bundle, write_bundle
    from vidchat.qa.replay import Answered, ReplayPlan, reask_bundle

    host = remembering_host(omni_engine, caption_tokens=5)
    entry = watching(host, 6, frames=3, kind="webrtc")
    for k in entry.session.scene_log.keyframes():
        entry.session.scene_log.set_caption(k.seq, f"caption of keyframe {k.seq}")
    done = await ask_and_finish(entry, "What was there at the start?", AnswerOptions(max_tokens=12, temperature=0.0))
    original = done.answer.summary()
    assert [f["time_s"] for f in original["memory_frames"]] == [0.0, 30.0]
    bundle = read_bundle(write_bundle(tmp_path, done.answer, t=359.0))
    assert bundle.memory.text == done.answer.memory.text
    assert all(np.array_equal(a.pixels, b.pixels) for a, b in zip(bundle.memory.frames, done.answer.memory.frames))
    # Replayed where nothing is remembered (a fresh session, memory off, other captions in no log):
    # the recorded memory is what the model gets again.
    replayer = ReplayingStandalone(omni_engine, answer_gate=AnswerQueue(), registry=SessionRegistry())
    result = await reask_bundle(replayer, ReplayPlan(), bundle)
    (outcome,) = result.outcomes
    assert isinstance(outcome, Answered), outcome
    again = outcome.record
    assert again["prompt"] == original["prompt"] and again["answer"] == done.answer.reply.text
    assert again["inputs_sha256"] == original["inputs_sha256"]
    assert again["memory_frames"] == original["memory_frames"] and again["memory_tokens"] == original["memory_tokens"]
    assert len(replayer.registry) == 0  # its session closed


@pytest.mark.unit
def test_a_suite_check_holds_the_memory_frames_to_a_span_of_the_clip():
    from vidchat.qa.suite import run_checks
    from vidchat.qa.suite_file import SuiteError, _expect

    frames = [{"time_s": 118.0, "source_s": None}, {"time_s": 200.0, "source_s": 121.5}]
    (ok,) = run_checks({"memory_frames_within": [115.0, 125.0]}, "", None, None, memory_frames=frames)
    assert ok.ok and "118.0, 121.5" in ok.detail
    (off,) = run_checks({"memory_frames_within": [119.0, 125.0]}, "", None, None, memory_frames=frames)
    assert not off.ok and "not within" in off.detail
    (none,) = run_checks({"memory_frames_within": [0, 10]}, "", None, None, memory_frames=[])
    assert not none.ok and "no memory frames" in none.detail
    with pytest.raises(SuiteError, match="memory_frames_within must be"):
        _expect({"memory_frames_within": [125.0, 115.0]}, "suite.toml [case]")


@pytest.mark.engine
async def test_a_caption_in_flight_is_aborted_by_a_question_and_written_later(omni_engine):
    # A caption of 2,000 tokens runs for seconds on the tiny model: long enough to be cut.
    host = remembering_host(omni_engine, caption_tokens=2000)
    entry = watching(host, 0.6, frames=2)  # two scenes
    assert len(entry.session.scene_log) == 2
    captioner = Captioner(host, host.memory)
    captioner.start()
    try:
        await eventually_async(lambda: captioner.running, 60, "a caption starts")
        done = await ask_and_finish(entry, "What is there?", AnswerOptions(max_tokens=4, temperature=0.0))
        assert done.status == COMPLETED
        assert captioner.stats.aborted == 1 and captioner.stats.written == 0
        assert len(entry.session.scene_log.uncaptioned()) == 2  # nothing lost: both are still due
        captioner.options = MemoryOptions(caption_tokens=4)
        await captioned(host, entry)
        assert captioner.stats.written == 2
    finally:
        await captioner.stop()
    assert omni_engine.running_requests == 0


@pytest.mark.engine
async def test_a_long_chat_is_folded_into_a_summary_and_the_context_never_overflows(omni_engine):
    host = remembering_host(omni_engine, caption_tokens=4, tokens=512)
    entry = watching(host, 4, frames=4)
    for k in entry.session.scene_log.keyframes():
        entry.session.scene_log.set_caption(k.seq, "a long caption " * 20)
    captioner = Captioner(host, host.memory)
    captioner.start()
    folded = []
    try:
        for i in range(10):  # 10 answers of 300 tokens: more chat than the context holds
            done = await ask_and_finish(entry, f"Question {i}: what was there 2 minutes ago?",
                                        AnswerOptions(max_tokens=300, temperature=0.0))
            assert done.status == COMPLETED, done.error
            rec = done.answer.summary()
            assert rec["prompt_tokens"] + rec["completion_tokens"] <= omni_engine.options.max_model_len
            assert rec["memory_tokens"] <= 512
            folded.append(rec["history_folded"])
            await eventually_async(lambda: captioner._fold_due(omni_engine) is None, 120, "the chat folded")
    finally:
        await captioner.stop()
    assert captioner.stats.folds >= 1 and folded[-1] > 0 and folded == sorted(folded), folded
    head = entry.history.turns()[0]
    assert head.role == "system" and head.text.startswith("Summary of the earlier conversation")
    assert entry.history.folded + len(entry.history) - 1 == 10  # every exchange is in the chat or its summary


# ---- the doors ---------------------------------------------------------------

@pytest.mark.engine
async def test_an_opted_in_socket_client_gets_memory_caption_and_its_log_over_http(server):
    import base64
    import json

    import websockets

    from vidchat.devtools import synthetic

    scenes = [base64.b64encode(j).decode() for j in synthetic.cuts_clip(120, 160, cuts=3, hold=1).jpegs()]

    async def messages(ws, until, within=90.0):
        seen = []
        deadline = asyncio.get_running_loop().time() + within
        while not until(seen):
            left = deadline - asyncio.get_running_loop().time()
            seen.append(json.loads(await asyncio.wait_for(ws.recv(), max(left, 0.01))))
        return seen

    async with websockets.connect(server.ws_url, max_size=None) as remembering, \
            websockets.connect(server.ws_url, max_size=None) as plain:
        await remembering.send(json.dumps({"type": "session.config", "memory": True, "num_sample_frames": 2}))
        await plain.send(json.dumps({"type": "session.config", "num_sample_frames": 2}))
        for data in scenes:
            for ws in (remembering, plain):
                await ws.send(json.dumps({"type": "video.frame", "data": data}))
        captions = [m for m in await messages(remembering, lambda seen: sum(
            m["type"] == "memory.caption" for m in seen) >= 3) if m["type"] == "memory.caption"]
        assert len({c["seq"] for c in captions}) == len(captions)  # each keyframe captioned once
        assert all(isinstance(c["time_ms"], int) and c["time_ms"] >= 0 and isinstance(c["caption"], str)
                   for c in captions)
        await remembering.send(json.dumps({"type": "session.update", "max_tokens": 4}))
        updated = (await messages(remembering, lambda seen: bool(seen) and seen[-1]["type"] == "session.updated"))[-1]
        assert updated["settings"]["memory"] is True
        memory = await asyncio.to_thread(server.get_json, f"/sessions/{updated['session_id']}/memory")
        assert [k["seq"] for k in memory["keyframes"]] == sorted(c["seq"] for c in captions)
        # Each keyframe's caption is the one the socket was sent. By seq, not by order of arrival: the
        # newest keyframe goes first, but one captioned before the next arrived is sent before it.
        assert {k["seq"]: k["caption"] for k in memory["keyframes"]} == {c["seq"]: c["caption"] for c in captions}
        assert memory["keyframes"][0]["time_s"] == 0.0 and memory["keyframes"][0]["thumbnail"].endswith(".jpg")
        # /metrics: the captions by outcome, and this session's log.
        from test_operations import scrape

        samples = await asyncio.to_thread(scrape, server)
        assert samples[("vidchat_memory_captions_total", (("outcome", "written"),))] >= len(captions)
        assert samples[("vidchat_memory_keyframes", (("session", updated["session_id"][:8]),))] == len(captions)
        # Without history (the seed's default) a question still carries the session's memory.
        await remembering.send(json.dumps({"type": "video.query", "text": "What was there at the start?"}))
        done = (await messages(remembering, lambda seen: bool(seen) and seen[-1]["type"] == "response.text.done"))[-1]
        assert done["stats"]["memory_tokens"] > 0 and done["stats"]["history_turns"] == 0
        assert [f["time_s"] for f in done["stats"]["memory_frames"]][0] == 0.0
        # The client that never named memory: no log, and not one memory.caption.
        await plain.send(json.dumps({"type": "session.update", "max_tokens": 4}))
        said = await messages(plain, lambda seen: bool(seen) and seen[-1]["type"] == "session.updated")
        assert not [m for m in said if m["type"] == "memory.caption"]
        plain_memory = await asyncio.to_thread(server.get_json, f"/sessions/{said[-1]['session_id']}/memory")
        assert plain_memory["memory"] is False and plain_memory["keyframes"] == []
    assert "no such session" in (await asyncio.to_thread(server.get_json, "/sessions/nope/memory"))["detail"]
    # The Realtime door names the session's id for the same route (its own session.id is the API's).
    async with websockets.connect(server.url.replace("http", "ws") + "/v1/realtime", max_size=None) as rt:
        created = json.loads(await asyncio.wait_for(rt.recv(), 30))
        assert created["type"] == "session.created"
        realtime_id = created["session"]["vidchat"]["session_id"]
        assert realtime_id != created["session"]["id"]
        log = await asyncio.to_thread(server.get_json, f"/sessions/{realtime_id}/memory")
        assert log["session_id"] == realtime_id and log["memory"] is False


@pytest.mark.unit
def test_the_memory_routes_serve_a_session_to_its_own_login_only():
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from vidchat.doors import LOGIN_HEADER, memory_routes

    registry = SessionRegistry()
    entry = registry.create("webrtc", SessionSettings(memory=True), owner="alice")
    for t, frame, _ in long_stream(1.5, SCENE_S):
        entry.session.add_frame(frame, t=T0 + t)
    sid = entry.session.id
    app = FastAPI()

    class State:
        pass

    state = State()
    state.registry = registry
    app.include_router(memory_routes.router(state))
    client = TestClient(app)
    alice, bob = {LOGIN_HEADER: "alice"}, {LOGIN_HEADER: "bob"}
    body = client.get(f"/sessions/{sid}/memory", headers=alice).json()
    assert [k["time_s"] for k in body["keyframes"]] == [0.0, 30.0, 60.0]
    thumb = client.get(body["keyframes"][1]["thumbnail"], headers=alice)
    assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
    assert client.get(f"/sessions/{sid}/memory", headers=bob).status_code == 404
    assert client.get(body["keyframes"][1]["thumbnail"], headers=bob).status_code == 404
    assert client.post(f"/sessions/{sid}/memory/pin", json={"seq": 2}, headers=bob).status_code == 404
    seq = body["keyframes"][1]["seq"]
    assert client.post(f"/sessions/{sid}/memory/pin", json={"seq": seq}, headers=alice).json() == {"pinned": seq}
    assert entry.memory_pin == seq
    refused = client.post(f"/sessions/{sid}/memory/pin", json={"seq": 999}, headers=alice)
    assert refused.status_code == 400 and "keyframe of this session" in refused.json()["detail"]
    assert client.post(f"/sessions/{sid}/memory/pin", json={}, headers=alice).status_code == 400  # say which
    off = client.post(f"/sessions/{sid}/memory", json={"memory": False}, headers=alice).json()
    assert off["memory"] is False and entry.session.settings.memory is False
    assert off["keyframes"] == [] and len(entry.session.scene_log) == 0  # off keeps nothing
    assert client.post(f"/sessions/{sid}/memory", json={"memory": "yes"}, headers=alice).status_code == 400


@pytest.mark.engine
async def test_a_replay_captions_what_it_saw_before_each_question(omni_engine):
    from vidchat.conversation.memory import write_captions

    host = remembering_host(omni_engine, caption_tokens=4)
    entry = watching(host, 3)
    assert await write_captions(host, omni_engine, entry, host.memory) == 6
    keyframes = entry.session.scene_log.keyframes()
    assert all(k.caption is not None for k in keyframes)
    written = [k.caption_wall for k in keyframes]
    assert written == sorted(written)  # oldest first
    assert await write_captions(host, omni_engine, entry, host.memory) == 0  # nothing twice


@pytest.mark.unit
def test_a_seed_session_starts_with_the_servers_memory():
    from types import SimpleNamespace

    from vidchat.doors.socket.session import SessionConfig

    for remembers in (True, False):
        state = SimpleNamespace(registry=SimpleNamespace(default_settings=lambda r=remembers: SessionSettings(
            memory=r)), check_frame_budget=lambda n: None)
        conn = SimpleNamespace(settings=SimpleNamespace(ws_max_audio_seconds=30.0), state=state)
        assert SessionConfig(conn)._session_settings({}).memory is remembers
        assert SessionConfig(conn)._session_settings({"memory": False}).memory is False


@pytest.mark.engine
async def test_a_suite_case_holds_a_clips_memory_frames_to_a_span_of_its_seconds(omni_engine, tmp_path):
    """A 10-minute clip (a scene every 30 s) replayed by a suite with memory on:
    at 10:00, "5 minutes ago" gets keyframes of minute 5, which the case's
    memory_frames_within checks; a span elsewhere fails, saying where they were."""

    from test_replay import make_clip

    from vidchat.qa.suite import run_model
    from vidchat.qa.suite_file import read_suite

    frames = [frame for _, frame, _ in long_stream(10, SCENE_S)]
    (tmp_path / "clips").mkdir()
    make_clip(tmp_path / "clips" / "hour.mp4", seconds=600, fps=1, size=(160, 120),
              picture=lambda i, n, h, w: frames[i], tone=False)
    (tmp_path / "suite.toml").write_text("""name = "memory"
[settings]
temperature = 0
max_tokens = 4
num_sample_frames = 2
memory = true

[[case]]
name = "ten-minutes"
video = "clips/hour.mp4"
  [[case.ask]]
  at = 599.0
  question = "What did you see 5 minutes ago?"
  expect = { memory_frames_within = [265.0, 335.0] }
  [[case.ask]]
  at = 599.5
  question = "And 5 minutes ago, again?"
  expect = { memory_frames_within = [0.0, 100.0] }
""")
    host = ReplayingStandalone(omni_engine, answer_gate=AnswerQueue(), memory=MemoryOptions(caption_tokens=4),
                               registry=SessionRegistry())

    @contextlib.asynccontextmanager
    async def open_host(model: str):
        yield host

    # The suite's runner for one model (run_suite runs each model in a loop of its own; this engine has one).
    first, second = await run_model(read_suite(tmp_path), "tiny", open_host, tmp_path / "out", 1, {})
    assert first.status == "passed", (first.error, first.checks)
    assert second.status == "failed" and "not within 0–100 s" in second.checks[0]["detail"], second.checks
    assert len(host.registry) == 0
