"""Warm-up scheduling (vidchat.conversation.warmup) against a fake engine:
a question that arrives while a warm-up is planned never runs beside it in
idle mode, one session's Enter reports neither abort nor crowd out another
session's warm-ups, and the history a door's next question carries is the
history its warm-up is prepared with.

The fake engine blocks where a test holds it (a threading event for the
prompt's preparation, which runs in a worker thread; an asyncio event for
the warm-up itself), so each race is driven step by step, not by timing."""

from __future__ import annotations

import asyncio
import threading
import time
import types

import numpy as np
import pytest

from vidchat.conversation import asking, runs
from vidchat.conversation.answers import AnswerOptions, AnswerQueue
from vidchat.conversation.registry import SessionRegistry, Standalone
from vidchat.conversation.warmup import Prewarmer
from vidchat.engine import Turn
from vidchat.media.session import SessionSettings

pytestmark = pytest.mark.unit

OPTIONS = AnswerOptions(max_tokens=2, temperature=0.0, include_audio=False)


class FakeEngine:
    """What the prewarmer uses of an engine: prepare (in a worker thread) and warm."""

    splits_audio = False
    is_dead = False

    def __init__(self) -> None:
        self.running_requests = 0
        self.preparing = threading.Event()  # a prompt is being prepared
        self.prepare_may_end = threading.Event()
        self.prepare_may_end.set()
        self.warm_started = asyncio.Event()
        self.warm_may_end = asyncio.Event()
        self.warm_may_end.set()
        self.warmed: list[str] = []  # cache salts of the warm-ups sent, in order
        self.cancelled: list[str] = []

    def prepare(self, question, frames, audio, *, cache_salt, history=(), **_):
        self.preparing.set()
        assert self.prepare_may_end.wait(10), "the test never let the prompt's preparation end"
        return types.SimpleNamespace(prompt_text=f"{len(history)} turns, {len(frames)} frames",
                                     stats=types.SimpleNamespace(audio_seconds=0.0), cache_salt=cache_salt)

    async def warm(self, prepared):
        self.warmed.append(prepared.cache_salt)
        self.warm_started.set()
        try:
            await self.warm_may_end.wait()
        except asyncio.CancelledError:
            self.cancelled.append(prepared.cache_salt)
            raise
        return types.SimpleNamespace(prompt_tokens=100, cached_tokens=0)


def entry_with_frames(registry: SessionRegistry, seed: int = 0, kind: str = "webrtc"):
    entry = registry.create(kind, SessionSettings(evs_enabled=False, num_sample_frames=4))
    rng = np.random.default_rng(seed)
    for i in range(4):
        entry.session.add_frame(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8), t=100.0 + i)
    return entry


def prewarmer_for(engine: FakeEngine, registry: SessionRegistry, mode: str = "idle") -> Prewarmer:
    state = Standalone(engine, AnswerQueue(0), OPTIONS, registry=registry)
    prewarmer = Prewarmer(state, mode, interval_s=0.0)
    state.answer_gate.arrival_hooks.append(prewarmer.answer_arriving)
    return prewarmer


def arriving(entry) -> types.SimpleNamespace:
    """An answer as the arrival hooks see it."""
    return types.SimpleNamespace(session_id=entry.session.id, sample=entry.session.sample(), options=OPTIONS)


# -- (a) the idle rule and a question arriving while a warm-up is planned ------


@pytest.mark.parametrize("which", ["the chat's question", "a re-ask beside the chat"])
async def test_a_question_arriving_while_a_warm_up_is_planned_is_not_run_beside_it(which):
    """In idle mode the engine is found idle, the warm-up's prompt is
    prepared in a worker thread, and a question arrives meanwhile: it finds
    no warm-up in flight to stop, so the warm-up must not start after it."""
    engine, registry = FakeEngine(), SessionRegistry()
    entry_with_frames(registry, seed=1)
    asking = entry_with_frames(registry, seed=2)
    prewarmer = prewarmer_for(engine, registry)
    engine.prepare_may_end.clear()
    step = asyncio.create_task(prewarmer._step())
    assert await asyncio.to_thread(engine.preparing.wait, 10), "the warm-up's prompt is being prepared"
    answer = arriving(asking)
    if which == "the chat's question":
        asking.answer = answer  # as answer_path.ask leaves it before the answer asks for its turn
    # (a re-ask runs in the session's side slot, which the registry does not list)
    await prewarmer.host.answer_gate.announce(answer)
    engine.prepare_may_end.set()
    await step
    assert engine.warmed == [] and prewarmer.stats.skipped_busy == 1, prewarmer.snapshot()
    asking.answer = None  # the answer ended: the engine is idle again
    await prewarmer._step()
    assert prewarmer.stats.warmups == 1  # put off, not lost


