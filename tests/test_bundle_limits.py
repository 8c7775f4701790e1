"""What a loaded bundle and its re-asks may take (issue 43, points 5, 6, 9):
a tab holds one loaded bundle, its frames as PNG bytes until re-asked, its
audio within --ws-max-audio-seconds and as long as its manifest says; the
re-asks of one tab (or session) hold at most one answer place between them;
a re-ask is never among the chat's kept answers, so Talk never reads one
aloud and it never becomes chat history."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import html
import shutil
import tracemalloc
import types

import hostile_bundles as hb
import numpy as np
import pytest
from conftest import eventually_async

from vidchat.conversation import bundles, runs
from vidchat.conversation.answers import AnswerOptions, AnswerQueue
from vidchat.conversation.registry import SessionRegistry, Standalone
from vidchat.doors.page.questions import load_bundle, reask, reask_choices
from vidchat.doors.webrtc_routes import talk_state_of
from vidchat.media.session import SessionSettings

AUDIO_CAP_S = 30.0  # the server's --ws-max-audio-seconds default


def page_state(engine=None, queue=None, registry=None):
    """What the page's answer functions read of the app."""

    async def wait_engine(timeout=None):
        return engine

    state = Standalone(engine, queue, registry=registry or SessionRegistry())
    # What the page reads of the app besides its host.
    state.compare_model_path, state.compare_engine, state.wait_engine = None, None, wait_engine
    state.ready = engine is not None
    state.settings = types.SimpleNamespace(ws_max_audio_seconds=AUDIO_CAP_S, record_dir="", model="", compare_model="")
    return state


def reask_settings(max_tokens: int) -> list:
    """/reask's settings after the answer id: k, sampling, window, filter on, threshold, max frames kept,
    frames as, audio, max tokens, temperature, seed, record, system prompt."""
    return [4, "uniform", 10, False, 0.95, 64, "images", False, max_tokens, 0.0, "5", False, ""]


def uploaded(tmp_path, name: str, pixels, meta, wav: bytes | None = None):
    """A bundle as Gradio hands it over: a file the load deletes once read."""
    path = hb.write_zip(tmp_path / f"{name}.zip", pixels, meta, wav=wav)
    upload = tmp_path / f"upload-{name}.zip"
    shutil.copy(path, upload)
    return str(upload)


# ---- point 5: one loaded bundle per tab, frames lazily, audio capped ----------------------

@pytest.mark.unit
async def test_loading_a_second_bundle_replaces_the_first_and_keeps_no_decoded_frames(tmp_path):
    # Uniform frames: each bundle weighs a few KB and decodes to 16 x 640x480x3 = 14.7 MB.
    pixels = hb.frames(16, (640, 480))
    uploads = [uploaded(tmp_path, name, pixels, hb.manifest(pixels, name)) for name in ("first", "second")]
    state = page_state()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        loaded: dict = {}
        chosen = []
        for path in uploads:
            loaded, _, answer_id, message = await load_bundle(state, path, loaded)
            assert "Loaded the bundle (16 frames)" in message, message
            chosen.append(answer_id)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert list(loaded) == [chosen[1]] and loaded[chosen[1]].question == "second"  # the first was replaced
    assert held < 2 << 20, f"the tab holds {held / 2**20:.1f} MB after loading two bundles"
    frames = loaded[chosen[1]].sample.frames
    assert frames.held_bytes < 64 << 10 and len(frames) == 16
    assert np.array_equal(frames[3], pixels[3]) and np.array_equal(frames.decoded()[15], pixels[15])


@pytest.mark.unit
async def test_a_bundle_whose_audio_is_longer_than_the_cap_is_refused_naming_the_field(tmp_path):
    pixels = hb.frames()
    meta, wav = hb.with_audio(hb.manifest(pixels), pixels, AUDIO_CAP_S + 10)
    loaded, _, chosen, message = await load_bundle(page_state(), uploaded(tmp_path, "long", pixels, meta, wav), {})
    assert not chosen and not loaded
    assert "Not a bundle vidchat can read" in message and "audio.seconds" in message, message
    assert f"at most {AUDIO_CAP_S:g} s" in message and "--ws-max-audio-seconds" in message, message
    # Read back without a server's cap (replay), the same bundle loads.
    bundle = bundles.read_bundle(hb.write_zip(tmp_path / "b.zip", pixels, meta, wav=wav))
    assert bundle.audio.size == (AUDIO_CAP_S + 10) * 16000


@pytest.mark.unit
@pytest.mark.parametrize("seconds, says, field", [
    (600.0, 2.0, "audio.seconds"),  # a WAV far longer than its manifest says: refused before it is converted
    (2.0, 3.0, "audio.seconds"),  # shorter than it says
])
async def test_a_bundle_whose_wav_is_not_as_long_as_its_manifest_says_is_refused(tmp_path, seconds, says, field):
    pixels = hb.frames()
    meta, wav = hb.with_audio(hb.manifest(pixels), pixels, seconds, says=says)
    _, _, chosen, shown = await load_bundle(page_state(), uploaded(tmp_path, "lying", pixels, meta, wav), {})
    message = html.unescape(shown)  # the page shows it as text
    assert not chosen and f"'{field}' says {says:g} s" in message and f"holds {seconds:g} s" in message, message


