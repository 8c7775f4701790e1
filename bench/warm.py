"""Warm-up benchmark: what keeping a session's frames prefilled buys, through
real vLLM and vidchat's own answer path (vidchat.conversation.asking, vidchat.conversation.warmup).

    .venv/bin/python bench/warm.py [--frames 16] [--repeats 5] [--sessions 16]
    .venv/bin/python bench/warm.py --preset smolvlm2-256m --true-size

Rows, each the median time to first token over --repeats questions:

* cold: 16 frames the engine has never seen;
* warm: the same question after a warm-up of the session's current sample;
* slid by 1 / by 4: 1 or 4 new kept frames after the warm-up (the window
  slides; unchanged frames are still encoder-cache hits as images);
* text: a question with no frames and a prompt of the same length (the floor);

for frames as images and as one video. With a model that hears, an audio
row: frames a second apart with the audio since the first, warmed, asked
after one more second of audio, with the audio as one clip and in 2-s
segments (vidchat.media.audio). Then a load run: --sessions sessions
stream frames while each asks in turn, with the prewarmer on (idle mode) and
off, in the same run: the p95 time to first token of each.

Last line: `warm: cold_ttft_ms=… warm_ttft_ms=… slid_ttft_ms=… text_ttft_ms=…
warm_ratio=… load_p95_on_ms=… load_p95_off_ms=… audio_segments_ttft_ms=…
audio_one_clip_ttft_ms=…` (images; warm_ratio is cold / warm, slid is by one
frame).
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

from vidchat.conversation import asking, runs
from vidchat.conversation.answers import AnswerOptions, AnswerQueue
from vidchat.conversation.registry import (
    SessionRegistry,  # noqa: E402
    Standalone,
)
from vidchat.conversation.warmup import Prewarmer
from vidchat.engine.local import LocalEngine  # noqa: E402
from vidchat.media.session import SessionSettings  # noqa: E402

log = logging.getLogger("bench.warm")
FRAME = (240, 320)


class Feed:
    """Distinct frames on demand: every frame differs, so each is kept."""

    def __init__(self, seed: int, frame: tuple[int, int] = FRAME):
        self.rng = np.random.default_rng(seed)
        self.t = 0.0
        self.frame = frame

    def add(self, entry, n: int) -> None:
        for _ in range(n):
            self.t += 1 / 15
            entry.session.add_frame(self.rng.integers(0, 255, (*self.frame, 3), dtype=np.uint8), t=self.t)


async def ttft(engine, entry, options, question="What happens in this video?",
               sample=None) -> tuple[float, int, int]:
    # A question on its own: no chat kept between the rows' questions (the warm-ups carry none).
    run = await entry.ask(question, options, engine=engine, sample=sample, continues_chat=False)
    t0 = time.perf_counter()
    first = None
    async for event in run.events():
        if isinstance(event, runs.Delta):
            first = time.perf_counter() - t0
            await run.cancel()
    if first is None:
        first = time.perf_counter() - t0
    stats = run.answer.reply.stats
    return first * 1000, stats.prompt_tokens, stats.cached_tokens


def text_of_length(engine, tokens: int) -> str:
    """A question whose whole prompt is about `tokens` tokens long."""
    tokenizer = engine._processor.tokenizer
    n = tokens
    for _ in range(3):
        text = " ".join(["the"] * max(1, n))
        n -= len(tokenizer(engine.build_prompt(text))["input_ids"]) - tokens
    return " ".join(["the"] * max(1, n))


async def warm(engine, entry, options) -> None:
    prepared = await asyncio.to_thread(asking.prepare, engine, entry, entry.session.sample(), options, (), "", True)
    await engine.warm(prepared)


async def rows(engine, frames: int, repeats: int, frames_as: str, sampling: str,
               frame: tuple[int, int] = FRAME) -> dict[str, float]:
    """The cold/warm/slid/text row (printed; the medians returned), with
    frames of `frame` (height, width), stored at that size."""
    options = AnswerOptions(max_tokens=4, temperature=0.0, include_audio=False, frames_as=frames_as)
    registry = Standalone(engine, registry=SessionRegistry(64)).registry
    out: dict[str, list[float]] = {k: [] for k in ("cold", "warm", "slid1", "slid4", "text")}
    prompt_tokens: dict[str, int] = {}
    for r in range(repeats):
        entry = registry.create("webrtc", SessionSettings(evs_enabled=False, num_sample_frames=frames,
                                                          sampling=sampling), store_max_pixels=frame[0] * frame[1])
        feed = Feed(1000 * r + (7 if frames_as == "video" else 0), frame)
        feed.add(entry, frames)
        ms, tokens, _ = await ttft(engine, entry, options)
        out["cold"].append(ms)
        feed.add(entry, frames)  # a new window, then warmed
        await warm(engine, entry, options)
        ms, _, cached_warm = await ttft(engine, entry, options)
        out["warm"].append(ms)
        for n in (1, 4):
            await warm(engine, entry, options)
            feed.add(entry, n)
            ms, _, _ = await ttft(engine, entry, options)
            out[f"slid{n}"].append(ms)
        # Text of the same prompt length: the floor a warmed question can reach.
        text_entry = registry.create("webrtc", SessionSettings(evs_enabled=False))
        Feed(99).add(text_entry, 1)
        text_prompt = engine.prepare(text_of_length(engine, tokens), [], max_tokens=4, temperature=0.0)
        reply = engine.submit(text_prompt)
        t0 = time.perf_counter()
        async for _ in reply:
            break
        out["text"].append((time.perf_counter() - t0) * 1000)
        text_tokens = reply.stats.prompt_tokens
        await reply.aclose()
        await registry.close(entry.session.id)
        await registry.close(text_entry.session.id)
        prompt_tokens = {"frames": tokens, "text": text_tokens, "cached_warm": cached_warm}
    med = {k: statistics.median(v) for k, v in out.items()}
    print(f"{frames_as:7s} cold {med['cold']:8.1f}  warm {med['warm']:8.1f}  slid1 {med['slid1']:8.1f}  "
          f"slid4 {med['slid4']:8.1f}  text {med['text']:8.1f} ms   prompt tokens {prompt_tokens['frames']} "
          f"(text {prompt_tokens['text']}), cached when warm {prompt_tokens['cached_warm']}", flush=True)
    return med


async def audio_rows(engine, frames: int, repeats: int) -> dict[str, float]:
    """A question with `frames` frames a second apart and the audio since the
    first (about `frames` seconds), warmed, then asked after one more second
    of audio: with the audio as one clip (all of it new again) and in 2-s
    segments (only the newest is new; vidchat.media.audio)."""
    options = AnswerOptions(max_tokens=4, temperature=0.0, include_audio=True)
    registry = Standalone(engine, registry=SessionRegistry(64)).registry
    out: dict[str, list[float]] = {"cold": [], "one_clip": [], "segments": []}
    cached: dict[str, int] = {}
    prompt_tokens = 0
    for r in range(repeats):
        for form in ("one_clip", "segments"):
            engine.options.split_audio = form == "segments"  # --audio-segments
            entry = registry.create("webrtc", SessionSettings(evs_enabled=False, num_sample_frames=frames))
            session = entry.session
            rng = np.random.default_rng(5000 + r)
            for i in range(frames):
                session.add_frame(rng.integers(0, 255, (*FRAME, 3), dtype=np.uint8), t=100.0 + i)
            session.add_audio((rng.standard_normal(frames * 16000) * 0.1).astype(np.float32), t=100.0)

            if form == "one_clip":
                ms, prompt_tokens, _ = await ttft(engine, entry, options)
                out["cold"].append(ms)
            # What the prewarmer would warm: the finished segments, or (one
            # clip) all the audio so far.
            warm_sample = session.sample() if form == "one_clip" else session.sample().without_audio_tail()
            await engine.warm(await asyncio.to_thread(asking.prepare, engine, entry, warm_sample, options, (), "",
                                                      True))
            session.add_audio((rng.standard_normal(16000) * 0.1).astype(np.float32), t=100.0 + frames)
            ms, _, cached[form] = await ttft(engine, entry, options)
            out[form].append(ms)
            await registry.close(session.id)
    engine.options.split_audio = False
    med = {k: statistics.median(v) for k, v in out.items()}
    print(f"audio   {frames} frames and {frames + 1} s of audio, warmed before the last second: "
          f"one clip {med['one_clip']:8.1f} ms ({cached['one_clip']} cached)  "
          f"2-s segments {med['segments']:8.1f} ms ({cached['segments']} cached)  "
          f"cold {med['cold']:8.1f} ms   prompt tokens {prompt_tokens}", flush=True)
    return med


async def load(engine, sessions: int, frames: int, rounds: int, prewarm: bool) -> float:
    """Sessions stream (one new kept frame each every 0.2 s) and take turns asking; p95 TTFT."""
    registry = SessionRegistry(sessions + 1)
    gate = AnswerQueue(8)
    options = AnswerOptions(max_tokens=8, temperature=0.0, include_audio=False)
    state = Standalone(engine, gate, options, registry=registry)
    entries = [registry.create("webrtc", SessionSettings(evs_enabled=False, num_sample_frames=frames))
               for _ in range(sessions)]
    feeds = [Feed(5000 + i) for i in range(sessions)]
    for entry, feed in zip(entries, feeds):
        feed.add(entry, frames)
        entry.warm_options = options
    prewarmer = Prewarmer(state, "idle" if prewarm else "off", interval_s=1.0)
    prewarmer.start()
    stop = asyncio.Event()

    async def stream() -> None:
        while not stop.is_set():
            for entry, feed in zip(entries, feeds):
                await asyncio.to_thread(feed.add, entry, 1)
            await asyncio.sleep(0.2)

    streaming = asyncio.create_task(stream())
    await asyncio.sleep(2.0)
    times = []
    try:
        for _ in range(rounds):
            for entry in entries:
                run = await entry.ask("What changed?", options)
                t0 = time.perf_counter()
                async for event in run.events():
                    if isinstance(event, runs.Delta):
                        times.append((time.perf_counter() - t0) * 1000)
                        await run.cancel()
                await asyncio.sleep(0.3)  # a user reads, then asks again
    finally:
        stop.set()
        await streaming
        await prewarmer.stop()
        await registry.close_all()
    p95 = float(np.percentile(times, 95))
    print(f"load    {sessions} sessions, prewarm {'on ' if prewarm else 'off'}: p50 {statistics.median(times):8.1f} "
          f"p95 {p95:8.1f} ms over {len(times)} questions; warm-ups {prewarmer.stats.warmups}, "
          f"gave way {prewarmer.stats.yielded}", flush=True)
    return p95


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(parser, kv_cache_gb=1.0)
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--load-rounds", type=int, default=2)
    parser.add_argument("--no-load", action="store_true", help="skip the load run")
    parser.add_argument("--sampling", default="uniform", choices=("uniform", "stable", "latest_frames"),
                        help="how questions pick their frames (the slid rows depend on it)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    options = engine_for(args)
    options.max_images = max(options.max_images, args.frames)
    options.max_audios = 16  # room for the audio row's segments (--audio-segments)
    # As the server sizes it: a sample per session in vLLM's encoder cache.
    options.encoder_cache_frames = args.sessions * args.frames
    engine = await asyncio.to_thread(LocalEngine.start, options)
    try:
        print(f"model {options.model} ({engine.model_revision}), {args.frames} frames of {FRAME[1]}x{FRAME[0]}, "
              f"{args.sampling} sampling, median of {args.repeats}", flush=True)
        images = await rows(engine, args.frames, args.repeats, "images", args.sampling)
        if engine.accepts_video:
            await rows(engine, args.frames, args.repeats, "video", args.sampling)
        audio = {"one_clip": float("nan"), "segments": float("nan")}
        if engine.accepts_audio:
            audio = await audio_rows(engine, args.frames, args.repeats)
        on = off = float("nan")
        if not args.no_load:
            off = await load(engine, args.sessions, args.frames, args.load_rounds, prewarm=False)
            on = await load(engine, args.sessions, args.frames, args.load_rounds, prewarm=True)
        print(f"warm: cold_ttft_ms={images['cold']:.1f} warm_ttft_ms={images['warm']:.1f} "
              f"slid_ttft_ms={images['slid1']:.1f} text_ttft_ms={images['text']:.1f} "
              f"warm_ratio={images['cold'] / images['warm']:.1f} load_p95_on_ms={on:.1f} load_p95_off_ms={off:.1f}"
              + f" audio_segments_ttft_ms={audio['segments']:.1f} audio_one_clip_ttft_ms={audio['one_clip']:.1f}"
              + f" sampling={args.sampling}"
              + (f" preset={args.preset} true_size={int(args.true_size)}" if args.preset else ""))
    finally:
        engine.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
