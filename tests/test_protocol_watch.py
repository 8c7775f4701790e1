"""Watch, recording and history for socket clients (session.config/update ``watch``
and ``record``), through the real server and vLLM: the standing question is
asked at scene changes and its answers arrive unasked, marked
``"watch": true``; switching it off ends a watched answer still streaming
and nothing more is asked; a typed question is never cut short by a scene
change. Recording is refused without --record-dir (the suite's shared
server has none; tests/test_compare.py records on a server that has one)."""

from __future__ import annotations

import pytest
from test_protocol import MOVING, SHORT, check_answer, connect, expect_error, frames, recv, send, still_alive, until

from vidchat.doors.socket.config import ConfigError, parse_watch

WATCH = {"question": "What changed?", "every_s": 0.3}


async def _messages_until_updated(ws) -> list[dict]:
    out = []
    while not out or out[-1]["type"] != "session.updated":
        out.append(await recv(ws, 30))
    return out


def _answers(msgs: list[dict]) -> list[list[dict]]:
    """Split a message list into whole answers (start … done); anything else is left out."""
    answers, current = [], None
    for m in msgs:
        if m["type"] == "response.start":
            assert current is None, "a response.start before the previous answer's done"
            current = [m]
        elif current is not None:
            current.append(m)
            if m["type"] == "response.text.done":
                answers.append(current)
                current = None
    assert current is None, "an answer without its response.text.done"
    return answers


@pytest.mark.engine
async def test_socket_watch_asks_at_scene_changes_and_stops_when_switched_off(server):
    ws = await connect(server, watch=WATCH, vidchat_events=True, **SHORT)
    try:
        await frames(ws, n=4)  # four different scenes: the filter keeps each, and sees the cuts
        watched = await until(ws, "response.text.done", timeout=60)
        start = next(m for m in watched if m["type"] == "response.start")
        assert start.get("watch") is True, start
        done = check_answer(watched[watched.index(start):])
        assert done["stats"]["frames"] >= 1 and done["stats"]["answer_id"]
        await send(ws, {"type": "session.update", "watch": None})
        before_off = await _messages_until_updated(ws)
        # Any watched answer under way when the switch came ended first, whole.
        for answer in _answers(before_off):
            assert answer[0].get("watch") is True and answer[-1]["type"] == "response.text.done"
        assert before_off[-1]["settings"]["watch"] is None
        # New scenes, then a typed question: its answer is the next one, not a watched one.
        await frames(ws, MOVING[4:])
        await send(ws, {"type": "video.query", "text": "And now?"})
        typed = await until(ws, "response.text.done", timeout=60)
        assert [m for m in typed if m["type"] not in ("response.start", "response.text.delta",
                                                      "response.text.done")] == []
        assert "watch" not in typed[0], typed[0]
        check_answer(typed)
        await send(ws, {"type": "video.done"})
        rest = await until(ws, "session.done")
        assert not any(m["type"] == "response.start" for m in rest), "watch asked after it was switched off"
    finally:
        await ws.close()


@pytest.mark.engine
async def test_socket_watch_never_cuts_a_typed_answer_short(server):
    ws = await connect(server, max_tokens=48, temperature=0.0, vidchat_events=True)
    try:
        await frames(ws, n=2)
        await send(ws, {"type": "session.update", "watch": WATCH})
        assert (await _messages_until_updated(ws))[-1]["settings"]["watch"] == WATCH
        await send(ws, {"type": "video.query", "text": "Describe it."})
        # New scenes while the typed answer streams: the watch waits for it to end.
        await frames(ws, MOVING[2:])
        msgs = await until(ws, "response.text.done", timeout=60)
        answers = _answers(msgs)
        typed = next(a for a in answers if "watch" not in a[0])
        assert typed[-1]["stats"]["cancelled"] is False, "a scene change cut the typed answer short"
        # And the scenes are then asked about.
        while True:
            answer = _answers(await until(ws, "response.text.done", timeout=60))[-1]
            if answer[0].get("watch"):
                break
        await send(ws, {"type": "session.update", "watch": None})
        await _messages_until_updated(ws)
    finally:
        await ws.close()


