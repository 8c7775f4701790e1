"""State the page shows, as a new user reads it (issue 23): a stopped answer
carries a mark, the re-ask list holds only the chat's answers and tells
the same question asked twice apart, a loaded bundle's message names only
what the page offers, and the settings speak in labels, not identifiers.
Server-side rules, without a model; the browser tests check they show."""

from __future__ import annotations

import types

import hostile_bundles as hb
import pytest

from vidchat.conversation import runs
from vidchat.conversation.asking import SETTINGS
from vidchat.conversation.events import REPLACED as REPLACED_WHY
from vidchat.conversation.events import STOPPED as STOPPED_WHY
from vidchat.conversation.events import AnswerEvent, QuestionAsked, QuestionRefused
from vidchat.conversation.registry import SessionRegistry
from vidchat.conversation.runs import CANCELLED, COMPLETED, FAILED, Delta, Done, Queued, Started
from vidchat.doors.page import REPLACED_MID, REPLACED_NOTE, STOPPED, notice
from vidchat.doors.page.chat import ChatTranscript
from vidchat.doors.page.questions import bundle_choices, load_bundle, reask_choices
from vidchat.media.session import SAMPLING_STRATEGIES, SessionSettings

pytestmark = pytest.mark.unit

def _said(text: str):
    return types.SimpleNamespace(question="Talk at length", spoken=None, reply=types.SimpleNamespace(text=text))


def _answer_event(event, ticket=1):
    return AnswerEvent(event, event.answer_id if isinstance(event, Done) else None, ticket=ticket)


def _done(text: str, status: str, error: str | None = None, started: bool = True):
    return _answer_event(Done(_said(text), status, error, started, True, None))


QUESTION = {"role": "user", "content": "Talk at length"}


@pytest.mark.parametrize("events, expected", [
    ([_answer_event(Started(_said(""))), _answer_event(Delta("So far")), _done("So far", CANCELLED)],
     [{"role": "assistant", "content": "So far"}, notice(STOPPED)]),
    ([_answer_event(Started(_said(""))), _done("", CANCELLED)], [notice(STOPPED)]),
    ([_answer_event(Queued(1)), _done("", CANCELLED, started=False)], [notice(STOPPED)]),
    ([QuestionRefused(1, STOPPED_WHY)], [notice(STOPPED)]),  # stopped before it was asked
    ([_answer_event(Started(_said(""))), _done("Whole.", COMPLETED)], [{"role": "assistant", "content": "Whole."}]),
    ([_answer_event(Started(_said(""))), _done("", FAILED, "boom")], [notice("⚠ boom")]),
], ids=["text so far", "empty bubble", "waiting", "not started", "whole answer", "error"])
async def test_an_answer_cut_short_is_marked_stopped_and_a_whole_one_is_not(events, expected):
    """The chat the page draws from the session's events (ChatTranscript)."""
    entry = SessionRegistry().create("webrtc", SessionSettings())
    transcript = ChatTranscript(types.SimpleNamespace(ready=True), entry)
    await transcript.apply(QuestionAsked(1, "Talk at length"))
    for event in events:
        await transcript.apply(event)
    assert transcript.messages() == [QUESTION, *expected]


async def test_four_questions_in_a_row_each_keep_their_bubble_and_say_what_became_of_them():
    """Sent 0.15 s apart (issue 59, point 11): the first was answering and
    is cut by the second; the second and third are replaced before they
    start; the fourth answers. Each question shows, with its fate."""
    entry = SessionRegistry().create("webrtc", SessionSettings())
    transcript = ChatTranscript(types.SimpleNamespace(ready=True), entry)
    await transcript.apply(QuestionAsked(1, "one"))
    await transcript.apply(_answer_event(Started(_said("")), ticket=1))
    await transcript.apply(_answer_event(Delta("so"), ticket=1))
    for ticket, question in ((2, "two"), (3, "three"), (4, "four")):
        await transcript.apply(QuestionAsked(ticket, question))
    await transcript.apply(_answer_event(Done(_said("so"), CANCELLED, None, True, True, None), ticket=1))
    await transcript.apply(QuestionRefused(2, REPLACED_WHY))
    await transcript.apply(QuestionRefused(3, REPLACED_WHY))
    await transcript.apply(_answer_event(Started(_said("")), ticket=4))
    await transcript.apply(_answer_event(Done(_said("Four."), COMPLETED, None, True, True, None), ticket=4))
    assert transcript.messages() == [
        {"role": "user", "content": "one"}, {"role": "assistant", "content": "so"}, notice(REPLACED_MID),
        {"role": "user", "content": "two"}, notice(REPLACED_NOTE),
        {"role": "user", "content": "three"}, notice(REPLACED_NOTE),
        {"role": "user", "content": "four"}, {"role": "assistant", "content": "Four."}]


def _answer(question: str, asked_at: float, temperature: float = 0.7, chat: int = 0, model: str = "tiny"):
    """What the re-ask list reads of an answer (``chat``: the chat it was asked in)."""
    return types.SimpleNamespace(question=question, asked_at=asked_at, sample=types.SimpleNamespace(frames=[0] * 16),
                                 options=types.SimpleNamespace(temperature=temperature), bundle_name="b.zip",
                                 chat=chat, model_name=model)


