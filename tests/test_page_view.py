"""The page's chat panel as the server draws it (issue 58 point 4): a
question is one request that returns its ticket, and the chat is said from
the session's events as HTML, Markdown rendered on the server with raw HTML
off; each draw names only what changed. Server-side rules, without a model
or a browser (the page's browser tests check they show)."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest
from conftest import ROOT

from vidchat.conversation.events import STOPPED as STOPPED_WHY
from vidchat.conversation.events import ChatCleared, Notice, QuestionAsked, QuestionRefused
from vidchat.conversation.registry import SessionRegistry
from vidchat.doors.page.chat import ChatTranscript, ChatView, message_html, notice, typing
from vidchat.doors.page.questions import PAGE_SETTINGS, ask_typed, page_defaults, sent_settings
from vidchat.media.session import SessionSettings

pytestmark = pytest.mark.unit


def test_a_models_or_users_markup_is_shown_as_text_and_markdown_is_rendered():
    said = message_html({"role": "assistant", "content": "<img src=x onerror=alert(1)> **bold**\n```\ncode\n```"})
    assert "<img" not in said and "&lt;img src=x onerror=alert(1)&gt;" in said
    assert "<strong>bold</strong>" in said and "<pre><code>code\n</code></pre>" in said
    assert "vc-copy" in said and "data-testid='bot'" in said  # an answer has its copy button
    asked = message_html({"role": "user", "content": "[x](javascript:alert(1)) <b>hi</b>"})
    assert "href" not in asked and "&lt;b&gt;" in asked and "data-testid='user'" in asked
    # A question is shown as it was typed, not as Markdown (issue 59, point 11).
    typed = message_html({"role": "user", "content": "*star* **two**\n<img src=x>"})
    assert "<em>" not in typed and "<strong>" not in typed and "<img" not in typed
    assert "*star* **two**\n&lt;img src=x&gt;" in typed and "vc-typed" in typed
    # The page's own markup stays markup: "Thinking…", and a fold under its title.
    assert "<span class='vc-typing'>" in message_html(typing())
    fold = message_html({"role": "assistant", "content": "<div class='vc-inputs'>x</div>",
                         "metadata": {"title": "What the model got: <2> frames", "status": "done"}})
    assert "<details class='vc-fold'>" in fold and "<div class='vc-inputs'>x</div>" in fold
    assert "&lt;2&gt;" in fold  # the title is text
    # A notice is Markdown too (its words may quote an error), without a copy button.
    warned = message_html(notice("⚠ <script>x</script>"))
    assert "<script>" not in warned and "vc-notice" in warned and "vc-copy" not in warned


async def test_each_draw_names_only_what_changed_and_a_clear_starts_a_new_chat():
    entry = SessionRegistry().create("webrtc", SessionSettings())
    transcript = ChatTranscript(types.SimpleNamespace(ready=True), entry, shows_typing=True)
    view = ChatView()
    first = view.draw(transcript)
    assert first["reset"] and first["order"] == [] and first["ended"] == []
    await transcript.apply(QuestionAsked(1, "What is there?"))
    asked = view.draw(transcript)
    assert not asked["reset"] and asked["order"] == ["q1.0", "q1.1"] and set(asked["html"]) == {"q1.0", "q1.1"}
    assert "vc-typing" in asked["html"]["q1.1"]
    assert view.draw(transcript)["html"] == {}  # nothing changed, nothing sent again
    await transcript.apply(QuestionRefused(1, STOPPED_WHY))
    stopped = view.draw(transcript)
    assert stopped["ended"] == [1] and stopped["order"] == ["q1.0", "q1.1"] and list(stopped["html"]) == ["q1.1"]
    assert "(stopped)" in stopped["html"]["q1.1"]
    await transcript.apply(Notice("A notice"))
    assert view.draw(transcript)["order"] == ["q1.0", "q1.1", "m1"]
    await transcript.apply(QuestionAsked(2, "And now?"))
    assert view.draw(transcript)["ended"] == []
    await transcript.apply(ChatCleared(chat=3))  # Clear took the chat's turn 3: the new chat's number
    cleared = view.draw(transcript)
    assert cleared["reset"] and cleared["order"] == [] and cleared["generation"] == 3 != first["generation"]
    assert cleared["ended"] == [2]  # its chat went before it ended: the page counts it over


def test_a_questions_settings_come_by_name_and_one_left_out_is_the_pages_default():
    settings = types.SimpleNamespace(frames_per_question=8, max_images=16, sampling="uniform", frames_as="images",
                                     max_tokens=256, temperature=0.7, system_prompt="", record_dir="")
    state = types.SimpleNamespace(settings=settings)
    defaults = page_defaults(state)
    assert list(defaults) == list(PAGE_SETTINGS)
    assert defaults["record"] is False
    # --record-dir: a tab records every answer until its tick is cleared (issue 59, point 4).
    assert page_defaults(types.SimpleNamespace(settings=types.SimpleNamespace(
        **{**vars(settings), "record_dir": "/tmp/rec"})))["record"] is True
    sent = sent_settings(state, {"max_tokens": 6, "sampling": "The newest frames", "unknown": 1})
    assert sent[PAGE_SETTINGS.index("max_tokens")] == 6
    assert sent[PAGE_SETTINGS.index("sampling")] == "latest_frames"  # the picker's label names its strategy
    assert sent[PAGE_SETTINGS.index("num_sample_frames")] == 8
    assert sent_settings(state, None) == tuple(defaults.values())


async def test_a_question_is_one_call_that_returns_its_ticket_or_why_it_was_not_asked():
    from vidchat.app.settings import Settings
    from vidchat.app.state import AppState

    state = AppState(settings=Settings(), model_path="none")
    entry = state.registry.create("webrtc", SessionSettings())
    with entry.event_hub.subscribe() as events:
        refused = await ask_typed(state, entry, "What?", {"seed": "soon"})
        assert "Settings not accepted" in refused["refused"] and "Seed" in refused["refused"]
        said = await events.get(timeout=1)
        assert isinstance(said, Notice) and refused["refused"] in said.text
        with pytest.raises(ValueError):
            await ask_typed(state, entry, "   ", {})
        # A misspelt or unknown setting, or settings that are no object, are refused by name, not ignored.
        with pytest.raises(ValueError, match="unknown setting.s. bogus: the page's are num_sample_frames"):
            await ask_typed(state, entry, "What?", {"bogus": 1})
        with pytest.raises(ValueError, match="'settings' must be an object"):
            await ask_typed(state, entry, "What?", [1])
        asked = await ask_typed(state, entry, "What is there?", {"max_tokens": 6})
        assert asked == {"ticket": entry.turn}
        first = await events.get(timeout=1)
        assert isinstance(first, QuestionAsked) and first.ticket == asked["ticket"]
        assert first.question == "What is there?"
    await entry.stop()


def test_no_module_of_vidchat_touches_gradios_private_state():
    private = {"state_holder", "config_values", "blocks_config", "session_data", "_id"}
    found = []
    for path in sorted(Path(ROOT, "vidchat").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
            elif isinstance(node, ast.Constant) and node.value in private:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert found == []


def test_a_stream_says_its_state_when_it_has_no_frames_and_its_frames_show_the_time_of_day():
    """Issue 59, point 6: a question on a stream of the server's with no frames
    speaks of that stream (no Start camera there), and its frames are
    captioned by the time of day they came, not by a file position."""
    import re
    import time

    from vidchat.doors.answer_routes import frame_caption, wall_clock
    from vidchat.doors.page.chat import no_frames_hint

    down = types.SimpleNamespace(stream=types.SimpleNamespace(
        snapshot=lambda: {"name": "cam", "state": "reconnecting", "error": "connection refused"}))
    assert no_frames_hint(down) == ("The stream **cam** is reconnecting: connection refused; "
                                    "ask again once its frames come.")
    assert "Start camera" in no_frames_hint(types.SimpleNamespace(stream=None))
    assert frame_caption(3, 1.25, 2.1, wall="14:03:05.2") == "#3 · 1.25 s · 14:03:05.2"
    assert "file" in frame_caption(3, 1.25, 2.1)
    assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d", wall_clock(time.monotonic()))
