"""The shared answer path through real vLLM (tiny omni model): one answer per
session however questions race, options checked in one place, and the page's
notices kept out of what the model sees."""

from __future__ import annotations

import asyncio
import threading
import types

import numpy as np
import pytest
from conftest import TEST_MAX_IMAGES, eventually_async

from vidchat.conversation import asking, runs
from vidchat.conversation.answers import AnswerOptions
from vidchat.conversation.asking import OptionError
from vidchat.conversation.events import Notice, QuestionRefused
from vidchat.conversation.registry import SessionRegistry, Standalone
from vidchat.doors.page import NOT_RUNNING, page_request
from vidchat.engine import Turn
from vidchat.media.session import SessionSettings


def filled_entry(kind="webrtc", n=6, **settings):
    registry = SessionRegistry()
    entry = registry.create(kind, SessionSettings(evs_enabled=False, num_sample_frames=4, **settings))
    rng = np.random.default_rng(0)
    for i in range(n):
        entry.session.add_frame(rng.integers(0, 255, (96, 128, 3), dtype=np.uint8), t=100.0 + i)
    return entry


# Greedy decoding of the random model runs on without an end token: a long answer.
LONG = AnswerOptions(max_tokens=2000, temperature=0.0)


async def drain(answer, seen: list | None = None):
    async for delta in answer.reply:
        if seen is not None:
            seen.append(delta)
    return answer.reply.stats


def talking_of(engine, entry):
    """The entry's conversation, with an engine and no app around it."""
    entry.host = Standalone(engine)
    return entry


async def drain_run(run, seen: list | None = None):
    """Read a run's events to its Done; its deltas into ``seen``."""
    async for event in run.events():
        if isinstance(event, runs.Delta) and seen is not None:
            seen.append(event.text)
    return run.answer.reply.stats


@pytest.mark.engine
async def test_racing_questions_leave_exactly_one_generation(omni_engine):
    entry = filled_entry()
    talking = talking_of(omni_engine, entry)
    # Five questions for one session at once, as from two doors or two /ask calls.
    results = await asyncio.gather(*(talking.ask(f"Q{i}", LONG) for i in range(5)), return_exceptions=True)
    started = [r for r in results if isinstance(r, runs.AnswerRun)]
    superseded = [r for r in results if isinstance(r, asking.Superseded)]
    assert len(started) == 1 and len(superseded) == 4, results
    winner = started[0]
    assert winner.answer.question == "Q4" and entry.answer is winner.answer  # the last to arrive wins
    # At each of its first 20 tokens, the winner is the only generation.
    seen = 0
    reader = winner.events()
    async for event in reader:
        if isinstance(event, runs.Delta):
            assert omni_engine.running_requests == 1
            seen += 1
            if seen == 20:
                break
    consumer = asyncio.create_task(drain_run(winner))
    await reader.aclose()
    # A later question replaces it: the running one is aborted in vLLM.
    short = await talking.ask("And now?", AnswerOptions(max_tokens=4, temperature=0.0))
    stats = await asyncio.wait_for(consumer, 10)
    assert stats.cancelled and stats.completion_tokens < 2000
    assert (await drain_run(short)).completion_tokens == 4
    assert (await short.finish()).current and entry.answer is None
    assert omni_engine.running_requests == 0


@pytest.mark.engine
async def test_questions_arriving_while_an_abort_winds_down_wait_for_it(omni_engine):
    """An abort that reaches vLLM while the request is still being registered
    only lands at its first output; questions arriving meanwhile (two at once
    here) must not start beside it."""
    entry = filled_entry()
    talking = talking_of(omni_engine, entry)
    first = await talking.ask("Q0", LONG)
    consumer = asyncio.create_task(drain_run(first))
    peak = 0

    async def watch():
        nonlocal peak
        while True:
            peak = max(peak, omni_engine.running_requests)
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0)  # the consumer is now inside vLLM's registration
    consumers = {}

    async def ask_and_stream(question):
        run = await talking.ask(question, LONG)
        consumers[question] = asyncio.create_task(drain_run(run, streamed))  # streams at once, as a door does
        return run

    streamed: list[str] = []
    results = await asyncio.gather(ask_and_stream("Q1"), ask_and_stream("Q2"), return_exceptions=True)
    started = [r for r in results if isinstance(r, runs.AnswerRun)]
    assert [r.answer.question for r in started] == ["Q2"], results
    # The peak is watched until the winner has streamed a while: the aborted
    # one is long gone by then, or it would have overlapped.
    await eventually_async(lambda: len(streamed) >= 20, 30, "the winning question streams 20 deltas")
    watcher.cancel()
    assert (await asyncio.wait_for(consumer, 10)).cancelled
    await talking.cancel()
    await asyncio.wait_for(consumers["Q2"], 10)
    assert peak == 1, peak
    assert omni_engine.running_requests == 0


