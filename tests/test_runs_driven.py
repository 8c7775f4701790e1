"""The conversation runs its answers (issue 44 point 1): an answer run is
driven by a task of the conversation, not by whoever reads it. It always
ends with one Done, read or not; doors listen and may leave; the last one to
leave before the Done cancels it; a cancelled run whose engine never lets go
is force-done after a grace. Through real vLLM on the tiny model, and the
page's Clear-during-prepare race (review item 2) through the page's own
answer functions."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import types

import pytest
from conftest import eventually_async
from test_answer_path import LONG, filled_entry

from vidchat.conversation import asking, runs
from vidchat.conversation.answers import AnswerOptions
from vidchat.conversation.registry import Standalone
from vidchat.conversation.runs import CANCELLED, COMPLETED, Delta, Done
from vidchat.doors.page import questions as page_answers

SHORT = AnswerOptions(max_tokens=6, temperature=0.0)


async def read_all(reader, log: list) -> None:
    async with contextlib.aclosing(reader) as events:
        async for event in events:
            log.append(event)


@pytest.mark.engine
async def test_a_run_nobody_reads_ends_by_itself_and_frees_its_slot(omni_engine):
    entry = filled_entry()
    entry.host = Standalone(omni_engine)
    talking = entry
    run = await talking.ask("What is there?", SHORT)
    await asyncio.wait_for(run.over.wait(), 60)  # nobody ever read it
    assert run.over.is_set() and entry.answer is None and not talking.answering
    done = await run.finish()
    assert isinstance(done, Done) and done.status == COMPLETED and done.answer.reply.stats.completion_tokens > 0
    # A late reader still gets the whole run, first event to Done.
    log: list = []
    await read_all(run.events(), log)
    assert type(log[0]).__name__ == "Started" and log[-1] is done
    assert omni_engine.running_requests == 0


@pytest.mark.engine
async def test_an_answer_nobody_listens_to_is_stopped_after_the_grace_and_a_listener_keeps_it(omni_engine,
                                                                                          monkeypatch):
    """Abort-on-disconnect for every door: no reader of the run, no listener
    of the session's events (a tab's chat feed, an API caller's stream) and
    nobody awaiting it: the answer stops once nobody has listened for
    UNHEARD_GRACE_S. One listener of the session's events keeps it going."""
    monkeypatch.setattr(runs, "UNHEARD_GRACE_S", 0.3)
    entry = filled_entry()
    entry.host = Standalone(omni_engine)
    talking = entry
    options = AnswerOptions(max_tokens=400, temperature=0.0)
    with entry.event_hub.subscribe() as listening:
        heard = await talking.ask("Tell me everything.", options)
        await asyncio.wait_for(heard.over.wait(), 120)
        assert listening.pending()  # it was listening all along
    assert (await heard.finish()).status == COMPLETED
    assert heard.answer.reply.stats.completion_tokens == 400
    unheard = await talking.ask("Tell me everything.", options)
    await asyncio.wait_for(unheard.over.wait(), 120)
    done = unheard._events[-1]
    assert done.status == CANCELLED and done.answer.cancelled_by == "nobody listens"
    assert 0 < done.answer.reply.stats.completion_tokens < 400
    assert omni_engine.running_requests == 0


@pytest.mark.engine
async def test_the_last_reader_leaving_mid_answer_cancels_it_and_one_left_keeps_it(omni_engine):
    entry = filled_entry()
    entry.host = Standalone(omni_engine)
    talking = entry
    run = await talking.ask("Tell me everything.", LONG)
    first, second = run.events(), run.events()
    kept: list = []
    keeper = asyncio.create_task(read_all(second, kept))
    async for event in first:
        if isinstance(event, Delta):
            break
    await first.aclose()  # one door leaves: the other still listens, the answer goes on
    await eventually_async(lambda: sum(isinstance(e, Delta) for e in kept) >= 5, 60, "the answer streams on")
    assert run.done is None and not run.answer._abandon.is_set()
    keeper.cancel()  # the last door leaves without reading to the end
    with contextlib.suppress(asyncio.CancelledError):
        await keeper
    await asyncio.wait_for(run.over.wait(), 30)
    done = await run.finish()
    assert done.status == CANCELLED and done.started
    assert done.answer.reply.stats.completion_tokens < LONG.max_tokens
    await eventually_async(lambda: omni_engine.running_requests == 0, 10, "the engine request is aborted")


