"""Talk mode (vidchat.conversation.modes) through real vLLM on the tiny omni model: an
utterance heard in a session's audio becomes a question whose audio is
exactly the utterance, speech during an answer aborts it in vLLM
(barge-in), and the listener ends with its session."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from conftest import eventually_async

from vidchat.conversation import asking, modes
from vidchat.conversation.answers import AnswerOptions
from vidchat.conversation.registry import SessionRegistry, Standalone
from vidchat.devtools import synthetic as sa
from vidchat.engine import NO_SPOKEN_QUESTIONS, EngineError
from vidchat.media import AUDIO_RATE
from vidchat.media.session import SessionSettings
from vidchat.media.vad import TurnSettings, Utterance

pytestmark = pytest.mark.engine

SHORT = AnswerOptions(max_tokens=4, temperature=0.0)
LONG = AnswerOptions(max_tokens=3000, temperature=0.0)


@pytest.fixture(scope="module")
def question():
    return sa.speech("What is on the table in front of me?")


async def vad_loaded(listener) -> None:
    await eventually_async(lambda: listener._detector is not None, 10, "the listener's VAD model is loaded")


def new_entry(registry: SessionRegistry, t0: float, seconds: float = 12.0, fps: float = 2.0):
    """A session with a frame every 1/fps s over `seconds` from t0 (each one different: all kept)."""
    entry = registry.create("webrtc", SessionSettings(evs_enabled=False, num_sample_frames=4))
    rng = np.random.default_rng(0)
    for i in range(int(seconds * fps)):
        entry.session.add_frame(rng.integers(0, 255, (96, 128, 3), dtype=np.uint8), t=t0 + i / fps)
    return entry


def feed(entry, audio: np.ndarray, t: float) -> None:
    for i in range(0, audio.size, 320):  # 20 ms packets, as WebRTC delivers them
        entry.session.add_audio(audio[i:i + 320], t + i / AUDIO_RATE)


async def next_utterance(listener, timeout: float = 10.0):
    return await asyncio.wait_for(listener.next_utterance(), timeout)


async def drain(answer) -> None:
    async for _ in answer.reply:
        pass


async def test_an_utterance_becomes_a_question_whose_audio_is_the_utterance(omni_engine, question):
    registry = SessionRegistry()
    t0 = time.monotonic()
    entry = new_entry(registry, t0)
    listener = modes.listener(entry, TurnSettings())
    await vad_loaded(listener)  # the listener starts from the audio it finds: none yet
    track = sa.compose([(sa.silence(1.0), False), (question, True), (sa.silence(1.0), False)])
    feed(entry, track.audio, t0 + 2.0)
    spoken = await next_utterance(listener)
    true_start, true_end = (t0 + 2.0 + x for x in track.speech[0])
    assert abs(spoken.speech_start - true_start) <= 0.15 and abs(spoken.speech_end - true_end) <= 0.15

    answer = await asking.ask(omni_engine, entry.chat, "", SHORT, spoken=spoken)
    await drain(answer)
    asking.release(entry.chat, answer)
    stats = answer.summary()
    origin = answer.sample.origin
    # The audio the model got is the utterance's span, sample for sample.
    assert stats["audio_span"] == [pytest.approx(spoken.start - origin, abs=1e-3),
                                   pytest.approx(spoken.end - origin, abs=1e-3)]
    assert stats["audio_seconds"] == pytest.approx(spoken.seconds, abs=1 / AUDIO_RATE * 2)
    assert stats["spoken_question"]["seconds"] == pytest.approx(spoken.seconds, abs=1e-3)
    # Frames come from the utterance: the one on screen when it began, then those captured during it.
    times = [t + origin for t in stats["frame_times"]]
    assert times[0] <= spoken.start < times[1] and all(spoken.start <= t <= spoken.end for t in times[1:])
    assert stats["completion_tokens"] == SHORT.max_tokens
    assert stats["prompt_tokens"] > 0 and stats["include_audio"] is True
    # The chat goes on with the spoken turn as its label, not as empty text.
    assert asking.spoken_text(answer).startswith("🎤 spoken question (")
    await registry.close(entry.session.id, "test over")
    assert not listener.running


async def test_speech_during_an_answer_aborts_it_and_becomes_the_next_question(omni_engine, question):
    registry = SessionRegistry()
    t0 = time.monotonic()
    entry = new_entry(registry, t0)
    coming = []  # speech starting tells the warm-ups a question is coming (vidchat.conversation.warmup)
    listener = modes.listener(entry, TurnSettings(), barge_in=True, on_speech=lambda: coming.append(time.monotonic()))
    await vad_loaded(listener)
    feed(entry, sa.silence(0.5), t0 + 1.0)
    typed = await asking.ask(omni_engine, entry.chat, "Tell me a long story.", LONG)
    streaming = asyncio.create_task(drain(typed))
    await eventually_async(lambda: typed.reply.stats.completion_tokens >= 3, 30, "the long answer generates")
    assert omni_engine.running_requests == 1
    feed(entry, np.concatenate([question, sa.silence(1.0)]), t0 + 1.5)
    spoken = await next_utterance(listener)
    await asyncio.wait_for(streaming, 10)
    assert typed.reply.stats.cancelled
    assert typed.reply.stats.completion_tokens < LONG.max_tokens
    assert listener.stats.barge_ins == 1 and listener.speech_starts == 1 and len(coming) == 1
    await eventually_async(lambda: omni_engine.running_requests == 0, 2, "the abort reached the engine")
    # The utterance that interrupted is the next question.
    answer = await asking.ask(omni_engine, entry.chat, "", SHORT, spoken=spoken)
    await drain(answer)
    asking.release(entry.chat, answer)
    assert answer.reply.stats.finish_reason == "length" and answer.summary()["spoken_question"] is not None
    await registry.close(entry.session.id, "test over")


async def test_without_barge_in_the_answer_goes_on(omni_engine, question):
    registry = SessionRegistry()
    t0 = time.monotonic()
    entry = new_entry(registry, t0)
    listener = modes.listener(entry, TurnSettings(), barge_in=False)
    await vad_loaded(listener)
    feed(entry, sa.silence(0.5), t0 + 1.0)
    typed = await asking.ask(omni_engine, entry.chat, "Tell me a story.", AnswerOptions(max_tokens=400, temperature=0.0))
    streaming = asyncio.create_task(drain(typed))
    feed(entry, np.concatenate([question, sa.silence(1.0)]), t0 + 1.5)
    await next_utterance(listener)
    await asyncio.wait_for(streaming, 60)
    assert not typed.reply.stats.cancelled and typed.reply.stats.finish_reason == "length"
    assert listener.stats.barge_ins == 0
    asking.release(entry.chat, typed)
    await registry.close(entry.session.id, "test over")


async def test_a_model_that_hears_nothing_refuses_spoken_questions_and_says_what_to_run(omni_engine, question,
                                                                                       monkeypatch):
    registry = SessionRegistry()
    t0 = time.monotonic()
    entry = new_entry(registry, t0)
    feed(entry, question, t0 + 1.0)
    monkeypatch.setattr(omni_engine, "accepts_audio", False)
    from vidchat.media.vad import Utterance

    with pytest.raises(EngineError) as err:
        await asking.ask(omni_engine, entry.chat, "", SHORT, spoken=Utterance(t0 + 1.0, t0 + 2.0, -20.0))
    assert str(err.value) == NO_SPOKEN_QUESTIONS and "--preset qwen2.5-omni-3b" in str(err.value)
    assert omni_engine.running_requests == 0
    await registry.close(entry.session.id, "test over")


async def test_a_spoken_question_is_recorded_and_re_asked_with_the_same_audio(omni_engine, question, tmp_path):
    """QA: a recorded spoken question replays as a spoken question, on exactly the same inputs."""
    from vidchat.conversation import bundles

    registry = SessionRegistry()
    t0 = time.monotonic()
    entry = new_entry(registry, t0)
    listener = modes.listener(entry, TurnSettings())
    feed(entry, np.concatenate([sa.silence(0.5), question, sa.silence(1.0)]), t0 + 2.0)
    spoken = await next_utterance(listener)
    answer = await asking.ask(omni_engine, entry.chat, "", SHORT, spoken=spoken)
    await drain(answer)
    asking.release(entry.chat, answer)
    path = bundles.write_bundle(tmp_path, answer)
    bundle = bundles.read_bundle(path)
    assert bundle.question == "" and bundle.manifest["spoken_question"] == answer.summary()["spoken_question"]
    assert bundle.spoken is not None and bundle.spoken.seconds == pytest.approx(spoken.seconds, abs=1e-3)
    other = registry.create("replay")
    again = await asking.ask(omni_engine, other.chat, bundle.question, SHORT, sample=bundle.sample(), spoken=bundle.spoken)
    await drain(again)
    asking.release(other.chat, again)
    assert again.reply.stats.inputs_sha256 == answer.reply.stats.inputs_sha256 == bundle.inputs_sha256
    assert again.summary()["spoken_question"]["seconds"] == pytest.approx(spoken.seconds, abs=1e-3)
    assert again.reply.text == answer.reply.text  # greedy, same inputs: the same answer
    await registry.close(entry.session.id, "test over")
    await registry.close(other.session.id, "test over")


async def test_talk_runs_as_a_task_of_the_conversation_that_a_typed_question_never_ends():
    """The page's Talk is a task of the session's conversation: each
    utterance the listener hears is asked as a spoken question; a typed
    question meanwhile leaves Talk running (no loop to restart), and Talk
    switched off ends the task and the listener."""
    registry = SessionRegistry()
    t0 = time.monotonic()
    entry = new_entry(registry, t0)
    entry.host = Standalone(None, registry=registry)
    talking = entry
    asked: list = []
    talking.submit = lambda question, options, **kw: asked.append((question, kw)) or len(asked)
    talking.modes.talk(TurnSettings(), True, lambda: AnswerOptions())
    await eventually_async(lambda: entry.talk is not None and entry.talk._detector is not None, 10,
                           "the listener listens")
    listener = entry.talk
    first = Utterance(t0 + 2.0, t0 + 3.5, level_dbfs=-20.0)
    listener.events.put_nowait(first)
    await eventually_async(lambda: len(asked) == 1, 10, "the utterance is asked")
    assert asked[0][0] == "" and asked[0][1]["spoken"] is first and asked[0][1]["cause"] == "spoken"
    talking.submit("A typed question", AnswerOptions())  # the chat's turn moves on; Talk goes on
    second = Utterance(t0 + 4.0, t0 + 5.0, level_dbfs=-20.0)
    listener.events.put_nowait(second)
    await eventually_async(lambda: len(asked) == 3, 10, "the next utterance is asked too")
    assert asked[2][1]["spoken"] is second and talking.modes.talking
    await talking.modes.stop_talking()
    assert not talking.modes.talking and not listener.running
    await registry.close(entry.session.id, "test over")
