"""vLLM's encoder cache, through real vLLM on the tiny model: sized to hold a
sample per session, and a window slid by one frame encodes only that frame.

The count of images vLLM encodes comes from its model runner (in the engine's
own process): a function sent with ``collective_rpc`` wraps the runner's
batching of encoder inputs. Sending functions needs vLLM's pickle transport,
so these tests start their own engine with it allowed; the app never does."""

from __future__ import annotations

import logging

import pytest
from conftest import tiny_options
from test_engine import collect, frames

from vidchat.engine import tokens_per_frame
from vidchat.engine.local import ENCODER_CACHE_FLOOR_TOKENS, ENCODER_CACHE_MAX_TOKENS, LocalEngine, encoder_cache_budget
from vidchat.media.session import Session, SessionSettings

SESSIONS, PER_QUESTION = 8, 16


def _count_encoded(worker) -> int:
    """Runs inside vLLM's worker: images encoded so far (installs the counter once)."""
    runner = worker.model_runner
    if not hasattr(runner, "vidchat_encoded"):
        runner.vidchat_encoded = 0
        batch = runner._batch_mm_inputs_from_scheduler

        def counting(scheduler_output):
            hashes, kwargs, refs = batch(scheduler_output)
            runner.vidchat_encoded += len(hashes)
            return hashes, kwargs, refs

        runner._batch_mm_inputs_from_scheduler = counting
    return runner.vidchat_encoded


@pytest.fixture(scope="module")
def engine(tiny_omni_path):
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    started = LocalEngine.start(tiny_options(tiny_omni_path, encoder_cache_frames=SESSIONS * PER_QUESTION))
    yield started
    started.shutdown()
    mp.undo()


async def encoded(engine: LocalEngine) -> int:
    (count,) = await engine._llm.collective_rpc(_count_encoded)
    return count


async def ask(engine: LocalEngine, shown, salt: str, ids=None) -> None:
    """A question as a session asks it: its salt, its frames named by their kept numbers."""
    reply = engine.ask("What changed?", frames=shown, max_tokens=1, temperature=0.0, cache_salt=salt,
                       frame_ids=ids)
    await collect(reply)


def numbered(first: int, count: int) -> list[str]:
    return [str(q) for q in range(first, first + count)]


@pytest.mark.unit
def test_the_budget_grows_only_where_a_sample_per_session_needs_it(caplog):
    assert encoder_cache_budget(64, 16, gpu=False) is None  # 1,024 tokens: vLLM's 2,048 hold it
    assert encoder_cache_budget(64, 16 * 16, gpu=False) == 16384
    assert encoder_cache_budget(256, 16, gpu=True) is None  # a GPU's 8,192 hold one 448-px sample
    assert encoder_cache_budget(256, 16, gpu=False) == 4096  # the CPU's 2,048 would not
    with caplog.at_level(logging.WARNING, logger="vidchat.engine"):
        assert encoder_cache_budget(256, 16 * 32, gpu=True) == ENCODER_CACHE_MAX_TOKENS
    assert "lower --max-sessions" in caplog.text


@pytest.mark.engine
async def test_tokens_per_frame_is_what_vllm_counts_and_the_cache_holds_a_sample_per_session(engine):
    # A 640x480 frame as sent, and as a session stores it (scaled to the pixel cap).
    session = Session("t", SessionSettings(evs_enabled=False), store_max_pixels=engine.options.max_image_pixels)
    session.add_frame(frames(1)[0])
    (stored,) = session.sample().frames
    assert stored.shape[:2] != (480, 640)
    counts = []
    for shown in ([frames(1)[0]], [stored], []):
        reply = engine.ask("?", frames=shown, max_tokens=1)
        await collect(reply)
        counts.append(reply.stats.prompt_tokens)
    measured = tokens_per_frame(engine._processor, engine.options.max_image_pixels, engine.processor_kwargs)
    assert engine.tokens_per_frame == measured
    # An upper bound on what vLLM counts (the cap's rounding differs a little
    # between a stored frame and a scaled test frame), and not a loose one.
    vllm_counts = max(counts[0], counts[1]) - counts[2]
    assert vllm_counts <= measured <= 1.25 * vllm_counts, (counts, measured)
    need = measured * SESSIONS * PER_QUESTION
    assert need > ENCODER_CACHE_FLOOR_TOKENS["cpu"]  # so the test shows the cache grown
    assert engine.encoder_cache_tokens >= need


@pytest.mark.engine
async def test_a_window_slid_by_one_frame_encodes_only_the_new_frame(engine):
    clip = frames(PER_QUESTION + 4, seed=11)
    start = await encoded(engine)
    await ask(engine, clip[:PER_QUESTION], "session-a", numbered(1, PER_QUESTION))
    cold = await encoded(engine) - start
    assert cold == PER_QUESTION
    await ask(engine, clip[1:PER_QUESTION + 1], "session-a", numbered(2, PER_QUESTION))
    slid1 = await encoded(engine) - start - cold
    await ask(engine, clip[4:PER_QUESTION + 4], "session-a", numbered(5, PER_QUESTION))
    slid4 = await encoded(engine) - start - cold - slid1
    assert (slid1, slid4) == (1, 3)  # only the frames the window had not held before
    # Eight sessions' samples fit at once: the first session's frames are still encoded.
    for s in range(SESSIONS - 1):
        await ask(engine, frames(PER_QUESTION, seed=100 + s), f"session-{s}", numbered(1, PER_QUESTION))
    before = await encoded(engine)
    await ask(engine, clip[4:PER_QUESTION + 4], "session-a", numbered(5, PER_QUESTION))
    assert await encoded(engine) - before == 0


@pytest.mark.engine
async def test_sessions_showing_the_same_picture_do_not_share_its_encoding(engine):
    clip = frames(4, seed=21)
    before = await encoded(engine)
    await ask(engine, clip, "session-x", numbered(1, 4))
    await ask(engine, clip, "session-y", numbered(1, 4))  # same pixels, same numbers, other session
    assert await encoded(engine) - before == 8
    # Without names vLLM hashes the pixels, and the same picture is one entry for everyone.
    other = frames(4, seed=22)
    before = await encoded(engine)
    await ask(engine, other, "session-x")
    await ask(engine, other, "session-y")
    assert await encoded(engine) - before == 4