@pytest.mark.engine
async def test_socket_watch_and_record_refusals_leave_the_session_running(server):
    ws = await connect(server, evs_enabled=False, **SHORT)
    try:
        await send(ws, {"type": "session.update", "watch": WATCH})
        await expect_error(ws, "session.update rejected: watch needs evs_enabled")
        await send(ws, {"type": "session.update", "watch": {"question": " "}})
        await expect_error(ws, "session.update rejected: watch.question must be a non-empty string")
        await send(ws, {"type": "session.update", "watch": {"question": "Hm?", "every_s": 0}})
        await expect_error(ws, "watch.every_s must be more than 0")
        await send(ws, {"type": "session.update", "record": True})
        await expect_error(ws, "session.update rejected: record: the server was started without --record-dir")
        await send(ws, {"type": "session.update", "record": "yes"})
        await expect_error(ws, "Invalid type for 'record': expected bool")
        await still_alive(ws)
        await frames(ws, n=2)
        await send(ws, {"type": "video.query", "text": "Still there?"})
        done = check_answer(await until(ws, "response.text.done"))
        assert "bundle" not in done["stats"]  # nothing recorded, nothing written
    finally:
        await ws.close()
    # In session.config, a refused watch or record is an error and the session goes on.
    ws = await connect(server, record=True, **SHORT)
    try:
        await expect_error(ws, "record: the server was started without --record-dir")
        await still_alive(ws)
    finally:
        await ws.close()


@pytest.mark.unit
def test_parse_watch():
    assert parse_watch(None) is None
    assert parse_watch({"question": " What? "}).describe() == {"question": "What?", "every_s": 10.0}
    assert parse_watch({"question": "Q", "every_s": 2}).every_s == 2.0
    for bad, said in (({}, "watch.question"), ({"question": 3}, "watch.question"),
                      ({"question": "Q", "every_s": True}, "expected number"),
                      ({"question": "Q", "every_s": "5"}, "expected number"),
                      ({"question": "Q", "every_s": -1}, "more than 0"),
                      ({"question": "Q", "every_s": float("nan")}, "more than 0"),
                      ({"question": "Q", "every_s": 1e9}, "at most 3600")):
        with pytest.raises(ConfigError, match=said):
            parse_watch(bad)


@pytest.mark.engine
async def test_socket_history_is_opt_in_and_kept_within_the_context(server):
    """Without history (the seed's way) each question goes alone; with
    ``history: true`` earlier questions and answers go with it (stats say how
    many turns of how many); false forgets them."""
    ws = await connect(server, **SHORT)
    try:
        await frames(ws, n=2)
        for _ in range(2):
            await send(ws, {"type": "video.query", "text": "What is there?"})
            done = check_answer(await until(ws, "response.text.done"))
            assert done["stats"]["history_turns"] == done["stats"]["history_turns_total"] == 0
        await send(ws, {"type": "session.update", "history": True})
        assert (await until(ws, "session.updated"))[-1]["settings"]["history"] is True
        kept = 0
        for _ in range(3):
            await send(ws, {"type": "video.query", "text": "And now?"})
            done = check_answer(await until(ws, "response.text.done"))
            # The tiny chat fits the context whole: all of it was sent.
            assert done["stats"]["history_turns"] == done["stats"]["history_turns_total"] == kept, done["stats"]
            kept += 2 if done["text"].strip() else 0  # each answered question adds its question and answer
        assert kept > 0
        await send(ws, {"type": "session.update", "history": False})
        await until(ws, "session.updated")
        await send(ws, {"type": "video.query", "text": "Alone again?"})
        done = check_answer(await until(ws, "response.text.done"))
        assert done["stats"]["history_turns_total"] == 0
    finally:
        await ws.close()