@pytest.mark.unit
def test_a_bundle_with_audio_must_say_how_long_it_is_and_counts_it_in_the_decoded_budget(tmp_path):
    pixels = hb.frames()
    meta, wav = hb.with_audio(hb.manifest(pixels), pixels, 1.0)
    del meta["audio"]["seconds"]
    with pytest.raises(bundles.BundleError, match="'audio.seconds' must be a number"):
        bundles.read_bundle(hb.write_zip(tmp_path / "a.zip", pixels, meta, wav=wav))
    # Frames just under the budget, plus audio over what is left of it.
    meta = hb.manifest(pixels)
    meta["frames"][0]["width"], meta["frames"][0]["height"] = 10_000, 17_000  # 486 MB decoded
    meta["audio"] = {"file": "audio.wav", "seconds": 500.0}  # 30.5 MB more as float32
    with pytest.raises(bundles.BundleError, match=r"frames and 500 s of audio would decode to 517 MB"):
        bundles.read_bundle(hb.write_zip(tmp_path / "b.zip", [], meta))  # no files: refused before reading


# ---- points 6 and 9, through real vLLM -------------------------------------------------------

class CountingQueue(AnswerQueue):
    """The answer queue, counting the places it granted and the most held at once."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.granted = self.peak = 0

    async def acquire(self, on_wait=None, abandon=None):
        slot = await super().acquire(on_wait, abandon)
        self.granted += 1
        self.peak = max(self.peak, self.running)
        return slot


async def _collect(updates, into: list) -> None:
    async with contextlib.aclosing(updates) as stream:
        async for update in stream:
            into.append(update)


@pytest.mark.engine
async def test_concurrent_reasks_of_one_tab_hold_at_most_one_answer_place(omni_engine, tmp_path):
    queue = CountingQueue(8)  # the default --max-concurrent-answers
    state = page_state(omni_engine, queue)
    pixels = [np.random.default_rng(i).integers(0, 255, (96, 128, 3), dtype=np.uint8) for i in range(4)]
    loaded, _, bundle_id, _ = await load_bundle(state, uploaded(tmp_path, "b", pixels, hb.manifest(pixels)), {})
    # A tab with no session running (as an API client can call it), re-asking at length.
    outs: list[list] = [[] for _ in range(5)]

    def call(i: int) -> asyncio.Task:
        return asyncio.create_task(_collect(reask(state, None, bundle_id, *reask_settings(2000), loaded=loaded),
                                            outs[i]))

    def streams(i: int) -> bool:
        return len(outs[i]) >= 2  # the comparison's first update, then the text: it holds a place

    tasks = [call(0)]
    try:
        await eventually_async(lambda: streams(0), 60, "the first re-ask streams")
        tasks += [call(i) for i in range(1, 5)]  # four more at once while it runs
        # Each call has ended (replaced) or streams; before the fix, each streamed in a place of its own.
        await eventually_async(lambda: all(t.done() or streams(i) for i, t in enumerate(tasks)), 60,
                               "every re-ask has ended or streams")
        assert queue.peak == 1 and queue.running == 1, (queue.peak, queue.snapshot())
        assert sum(not t.done() for t in tasks) == 1  # the one re-ask still running is the tab's only one
        assert tasks[0].done() and queue.granted >= 2  # the first was replaced by a newer one
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    await eventually_async(lambda: omni_engine.running_requests == 0 and queue.running == 0, 30,
                           "the re-asks' requests and places are given back")


@pytest.mark.engine
async def test_a_reask_is_never_read_aloud_nor_kept_as_a_chat_answer(omni_engine):
    registry = SessionRegistry()
    entry = registry.create("webrtc", SessionSettings(evs_enabled=False, num_sample_frames=4))
    rng = np.random.default_rng(0)
    for i in range(6):
        entry.session.add_frame(rng.integers(0, 255, (96, 128, 3), dtype=np.uint8), t=100.0 + i)
    state = page_state(omni_engine, AnswerQueue(8), registry)
    entry.host = state
    talking = entry
    short = AnswerOptions(max_tokens=6, temperature=0.0)
    chat_ids = []
    for n in range(1, 4):  # three chat questions (n = 1..3), Talk on from the start
        done = await (await talking.ask(f"Question {n}?", short)).finish()
        chat_ids.append(done.answer_id)
    third = entry.answers[chat_ids[2]]
    said = talk_state_of(entry)["answer"]
    assert said["n"] == 3 and said["done"] and said["text"] == third.reply.text

    updates: list = []
    reasking = asyncio.create_task(_collect(reask(state, entry.session.id, chat_ids[0], *reask_settings(40)),
                                            updates))
    try:
        await eventually_async(lambda: len(updates) >= 2 or reasking.done(), 60, "the re-ask streams")
        assert talk_state_of(entry)["answer"] == said  # while it streams, Talk still has the chat's answer
        await asyncio.wait_for(reasking, 60)
    finally:
        reasking.cancel()
    assert "Re-asked" in updates[-1]
    assert talk_state_of(entry)["answer"] == said  # and after: the re-ask is never read aloud
    assert list(entry.answers) == chat_ids and [a.ticket for a in entry.answers.values()] == [1, 2, 3]
    assert [answer_id for answer_id, _ in runs.chat_answers(entry)] == chat_ids[::-1]
    assert [answer_id for _, answer_id in reask_choices(state, entry.session.id)] == chat_ids[::-1]
    assert entry.warm_history[-2].text == "Question 3?"  # nor is it the chat's last turn
    assert omni_engine.running_requests == 0
