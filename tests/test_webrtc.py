"""The WebRTC door with a real aiortc client (no browser) against the app
served by uvicorn with real vLLM: media arrives in its own session, the chat
endpoint answers from that session's frames, peers end cleanly."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from conftest import SESSION_IDLE_TIMEOUT, eventually_async, thumbnail_colours, until_idle, until_running
from gradio_client import Client

from vidchat.conversation.asking import SETTINGS
from vidchat.devtools.rtc_client import RtcClient, SyntheticAudio, SyntheticVideo

pytestmark = pytest.mark.engine

RED, BLUE = (200, 30, 30), (30, 40, 200)


def submit(server, sid: str, question: str, k=8, max_tokens=16, temperature=0.0, seed="",
           gradio: Client | None = None, history=None, frames_as="images"):
    """Ask through the page's chat endpoint (the Gradio event the page uses); returns the job."""
    gradio = gradio or Client(server.url + "/", verbose=False)
    return gradio.submit(
        question, history or [], sid, k, "uniform", 10, True, 0.95, 64, frames_as, True, max_tokens, temperature,
        seed, api_name="/ask"
    )


def ask(server, sid: str, question: str, **kw):
    return submit(server, sid, question, **kw).result(timeout=120)


async def wait_for(predicate, timeout: float, what: str = "the session's media arrives"):
    return await eventually_async(predicate, timeout, what, interval=0.1)


async def running(server) -> int:
    return await asyncio.to_thread(server.running_requests)



async def _frames_seen_beyond(client, n: int) -> bool:
    return (await client.stats())["media"]["video_frames_seen"] >= n

async def test_media_arrives_and_question_uses_this_sessions_frames(server):
    red = RtcClient(server.url, SyntheticVideo(colour=RED, fps=15), SyntheticAudio())
    blue = RtcClient(server.url, SyntheticVideo(colour=BLUE, fps=15))
    await red.connect()
    await blue.connect()
    try:
        assert red.session_id != blue.session_id
        stats = await wait_for(lambda: _enough(red, frames=20, audio_s=1.0), timeout=20)
        assert stats["media"]["tracks"] == ["video", "audio"]
        assert stats["frames_received"] >= 20
        # The square moves 8 % of the width per frame: real motion, so the
        # filter keeps most frames and its counts add up.
        evs = stats["evs"]
        assert evs["total_count"] == evs["retained_count"] + evs["dropped_count"] == stats["frames_received"]
        assert evs["retained_count"] >= evs["total_count"] // 2
        assert stats["audio_seconds"] >= 1.0

        await wait_for(lambda: _enough(blue, frames=10), timeout=20)
        blue_stats = await blue.stats()
        assert blue_stats["audio_seconds"] == 0.0 and blue_stats["media"]["tracks"] == ["video"]

        for client, colour in ((red, RED), (blue, BLUE)):
            history, inputs_html, details = await asyncio.to_thread(ask, server, client.session_id, "Colour?")
            assert history[-1]["role"] == "assistant" and history[-1]["content"]
            assert details["frames"] == 8 and details["completion_tokens"] == 16
            assert details["prompt_tokens"] > 8 * 20
            colours = thumbnail_colours(inputs_html)
            assert len(colours) == 8
            for c in colours:  # every frame sent came from this client's camera
                assert np.abs(c - np.array(colour)).max() < 40, (c, colour)
        assert await asyncio.to_thread(server.running_requests) == 0
    finally:
        await red.close()
        await blue.close()


async def _enough(client: RtcClient, frames: int, audio_s: float = 0.0):
    s = await client.stats()
    return s if s["frames_received"] >= frames and s["audio_seconds"] >= audio_s else None


async def _back(client: RtcClient):
    """The session's stats once its tab is back (media flows through a connected peer), else None."""
    s = await client.stats()
    return s if s["away"] is False else None


async def test_an_out_of_range_slider_value_is_refused_by_vidchat_naming_the_field(server):
    """The page's sliders clamp what is typed into them, but the /ask API
    takes any value: Gradio's own bounds check would fail the event with
    "Value 0 is less than minimum value 1." (no field named, the chat
    replaced by an error). vidchat's settings table refuses it instead, as
    a notice naming the slider's label, and asks the model nothing."""
    client = RtcClient(server.url, SyntheticVideo())
    await client.connect()
    try:
        await wait_for(lambda: _enough(client, frames=4), timeout=20)
        asked = server.get_json("/api/health")["questions_asked"]
        for field, change in (("max_tokens", {"max_tokens": 0}), ("temperature", {"temperature": -1.0}),
                              ("num_sample_frames", {"k": 0})):
            history, _, _ = await asyncio.to_thread(ask, server, client.session_id, "Anything there?", **change)
            assert [m["role"] for m in history] == ["user", "assistant"], history
            text = str(history[-1]["content"])
            assert f"{SETTINGS[field].label} must be" in text and "minimum value" not in text, text
        assert server.get_json("/api/health")["questions_asked"] == asked
    finally:
        await client.close()


