"""The conversation core (vidchat.conversation) through real vLLM: an answer
run's events, the one preemption rule for the chat, re-asks beside it, and
runs that wait for a place."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from conftest import eventually_async
from test_answer_path import LONG, filled_entry

from vidchat.conversation import asking
from vidchat.conversation.answers import AnswerQueue
from vidchat.conversation.registry import Standalone
from vidchat.conversation.runs import CANCELLED, COMPLETED, Delta, Done, Queued, Started

pytestmark = pytest.mark.engine

SHORT = asking.AnswerOptions(max_tokens=6, temperature=0.0)


def kinds(events) -> list[str]:
    return [type(e).__name__ for e in events]


async def read(run, log: list, name: str):
    async with contextlib.aclosing(run.events()) as events:
        async for event in events:
            log.append((name, event))


async def test_a_run_streams_its_events_in_order_and_ends_with_one_done(omni_engine):
    entry = filled_entry()
    entry.host = Standalone(omni_engine)
    talking = entry
    run = await talking.ask("What is there?", asking.AnswerOptions(max_tokens=8, temperature=0.0))
    log: list = []
    await read(run, log, "q")
    names = kinds(e for _, e in log)
    assert names[0] == "Started" and names[-1] == "Done" and names.count("Done") == 1, names
    assert set(names[1:-1]) <= {"Delta"}
    done = log[-1][1]
    assert done.status == COMPLETED and done.started and done.current and done.error is None
    assert done.text == "".join(e.text for _, e in log if isinstance(e, Delta))
    assert done.answer_id in entry.answers  # its inputs are kept for the session's page
    assert run.over.is_set() and entry.answer is None and omni_engine.running_requests == 0


async def test_a_newer_question_cancels_the_running_answer_whose_done_comes_first(omni_engine):
    entry = filled_entry()
    entry.host = Standalone(omni_engine)
    talking = entry
    log: list = []
    first = await talking.ask("Tell me everything.", LONG)
    reading = asyncio.create_task(read(first, log, "first"))
    await eventually_async(lambda: sum(isinstance(e, Delta) for _, e in log) >= 3, 60, "the first answer streams")
    second = await talking.ask("And now?", SHORT)  # returns once the first run's Done was delivered
    assert log[-1][0] == "first" and isinstance(log[-1][1], Done), kinds(e for _, e in log[-3:])
    done = log[-1][1]
    assert done.status == CANCELLED and done.started and not done.current
    await reading
    assert omni_engine.running_requests <= 1  # never the two at once
    await read(second, log, "second")
    assert [name for name, e in log if isinstance(e, Started)] == ["first", "second"]
    assert log[-1][1].status == COMPLETED and log[-1][1].current
    assert omni_engine.running_requests == 0


async def test_a_reask_runs_beside_the_chat_and_leaves_its_answer_running(omni_engine):
    entry = filled_entry()
    entry.host = Standalone(omni_engine)
    talking = entry
    log: list = []
    chat_run = await talking.ask("Describe it.", asking.AnswerOptions(max_tokens=40, temperature=0.0, seed=1))
    reading = asyncio.create_task(read(chat_run, log, "chat"))
    await eventually_async(lambda: any(isinstance(e, Delta) for _, e in log), 60, "the chat's answer streams")
    original = chat_run.answer
    again = await talking.reask(original, SHORT, asking.frozen_sample(original))
    assert entry.answer is original  # the chat's slot is untouched
    await read(again, log, "reask")
    await reading
    chat_done = next(e for name, e in log if name == "chat" and isinstance(e, Done))
    reask_done = next(e for name, e in log if name == "reask" and isinstance(e, Done))
    assert chat_done.status == COMPLETED and not chat_done.answer.reply.stats.cancelled
    assert reask_done.status == COMPLETED and reask_done.current
    assert reask_done.answer.reply.stats.inputs_sha256 == original.reply.stats.inputs_sha256
    assert entry.warm_history and entry.warm_history[-2].text == "Describe it."  # a re-ask is no chat turn


async def test_a_run_waiting_for_its_place_says_so_and_a_cancel_there_ends_it_unstarted(omni_engine):
    gate = AnswerQueue(1)
    busy, waiting = filled_entry(), filled_entry()
    busy.host = waiting.host = Standalone(omni_engine, gate)
    holder = await busy.ask("Go on.", LONG)
    holder_log: list = []
    holding = asyncio.create_task(read(holder, holder_log, "holder"))
    await eventually_async(lambda: any(isinstance(e, Started) for _, e in holder_log), 60, "the holder starts")
    queued = await waiting.ask("Me too?", SHORT)
    log: list = []
    reading = asyncio.create_task(read(queued, log, "queued"))
    await eventually_async(lambda: any(isinstance(e, Queued) for _, e in log), 30, "the second run is queued")
    assert log[0][1] == Queued(ahead=0)  # first in line, behind the one generating
    await queued.cancel()
    await reading
    done = log[-1][1]
    assert isinstance(done, Done) and not done.started and done.status == CANCELLED
    assert not any(isinstance(e, Started) for _, e in log)
    await holder.cancel()
    await holding
    assert holder_log[-1][1].status == CANCELLED and omni_engine.running_requests == 0


async def test_a_question_or_history_beyond_the_caps_is_refused_naming_the_field_and_changes_nothing(omni_engine):
    """Issue 43 point 4: one cap for a question's text and one for its
    history, in the settings table, checked in the core every door asks
    through, before the running answer is touched."""
    from vidchat.conversation.asking import MAX_HISTORY_CHARS, MAX_HISTORY_TURNS, MAX_QUESTION_CHARS
    from vidchat.engine import Turn

    entry = filled_entry()
    entry.host = Standalone(omni_engine)
    talking = entry
    log: list = []
    running = await talking.ask("Tell me everything.", LONG)
    reading = asyncio.create_task(read(running, log, "running"))
    await eventually_async(lambda: any(isinstance(e, Delta) for _, e in log), 60, "the answer streams")
    refusals = [
        (dict(question="x" * (MAX_QUESTION_CHARS + 1)),
         f"question must be at most {MAX_QUESTION_CHARS} characters, got {MAX_QUESTION_CHARS + 1}", "question"),
        (dict(question="Short?", history=[Turn("user", "hi")] * (MAX_HISTORY_TURNS + 1)),
         f"history must be at most {MAX_HISTORY_TURNS} turns", "history"),
        (dict(question="Short?", history=[Turn("user", "y" * (MAX_HISTORY_CHARS // 2 + 1))] * 2),
         f"history must be at most {MAX_HISTORY_CHARS} characters in all", "history"),
    ]
    for kwargs, message, field in refusals:
        question = kwargs.pop("question")
        with pytest.raises(asking.QuestionTooLarge) as refused:
            await talking.ask(question, SHORT, **kwargs)
        assert message in str(refused.value) and refused.value.field == field
    # The answer that was running was not cancelled by the refusals.
    assert not any(isinstance(e, Done) for _, e in log) and talking.answering
    await running.cancel()
    await reading
    # A question within the caps is answered, with the longest history allowed (cut to the model's context).
    ok = await talking.ask("And now?", SHORT, history=[Turn("user", "hi"), Turn("assistant", "yo")]
                           * (MAX_HISTORY_TURNS // 2))
    await read(ok, log, "ok")
    assert log[-1][1].status == COMPLETED


@pytest.mark.engine
async def test_a_sampled_answer_records_the_seed_it_drew_and_replays_exactly_with_it(omni_engine):
    """No seed set: one is drawn for the answer and recorded with it (its
    summary, hence its record and bundle), so the same inputs with that seed
    give the same sampled answer; another draw gives another seed."""
    entry = filled_entry()
    entry.host = Standalone(omni_engine)
    talking = entry
    sampled = asking.AnswerOptions(max_tokens=12, temperature=1.0)
    first = await (await talking.ask("Describe it.", sampled)).finish()
    seed = first.answer.options.seed
    assert isinstance(seed, int) and first.answer.summary()["seed"] == seed
    assert entry.warm_options.seed is None  # what the next warm-up prepares for is what was asked
    again = await talking.reask(first.answer, sampled.updated(seed=seed), asking.frozen_sample(first.answer))
    assert (await again.finish()).text == first.text
    other = await (await talking.ask("Describe it.", sampled)).finish()
    assert other.answer.options.seed != seed
