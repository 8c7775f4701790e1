"""The one settings table (vidchat.conversation.asking): every question setting
is refused for the same reason wherever it comes from (the page and its
/ask API, session.config, replay's --set and a bundle's manifest); only the
name differs: the page says its own label."""

from __future__ import annotations

import dataclasses

import pytest

from vidchat.conversation import asking
from vidchat.conversation.answers import AnswerOptions
from vidchat.conversation.asking import ALIASES, SETTINGS
from vidchat.doors.socket.config import FIELDS, VIDCHAT_FIELDS, parse_config
from vidchat.media.session import SessionSettings

pytestmark = pytest.mark.unit

BAD = [("max_frames", 0), ("num_sample_frames", 2000), ("evs_threshold", 1.5), ("sample_seconds", 0),
       ("keepalive_s", -1), ("audio_last_seconds", 0.0), ("sampling", "random"), ("audio_mode", "loud"),
       ("frames_as", "gif"), ("max_tokens", 0), ("temperature", 2.5), ("seed", 2**64), ("scene_change_share", 0)]


def _reason(message: str) -> str:
    """What a good value is, as the refusal says it (the page shows numbers as floats)."""
    return message.split(" must be ", 1)[1].rsplit(", got ", 1)[0]


@pytest.mark.parametrize("name,value", BAD, ids=[n for n, _ in BAD])
def test_a_bad_value_is_refused_for_the_same_reason_at_every_door(name, value):
    spec = SETTINGS[name]
    with pytest.raises(ValueError) as socket_or_bundle:  # session.config, --set and manifests share this path
        asking.checked_settings({name: value})
    with pytest.raises(ValueError) as page:
        spec.from_page(value, high=4096 if name == "max_tokens" else None)
    assert str(page.value).startswith(f"{spec.label} must be "), page.value
    if spec.choices:  # the socket refuses these by type, naming the key as sent; the same choices
        assert str(socket_or_bundle.value).startswith(f"Invalid value for '{name}': expected one of ")
        assert ", ".join(spec.choices) in str(socket_or_bundle.value) and ", ".join(spec.choices) in str(page.value)
        return
    assert str(socket_or_bundle.value).startswith(f"{name} must be "), socket_or_bundle.value
    if name != "max_tokens":  # its bound is the model's context, unknown to a bundle read without one
        assert _reason(str(page.value)) == _reason(str(socket_or_bundle.value))


def test_every_setting_a_session_or_an_answer_has_is_in_the_table_and_the_socket_takes_it():
    settable = {f.name for f in dataclasses.fields(SessionSettings)} - {"audio_seconds"}
    settable |= {f.name for f in dataclasses.fields(AnswerOptions)} & set(SETTINGS)
    assert settable <= set(SETTINGS), settable - set(SETTINGS)
    for name, spec in SETTINGS.items():
        assert FIELDS[name].target == spec.target and FIELDS[name].nullable == spec.nullable
        assert (name in VIDCHAT_FIELDS) == (spec.origin == "vidchat")
        for alias in spec.aliases:
            assert ALIASES[alias] == name


def test_defaults_pass_their_own_table():
    SessionSettings().validate()
    asking.check_options(AnswerOptions(), None, SessionSettings())
    assert parse_config({"num_frames": 8, "use_audio_in_video": False}).session == {"num_sample_frames": 8}


def test_page_whole_numbers_are_exact():
    seed = SETTINGS["seed"]
    assert seed.from_page(2**63 - 1) == 2**63 - 1 and seed.from_page(-(2**63)) == -(2**63)
    assert SETTINGS["max_tokens"].from_page("32", high=4096) == 32 and SETTINGS["max_frames"].from_page(64.0) == 64
    with pytest.raises(ValueError, match="Seed must be a whole number that fits"):
        seed.from_page(2**63)