async def test_question_without_camera_gets_a_friendly_message(server):
    history, _, _ = await asyncio.to_thread(ask, server, "", "Hello?")
    text = history[-1]["content"]
    text = text if isinstance(text, str) else "".join(p.get("text", "") for p in text)
    assert "Start camera" in text and "Traceback" not in text


async def test_newest_frame_lag_stays_bounded_while_the_model_answers(server):
    """30 fps in; a long answer runs meanwhile; frames must not queue up."""
    client = RtcClient(server.url, SyntheticVideo(fps=30))
    await client.connect()
    try:
        await wait_for(lambda: _enough(client, frames=30), timeout=20)
        asked = time.monotonic()
        job = submit(server, client.session_id, "Talk at length.", k=16, max_tokens=1500, temperature=0.0)
        await until_running(server, 1, 30, "the answer generates")
        seen = (await client.stats())["media"]["video_frames_seen"]
        # 60 frames (2 s of camera) go through the consumer while the answer generates.
        await wait_for(lambda: _frames_seen_beyond(client, seen + 60), 30, "60 more frames processed")
        assert await running(server) == 1, "the answer must be generating during the measured window"
        # Off the loop: the client's own sender must keep streaming meanwhile.
        await asyncio.to_thread(job.result, 120)
        answer_ms = (time.monotonic() - asked) * 1000
        recent = (await client.stats())["media"]
        # lag_ms_* cover the last 600 processed frames, i.e. the answer's
        # window. Frames that queued behind the answer would lag by a good
        # part of it; a loaded machine slows both alike, so the bound is
        # relative to the answer (with a floor), not a wall-clock figure.
        assert recent["lag_ms_p95"] < max(1000.0, answer_ms / 4), (recent, answer_ms)
        assert recent["video_frames_seen"] > 60
    finally:
        await client.close()


async def test_close_ends_the_peer_and_frees_the_session(server):
    client = RtcClient(server.url, SyntheticVideo())
    await client.connect()
    await wait_for(lambda: _enough(client, frames=3), timeout=20)
    health = lambda: server.get_json("/api/health")["sessions"]  # noqa: E731
    before = await asyncio.to_thread(health)
    await client.close(tell_server=True)
    assert await asyncio.to_thread(health) == before - 1
    stats = await asyncio.to_thread(server.get_json, f"/webrtc/stats?session_id={client.session_id}")
    assert "detail" in stats


async def test_dropped_connection_is_noticed_and_session_freed(server):
    """A client that vanishes without saying goodbye (killed tab)."""
    client = RtcClient(server.url, SyntheticVideo())
    sid = await client.connect()
    await wait_for(lambda: _enough(client, frames=3), timeout=20)
    await client.close(tell_server=False)

    async def gone():
        return "detail" in await asyncio.to_thread(server.get_json, f"/webrtc/stats?session_id={sid}")

    # The server's peer sees the DTLS close at once, or the media stop
    # within --session-idle-timeout (conftest.SESSION_IDLE_TIMEOUT).
    await wait_for(gone, SESSION_IDLE_TIMEOUT + 10, "the server ended the vanished client's session")


async def test_a_stop_heard_after_its_tab_stopped_reading_still_ends_the_session(server):
    """The page's Stop pauses the session, which then ends when its tab's chat
    stream goes. A browser shut as Stop was clicked closes that stream before
    the server hears the Stop: the session must still end after the reload
    grace, not wait paused for ever (a clean run found one left until the
    server stopped). Here no chat stream was ever open when the Stop comes."""
    from vidchat.doors.webrtc_routes import RELOAD_GRACE_S

    client = RtcClient(server.url, SyntheticVideo())
    sid = await client.connect()
    await wait_for(lambda: _enough(client, frames=3), timeout=20)
    paused = await asyncio.to_thread(server.post_json, "/webrtc/close", {"session_id": sid, "pause": True})
    assert paused == {"closed": False, "paused": True}
    await client.close(tell_server=False)

    async def gone():
        return "detail" in await asyncio.to_thread(server.get_json, f"/webrtc/stats?session_id={sid}")

    await wait_for(gone, RELOAD_GRACE_S + 10, "the stopped session whose tab reads nothing ends")
    assert f"session {sid[:6]}… the tab went away" in server.log()