# -- (b) Enter reports: only a session's own warm-up gives way, pins take turns ---


async def test_one_sessions_enter_leaves_another_sessions_warm_up_running():
    engine, registry = FakeEngine(), SessionRegistry()
    theirs = entry_with_frames(registry, seed=3)  # first in line: warmed first
    mine = entry_with_frames(registry, seed=4)
    prewarmer = prewarmer_for(engine, registry)
    engine.warm_may_end.clear()
    step = asyncio.create_task(prewarmer._step())
    await engine.warm_started.wait()
    assert engine.warmed == [theirs.cache_salt]
    await prewarmer.question_now(mine.session.id)
    assert engine.cancelled == [] and prewarmer.stats.yielded == 0, prewarmer.snapshot()
    engine.warm_may_end.set()
    await step
    await prewarmer._step()  # then the pin, before anything else
    assert engine.warmed == [theirs.cache_salt, mine.cache_salt] and prewarmer.stats.warmups == 2


async def test_a_sessions_enter_still_stops_its_own_warm_up():
    engine, registry = FakeEngine(), SessionRegistry()
    mine = entry_with_frames(registry, seed=5)
    prewarmer = prewarmer_for(engine, registry)
    engine.warm_may_end.clear()
    step = asyncio.create_task(prewarmer._step())
    await engine.warm_started.wait()
    await prewarmer.question_now(mine.session.id)
    await step
    assert engine.cancelled == [mine.cache_salt] and prewarmer.stats.yielded == 1


async def test_a_page_posting_enter_in_a_loop_does_not_starve_another_sessions_pin():
    engine, registry = FakeEngine(), SessionRegistry()
    looping = entry_with_frames(registry, seed=6)  # first in the registry
    other = entry_with_frames(registry, seed=7)
    prewarmer = prewarmer_for(engine, registry)
    await prewarmer.question_now(other.session.id)
    for _ in range(3):
        await prewarmer.question_now(looping.session.id)
        await prewarmer._step()
    assert other.cache_salt in engine.warmed, engine.warmed
    assert engine.warmed.count(looping.cache_salt) == 1  # one pin for the question on its way
    assert prewarmer.stats.repeated_enter_reports == 2 and prewarmer.stats.pinned == 2
    # Reports posted together (each waits on the sample in a worker thread) take one pin.
    third = entry_with_frames(registry, seed=8)
    await asyncio.gather(*(prewarmer.question_now(third.session.id) for _ in range(5)))
    assert prewarmer.stats.pinned == 3 and prewarmer.stats.repeated_enter_reports == 6


async def test_pins_are_warmed_longest_unwarmed_session_first():
    engine, registry = FakeEngine(), SessionRegistry()
    recent = entry_with_frames(registry, seed=9)  # first in the registry, and warmed just now
    waited = entry_with_frames(registry, seed=10)
    prewarmer = prewarmer_for(engine, registry)
    prewarmer.interval_s = 3600.0  # only pins are warmed from here on
    await prewarmer._step()
    assert engine.warmed == [recent.cache_salt]
    await prewarmer.question_now(recent.session.id)
    await prewarmer.question_now(waited.session.id)
    await prewarmer._step()
    assert engine.warmed == [recent.cache_salt, waited.cache_salt]


# -- (c) the warm history is the chat the conversation keeps on the server -------


def finished(question: str, text: str) -> asking.Answer:
    reply = types.SimpleNamespace(text=text, stats=types.SimpleNamespace(cancelled=False))
    return asking.Answer(question, reply, sample=None, options=OPTIONS)


def answered(talking, answer: asking.Answer, *, continues_chat: bool = True, slot=None, chat=None) -> None:
    """The conversation's rule at a run's Done (what AnswerRun._end calls)."""
    run = types.SimpleNamespace(continues_chat=continues_chat, slot=slot or talking.chat,
                                chat=talking.chat_began if chat is None else chat)
    talking._answered(run, runs.Done(answer, runs.COMPLETED, None, True, True, "answer-id"))