@pytest.mark.engine
async def test_clear_while_a_page_question_is_prepared_never_leaves_a_run_behind(omni_engine, monkeypatch, caplog):
    """Review item 2: Clear chat pressed while the page's question was
    prepared left a run nobody read; it never finished, the next question
    stalled 5 s (PREEMPT_GRACE_S) and the session's answer slot stayed set."""
    entry = filled_entry()
    registry = types.SimpleNamespace(get=lambda sid: entry if sid == entry.session.id else None)
    state = Standalone(omni_engine, registry=registry)
    state.ready = True  # what the page reads of the app besides its host
    entry.host = state

    preparing, release = threading.Event(), threading.Event()
    real_prepare = asking.prepare

    def held_prepare(*args, **kwargs):
        preparing.set()
        release.wait(30)
        return real_prepare(*args, **kwargs)

    monkeypatch.setattr(asking, "prepare", held_prepare)
    settings = [4, "uniform", 10, False, 0.95, 64, "images", False, 6, 0.0, "5"]
    updates: list = []

    async def ask_on_page(text: str) -> None:
        async for update in page_answers.respond(state, text, [], entry.session.id, *settings):
            updates.append(update)

    asked = asyncio.create_task(ask_on_page("What is there?"))
    await asyncio.to_thread(preparing.wait, 30)
    await page_answers.clear_chat(state, entry.session.id)  # while the question is prepared
    release.set()
    await asyncio.wait_for(asked, 30)
    assert entry.answer is None  # the question for the old chat never started
    monkeypatch.setattr(asking, "prepare", real_prepare)
    caplog.set_level(logging.INFO, logger="vidchat.conversation")
    # The next question starts at once: nothing holds the chat.
    talking = entry
    run = await talking.ask("And now?", SHORT)
    done = await asyncio.wait_for(run.finish(), 60)
    assert done.status == COMPLETED
    assert "did not finish" not in caplog.text and "did not end within" not in caplog.text
    assert entry.answer is None and omni_engine.running_requests == 0


class _StuckReply:
    """A reply whose engine never lets go: aborting it does not end the stream."""

    def __init__(self) -> None:
        self.text = ""
        self.stats = types.SimpleNamespace(cancelled=False, completion_tokens=0, prompt_tokens=0, cached_tokens=0,
                                           frames=0, history_turns=0, history_turns_total=0, finish_reason=None)
        self.aclosed = threading.Event()
        self._forever = asyncio.Event()

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        if not self.text:
            self.text = "first"
            return "first"
        await self._forever.wait()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.aclosed.set()


@pytest.mark.unit
async def test_a_cancelled_run_whose_engine_hangs_is_force_done_after_the_grace(monkeypatch):
    monkeypatch.setattr(runs, "CANCEL_GRACE_S", 0.2)
    entry = filled_entry()
    reply = _StuckReply()
    answer = asking.Answer("q", reply, entry.session.sample(), SHORT, session_id=entry.session.id)
    entry.answer = answer
    entry.host = Standalone(engine=None)
    talking = entry
    run = runs.AnswerRun(talking, entry, answer, record=False, continues_chat=True, remember=True)
    log: list = []
    reading = asyncio.create_task(read_all(run.events(), log))
    await eventually_async(lambda: any(isinstance(e, Delta) for e in log), 5, "the first delta")
    await run.cancel("stopped")
    await asyncio.wait_for(reading, 10)  # ends on the forced Done, the stream still stuck
    done = log[-1]
    assert isinstance(done, Done) and done.status == CANCELLED and not done.current
    assert run.done is not None and run.over.is_set() and entry.answer is None and reply.aclosed.is_set()
    assert sum(isinstance(e, Done) for e in log) == 1
    run._task.cancel()  # the stuck stream itself (an engine that hangs) is not the run's to end


@pytest.mark.engine
async def test_the_chat_lives_on_the_server_and_clear_empties_it(omni_engine):
    """Issue 44 point 2: the page sends only its question; the model gets
    the conversation's own chat (kept on the server, appended at each Done),
    and Clear chat empties it. Here the page's event is given no chat at all."""
    entry = filled_entry()
    registry = types.SimpleNamespace(get=lambda sid: entry if sid == entry.session.id else None)
    state = Standalone(omni_engine, registry=registry)
    state.ready = True  # what the page reads of the app besides its host
    entry.host = state
    settings = [4, "uniform", 10, False, 0.95, 64, "images", False, 6, 1.0, "5"]

    async def ask_on_page(text: str) -> dict:
        last = None
        async for update in page_answers.respond(state, text, [], entry.session.id, *settings):
            last = update
        return last[2]  # the answer's details: its stats

    first = await ask_on_page("What is there?")
    assert first["history_turns"] == 0 and first["completion_tokens"] >= 1
    second = await ask_on_page("And now?")
    assert second["history_turns_total"] == 2  # the first exchange, from the server's chat
    talking = entry
    assert [turn.role for turn in talking.history.turns()] == ["user", "assistant"] * 2
    assert entry.warm_history == talking.history.turns()  # the next warm-up starts as the question will
    await page_answers.clear_chat(state, entry.session.id)
    assert talking.history.turns() == () and entry.warm_history == ()
    third = await ask_on_page("Anything else?")
    assert third["history_turns_total"] == 0