@pytest.mark.engine
async def test_question_arriving_during_preparation_wins(omni_engine):
    entry = filled_entry(n=16)
    talking = talking_of(omni_engine, entry)
    first = asyncio.create_task(talking.ask("first", LONG))
    await asyncio.sleep(0)  # the first is being prepared in its worker thread
    second = await talking.ask("second", AnswerOptions(max_tokens=2, temperature=0.0))
    with pytest.raises(asking.Superseded):
        await first
    assert entry.answer is second.answer
    await drain_run(second)
    assert omni_engine.running_requests == 0


@pytest.mark.engine
async def test_no_frames_is_the_cores_fact_and_each_door_says_what_to_do(omni_engine):
    from vidchat.doors.page.chat import NO_FRAMES_HINT
    from vidchat.doors.socket.session import SocketSession

    for kind in ("ws", "webrtc"):  # the core says the same to every door
        entry = filled_entry(kind=kind, n=0)
        with pytest.raises(asking.NoFrames) as err:
            await asking.ask(omni_engine, entry.chat, "Hi?", AnswerOptions())
        assert str(err.value) == "No frames available."
    assert err.value.said_with(SocketSession.no_frames_hint) == \
        "No frames available. Send video.frame before video.query."
    assert "Start camera" in err.value.said_with(NO_FRAMES_HINT)


@pytest.mark.engine
@pytest.mark.parametrize("change, fragment", [
    ({"seed": 2**63}, "seed must be a whole number that fits a signed 64-bit integer"),
    ({"seed": -(2**63) - 1}, "signed 64-bit"),
    ({"seed": 1.5}, "seed must be"),
    ({"temperature": float("nan")}, "temperature must be a number in 0..2"),
    ({"temperature": -0.1}, "temperature must be"),
    ({"max_tokens": 0}, "max_tokens must be a whole number in 1..4096"),
    ({"max_tokens": 10**9}, "max_tokens must be"),
    ({"frames_as": "gif"}, "frames_as must be one of images, video"),
])
def test_options_are_checked_in_one_place(omni_engine, change, fragment):
    with pytest.raises(OptionError, match=fragment.replace("(", r"\(").replace(".", r"\.")):
        asking.check_options(AnswerOptions().updated(**change), omni_engine)


@pytest.mark.engine
def test_frames_per_question_are_counted_against_the_engine_for_images_and_video(omni_engine):
    asking.check_options(AnswerOptions(seed=2**63 - 1), omni_engine, SessionSettings(num_sample_frames=TEST_MAX_IMAGES))
    for frames_as in ("images", "video"):
        with pytest.raises(OptionError, match=f"carries {TEST_MAX_IMAGES + 1} frames"):
            asking.check_options(AnswerOptions(frames_as=frames_as), omni_engine,
                               SessionSettings(num_sample_frames=TEST_MAX_IMAGES + 1))


