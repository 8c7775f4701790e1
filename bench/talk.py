"""Talk mode benchmark: from the end of a spoken question to its answer's
first token, through vidchat's own listener (vidchat.conversation.modes), answer path and
real vLLM.

    .venv/bin/python bench/talk.py [--utterances 20] [--silence-ms 500]

Questions spoken by espeak-ng are fed to a session in real time (20 ms
packets, as WebRTC delivers them) while frames arrive at 2 fps. For each:

* decision: end of the speech -> the listener's utterance (the trailing
  silence the detector waits for, plus its polling and inference);
* engine: the utterance -> first token (sampling, preparing, prefill);
* end to first token: the two together, what a user waits.

(--warmup questions go first and are not counted: TorchScript optimises the
detector over its first calls, and vLLM's first audio request is slow.)

Baseline, measured in the same run: a typed question on the same session
(same frames), so the engine row reads as a ratio against it. Then the
detector alone: its cost per second of audio (one core), and how many turns
it finds in 40 s of sounds that are not a question (silence, room noise,
music-like tones, the page's own voice coming back 25 dB down while it
speaks); every one is a false trigger.

Last line: `talk: end_to_first_token_ms=… vad_ms_per_s=… false_triggers=…`
(end to first token: the median; p95 in the table).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import add_model_args, engine_for  # noqa: E402  (bench/engine.py: the same model choice)

from vidchat.conversation import modes, runs
from vidchat.conversation.answers import AnswerOptions
from vidchat.conversation.registry import Standalone
from vidchat.devtools import synthetic as sa
from vidchat.engine.local import LocalEngine  # noqa: E402
from vidchat.media import AUDIO_RATE  # noqa: E402
from vidchat.media.session import SessionSettings  # noqa: E402
from vidchat.media.vad import SpeechStarted, TurnDetector, TurnSettings, Utterance  # noqa: E402

log = logging.getLogger("bench.talk")
PACKET = 320  # 20 ms
PHRASES = [
    "What is on the table?",
    "Can you see my hand now?",
    "What colour is the wall behind me?",
    "How many people are in the room?",
    "Read the text on this page, please.",
]
OPTIONS = AnswerOptions(max_tokens=8, temperature=0.0)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def feed_frames(entry, stop: asyncio.Event) -> None:
    rng = np.random.default_rng(1)
    while not stop.is_set():
        entry.session.add_frame(rng.integers(0, 255, (240, 320, 3), dtype=np.uint8), t=time.monotonic())
        await asyncio.sleep(0.5)


async def speak_in_real_time(entry, audio: np.ndarray) -> float:
    """Feed audio paced as it would arrive; returns when its last sample was due (timeline time)."""
    start = time.monotonic()
    for i in range(0, audio.size, PACKET):
        due = start + i / AUDIO_RATE
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        entry.session.add_audio(audio[i:i + PACKET], due)
    return start + audio.size / AUDIO_RATE


async def first_token(run: runs.AnswerRun) -> float:
    """When the run's first text came; the run is read to its end."""
    first = None
    async for event in run.events():
        if isinstance(event, runs.Delta) and first is None:
            first = time.monotonic()
    return first if first is not None else time.monotonic()