async def test_bad_offer_is_refused_with_a_message(server):
    import json
    import urllib.request

    req = urllib.request.Request(server.url + "/webrtc/offer", b'{"type": "offer", "sdp": "garbage"}',
                                 {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 400
    assert "offer" in json.loads(err.value.read())["detail"]


async def test_a_new_question_cancels_the_one_still_answering(server):
    client = RtcClient(server.url, SyntheticVideo())
    await client.connect()
    try:
        await wait_for(lambda: _enough(client, frames=10), timeout=20)
        gradio = Client(server.url + "/", verbose=False)
        # Greedy: the tiny model's zeroed end tokens then never end it early
        # (sampled, it may pick one within a few tokens).
        first = submit(server, client.session_id, "Talk at length.", k=4, max_tokens=2000, temperature=0.0,
                       gradio=gradio)
        await wait_for(lambda: asyncio.to_thread(server.running_requests), 20, "the first answer generates")
        second = await asyncio.to_thread(ask, server, client.session_id, "Short one?", k=4, max_tokens=8,
                                         gradio=gradio)
        assert second[2]["completion_tokens"] == 8 and not second[2]["cancelled"]
        # 2000 tokens take far longer than the short answer: nothing still
        # generating means the first answer was aborted, not left running.
        assert await asyncio.to_thread(server.running_requests) == 0
        await asyncio.to_thread(first.result, 60)
    finally:
        await client.close()


async def test_closing_the_tab_mid_answer_aborts_the_generation(server):
    client = RtcClient(server.url, SyntheticVideo())
    await client.connect()
    await wait_for(lambda: _enough(client, frames=5), timeout=20)
    job = submit(server, client.session_id, "Talk at length.", k=4, max_tokens=2000, temperature=0.0)
    await wait_for(lambda: asyncio.to_thread(server.running_requests), 20, "the answer generates")
    await client.close(tell_server=True)  # what the page's Stop / pagehide beacon does
    # 5 s: far less than 2000 tokens take, and room for a loaded machine's event loop.
    assert await until_idle(server, within=5.0) == 0
    await asyncio.to_thread(job.result, 60)


# ---- a dropped network is not a lost session ----------------------------------

async def test_a_dropped_connection_reattaches_to_its_session_with_the_token(server):
    client = RtcClient(server.url, SyntheticVideo(fps=15), SyntheticAudio())
    sid = await client.connect()
    token = client.resume_token
    await wait_for(lambda: _enough(client, frames=15, audio_s=0.5), timeout=20)
    before = await client.stats()
    # No /webrtc/close: the network went away. The tab comes back at once,
    # whether or not the server has noticed the old peer go yet.
    await client.drop()
    # Someone without the token cannot take the session over: they get a new one.
    thief = RtcClient(server.url, SyntheticVideo(fps=5))
    thief.session_id, thief.resume_token = sid, "not-the-token"
    await thief.reconnect()
    assert thief.session_id != sid and thief.resumed is False
    await thief.close()
    # The tab comes back with its token: same session, same buffer, media flows again.
    await client.reconnect(SyntheticVideo(fps=15), SyntheticAudio())
    assert client.session_id == sid and client.resumed is True and client.resume_token == token
    after = await wait_for(lambda: _enough(client, frames=before["frames_received"] + 10), timeout=20)
    assert before["away"] is False and after["away"] is False
    assert after["frames_in_buffer"] >= before["frames_in_buffer"]
    assert after["frames_kept"] > before["frames_kept"]
    history, _, details = await asyncio.to_thread(ask, server, sid, "Still there?", k=8, max_tokens=2)
    assert details["frames"] == 8 and details["frame_indices"][0] == 0  # the old frames are still in the ring
    # The tab goes away as a reload does (the page's pagehide beacon): the
    # session waits for it, away, and gets no warm-ups meanwhile; back, it is not.
    gone = await asyncio.to_thread(server.post_json, "/webrtc/close", {"session_id": sid, "reload_grace": True})
    assert gone["closed"] is False and (await client.stats())["away"] is True
    await client.reconnect(SyntheticVideo(fps=15), SyntheticAudio())
    assert client.resumed is True
    await wait_for(lambda: _back(client), timeout=20, what="the resumed peer connects")
    await client.close()


# ---- the page's /ask API: checked options, one answer per session ------------

async def test_bad_values_through_the_ask_api_get_a_clear_notice(server):
    # (Sliders are bounded by Gradio itself before the event runs; these
    # fields are free-form, so the answer path's own checks speak.)
    client = RtcClient(server.url, SyntheticVideo())
    await client.connect()
    try:
        await wait_for(lambda: _enough(client, frames=3), timeout=20)
        for kw, fragment in [
            (dict(seed=str(2**64)), "Seed must be a whole number that fits a signed 64-bit integer"),
            (dict(seed="soon"), "Seed must be a whole number"),
            (dict(seed="1e400"), "Seed must be a whole number"),
        ]:
            history, _, _ = await asyncio.to_thread(ask, server, client.session_id, "Hi?", **kw)
            last = history[-1]
            assert last["role"] == "assistant" and (last.get("metadata") or {}).get("log") == "vidchat notice"
            text = last["content"] if isinstance(last["content"], str) else str(last["content"])
            assert "Settings not accepted" in text and fragment in text and "Traceback" not in text, text
        # A valid seed in range works, and the same seed gives the same reply.
        replies = [await asyncio.to_thread(ask, server, client.session_id, "Hi?", seed=str(2**63 - 1),
                                           temperature=1.0, max_tokens=6) for _ in range(2)]
        assert replies[0][2]["seed"] == 2**63 - 1 and replies[0][2]["completion_tokens"] == 6
    finally:
        await client.close()


async def test_concurrent_ask_calls_never_generate_twice(server):
    client = RtcClient(server.url, SyntheticVideo())
    await client.connect()
    try:
        await wait_for(lambda: _enough(client, frames=10), timeout=20)
        gradio = Client(server.url + "/", verbose=False)
        # Greedy decoding of the random model runs on without an end token,
        # so no answer can finish before the next question arrives.
        jobs = [submit(server, client.session_id, f"Q{i}", k=4, max_tokens=400, temperature=0.0, gradio=gradio)
                for i in range(3)]
        peak = 0

        async def all_done() -> bool:  # watching the engine all along
            nonlocal peak
            peak = max(peak, await running(server))
            return all(job.done() for job in jobs)

        await wait_for(all_done, 120, "the three questions are answered or replaced")
        results = [await asyncio.to_thread(job.result, 120) for job in jobs]
        assert peak == 1, peak
        finished = [r[2] for r in results if isinstance(r[2], dict) and r[2].get("cancelled") is False]
        assert len(finished) == 1 and finished[0]["completion_tokens"] > 0
        assert await until_idle(server) == 0
    finally:
        await client.close()


async def _first_answer(server, client, gradio) -> str:
    """Ask once through the page's API (8 frames); the answer's id."""
    await wait_for(lambda: _enough(client, frames=10), timeout=20)
    history = (await asyncio.to_thread(
        lambda: submit(server, client.session_id, "What moves?", k=8, max_tokens=6, gradio=gradio).result(120)))[0]
    panel = history[-1]
    assert panel["metadata"]["title"].startswith("What the model got: 8 frames")
    return panel["metadata"]["id"]


def _reask(gradio, sid: str, answer_id: str, k: int, temperature: float) -> str:
    """The page's re-ask of ``answer_id`` with k frames: the comparison's HTML."""
    return gradio.predict(sid, answer_id, k, "uniform", 10, True, 0.95, 64, "images", True, 6, temperature, "7",
                          api_name="/reask")


async def test_reask_uses_the_exact_inputs_and_shows_both_answers(server):
    client = RtcClient(server.url, SyntheticVideo())
    await client.connect()
    try:
        gradio = Client(server.url + "/", verbose=False)
        answer_id = await _first_answer(server, client, gradio)
        record = await asyncio.to_thread(server.get_json, f"/inputs/{answer_id}/record.json")

        def reask(k, temperature):
            return _reask(gradio, client.session_id, answer_id, k, temperature)

        # New frames arrive meanwhile: a re-ask must not use them.
        received = (await client.stats())["frames_received"]
        await wait_for(lambda: _enough(client, frames=received + 10), 20, "10 newer frames received")
        same = await asyncio.to_thread(reask, 8, 0.0)
        assert "Same inputs (inputs_sha256 matches)" in same and same.count("class='vc-compare-col'") == 2
        assert same.count(record["inputs_sha256"][:16]) == 2  # both columns name the original's inputs
        fewer = await asyncio.to_thread(reask, 4, 0.5)
        assert "Different inputs" in fewer and "4 as images" in fewer and "8 as images" in fewer
        assert await until_idle(server, within=2.0) == 0
    finally:
        await client.close()


async def test_a_reask_while_the_chat_answers_leaves_the_chat_answer_running(server):
    client = RtcClient(server.url, SyntheticVideo())
    await client.connect()
    try:
        gradio = Client(server.url + "/", verbose=False)
        answer_id = await _first_answer(server, client, gradio)
        # The tiny model never ends early: the chat's answer runs its 600 tokens
        # unless something cancels it.
        chatting = submit(server, client.session_id, "Talk at length.", k=8, max_tokens=600, gradio=gradio)
        await until_running(server, 1, 30, "the chat's answer generates")
        again = await asyncio.to_thread(_reask, gradio, client.session_id, answer_id, 8, 0.0)
        assert "Same inputs (inputs_sha256 matches)" in again and again.count("class='vc-compare-col'") == 2
        _, _, stats = await asyncio.to_thread(chatting.result, 180)
        assert stats["cancelled"] is False and stats["completion_tokens"] == 600, stats
        assert await until_idle(server) == 0
    finally:
        await client.close()


# A hundred answers through the page's API. One frame and 8-token answers
# keep each turn quick; the questions are long instead, so the whole chat
# still outgrows the context after about 50 turns and the last half of the
# questions are trimmed.
LONG_QUESTION = ("what do you see now, which colours and shapes are in the picture, where are they, "
                 "and what has moved since the question before this one?")
ANSWER_TOKENS = 8


@pytest.mark.timeout(600)
async def test_a_hundred_questions_in_one_chat_all_answer_within_the_context(server):
    """The chat the model gets is the conversation's own (the /ask API's
    history is only the caller's picture of it, echoed back, so none is sent
    here: a hundred exchanges of it would pass the page API's body bound);
    once it outgrows --max-model-len (4096 tokens here) the oldest turns are
    left out, and the record says how many went. No question fails for length."""
    client = RtcClient(server.url, SyntheticVideo())
    await client.connect()
    try:
        await wait_for(lambda: _enough(client, frames=10), timeout=20)
        gradio = Client(server.url + "/", verbose=False)
        records = []
        for i in range(100):
            history, _, stats = await asyncio.to_thread(
                lambda: submit(server, client.session_id, f"Question {i}: {LONG_QUESTION}", k=1, max_tokens=ANSWER_TOKENS,
                               temperature=1.0, gradio=gradio).result(120))
            # Sampled, not greedy: greedy decoding of the random model drifts
            # into tokens that decode to no text, and an empty answer is not
            # a turn of the chat, which then stops growing.
            assert isinstance(stats, dict) and stats.get("completion_tokens", 0) >= 1, (i, history[-1])
            records.append(stats)
        sent = [(r["history_turns"], r["history_turns_total"]) for r in records]
        assert sent[0] == (0, 0) and all(n <= total for n, total in sent)
        trimmed = [i for i, (n, total) in enumerate(sent) if n < total]
        assert trimmed and trimmed == list(range(trimmed[0], 100)), (sent[-3:], [r["prompt_tokens"] for r in records][-3:])  # once full, the oldest always go
        assert all(n % 2 == 0 for n, _ in sent)  # whole question-and-answer pairs
        # The kept turns are cut a step at a time (vidchat.engine.prompts):
        # between two cuts they are the prompt's unchanged prefix, served
        # from vLLM's cache; only a question that moves the cut prefills it.
        full = records[trimmed[0]:]
        cut_moved = sum(a["history_turns_total"] - a["history_turns"] != b["history_turns_total"] - b["history_turns"]
                        for a, b in zip(full, full[1:]))
        mostly_cached = [r["cached_tokens"] >= r["prompt_tokens"] // 2 for r in full]
        print(f"the oldest turns were left out from question {trimmed[0]} on; the cut moved {cut_moved} times "
              f"in {len(full)} questions, {sum(mostly_cached)} of them served mostly from the cache")
        assert cut_moved * 3 < len(full), cut_moved
        assert sum(mostly_cached) >= len(full) // 2, [(r["cached_tokens"], r["prompt_tokens"]) for r in full]
        assert max(r["prompt_tokens"] for r in records) + ANSWER_TOKENS <= 4096
    finally:
        await client.close()


def _cuts(width=320, height=240, fps=10.0, every_s=2.0, still=False):
    """A camera whose whole picture changes every `every_s` seconds (scene cuts), or never."""
    colours = [(200, 40, 40), (40, 60, 200), (40, 180, 60), (230, 230, 230)]

    def frame(i: int) -> np.ndarray:
        img = np.empty((height, width, 3), np.uint8)
        img[:] = colours[0 if still else int(i / fps / every_s) % len(colours)]
        return img

    return SyntheticVideo(width, height, fps, make_frame=frame)


def _watch_job(gradio, sid, every_s):
    return gradio.submit(True, "What changed?", every_s, [], sid, 4, "uniform", 10, True, 0.95, 64, "images", True,
                         4, 0.0, "", api_name="/watch")


def _watch_answers(job) -> tuple[int, int]:
    """(scene-change notices, model answers) in the newest chat the watch event sent."""
    outputs = job.outputs()
    if not outputs:
        return 0, 0
    history = outputs[-1][0]
    notices = sum("Scene changed" in str(m.get("content")) for m in history)
    answers = sum(1 for m in history if m["role"] == "assistant" and not (m.get("metadata") or {}).get("log")
                  and not (m.get("metadata") or {}).get("title"))
    return notices, answers


def _questions_asked(server) -> int:
    return server.get_json("/api/health")["questions_asked"]


async def test_watch_switched_off_or_stopped_asks_nothing_more(server):
    """Off (the /watch event with on false, as the page's switch sends it) and
    Stop each end a running watch at once: later scene changes ask nothing."""
    cutting = RtcClient(server.url, _cuts(every_s=1.0))
    await cutting.connect()
    try:
        gradio = Client(server.url + "/", verbose=False)
        sid = cutting.session_id
        for switch_off in ("off", "stop"):
            job = _watch_job(gradio, sid, 1)
            await wait_for(lambda: _watch_answers(job)[1] >= 1, 60, "a scene change asked about and answered")
            if switch_off == "off":
                await asyncio.to_thread(
                    gradio.predict, False, "What changed?", 1, [], sid, 4, "uniform", 10, True, 0.95, 64, "images",
                    True, 4, 0.0, "", api_name="/watch")
            else:
                assert await asyncio.to_thread(gradio.predict, sid, api_name="/stop") is False  # the box unticks
            await wait_for(lambda: job.done(), 30, f"the watch event ends once switched {switch_off}")
            assert (await cutting.stats())["watching"] is False
            # A question already under way when the switch came is counted
            # by the next scene change, a second or more away.
            changes = (await cutting.stats())["scene_changes"]
            await wait_for(lambda: _more_scene_changes(cutting, changes + 1), 30, "a scene change")
            asked, changes = await asyncio.to_thread(_questions_asked, server), (await cutting.stats())["scene_changes"]
            await wait_for(lambda: _more_scene_changes(cutting, changes + 3), 30, "three more scene changes")
            assert await asyncio.to_thread(_questions_asked, server) == asked, f"watch asked after {switch_off}"
            assert await until_idle(server, within=5.0) == 0
    finally:
        await cutting.close()


async def _more_scene_changes(client, n: int) -> bool:
    return (await client.stats())["scene_changes"] >= n


async def test_watch_mode_asks_on_scene_changes_and_not_on_a_still_scene(server):
    cutting, still = RtcClient(server.url, _cuts()), RtcClient(server.url, _cuts(still=True))
    await cutting.connect()
    await still.connect()
    try:
        gradio = Client(server.url + "/", verbose=False)
        started = time.monotonic()
        jobs = [_watch_job(gradio, cutting.session_id, 2), _watch_job(gradio, still.session_id, 2)]

        def two_cuts_answered():
            notices, answers = _watch_answers(jobs[0])
            return notices >= 2 and answers >= 2

        await wait_for(lambda: two_cuts_answered(), 30, "two scene changes asked about and answered")
        elapsed = time.monotonic() - started
        (cut_notices, cut_answers), (still_notices, still_answers) = map(_watch_answers, jobs)
        assert cut_notices >= 2 and cut_answers >= 2, (cut_notices, cut_answers)
        assert cut_notices <= elapsed / 2 + 1, (cut_notices, elapsed)  # at most one per 2 s
        # The still camera streamed as long, and no question came of it.
        assert still_notices == 0 and still_answers == 0
        stats = await cutting.stats()
        assert stats["scene_changes"] >= cut_notices
        for job in jobs:
            job.cancel()
        assert await until_idle(server, within=5.0) == 0
    finally:
        await cutting.close()
        await still.close()