@pytest.mark.engine
def test_page_values_are_coerced_with_clear_messages(omni_engine):
    class State:
        settings = None

        @staticmethod
        def answer_defaults():
            return AnswerOptions()

    good = page_request(State, 8.0, "uniform", 10, True, 0.95, 64, "images", True, "32", 0.5, " 42 ")
    assert good.sampling["num_sample_frames"] == 8 and good.options.seed == 42 and good.options.max_tokens == 32
    assert page_request(State, 8, "uniform", 10, True, 0.95, 64, "images", True, 32, 0.5, "").options.seed is None
    for args, fragment in [
        ((8.5, "uniform", 10, True, 0.95, 64, "images", True, 32, 0.5, ""), "Frames per question must be a whole"),
        ((8, "random", 10, True, 0.95, 64, "images", True, 32, 0.5, ""), "Sampling must be one of"),
        ((8, "uniform", 10, True, 0.95, 64, "images", True, "lots", 0.5, ""), "Max tokens must be a whole"),
        ((8, "uniform", 10, True, 0.95, 64, "images", True, 32, None, ""), "Temperature must be a number"),
        ((8, "uniform", 10, True, 0.95, 64, "images", True, 32, 0.5, "abc"), "Seed must be a whole number"),
    ]:
        with pytest.raises(OptionError, match=fragment):
            page_request(State, *args)


def _said(question: str, text: str):
    return types.SimpleNamespace(question=question, spoken=None, reply=types.SimpleNamespace(text=text))


@pytest.mark.unit
@pytest.mark.parametrize("change, joins", [
    ({}, True),
    ({"status": runs.CANCELLED}, True),  # Stop or a newer question: the text the user saw
    ({"text": " "}, False),  # said nothing
    ({"started": False}, False),  # never had a place
    ({"continues_chat": False}, False),  # asked outside the chat (Realtime's conversation "none")
    ({"older_chat": True}, False),  # Clear came while it ran
    ({"side": True}, False),  # a re-ask beside the chat
], ids=["answered", "stopped", "empty", "not started", "outside the chat", "cleared", "re-ask"])
def test_only_an_answered_exchange_of_this_chat_joins_the_servers_history(change, joins):
    """The one rule for what the model is given as its chat: the page's
    notices, refusals and waiting lines are never in it (they are not
    exchanges), and neither is an answer that said nothing."""
    entry = filled_entry()
    run = types.SimpleNamespace(continues_chat=change.get("continues_chat", True),
                                slot=entry.side if change.get("side") else entry.chat,
                                chat=entry.chat_began)
    if change.get("older_chat"):
        entry.clear()
    done = runs.Done(_said("Colour?", change.get("text", "Blue.")), change.get("status", runs.COMPLETED),
                             None, change.get("started", True), True, "a1")
    entry._answered(run, done)
    if joins:
        assert entry.history.turns() == (Turn("user", "Colour?"), Turn("assistant", "Blue."))
        assert entry.history.exchanges[0].stopped == (done.status == runs.CANCELLED)
    else:
        assert entry.history.turns() == ()


@pytest.mark.engine
async def test_a_refused_question_and_a_notice_change_nothing_the_engine_sees(omni_engine):
    entry = talking_of(omni_engine, filled_entry())
    opts = AnswerOptions(max_tokens=1, temperature=0.0)
    await drain_run(await entry.ask("Hi", opts))
    prompts = []
    for _ in range(2):
        run = await entry.ask("Colour?", opts, continues_chat=False, history=entry.history.turns())
        await drain_run(run)
        prompts.append((run.answer.prompt_text, run.answer.reply.stats.prompt_tokens))
        with entry.event_hub.subscribe() as events:
            entry.event_hub.publish(Notice(NOT_RUNNING))

            def refuse():
                raise ValueError("no such setting")
            ticket = entry.submit("Hm?", refuse)
            while not isinstance(refused := await events.get(), QuestionRefused):
                pass
        assert refused.ticket == ticket and "no such setting" in refused.reason
    assert prompts[0] == prompts[1] and NOT_RUNNING not in prompts[0][0] and "Hm?" not in prompts[1][0]
    assert entry.history.turns()[0] == Turn("user", "Hi") and len(entry.history) == 1