@pytest.mark.parametrize("kind", ["webrtc", "ws", "replay"])
def test_a_chat_answer_is_kept_on_the_server_and_warmed_with(kind):
    entry = SessionRegistry().create(kind)
    entry.host = Standalone(engine=None)
    talking = entry
    talking.history.add("a0", "Hi?", "Hello.")
    answered(talking, finished("What is there?", " A cat. "))
    expected = (Turn("user", "Hi?"), Turn("assistant", "Hello."), Turn("user", "What is there?"),
                Turn("assistant", "A cat."))
    assert talking.history.turns() == expected and entry.warm_history == expected


@pytest.mark.parametrize("kind, how", [("ws", "no history"), ("realtime", "no history"), ("webrtc", "re-ask"),
                                        ("webrtc", "cleared"), ("webrtc", "said nothing")])
def test_an_answer_the_chat_does_not_continue_with_is_not_kept(kind, how):
    """A socket session without history: true and the Realtime door say
    continues_chat=False; a re-ask runs in the side slot; an answer of a
    chat cleared since it was asked, or one with no text, is not the chat's."""
    entry = SessionRegistry().create(kind)
    entry.host = Standalone(engine=None)
    talking = entry
    answer = finished("What is there?", "" if how == "said nothing" else "A cat.")
    answered(talking, answer, continues_chat=how != "no history",
             slot=entry.side if how == "re-ask" else None,
             chat=talking.chat_began - 1 if how == "cleared" else None)
    assert talking.history.turns() == () and entry.warm_history == ()


async def test_a_session_whose_tab_went_away_is_not_warmed_until_it_is_back():
    """A tab gone (a reload's grace, a dropped connection) asks nothing: the
    one-frame catch-up of a starting camera would spend on it the engine
    time the next tab's first question needs (the page bench's first
    questions, issue 49)."""
    engine, registry = FakeEngine(), SessionRegistry()
    prewarmer = prewarmer_for(engine, registry)
    prewarmer.frame_cost.per_frame_s = 0.9  # slow frames: starting sessions catch up one frame at a time
    gone, arriving = entry_with_frames(registry, seed=31), entry_with_frames(registry, seed=32)
    gone.away = True
    for _ in range(3):
        await prewarmer._step()
    assert engine.warmed == [arriving.cache_salt] * 3 and gone.session.encoded_in_buffer() == 0
    gone.away = False  # resumed
    await prewarmer._step()
    assert engine.warmed[-1] == gone.cache_salt


async def test_slow_frames_budget_every_session_and_a_starting_camera_is_warmed_beyond_the_share():
    """Issue 49: once frames are known to be slow, every session keeps to one
    new frame a question, also one no warm-up has reached; with the engine's
    share spent, a session whose camera just started still gets its first
    question's worth of one-frame warm-ups, one that has had them does not."""
    engine, registry = FakeEngine(), SessionRegistry()
    prewarmer = prewarmer_for(engine, registry)
    prewarmer.frame_cost.per_frame_s = 0.9  # the true-size CPU default
    first = entry_with_frames(registry, seed=21)
    second = entry_with_frames(registry, seed=22)
    prewarmer.stats.recent.append((time.monotonic(), 60.0))  # a minute of warm-ups just now
    assert prewarmer.stats.share(time.monotonic()) >= prewarmer.max_share
    await prewarmer._step()
    assert first.session.encode_budget == second.session.encode_budget == 1
    assert engine.warmed == [first.cache_salt] and prewarmer.stats.skipped_budget == 0
    assert first.session.encoded_in_buffer() == 1  # one frame: the newest
    for _ in range(3):  # one frame a warm-up, the longest unwarmed session first
        await prewarmer._step()
    assert engine.warmed == [first.cache_salt, second.cache_salt] * 2 and prewarmer.stats.skipped_budget == 0
    assert first.session.encoded_in_buffer() == second.session.encoded_in_buffer() == 2
    for entry in (first, second):  # each has had a question's worth: the share holds again
        prewarmer._warm[entry.session.id].warmed = 4
    first.session.add_frame(np.full((24, 32, 3), 7, np.uint8), t=200.0)
    await prewarmer._step()
    assert prewarmer.stats.warmups == 4 and prewarmer.stats.skipped_budget == 1
