"""The engine adapter against real vLLM on the tiny models."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from conftest import TEST_MAX_IMAGES, eventually_async

from vidchat.engine import EngineError, Turn
from vidchat.engine.local import LocalEngine
from vidchat.media import AUDIO_RATE

pytestmark = pytest.mark.engine


def frames(n: int, h: int = 480, w: int = 640, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    base = np.linspace(0, 255, w, dtype=np.float32)[None, :, None].repeat(h, 0).repeat(3, 2)
    return [np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8) for _ in range(n)]


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * AUDIO_RATE)) / AUDIO_RATE
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


async def collect(reply) -> list[str]:
    return [delta async for delta in reply]


CASES = {
    "text": dict(),
    "1 image": dict(frames=frames(1)),
    "8 images": dict(frames=frames(8)),
    "video": dict(frames=frames(8), frames_as="video"),
    "audio": dict(audio=tone(2.0)),
    "audio + frames": dict(frames=frames(4), audio=tone(3.0)),
}


def test_the_engine_core_is_started_with_onednns_primitive_cache_bounded(omni_engine: LocalEngine):
    """oneDNN keeps 1,024 matmul primitives by default, and on live video
    (each prompt a new length) the engine core grew for hours filling them
    (the soak, docs/operations.md). vLLM spawns its engine core with this
    process's environment, so the bound must be in it once the engine runs."""
    import os

    from vidchat.engine.native_heap import ONEDNN_PRIMITIVE_CACHE_CAPACITY

    assert not omni_engine.closed
    assert os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY") == ONEDNN_PRIMITIVE_CACHE_CAPACITY


async def test_the_engine_core_gives_its_free_native_memory_back(omni_engine: LocalEngine):
    """vLLM runs vidchat's worker extension inside the engine core: the trim
    answers from that process, not this one (vidchat.engine.local)."""
    import os

    import psutil

    replies = await omni_engine.trim_heap()
    children = {p.pid for p in psutil.Process(os.getpid()).children(recursive=True)}
    assert len(replies) == 1 and replies[0]["pid"] in children, (replies, children)
    assert isinstance(replies[0]["trimmed"], bool)


@pytest.mark.parametrize("case", CASES)
async def test_streams_deltas_that_join_to_the_text(omni_engine: LocalEngine, case: str):
    kw = CASES[case]
    reply = omni_engine.ask("What do you see and hear?", max_tokens=24, temperature=0.0, ignore_eos=True, **kw)
    deltas = await collect(reply)
    assert len(deltas) >= 2, "the reply must stream in several deltas"
    assert all(isinstance(d, str) and d for d in deltas)
    assert "".join(deltas) == reply.text
    s = reply.stats
    assert s.completion_tokens == 24
    assert s.frames == len(kw.get("frames", []))
    assert s.audio_seconds == pytest.approx(len(kw.get("audio", [])) / AUDIO_RATE)
    assert s.prompt_tokens > 10
    assert s.ttft_s is not None and 0 < s.ttft_s < s.total_s
    assert s.tokens_per_s and s.tokens_per_s > 0
    assert not s.cancelled and s.finish_reason == "length"
    assert omni_engine.running_requests == 0


async def test_more_frames_cost_more_prompt_tokens(omni_engine: LocalEngine):
    counts = []
    for n in (1, 2, 4):
        reply = omni_engine.ask("Describe.", frames=frames(n), max_tokens=1)
        await collect(reply)
        counts.append(reply.stats.prompt_tokens)
    per_frame = counts[1] - counts[0]
    assert per_frame > 20
    assert counts[2] - counts[1] == 2 * per_frame


@pytest.mark.parametrize("case", ["1 image", "8 images", "video", "audio + frames"])
async def test_prompt_tokens_match_the_transformers_processor(omni_engine: LocalEngine, tiny_omni_path, case: str):
    kw = CASES[case]
    fr, audio, as_ = kw.get("frames", []), kw.get("audio"), kw.get("frames_as", "images")
    reply = omni_engine.ask("How many people?", max_tokens=1, system_prompt="Be brief.", **kw)
    await collect(reply)

    from transformers import AutoProcessor  # here, not at the top: its import is most of collecting the suite

    processor = AutoProcessor.from_pretrained(tiny_omni_path)
    prompt = omni_engine.build_prompt(
        "How many people?", n_frames=len(fr), frames_as=as_, with_audio=audio is not None, system_prompt="Be brief."
    )
    inputs = {"text": [prompt], "return_tensors": "np", **omni_engine.processor_kwargs}
    if fr:
        inputs["videos" if as_ == "video" else "images"] = [np.stack(fr)] if as_ == "video" else fr
    if audio is not None:
        inputs["audio"] = [audio]
    expected = processor(**inputs)["input_ids"].shape[1]
    assert reply.stats.prompt_tokens == expected