async def test_the_reask_list_tells_repeated_questions_apart_and_forgets_a_cleared_chat():
    registry = SessionRegistry()
    entry = registry.create("webrtc", SessionSettings())
    entry.session.timeline_start = 100.0
    state = types.SimpleNamespace(registry=registry)
    for t, model in ((112.0, "tiny"), (118.5, "tiny"), (118.6, "tiny-vl")):
        runs.remember(entry, _answer("What just changed?", t, model=model))
    labels = [label for label, _ in reask_choices(state, entry.session.id)]
    # Each entry names its model: Both models' two answers to one question read as two (issue 59, point 9).
    assert labels == ["latest, at 18.6 s: What just changed? (tiny-vl, 16 frames, T=0.7)",
                      "at 18.5 s: What just changed? (tiny, 16 frames, T=0.7)",
                      "at 12.0 s: What just changed? (tiny, 16 frames, T=0.7)"]

    loaded = {"bundle-x": _answer("Recorded?", 0.0)}
    entry.clear()
    assert reask_choices(state, entry.session.id, loaded) == bundle_choices(loaded) == [
        ("bundle: Recorded? (16 frames, b.zip)", "bundle-x")]
    runs.remember(entry, _answer("After the clear", 130.0, chat=1))
    assert [label for label, _ in reask_choices(state, entry.session.id)] == [
        "latest, at 30.0 s: After the clear (tiny, 16 frames, T=0.7)"]
    assert len(entry.answers) == 4  # still kept: their inputs stay served, the timings chart counts them


@pytest.mark.parametrize("second_model", [None, "tiny-vl"], ids=["one model", "two models"])
async def test_a_loaded_bundle_says_what_this_page_lets_you_do(tmp_path, second_model):
    pixels = hb.frames()
    path = hb.write_zip(tmp_path / "b.zip", pixels, hb.manifest(pixels))
    state = types.SimpleNamespace(compare_model_path=second_model)
    _, _, chosen, message = await load_bundle(state, str(path), {})
    assert chosen.startswith("bundle-") and "Loaded the bundle (2 frames)" in message
    assert "“Re-ask with these settings”" in message
    assert ("Choose the model" in message) == (second_model is not None)


def test_the_sampling_picker_shows_labels_and_sends_the_protocols_names():
    sampling = SETTINGS["sampling"]
    choices = sampling.page_choices()
    assert [value for _, value in choices] == list(SAMPLING_STRATEGIES)  # what the page sends is unchanged
    helps = [sampling.choice_help(value) for value in SAMPLING_STRATEGIES]
    for label, value in choices:
        assert label != value and "_" not in label, label
    assert all(helps) and len(set(helps)) == len(helps)  # each choice has its own help
    assert "_" not in SETTINGS["sample_seconds"].label  # "Window for latest_seconds" was an identifier


def _answered(history_turns: int, total: int, max_model_len: int | None = 8192):
    from vidchat.engine import ReplyStats

    stats = ReplyStats(history_turns=history_turns, history_turns_total=total)
    engine = types.SimpleNamespace(options=types.SimpleNamespace(max_model_len=max_model_len))
    reply = types.SimpleNamespace(stats=stats, engine=engine, text="an answer")
    return types.SimpleNamespace(reply=reply)


def test_a_chat_cut_to_fit_the_context_is_said_in_one_line_under_the_answer():
    from vidchat.doors.answer_routes import history_cut

    assert history_cut(_answered(36, 50)) == (
        "<p class='vc-history-cut'>14 older turns of the chat left out to fit the model's 8,192 tokens: "
        "the model got the last 36 of 50.</p>")
    assert "1 older turn of" in history_cut(_answered(3, 4))
    assert history_cut(_answered(4, 4)) == "" and history_cut(_answered(0, 0)) == ""
    assert "the model's context" in history_cut(_answered(2, 6, max_model_len=None))


def test_what_the_model_got_starts_with_where_the_record_and_bundle_download():
    from vidchat.doors.answer_routes import record_links_html

    plain, recorded = record_links_html("abcdefgh123", False), record_links_html("abcdefgh123", True)
    assert "/inputs/abcdefgh123/record.json" in plain and "bundle.zip" not in plain
    assert "/inputs/abcdefgh123/bundle.zip" in recorded and "session-bundles.zip" in recorded


@pytest.mark.parametrize("value, said", [
    (0, "you typed 0"), (-5, "you typed -5"), (None, "the box is empty or not a number"),
    ("", "the box is empty or not a number"), ("abc", "you typed 'abc'"), (float("nan"), "you typed nan"),
])
def test_a_page_number_box_is_refused_in_the_users_words(value, said):
    from vidchat.conversation.asking import OptionError
    from vidchat.doors.page.questions import positive_number

    with pytest.raises(OptionError) as refused:
        positive_number("At most every (s)", value, "seconds", "Watch is off.")
    assert str(refused.value) == f"At most every (s): enter seconds above 0 ({said}); Watch is off."
    assert positive_number("At most every (s)", 2.5, "seconds", "Watch is off.") == 2.5