@pytest.mark.engine
async def test_video_answers_carry_their_real_frame_rate(omni_engine):
    entry = filled_entry(n=8)
    answer = await asking.ask(omni_engine, entry.chat, "What moves?", AnswerOptions(frames_as="video", max_tokens=2))
    await drain(answer)
    summary = answer.summary()
    assert summary["frames_as"] == "video" and summary["frame_times"] == [0.0, 2.0, 4.0, 7.0]
    assert summary["video_fps"] == pytest.approx(3 / 7, abs=1e-3)  # 4 frames over 7 s of media time


@pytest.mark.engine
async def test_each_session_has_its_own_prefix_cache_salt(omni_engine):
    """Identical frames and question in two sessions: the second session must
    not hit the first one's prefix cache, while a session's own repeat does."""
    first, second = filled_entry(n=6), filled_entry(n=6)  # same seed: identical frames
    # A prompt of several 128-token blocks: only whole blocks are cached.
    options = AnswerOptions(max_tokens=2, temperature=0.0, system_prompt="Watch closely. " * 100)

    async def ask(entry):
        answer = await asking.ask(omni_engine, entry.chat, "What is shown?", options)
        stats = await drain(answer)
        asking.release(entry.chat, answer)
        return answer.reply._prompt["cache_salt"], stats

    salt_a1, cold = await ask(first)
    salt_a2, warm = await ask(first)
    salt_b, other = await ask(second)
    assert salt_a1 == salt_a2 and salt_a1 != salt_b and len(salt_b) == 32
    assert cold.prompt_tokens == warm.prompt_tokens == other.prompt_tokens > 0
    assert warm.cached_tokens > 0, "a session's repeated prompt is served from the prefix cache"
    assert other.cached_tokens == 0, "another session's identical prompt must not be"


@pytest.mark.engine
async def test_the_answer_record_names_its_exact_inputs(omni_engine):
    from vidchat.engine import inputs_digest

    entry, twin, other = filled_entry(n=6), filled_entry(n=6), filled_entry(n=6)
    other.session.add_frame(np.zeros((96, 128, 3), np.uint8), t=106.0)  # one frame differs
    options = AnswerOptions(max_tokens=2, temperature=0.0, include_audio=False)
    records = []
    for e in (entry, twin, other):
        answer = await asking.ask(omni_engine, e.chat, "What is shown?", options)
        await drain(answer)
        asking.release(e.chat, answer)
        records.append((answer, answer.summary()))
    (a, ra), (_, rb), (_, rc) = records
    assert ra["inputs_sha256"] == inputs_digest(a.sample.frames, None) and len(ra["inputs_sha256"]) == 64
    assert ra["inputs_sha256"] == rb["inputs_sha256"] != rc["inputs_sha256"]
    assert ra["model"] == omni_engine.model_path and ra["prompt"] == a.prompt_text
    assert "<|vision_start|>" in ra["prompt"] or "<|IMAGE|>" in ra["prompt"]  # special tokens kept
    assert ra["ttft_ms"] > 0 and ra["prompt_tokens"] > 0


@pytest.mark.unit
async def test_a_question_being_prepared_when_its_session_closes_never_starts():
    registry = SessionRegistry()
    entry = registry.create("ws", SessionSettings(evs_enabled=False, num_sample_frames=4))
    for i in range(4):
        entry.session.add_frame(np.full((96, 128, 3), 40 * i, np.uint8), t=100.0 + i)
    preparing, release = threading.Event(), threading.Event()
    submitted = []

    class HeldEngine:
        """Holds the question in its preparation until the session has closed."""

        def prepare(self, *args, **kwargs):
            preparing.set()
            assert release.wait(10), "the test never released the preparation"
            return types.SimpleNamespace(prompt_text="", video_fps=None,
                                         stats=types.SimpleNamespace(audio_seconds=0.0))

        def submit(self, prepared):
            submitted.append(prepared)
            raise AssertionError("a closed session's question reached the engine")

    asked = asyncio.create_task(asking.ask(HeldEngine(), entry.chat, "Still there?", AnswerOptions(max_tokens=2)))
    assert await asyncio.to_thread(preparing.wait, 10)
    assert await registry.close(entry.session.id, "peer closed")
    release.set()
    with pytest.raises(asking.Superseded, match="session closed"):
        await asked
    assert submitted == [] and entry.answer is None