async def spoken_round(engine, args) -> dict[str, list[float]]:
    registry = Standalone(engine).registry
    entry = registry.create("webrtc", SessionSettings(evs_enabled=False, num_sample_frames=args.frames))
    talking = entry
    stop = asyncio.Event()
    frames = asyncio.create_task(feed_frames(entry, stop))
    await asyncio.sleep(args.frames * 0.5 + 0.5)
    settings = TurnSettings(min_silence_s=args.silence_ms / 1000)
    listener = modes.listener(entry, settings)
    voices = [sa.speech(p, words_per_minute=150 + 10 * (i % 4)) for i, p in enumerate(PHRASES)]
    out: dict[str, list[float]] = {"decision": [], "engine": [], "total": [], "typed": [], "extra": []}
    try:
        await speak_in_real_time(entry, sa.silence(0.5))
        for i in range(-args.warmup, args.utterances):
            # The first rounds are not counted: TorchScript optimises the
            # detector over its first calls, vLLM its first audio request.
            speech = voices[i % len(voices)]
            speech_start = time.monotonic()
            speech_end = speech_start + speech.size / AUDIO_RATE
            speaking = asyncio.create_task(speak_in_real_time(entry, np.concatenate([speech, sa.silence(1.5)])))
            while True:  # the utterance that ends with this speech (a split one would show as extra)
                spoken = await asyncio.wait_for(listener.next_utterance(), 30)
                decided = time.monotonic()
                if abs(spoken.speech_end - speech_end) < 0.5:
                    break
                out["extra"].append(spoken.seconds)
                log.warning("utterance %d: an extra utterance of %.2f s ending %.2f s before the speech's end",
                            i, spoken.seconds, speech_end - spoken.speech_end)
            first = await first_token(await talking.ask("", OPTIONS, spoken=spoken, continues_chat=False))
            await speaking
            if i < 0:
                continue
            out["decision"].append((decided - speech_end) * 1000)
            out["engine"].append((first - decided) * 1000)
            out["total"].append((first - speech_end) * 1000)
            log.info("utterance %d: %.2f s heard as %.2f s; decided %.0f ms after its end, first token %.0f ms later",
                     i, speech.size / AUDIO_RATE, spoken.seconds, out["decision"][-1], out["engine"][-1])
        for _ in range(max(5, args.utterances // 4)):
            # The baseline: a typed question with as many frames and the
            # audio since the first, after a new frame (no whole-prompt cache hit).
            await asyncio.sleep(0.6)
            began = time.monotonic()
            first = await first_token(await talking.ask("What is on the table?", OPTIONS, continues_chat=False))
            out["typed"].append((first - began) * 1000)
    finally:
        stop.set()
        await frames
        await registry.close(entry.session.id, "benchmark over")
    return out


def detector_only() -> tuple[float, int, list[str]]:
    """(ms of detector time per second of audio, false triggers, what triggered)."""
    speech = sa.speech("This is the answer being read aloud by the page, sentence by sentence.")
    echo = sa.scaled(speech, -25)
    sounds = [
        ("silence", sa.silence(10), False),
        ("room noise -45 dBFS", sa.room_noise(10, -45, seed=5), False),
        ("music-like tones", sa.tones(10, -20, seed=6), False),
        ("the page's own voice, 25 dB down, while it speaks", np.concatenate([echo, sa.silence(10 - echo.size / AUDIO_RATE)])
         if echo.size < 10 * AUDIO_RATE else echo, True),
    ]
    triggers, what = 0, []
    spent, seconds = 0.0, 0.0
    for name, audio, playback in sounds:
        detector = TurnDetector(TurnSettings())
        detector.playback = playback
        began = time.perf_counter()
        events = []
        for i in range(0, audio.size, PACKET):
            events += detector.feed(audio[i:i + PACKET], i / AUDIO_RATE)
        spent += time.perf_counter() - began
        seconds += audio.size / AUDIO_RATE
        found = [e for e in events if isinstance(e, (SpeechStarted, Utterance))]
        triggers += sum(isinstance(e, Utterance) for e in found)
        print(f"  {name:52s} {len(found)} events", flush=True)
        if found:
            what.append(name)
    return spent * 1000 / seconds, triggers, what


def echo_table() -> None:
    """What keeps the page's own voice out: turns found in the answer read
    aloud coming back at each level (dB below the user's own voice, which
    the detector learnt from one question first), with and without the
    playback gate (POST /webrtc/talk {speaking})."""
    user = sa.speech("What is on the table?")
    reply = sa.speech("There is a cup on the table, and a book beside it.")
    print("  echo level   turns without the gate   with the gate")
    for gain in (-30, -25, -20, -15, -10, -6):
        counts = []
        for gated in (False, True):
            detector = TurnDetector(TurnSettings())
            audio = np.concatenate([sa.silence(0.3), user, sa.silence(1.0)])
            for i in range(0, audio.size, PACKET):
                detector.feed(audio[i:i + PACKET], i / AUDIO_RATE)
            detector.playback = gated
            echo = np.concatenate([sa.scaled(reply, gain), sa.silence(1.0)])
            t0 = audio.size / AUDIO_RATE
            found = 0
            for i in range(0, echo.size, PACKET):
                found += sum(isinstance(e, Utterance) for e in detector.feed(echo[i:i + PACKET], t0 + i / AUDIO_RATE))
            counts.append(found)
        print(f"  {gain:+4d} dB     {counts[0]:>10d}               {counts[1]:>6d}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(parser, kv_cache_gb=1.0)
    parser.add_argument("--utterances", type=int, default=20)
    parser.add_argument("--verbose", action="store_true", help="a line per spoken question")
    parser.add_argument("--warmup", type=int, default=2, help="spoken questions asked first and not counted")
    parser.add_argument("--frames", type=int, default=8, help="frames per question (sampled over the utterance)")
    parser.add_argument("--silence-ms", type=float, default=TurnSettings.min_silence_s * 1000,
                        help="the pause that ends a question")
    return parser.parse_args(argv)


async def report(engine: LocalEngine, args: argparse.Namespace) -> str:
    """Run the rows on a started engine, print the table; return the last line."""
    if not engine.accepts_audio:
        sys.exit(f"bench/talk.py: {engine.options.model} takes no audio; Talk mode needs a model that hears")
    print(f"model {engine.options.model} ({engine.model_revision}), {args.utterances} spoken questions in real "
          f"time, {args.frames} frames each, pause {args.silence_ms:.0f} ms", flush=True)
    times = await spoken_round(engine, args)
    print(f"{'ms':34s} {'p50':>8s} {'p95':>8s}")
    for key, label in (("decision", "speech end -> utterance (VAD)"), ("engine", "utterance -> first token"),
                       ("total", "speech end -> first token"), ("typed", "typed question -> first token")):
        print(f"{label:34s} {statistics.median(times[key]):8.1f} {pct(times[key], 0.95):8.1f}")
    typed = statistics.median(times["typed"])
    if times["extra"]:
        print(f"extra utterances (speech split by a pause): {len(times['extra'])}")
    print(f"engine part vs a typed question: {statistics.median(times['engine']) / typed:.2f}x; "
          f"decision beyond the {args.silence_ms:.0f} ms pause: "
          f"{statistics.median(times['decision']) - args.silence_ms:.1f} ms")
    print("detector alone, 40 s of sounds that are not a question:")
    vad_ms, false_triggers, _ = detector_only()
    print("the page's own voice coming back through the microphone (after the browser's echo cancellation):")
    echo_table()
    return (f"talk: end_to_first_token_ms={statistics.median(times['total']):.1f} vad_ms_per_s={vad_ms:.2f} "
            f"false_triggers={false_triggers} p95_ms={pct(times['total'], 0.95):.1f} "
            f"typed_ttft_ms={typed:.1f} silence_ms={args.silence_ms:.0f}")


async def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.verbose:
        log.setLevel(logging.INFO)
    options = engine_for(args)
    options.max_images = max(options.max_images, args.frames)
    engine = await asyncio.to_thread(LocalEngine.start, options)
    try:
        last = await report(engine, args)
    finally:
        engine.shutdown()
    sys.stdout.flush()
    print(last, flush=True)  # after vLLM's shutdown log lines: the last line


if __name__ == "__main__":
    asyncio.run(main())
