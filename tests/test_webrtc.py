"""The WebRTC door with a real aiortc client (no browser) against the app
served by uvicorn with real vLLM: media arrives in its own session, the chat
endpoint answers from that session's frames, peers end cleanly."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from gradio_client import Client

from vidchat.rtc_client import RtcClient, SyntheticAudio, SyntheticVideo

from conftest import thumbnail_colours, until_idle

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


async def wait_for(predicate, timeout: float, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError("condition not met in time")


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
        job = submit(server, client.session_id, "Talk at length.", k=16, max_tokens=1500, temperature=1.0)
        running = []
        for _ in range(15):
            await asyncio.sleep(0.2)
            running.append(await asyncio.to_thread(server.running_requests))
        assert max(running) == 1, "the answer must be generating during the measured window"
        # Off the loop: the client's own sender must keep streaming meanwhile.
        await asyncio.to_thread(job.result, 120)
        recent = (await client.stats())["media"]
        # lag_ms_* cover the last 600 processed frames, i.e. the answer's window.
        assert recent["lag_ms_p95"] < 500, recent
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
    # within --session-idle-timeout (8 s in the test server).
    await wait_for(gone, timeout=15, interval=0.5)


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
        first = submit(server, client.session_id, "Talk at length.", k=4, max_tokens=2000, temperature=1.0,
                       gradio=gradio)
        await wait_for(lambda: asyncio.to_thread(server.running_requests), timeout=20, interval=0.1)
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
    job = submit(server, client.session_id, "Talk at length.", k=4, max_tokens=2000, temperature=1.0)
    await wait_for(lambda: asyncio.to_thread(server.running_requests), timeout=20, interval=0.1)
    await client.close(tell_server=True)  # what the page's Stop / pagehide beacon does
    assert await until_idle(server, within=1.0) == 0
    await asyncio.to_thread(job.result, 60)