async def test_history_is_part_of_the_prompt(omni_engine: LocalEngine):
    history = [Turn("user", "What colour is the cup?"), Turn("assistant", "It is red.")]
    prompt = omni_engine.build_prompt("And the table?", n_frames=2, history=history)
    assert prompt.index("What colour is the cup?") < prompt.index("It is red.") < prompt.index("And the table?")
    assert prompt.count("<|IMAGE|>") == 2
    a = omni_engine.ask("And the table?", frames=frames(2), max_tokens=1)
    b = omni_engine.ask("And the table?", frames=frames(2), history=history, max_tokens=1)
    await collect(a), await collect(b)
    assert b.stats.prompt_tokens > a.stats.prompt_tokens


async def test_cancel_mid_stream_aborts_the_request(omni_engine: LocalEngine):
    reply = omni_engine.ask("Talk.", frames=frames(2), max_tokens=2000, ignore_eos=True)
    got = 0
    async for _ in reply:
        got += 1
        if got == 3:
            assert omni_engine.running_requests == 1
            break
    await reply.aclose()
    await eventually_async(lambda: omni_engine.running_requests == 0, 1.0, "the cancelled request left vLLM")
    assert reply.stats.cancelled and reply.stats.completion_tokens < 2000


async def test_cancelling_the_consumer_task_aborts_the_request(omni_engine: LocalEngine):
    reply = omni_engine.ask("Talk.", max_tokens=2000, ignore_eos=True)
    first = asyncio.Event()

    async def consume():
        async for _ in reply:
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually_async(lambda: omni_engine.running_requests == 0, 1.0, "the cancelled request left vLLM")


async def test_three_concurrent_questions_all_complete(omni_engine: LocalEngine):
    replies = [
        omni_engine.ask(f"Question {i}?", frames=frames(2, seed=i), max_tokens=16, ignore_eos=True) for i in range(3)
    ]
    results = await asyncio.gather(*(collect(r) for r in replies))
    assert [r.stats.completion_tokens for r in replies] == [16, 16, 16]
    assert all("".join(d) == r.text for d, r in zip(results, replies))
    assert len({r.request_id for r in replies}) == 3
    assert omni_engine.running_requests == 0


async def test_too_many_images_is_a_clear_error_and_engine_keeps_serving(omni_engine: LocalEngine):
    with pytest.raises(EngineError, match=rf"at most {TEST_MAX_IMAGES} images.*--max-images"):
        omni_engine.ask("Hi?", frames=frames(TEST_MAX_IMAGES + 1, h=64, w=64))
    reply = omni_engine.ask("Hi?", frames=frames(1), max_tokens=4, ignore_eos=True)
    assert len(await collect(reply)) >= 1


async def test_over_long_context_is_a_clear_error_and_engine_keeps_serving(omni_engine: LocalEngine):
    long_question = "describe the room " * 3000
    reply = omni_engine.ask(long_question, max_tokens=4)
    with pytest.raises(EngineError, match=r"too long for the model \(limit 4096 tokens\).*--max-model-len"):
        await collect(reply)
    assert omni_engine.running_requests == 0
    reply = omni_engine.ask("Hi?", frames=frames(1), max_tokens=4, ignore_eos=True)
    assert len(await collect(reply)) >= 1


async def test_empty_question_is_refused(omni_engine: LocalEngine):
    with pytest.raises(EngineError, match="empty"):
        omni_engine.ask("   ")


async def test_vision_only_model_answers_images_and_video_and_ignores_audio(vl_engine):
    engine = vl_engine
    assert not engine.accepts_audio and engine.accepts_video
    for kw in (dict(frames=frames(3)), dict(frames=frames(4), frames_as="video")):
        reply = engine.ask("What is it?", audio=tone(1.0), max_tokens=8, ignore_eos=True, **kw)
        deltas = await collect(reply)
        assert "".join(deltas) == reply.text and reply.stats.completion_tokens == 8
        assert reply.stats.audio_seconds == 0.0


async def test_a_sliver_of_audio_is_dropped_not_fatal(omni_engine: LocalEngine):
    reply = omni_engine.ask("Hi?", frames=frames(1), audio=tone(0.0065), max_tokens=4, ignore_eos=True)
    assert len(await collect(reply)) >= 1
    assert reply.stats.audio_seconds == 0.0


async def test_cancel_from_another_task_ends_the_stream(omni_engine: LocalEngine):
    """The page's Stop button and a newer question cancel from a different task."""
    reply = omni_engine.ask("Talk.", max_tokens=2000, ignore_eos=True)
    got = []

    async def consume():
        async for d in reply:
            got.append(d)
            if len(got) == 3:
                asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(reply.aclose()))

    await asyncio.wait_for(consume(), 30)
    assert reply.stats.cancelled and reply.stats.completion_tokens < 2000
    assert omni_engine.running_requests == 0


async def test_a_greedy_reply_of_the_tiny_model_runs_to_max_tokens(omni_engine: LocalEngine):
    """Through real vLLM, without ignore_eos: the tiny model's end tokens can
    never win (tinymodel._never_stop_on_its_own), so long-answer tests get one."""
    reply = omni_engine.ask("Talk for a long time.", frames=frames(1), max_tokens=800, temperature=0.0)
    await collect(reply)
    assert reply.stats.completion_tokens == 800 and reply.stats.finish_reason == "length"
