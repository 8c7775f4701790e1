"""Warm-ups (vidchat.conversation.warmup) through real vLLM on the tiny omni model: a
warmed sample is a prefix-cache hit at question time, warm-ups give way to
answers, stop with their session, and never cross sessions."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import types

import numpy as np
import pytest
from conftest import eventually_async

from vidchat.conversation import asking, warmup
from vidchat.conversation.answers import AnswerOptions, AnswerQueue
from vidchat.conversation.registry import SessionRegistry, Standalone
from vidchat.conversation.warmup import Prewarmer
from vidchat.media.session import SessionSettings

QUESTION = AnswerOptions(max_tokens=2, temperature=0.0, include_audio=False)


def entry_with_frames(registry: SessionRegistry, n: int = 16, seed: int = 0, t0: float = 100.0):
    entry = registry.create("webrtc", SessionSettings(evs_enabled=False, num_sample_frames=16))
    add_frames(entry, n, seed, t0)
    return entry


def add_frames(entry, n: int, seed: int, t0: float) -> None:
    rng = np.random.default_rng(seed)
    for i in range(n):
        entry.session.add_frame(rng.integers(0, 255, (96, 128, 3), dtype=np.uint8), t=t0 + i)


async def warm(engine, entry, options=QUESTION):
    prepared = await asyncio.to_thread(asking.prepare, engine, entry, entry.session.sample(), options, (), "", True)
    return await engine.warm(prepared)


async def ask(engine, entry, question="What is there?", options=QUESTION):
    answer = await asking.ask(engine, entry.chat, question, options)
    async for _ in answer.reply:
        pass
    asking.release(entry.chat, answer)
    return answer.reply.stats


@pytest.mark.engine
async def test_a_warmed_sample_is_a_prefix_cache_hit_covering_the_frames(omni_engine):
    registry = SessionRegistry()
    entry = entry_with_frames(registry, seed=1)
    warmed = await warm(omni_engine, entry)
    assert warmed.prompt_tokens > 16 * 10 and warmed.completion_tokens == 0 and not warmed.cancelled
    stats = await ask(omni_engine, entry)
    question_tokens = stats.prompt_tokens - warmed.prompt_tokens
    assert 0 < question_tokens < 40
    # Every token of the warm-up's prompt but the last, partial cache block is reused.
    block = 128
    assert stats.cached_tokens >= warmed.prompt_tokens - block, (stats, warmed)
    assert omni_engine.running_warmups == 0 and omni_engine.running_requests == 0


@pytest.mark.engine
async def test_the_same_frames_in_another_session_are_not_a_hit(omni_engine):
    registry = SessionRegistry()
    mine, theirs = entry_with_frames(registry, seed=2), entry_with_frames(registry, seed=2)
    assert mine.cache_salt != theirs.cache_salt
    await warm(omni_engine, mine)
    stats = await ask(omni_engine, theirs)
    assert stats.cached_tokens == 0  # the salt keeps sessions' cache entries apart
    assert (await ask(omni_engine, mine)).cached_tokens > 16 * 10


@pytest.mark.engine
async def test_a_question_is_scheduled_before_a_warm_up_sent_first(omni_engine):
    """By the engine's own event order: a real question (of another session)
    arriving while a warm-up prefills makes the warm-up give way (idle mode),
    and by its first token vLLM holds nothing but that question."""
    registry = SessionRegistry()
    entry_with_frames(registry, seed=3)  # the session warmed
    questioner = entry_with_frames(registry, n=4, seed=4)
    state = fake_state(omni_engine, registry, answer_gate=AnswerQueue(0))
    prewarmer = Prewarmer(state, "idle", interval_s=0.0)
    state.answer_gate.arrival_hooks.append(prewarmer.answer_arriving)
    step = asyncio.create_task(prewarmer._step())
    await eventually_async(lambda: omni_engine.running_warmups == 1, 5, "the warm-up is in vLLM", interval=0.005)
    # Long enough to be still generating at its first token (the tiny model
    # never ends an answer on its own): a 2-token answer may already be done.
    long = dataclasses.replace(QUESTION, max_tokens=2000)
    answer = await asking.ask(omni_engine, questioner.chat, "Now?", long, queue=state.answer_gate)
    await answer.wait_turn()
    assert omni_engine.running_warmups == 0 and prewarmer.stats.yielded == 1
    async for _ in answer.reply:
        assert omni_engine._llm.get_num_unfinished_requests() == 1  # the question alone
        break
    await answer.reply.aclose()
    asking.release(questioner.chat, answer)
    await step
    assert prewarmer.stats.warmups == 0
    await prewarmer._step()  # the engine is idle again: the warm-up is done now
    assert prewarmer.stats.warmups == 1


def fake_state(engine, registry, answer_gate=None):
    """A host of the registry's conversations and the prewarmer (the server's AppState in tests)."""
    return Standalone(engine, answer_gate or AnswerQueue(0), QUESTION, registry=registry)


@pytest.mark.engine
async def test_the_prewarmer_warms_on_new_frames_only_and_skips_repeats(omni_engine):
    registry = SessionRegistry()
    entry = entry_with_frames(registry, seed=5)
    prewarmer = Prewarmer(fake_state(omni_engine, registry), "always", interval_s=0.0)
    await prewarmer._step()
    assert prewarmer.stats.warmups == 1 and prewarmer.state_of(entry.session.id).last_prompt_tokens > 16 * 10
    await prewarmer._step()  # nothing changed: no second warm-up
    assert prewarmer.stats.warmups == 1
    add_frames(entry, 1, seed=6, t0=200.0)  # one new kept frame: only the newest pick changes
    await prewarmer._step()
    assert prewarmer.stats.warmups == 1 and prewarmer.stats.skipped_same_inputs == 1  # a frame's worth: not worth it
    add_frames(entry, 4, seed=7, t0=300.0)  # the earlier picks move too
    await prewarmer._step()
    assert prewarmer.stats.warmups == 2
    stats = await ask(omni_engine, entry)
    assert stats.cached_tokens >= stats.prompt_tokens - 128 - 40


@pytest.mark.engine
async def test_idle_mode_waits_while_an_answer_generates(omni_engine):
    registry = SessionRegistry()
    busy, idle = entry_with_frames(registry, n=4, seed=7), entry_with_frames(registry, seed=8)
    prewarmer = Prewarmer(fake_state(omni_engine, registry), "idle", interval_s=0.0)
    answer = await asking.ask(omni_engine, busy.chat, "Talk.", AnswerOptions(max_tokens=2000, temperature=0.0,
                                                                       include_audio=False))
    reading = asyncio.create_task(answer.reply.__anext__())
    await reading
    await prewarmer._step()
    assert prewarmer.stats.warmups == 0 and prewarmer.stats.skipped_busy == 1
    await answer.reply.aclose()
    asking.release(busy.chat, answer)
    await prewarmer._step()
    assert prewarmer.stats.warmups == 1


@pytest.mark.engine
async def test_a_warm_up_of_a_session_that_ends_is_aborted(omni_engine):
    registry = SessionRegistry()
    entry = registry.create("webrtc", SessionSettings(evs_enabled=False, num_sample_frames=16))
    add_frames(entry, 16, seed=9, t0=0.0)
    prewarmer = Prewarmer(fake_state(omni_engine, registry), "always", interval_s=0.0)
    step = asyncio.create_task(prewarmer._step())
    await eventually_async(lambda: omni_engine.running_warmups == 1, 5, "the warm-up is in vLLM", interval=0.005)
    await registry.close(entry.session.id)
    await step
    assert prewarmer.stats.aborted == 1 and prewarmer.stats.warmups == 0
    await eventually_async(lambda: omni_engine._llm.get_num_unfinished_requests() == 0, 2,
                           "the aborted warm-up left vLLM")
    assert omni_engine.running_warmups == 0


@pytest.mark.unit
def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="off, idle, always"):
        Prewarmer(types.SimpleNamespace(), "sometimes")


@pytest.mark.unit
def test_the_encoder_budget_swaps_the_oldest_new_frames_for_encoded_ones():
    from vidchat.media.session import Session

    session = Session("s", SessionSettings(evs_enabled=False, num_sample_frames=4, max_frames=64))
    rng = np.random.default_rng(0)
    for i in range(8):
        session.add_frame(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8), t=float(i))
    first = session.sample()
    assert first.seqs == [1, 3, 5, 8] and first.substituted == 0
    session.mark_encoded(first.seqs)  # a warm-up carried these
    for i in range(8, 16):
        session.add_frame(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8), t=float(i))
    unlimited = session.sample()
    assert unlimited.seqs == [1, 6, 11, 16] and unlimited.substituted == 0
    session.encode_budget = 1
    budgeted = session.sample()
    # 6, 11 and 16 are new: the newest (16) stays, 6 and 11 become the nearest encoded frames.
    assert budgeted.seqs == [1, 5, 8, 16] and budgeted.substituted == 2
    assert budgeted.timestamps == sorted(budgeted.timestamps)
    session.mark_encoded(budgeted.seqs)
    session.encode_budget = None
    session.reset()  # kept numbers start again: nothing counts as encoded
    session.add_frame(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8), t=0.0)
    assert session.encoded_count([1]) == 0


@pytest.mark.unit
def test_the_budget_follows_the_measured_cost_of_a_new_frame():
    from vidchat.media.session import Session

    prewarmer = Prewarmer(types.SimpleNamespace(), "idle")
    session = Session("s", SessionSettings(num_sample_frames=16))
    prewarmer._budget(session, 16 * 0.02, 16)  # a GPU or the tiny model: 20 ms a frame
    assert session.encode_budget is None
    for _ in range(10):
        prewarmer._budget(session, 16 * 0.8, 16)  # the true-size CPU default: 0.8 s a frame
    # Slower than ENCODE_BUDGET_S a frame: a question carries one new frame
    # (its newest), the others a warm-up encoded.
    assert session.encode_budget == 1 and prewarmer.snapshot()["frame_cost_ms"] > 700
    assert prewarmer.frame_cost.slow


@pytest.mark.unit
def test_auto_turns_warm_ups_on_only_where_a_frame_is_slow_to_encode():
    cheap, slow = warmup.choose(6.0), warmup.choose(480.0)  # the tiny model; a faster CPU
    assert cheap.chosen == "off" and slow.chosen == "idle"
    assert "6 ms" in cheap.reason and "150 ms" in cheap.reason and "480 ms" in slow.reason
    # The true-size CPU default on a busy day (~1 s a frame): encoding ahead
    # one frame at a time still pays, since a question waits at most for
    # that one frame (the frame in flight is its one new frame).
    slowest = warmup.choose(994.0)
    assert slowest.chosen == "idle" and "994 ms" in slowest.reason and "one frame at a time" in slowest.reason
    assert warmup.explicit("always").chosen == "always"


@pytest.mark.unit
def test_auto_is_the_default_and_its_engine_schedules_answers_before_warm_ups():
    from vidchat.app.server import engine_options
    from vidchat.app.settings import parse_settings

    settings = parse_settings([])
    assert settings.prewarm == "auto"
    # auto may turn warm-ups on after start-up, so the engine is built with
    # priority scheduling from the start; only an explicit off leaves it out.
    assert engine_options(settings, "tiny", tiny=True).priority_scheduling
    # Captions (--memory, auto by default) run behind answers too: only both off leave it out.
    assert engine_options(parse_settings(["--prewarm", "off"]), "tiny", tiny=True).priority_scheduling
    assert not engine_options(parse_settings(["--prewarm", "off", "--memory", "off"]), "tiny",
                              tiny=True).priority_scheduling


@pytest.mark.unit
async def test_auto_stays_off_until_its_choice_then_seeds_the_encoder_budget():
    registry = SessionRegistry()
    prewarmer = Prewarmer(fake_state(None, registry), "auto")
    prewarmer.start()
    assert prewarmer.mode == "off" and prewarmer.snapshot()["setting"] == "auto"
    await prewarmer.apply_choice(warmup.choose(480.0))
    snap = prewarmer.snapshot()
    assert (snap["mode"], snap["chosen"], snap["frame_encode_ms"]) == ("idle", "idle", 480.0)
    assert "more than 150 ms" in snap["reason"] and prewarmer.frame_cost.slow
    assert prewarmer.frame_cost.budget(4) == 1  # one frame new to the engine a question: its newest
    await prewarmer.stop()


@pytest.mark.engine
async def test_slow_frames_are_encoded_one_at_a_time_and_a_question_brings_one_new(omni_engine):
    """Where a frame is slow to encode (issue 49): from the moment frames
    come, warm-ups encode them one at a time, each warm-up one new frame,
    until a question's worth is encoded; then each new kept frame as it
    arrives, also while the user types. A question carries at most one new
    frame, its newest (the moment it was asked)."""
    registry = SessionRegistry()
    entry = entry_with_frames(registry, seed=11)
    prewarmer = Prewarmer(fake_state(omni_engine, registry), "idle", interval_s=0.0)
    prewarmer.frame_cost.per_frame_s = 0.5  # as --prewarm auto measured on the CPU default
    session = entry.session
    assert session.sample().new_frames == 16  # nothing encoded yet (no budget set before the first warm-up)
    first_samples = []
    for _ in range(16):
        await prewarmer._step()
        first_samples.append(prewarmer.state_of(session.id).last_prompt_tokens)
        if session.encoded_in_buffer() == 16:
            break
    # One warm-up a frame, each prompt longer than the last (one frame more).
    assert prewarmer.stats.warmups == 16 and session.encoded_in_buffer() == 16
    assert first_samples == sorted(first_samples) and len(set(first_samples)) == 16
    assert session.encode_budget == 1
    question = session.sample()
    assert len(question.seqs) == 16 and question.new_frames == 0
    add_frames(entry, 1, seed=12, t0=200.0)  # one new kept frame
    newest = session.sample(new_frames=None).seqs[-1]
    asked = session.sample()
    assert asked.seqs[-1] == newest and asked.new_frames == 1  # the question would bring its newest frame
    await prewarmer._step()  # ...which a warm-up encodes as it arrives
    assert prewarmer.stats.warmups == 17 and session.sample().new_frames == 0
    prewarmer.question_coming(session.id)  # a key pressed: frames are still encoded as they come
    add_frames(entry, 1, seed=13, t0=300.0)
    newest = session.sample(new_frames=None).seqs[-1]

    async def warmed_newest() -> bool:
        await prewarmer._step()  # a typing session is warmed every URGENT_INTERVAL_S
        return session.encoded_count([newest]) == 1

    await eventually_async(warmed_newest, 10, "the newest frame warmed while the user types")
    assert prewarmer.stats.warmups == 18
    add_frames(entry, 1, seed=14, t0=400.0)  # a newer one, which the question brings
    newest = session.sample(new_frames=None).seqs[-1]
    question = session.sample()
    assert question.seqs[-1] == newest and question.new_frames == 1 and len(question.seqs) == 16
    # The record says so; the answer's prefill marks its frames encoded, so
    # the next question brings nothing new.
    entry.host = Standalone(omni_engine)
    done = await (await entry.ask("What is there?", QUESTION)).finish()
    record = done.answer.summary()
    assert (record["frames_new"], record["frames_substituted"], record["frames_left_out"]) == (1, 0, 0)
    assert len(record["frame_times"]) == 16 and record["frame_indices"][-1] == session.frame_count - 1  # the newest
    assert session.sample().new_frames == 0


def add_audio(entry, seconds: float, t: float, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    entry.session.add_audio((rng.standard_normal(int(seconds * 16000)) * 0.1).astype(np.float32), t)


@pytest.mark.engine
async def test_finished_audio_segments_are_warmed_and_only_the_newest_is_new(omni_engine, monkeypatch):
    """With --audio-segments on, the audio goes as 2-s segments
    (vidchat.media.audio): a warm-up takes the finished ones, and a question with
    more audio since reuses them all."""
    monkeypatch.setattr(omni_engine.options, "split_audio", True)
    registry = SessionRegistry()
    entry = entry_with_frames(registry, seed=7)  # frames at 100..115 s
    add_audio(entry, 17.0, 99.0, seed=1)  # 99..116 s: eight finished segments and a growing ninth
    with_audio = AnswerOptions(max_tokens=2, temperature=0.0, include_audio=True)
    warm_sample = entry.session.sample().without_audio_tail()
    # From the first frame (100 s): the first segment is cut short at the
    # front, on the stream's 2-s grid; a name is only ever given to the same samples.
    assert [size for size, _ in warm_sample.audio_parts] == [16000] + [32000] * 7
    prepared = await asyncio.to_thread(asking.prepare, omni_engine, entry, warm_sample, with_audio, (), "", True)
    assert prepared.prompt["multi_modal_uuids"]["audio"] == [f"{entry.cache_salt}/audio/{name}"
                                                             for _, name in warm_sample.audio_parts]
    warmed = await omni_engine.warm(prepared)
    assert warmed.audio_parts == [16000] + [32000] * 7 and not warmed.cancelled

    add_audio(entry, 0.5, 116.0, seed=2)  # the newest segment grows
    stats = await ask(omni_engine, entry, options=with_audio)
    assert stats.audio_parts == [16000] + [32000] * 7 + [24000]
    assert stats.audio_seconds == pytest.approx(16.5)
    # The frames and the finished segments came from the cache: every full
    # 128-token block before the chat template's few closing tokens.
    assert stats.cached_tokens >= (warmed.prompt_tokens - 16) // 128 * 128, (stats, warmed)

    # As one clip (the default), the same audio is new again as soon as it
    # grows: only the frames are reused.
    monkeypatch.setattr(omni_engine.options, "split_audio", False)
    one_clip = await asyncio.to_thread(asking.prepare, omni_engine, entry, entry.session.sample(),
                                       with_audio, (), "Again?")
    reply = omni_engine.submit(one_clip)
    async for _ in reply:
        pass
    assert reply.stats.audio_parts == [] and reply.stats.cached_tokens <= stats.cached_tokens - 256, reply.stats


@pytest.mark.engine
async def test_the_sample_taken_at_enter_is_warmed_whole_and_is_the_questions(omni_engine, monkeypatch):
    """Enter pressed (question_now): the sample is taken then, warmed with
    all its audio, and the question that arrives a moment later takes it,
    not the media that came in between, and finds it all prefilled."""
    monkeypatch.setattr(warmup, "PIN_S", 60.0)  # however slow this machine's warm-up is today
    registry = SessionRegistry()
    entry = entry_with_frames(registry, seed=11)  # frames at 100..115 s
    add_audio(entry, 16.5, 99.5, seed=3)
    with_audio = AnswerOptions(max_tokens=2, temperature=0.0, include_audio=True)
    entry.warm_options = with_audio
    sid = entry.session.id
    off = Prewarmer(fake_state(omni_engine, registry), "off")
    await off.question_now(sid)
    assert off.take_pin(entry) is None  # warm-ups off: a question samples on arrival

    prewarmer = Prewarmer(fake_state(omni_engine, registry), "idle", interval_s=0.0)
    await prewarmer.question_now(sid)
    await prewarmer._step()
    warmed = prewarmer.state_of(sid)
    assert prewarmer.stats.warmups == 1 and prewarmer.snapshot()["pinned"] == 1
    add_frames(entry, 1, seed=12, t0=116.0)  # media keep coming while the question travels
    add_audio(entry, 0.4, 116.0, seed=4)
    pin = prewarmer.take_pin(entry)
    assert pin is not None and prewarmer.take_pin(entry) is None  # used once
    assert 17 not in pin.sample.seqs and pin.sample.audio_end == pytest.approx(116.0)
    answer = await asking.ask(omni_engine, entry.chat, "What is there?", with_audio, sample=pin.sample)
    async for _ in answer.reply:
        pass
    asking.release(entry.chat, answer)
    stats = answer.reply.stats
    assert stats.audio_seconds == pytest.approx(16.0) and stats.audio_parts == []  # one clip, the default
    # Everything but the question, all of the audio too (all full blocks).
    assert stats.cached_tokens >= (warmed.last_prompt_tokens - 16) // 128 * 128 > 0, (stats, warmed)

    # A pin is not used by a question with other sampling settings, nor by
    # the question after the one it was taken for.
    await prewarmer.question_now(sid)
    entry.session.update_settings(num_sample_frames=8)
    assert prewarmer.take_pin(entry) is None
    await prewarmer.question_now(sid)
    entry.host = prewarmer.host
    talking = entry
    await talking.stop()  # the chat's turn moved on: its question came (or was stopped) without it
    assert prewarmer.take_pin(entry) is None
    # An Enter report that arrives after its typed question: ignored, so
    # the next question never takes a sample from before this one.
    await talking.stop()
    entry.typed_question_at = time.monotonic()
    late = prewarmer.stats.late_enter_reports
    await prewarmer.question_now(sid)
    assert prewarmer.stats.late_enter_reports == late + 1
    assert prewarmer.take_pin(entry) is None  # the next question's event takes a pin before it is asked


@pytest.mark.unit
def test_speech_starting_in_talk_mode_warms_the_session_first():
    from vidchat.conversation import modes

    registry = SessionRegistry()
    entry = registry.create("webrtc", SessionSettings(evs_enabled=False))
    host = Standalone(None, registry=registry)
    assert modes.speech_warms(host, entry) is None  # no warm-ups
    host.prewarmer = prewarmer = Prewarmer(host, "idle")
    modes.speech_warms(host, entry)()
    assert prewarmer.state_of(entry.session.id).urgent_until > time.monotonic()


@pytest.mark.engine
async def test_an_enter_sample_with_nothing_new_for_a_model_that_hears_nothing_is_not_warmed_again(vl_engine,
                                                                                                  monkeypatch):
    """The sample taken at Enter carries the audio; a background warm-up
    does not. For a model that takes no audio the two prompts are the same,
    so once a warm-up has warmed these frames the Enter sample has nothing
    new, and its question must not wait for a second warm-up of it (the
    true-size CPU default's still scene: 130-250 ms of waiting for nothing)."""
    monkeypatch.setattr(warmup, "PIN_S", 60.0)
    assert not vl_engine.accepts_audio
    registry = SessionRegistry()
    entry = entry_with_frames(registry, seed=21)
    add_audio(entry, 16.5, 99.5, seed=5)
    entry.warm_options = AnswerOptions(max_tokens=2, temperature=0.0, include_audio=True)
    sid = entry.session.id
    prewarmer = Prewarmer(fake_state(vl_engine, registry), "idle", interval_s=0.0)
    await prewarmer._step()  # the background warm-up of these frames
    assert prewarmer.stats.warmups == 1
    await prewarmer.question_now(sid)
    await prewarmer._step()  # the Enter sample: the same frames, and audio this model does not take
    assert prewarmer.stats.warmups == 1 and prewarmer.stats.skipped_same_inputs == 1, prewarmer.snapshot()
    pin = prewarmer.take_pin(entry)
    assert pin is not None and pin.sample.audio is not None  # the question still takes the sample from Enter


class SeedClient:
    """What SocketAnswers needs of its connection (vidchat.doors.socket.session.Client), minus the socket."""

    def __init__(self, state, entry, options) -> None:
        self.state, self.entry, self.options = state, entry, options
        self.settings = types.SimpleNamespace(record_dir=None)
        self.media = types.SimpleNamespace(names_frames=False, audio_dated=True)
        self.peer, self.vidchat_events = "test", False
        self.answer_task: asyncio.Task | None = None
        self.sent: list[dict] = []

    @property
    def answering(self) -> bool:
        return self.answer_task is not None and not self.answer_task.done()

    async def send(self, msg: dict) -> bool:
        self.sent.append(msg)
        return True

    async def error(self, message: str) -> bool:
        return await self.send({"type": "error", "message": message})

    def stream_answer(self, answer, name: str) -> None:
        self.answer_task = asyncio.create_task(answer, name=name)

    async def finish_answer(self) -> None:
        task, self.answer_task = self.answer_task, None
        if task is not None:
            await task


@pytest.mark.engine
async def test_a_seed_session_with_history_is_warmed_with_it(omni_engine, monkeypatch):
    """history: true on the seed socket: the next question carries the chat
    before its frames, so its warm-up must too, or it shares nothing but the
    system prompt. Without history, the warm-up carries none."""
    from vidchat.conversation import warmup
    from vidchat.doors.socket.session import SocketAnswers

    monkeypatch.setattr(warmup, "SETTLE_S", 0.0)  # warmed as soon as the answer ends
    registry = SessionRegistry()
    entry = registry.create("ws", SessionSettings(evs_enabled=False, num_sample_frames=16))
    add_frames(entry, 16, seed=31, t0=100.0)
    state = fake_state(omni_engine, registry)
    modes = AnswerOptions(max_tokens=8, temperature=0.0, include_audio=False)
    answers = SocketAnswers(SeedClient(state, entry, modes))
    answers.set_history(True)
    await answers.ask("What is there?")
    await answers.conn.finish_answer()
    chat_turns = entry.history.turns()  # the chat, kept on the server
    assert len(chat_turns) == 2, answers.conn.sent  # the tiny model said something
    assert entry.warm_history == chat_turns  # what the next question carries
    prewarmer = Prewarmer(state, "idle", interval_s=0.0)
    await prewarmer._step()
    warmed = prewarmer.state_of(entry.session.id)
    assert prewarmer.stats.warmups == 1
    await answers.ask("And now?")
    await answers.conn.finish_answer()
    stats = answers.conn.sent[-1]["stats"]
    assert stats["history_turns"] == 2
    # The whole warm-up but its last, partial cache block: history and frames.
    assert stats["cached_tokens"] >= warmed.last_prompt_tokens - 128 > 16 * 10, (stats, warmed)

    answers.set_history(False)
    assert entry.warm_history == ()  # the next question carries no chat: nor does its warm-up
    await answers.ask("What now?")
    await answers.conn.finish_answer()
    assert entry.warm_history == ()
