"""--engine-url: vidchat in front of a real `vllm serve` of the tiny model
(the suite's shared one, conftest's tiny_vllm_serve). Same protocol and stats as in-process; a cancelled or
abandoned answer is aborted on the remote server."""

from __future__ import annotations

import asyncio
import re
import urllib.request

import pytest
from conftest import eventually_async, start_server, stop_server, tiny_options
from test_engine import collect, frames
from test_protocol import LONG, SHORT, answer, check_answer, connect, send, until
from test_protocol import frames as send_frames
from test_webrtc import _enough, submit, wait_for

from vidchat.devtools.rtc_client import RtcClient, SyntheticVideo
from vidchat.engine.remote import RemoteEngine

pytestmark = pytest.mark.engine


def remote_running(url: str) -> float:
    """Requests the remote vLLM server is generating (its Prometheus metrics)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.findall(r"^vllm:num_requests_running\{[^}]*\} ([\d.e+-]+)$", text, re.M)
    return sum(float(v) for v in found)


async def until_remote_idle(url: str, within: float = 3.0) -> None:
    await eventually_async(lambda: asyncio.to_thread(lambda: remote_running(url) == 0), within,
                           "the remote request is aborted")


async def test_the_remote_engine_answers_with_the_same_stats_and_cache_hits(tiny_vllm_serve, tiny_omni_path):
    engine = await asyncio.to_thread(RemoteEngine.start, tiny_options(tiny_omni_path), tiny_vllm_serve)
    try:
        assert engine.served_model == str(tiny_omni_path) and engine.accepts_audio
        shown = frames(4, seed=5)
        first = engine.ask("What do you see?", frames=shown, max_tokens=12, temperature=0.0, cache_salt="s1",
                           frame_ids=["1", "2", "3", "4"])
        deltas = await collect(first)
        assert "".join(deltas) == first.text and len(deltas) >= 2
        s = first.stats
        assert s.completion_tokens == 12 and s.finish_reason == "length" and s.frames == 4
        assert s.prompt_tokens > 4 * 40 and s.ttft_s is not None and len(s.inputs_sha256) == 64
        again = engine.ask("And now?", frames=shown, max_tokens=4, temperature=0.0, cache_salt="s1",
                           frame_ids=["1", "2", "3", "4"])
        await collect(again)
        assert again.stats.cached_tokens >= 128  # the same frames, the same salt: a prefix-cache hit
        other = engine.ask("And now?", frames=shown, max_tokens=4, temperature=0.0, cache_salt="s2",
                           frame_ids=["1", "2", "3", "4"])
        await collect(other)
        assert other.stats.cached_tokens == 0  # another session's salt
        with pytest.raises(Exception, match="as images"):
            engine.prepare("?", shown, frames_as="video")
        # Cancelling mid-answer aborts the remote request.
        long = engine.ask("Talk.", frames=shown[:1], max_tokens=3000, temperature=0.0)
        async for _ in long:
            break
        assert engine.running_requests == 1 and await asyncio.to_thread(remote_running, tiny_vllm_serve) == 1
        await long.aclose()
        assert long.stats.cancelled and engine.running_requests == 0
        await until_remote_idle(tiny_vllm_serve)
    finally:
        engine.shutdown()


async def test_vidchat_in_front_of_a_remote_server_over_the_protocol(tiny_vllm_serve, tiny_omni_path, artifacts_dir):
    srv = await asyncio.to_thread(start_server, ["--model", "tiny", "--engine-url", tiny_vllm_serve,
                                                 "--ws-idle-timeout", "4", "--ws-config-timeout", "2"],
                                  artifacts_dir / "server-remote.log")
    try:
        health = srv.get_json("/api/health")
        assert health["ok"] and health["model"] == str(tiny_omni_path)
        ws = await connect(srv, **SHORT)
        await send_frames(ws, n=3)
        done = check_answer(await answer(ws))
        assert done["stats"]["frames"] == 3 and done["stats"]["completion_tokens"] == SHORT["max_tokens"]
        # A new question replaces a running one: the old one is aborted remotely.
        await send(ws, {"type": "session.update", "max_tokens": LONG["max_tokens"]})
        await send(ws, {"type": "video.query", "text": "Talk for a long time."})
        await until(ws, "response.text.delta")
        await send(ws, {"type": "session.update", "max_tokens": 3})
        await send(ws, {"type": "video.query", "text": "Short now."})
        msgs = await until(ws, "response.start")
        cancelled = [m for m in msgs if m["type"] == "response.text.done"]
        assert cancelled and cancelled[0]["stats"]["cancelled"] is True
        await until(ws, "response.text.done")
        # A client that drops mid-answer: the remote generation stops.
        await send(ws, {"type": "session.update", "max_tokens": LONG["max_tokens"]})
        await send(ws, {"type": "video.query", "text": "Talk again."})
        await until(ws, "response.text.delta")
        assert await asyncio.to_thread(remote_running, tiny_vllm_serve) == 1
        ws.transport.abort()
        await until_remote_idle(tiny_vllm_serve)
        # The page's door: a WebRTC session asks through the chat and gets the same QA record.
        client = RtcClient(srv.url, SyntheticVideo())
        await client.connect()
        try:
            await wait_for(lambda: _enough(client, frames=6), timeout=20)
            history = (await asyncio.to_thread(
                lambda: submit(srv, client.session_id, "What moves?", k=4, max_tokens=5).result(120)))[0]
            answer_id = history[-1]["metadata"]["id"]
            record = await asyncio.to_thread(srv.get_json, f"/inputs/{answer_id}/record.json")
            assert len(record["frame_indices"]) == 4 and len(record["inputs_sha256"]) == 64
            assert record["prompt"].count("<image>") == 4 and "What moves?" in record["prompt"]
            assert record["model"] == str(tiny_omni_path) and record["completion_tokens"] == 5
        finally:
            await client.close()
    finally:
        await asyncio.to_thread(stop_server, srv)
