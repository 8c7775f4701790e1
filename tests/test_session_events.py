"""One event stream per session (issue 44 point 3): what happens in a
session reaches every listener in order, typed, from the moment it
subscribes; a slow listener loses its oldest news, never the session's time;
Closed is always last. Through real vLLM: an answer's events, a settings
change, the session's end, the Talk stream and the page's server-sent events."""

from __future__ import annotations

import asyncio
import json

import pytest
from test_answer_path import filled_entry

from vidchat.conversation import asking
from vidchat.conversation.answers import AnswerOptions
from vidchat.conversation.events import (
    MAX_BEHIND,
    AnswerEvent,
    Closed,
    EventHub,
    QuestionAsked,
    SceneChanged,
    SettingsChanged,
)
from vidchat.conversation.registry import SessionRegistry, Standalone
from vidchat.conversation.runs import Delta, Done, Started
from vidchat.doors.webrtc_routes import server_sent, wire
from vidchat.media.session import SessionSettings

SHORT = AnswerOptions(max_tokens=6, temperature=0.0)


@pytest.mark.unit
async def test_listeners_get_events_in_order_from_when_they_subscribe_and_closed_last():
    hub = EventHub()
    hub.publish(SceneChanged(1.0))  # nobody listens yet: nobody gets it
    early, late = hub.subscribe(), None
    hub.publish(SceneChanged(2.0))
    late = hub.subscribe()
    hub.publish(SettingsChanged({"max_frames": 8}))
    hub.publish(Closed("stopped"))
    hub.publish(SceneChanged(3.0))  # after Closed: nothing more
    assert [await early.get(0) for _ in range(3)] == [SceneChanged(2.0), SettingsChanged({"max_frames": 8}),
                                                      Closed("stopped")]
    assert [await late.get(0) for _ in range(2)] == [SettingsChanged({"max_frames": 8}), Closed("stopped")]
    assert await early.get(timeout=0.01) is None  # waits, and times out without losing anything
    after = hub.subscribe()  # a listener of a closed session gets Closed at once
    assert await after.get(0) == Closed("stopped")
    early.close(), late.close(), after.close()
    assert hub.listeners == 0


@pytest.mark.unit
async def test_a_listener_that_falls_behind_loses_its_oldest_events_and_never_closed():
    hub = EventHub()
    with hub.subscribe() as slow:
        for i in range(MAX_BEHIND + 10):
            hub.publish(SceneChanged(float(i)))
        hub.publish(Closed("gone"))
        got = slow.pending()
    assert slow.dropped == 10 and len(got) == MAX_BEHIND + 1  # Closed is never the one dropped
    assert got[0] == SceneChanged(10.0) and got[-1] == Closed("gone")
    assert hub.listeners == 0


@pytest.mark.unit
async def test_a_listener_far_behind_loses_pieces_of_text_before_any_question_start_or_end():
    # Four questions asked at once, their answers streaming faster than a starved page reads:
    # the questions and each answer's end must all reach it, the text is on the answers.
    hub = EventHub()
    with hub.subscribe() as slow:
        for ticket in range(1, 5):
            hub.publish(QuestionAsked(ticket, f"q{ticket}", "typed", None, None))
        for ticket in range(1, 5):
            for _ in range(MAX_BEHIND // 2):
                hub.publish(AnswerEvent(Delta("w"), ticket=ticket))
            hub.publish(AnswerEvent("its Done", ticket=ticket))  # any run event that is not text
        got = slow.pending()
    assert slow.dropped == 4 + 4 * (MAX_BEHIND // 2 + 1) - MAX_BEHIND
    assert [e.ticket for e in got if isinstance(e, QuestionAsked)] == [1, 2, 3, 4]
    assert [e.ticket for e in got if isinstance(e, AnswerEvent) and not e.is_text] == [1, 2, 3, 4]


@pytest.mark.unit
async def test_the_events_generator_ends_with_closed_and_unsubscribes():
    hub = EventHub()
    seen = []

    async def listen():
        async for event in hub.events():
            seen.append(event)

    task = asyncio.create_task(listen())
    while hub.listeners == 0:
        await asyncio.sleep(0)  # the listener subscribes as it starts
    hub.publish(SceneChanged(1.0))
    hub.publish(Closed("end"))
    await asyncio.wait_for(task, 5)
    assert seen == [SceneChanged(1.0), Closed("end")] and hub.listeners == 0


@pytest.mark.engine
async def test_an_answer_a_settings_change_and_the_end_reach_the_sessions_stream(omni_engine):
    registry = SessionRegistry()
    entry = registry.create("ws", SessionSettings(evs_enabled=False, num_sample_frames=4))
    for i, frame in enumerate(filled_entry(n=4).session.sample().frames):
        entry.session.add_frame(frame, t=100.0 + i)
    entry.host = Standalone(omni_engine)
    talking = entry
    with talking.event_hub.subscribe() as events:
        asking.apply_settings(entry.session, omni_engine, SHORT, {"num_sample_frames": 3, "max_frames": 64},
                                   entry.event_hub)
        run = await talking.ask("What is there?", SHORT)
        await asyncio.wait_for(run.over.wait(), 60)
        await registry.close(entry.session.id, "stopped by the client")
        got = events.pending()
    kinds = [type(e.event).__name__ if isinstance(e, AnswerEvent) else type(e).__name__ for e in got]
    # max_frames was 64 already: only what changed is said.
    assert got[0] == SettingsChanged({"num_sample_frames": 3})
    answer_events = [e for e in got if isinstance(e, AnswerEvent)]
    assert isinstance(answer_events[0].event, Started) and isinstance(answer_events[-1].event, Done)
    assert sum(isinstance(e.event, Delta) for e in answer_events) >= 1
    done = answer_events[-1]
    assert done.answer_id and done.event.status == "completed" and not done.side
    assert "".join(e.event.text for e in answer_events if isinstance(e.event, Delta)) == done.event.text
    assert kinds[-1] == "Closed" and got[-1].reason == "stopped by the client"
    # The page's wire format says each of them.
    assert [wire(e)[0] for e in got][:3] == ["settings.changed", "question.asked", "answer.started"]
    asked = got[1]
    assert isinstance(asked, QuestionAsked) and asked.question == "What is there?" and asked.cause == "typed"
    assert {e.ticket for e in answer_events} == {asked.ticket}  # every event of its answer names it
    assert wire(got[-1]) == ("closed", {"reason": "stopped by the client"})


@pytest.mark.unit
async def test_the_server_sent_stream_says_each_event_and_ends_with_closed():
    hub = EventHub()
    with hub.subscribe() as events:
        hub.publish(SceneChanged(2.5))
        hub.publish(Closed("the tab went away"))
        chunks = [chunk async for chunk in server_sent(events)]
    assert chunks[0].startswith(b":")  # said at once: the page knows it is subscribed
    frames = [c.decode() for c in chunks[1:]]
    assert frames[0] == 'event: scene.changed\ndata: {"t": 2.5}\n\n'
    assert frames[-1].startswith("event: closed\n") and json.loads(frames[-1].split("data: ")[1]) == {
        "reason": "the tab went away"}
