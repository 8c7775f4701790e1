"""Turn detection (vidchat.media.vad) on speech generated offline by espeak-ng,
mixed with silence, room noise, music-like tones and the page's own voice."""

from __future__ import annotations

import numpy as np
import pytest

from vidchat.devtools import synthetic as sa
from vidchat.media import AUDIO_RATE
from vidchat.media.vad import SpeechStarted, TurnDetector, TurnSettings, Utterance

pytestmark = pytest.mark.unit

# Delivered as WebRTC does: 20 ms packets.
PACKET = 320
BOUNDARY_TOLERANCE_S = 0.15

QUESTIONS = [
    ("What colour is the cup on the table?", dict()),
    ("How many people can you see right now?", dict(words_per_minute=190, voice="en-us")),
    ("Describe what just happened, please.", dict(words_per_minute=140, pitch=30)),
]


@pytest.fixture(scope="module")
def spoken():
    return [sa.speech(text, **kw) for text, kw in QUESTIONS]


def run(track: sa.Track, settings: TurnSettings | None = None, t0: float = 50.0,
        playback: list[tuple[float, float]] = ()) -> list:
    detector = TurnDetector(settings or TurnSettings())
    events = []
    for i in range(0, track.audio.size, PACKET):
        t = i / AUDIO_RATE
        detector.playback = any(a <= t < b for a, b in playback)
        events += detector.feed(track.audio[i:i + PACKET], t0 + t)
    return [e for e in events]


def utterances(events) -> list[Utterance]:
    return [e for e in events if isinstance(e, Utterance)]


def test_utterances_are_found_with_their_boundaries(spoken):
    parts = [(sa.silence(0.8), False)]
    for audio in spoken:
        parts += [(audio, True), (sa.silence(1.2), False)]
    track = sa.compose(parts, background=sa.room_noise(30, -55, seed=1))
    events = run(track, t0=50.0)
    found = utterances(events)
    assert len(found) == len(spoken), events
    starts = [e for e in events if isinstance(e, SpeechStarted)]
    assert len(starts) == len(spoken)
    for (true_start, true_end), utt, began in zip(track.speech, found, starts):
        print(f"truth {true_start:.3f}-{true_end:.3f}  speech {utt.speech_start - 50:.3f}-{utt.speech_end - 50:.3f}")
        assert abs(utt.speech_start - 50.0 - true_start) <= BOUNDARY_TOLERANCE_S
        assert abs(utt.speech_end - 50.0 - true_end) <= BOUNDARY_TOLERANCE_S
        # The utterance's audio is the speech plus the padding on each side.
        assert utt.start == pytest.approx(utt.speech_start - TurnSettings.pad_s)
        assert utt.end == pytest.approx(utt.speech_end + TurnSettings.pad_s)
        # Speech is announced (the barge-in point) once it lasted min_speech_s, before the utterance ends.
        assert began.start == utt.speech_start
        assert began.at - began.start == pytest.approx(TurnSettings.min_speech_s, abs=0.04)
        assert not utt.cut


@pytest.mark.parametrize("name, audio", [
    ("silence", sa.silence(6)),
    ("room noise", sa.room_noise(6, -45, seed=2)),
    ("loud room noise", sa.room_noise(6, -25, seed=3)),
    ("music-like tones", sa.tones(6, -20, seed=4)),
])
def test_sounds_that_are_not_speech_do_not_trigger(name, audio):
    assert run(sa.Track(audio)) == []


def test_the_pages_own_voice_does_not_trigger_while_it_speaks(spoken):
    """The answer read aloud comes back through the microphone, quieter
    (what the browser's echo cancellation leaves); with the page's playback
    flag it is not a question. The user talking over it at their own level is."""
    detector_settings = TurnSettings()
    user = spoken[0]
    echo = sa.scaled(spoken[1], -20)  # the page's reply, 20 dB down
    track = sa.compose([(sa.silence(0.5), False), (user, True), (sa.silence(1.0), False),
                        (echo, False), (sa.silence(1.0), False)])
    echo_start = 0.5 + user.size / AUDIO_RATE + 1.0
    playback = [(echo_start - 0.1, echo_start + echo.size / AUDIO_RATE + 0.3)]
    found = utterances(run(track, detector_settings, playback=playback))
    assert len(found) == 1  # the user's question only
    # Without the flag the same echo is speech: the flag is what keeps it out.
    assert len(utterances(run(track, detector_settings))) == 2
    # A user barging in at their own level while the page speaks is heard.
    barge = sa.compose([(sa.silence(0.5), False), (user, True), (sa.silence(1.0), False),
                        (spoken[2] + np.resize(echo, spoken[2].size), True), (sa.silence(1.0), False)])
    start2 = 0.5 + user.size / AUDIO_RATE + 1.0
    found = utterances(run(barge, detector_settings, playback=[(start2 - 0.1, start2 + 5)]))
    assert len(found) == 2


def test_bursts_shorter_than_min_speech_are_no_turn(spoken):
    burst = spoken[0][: int(0.12 * AUDIO_RATE)]
    track = sa.compose([(sa.silence(0.5), False), (burst, False), (sa.silence(1.5), False)])
    assert run(track) == []


def test_a_long_monologue_is_cut_at_max_utterance(spoken):
    settings = TurnSettings(max_utterance_s=1.5)
    found = utterances(run(sa.compose([(sa.silence(0.3), False), (spoken[0], True), (sa.silence(1), False)]),
                           settings))
    assert found and found[0].cut
    assert found[0].speech_end - found[0].speech_start == pytest.approx(1.5, abs=0.05)


def test_a_shorter_pause_setting_splits_what_a_longer_one_joins(spoken):
    a, b = spoken[0], spoken[1]
    track = sa.compose([(sa.silence(0.5), False), (a, True), (sa.silence(0.45), False), (b, True),
                        (sa.silence(1.2), False)])
    assert len(utterances(run(track, TurnSettings(min_silence_s=0.8)))) == 1
    assert len(utterances(run(track, TurnSettings(min_silence_s=0.3)))) == 2


def test_a_jump_in_the_audio_starts_the_detector_again(spoken):
    detector = TurnDetector()
    q = spoken[0]
    half = q.size // 2
    events = detector.feed(np.concatenate([sa.silence(0.5), q[:half]]), 10.0)
    # The stream restarts 30 s later (a new source): the half utterance is forgotten, not joined.
    events += detector.feed(np.concatenate([sa.silence(0.5), q, sa.silence(1.0)]), 40.0)
    found = utterances(events)
    assert len(found) == 1 and found[0].start > 40.0


@pytest.mark.parametrize("field, value", [("threshold", 1.5), ("min_silence_s", 0.0), ("min_speech_s", -1),
                                          ("max_utterance_s", float("nan")), ("pad_s", "0.1")])
def test_bad_settings_are_refused_with_the_field_named(field, value):
    with pytest.raises(ValueError, match=field):
        TurnSettings(**{field: value}).validate()
