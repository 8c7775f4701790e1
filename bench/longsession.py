"""Benchmark: a live session of an hour with memory (docs/memory.md).

Run: .venv/bin/python bench/longsession.py                      (the tiny model, 60 minutes: ~3 min here)
     .venv/bin/python bench/longsession.py --preset smolvlm2-256m --true-size --minutes 6 --baseline
                                                                (the CPU default's true size, a shorter run)

What it does, in this process (vLLM's in-process engine, vidchat's
conversation core on a standalone host, the memory's real captioner):
  plays a synthetic stream of --minutes (a new scene every --scene-s, 30 s,
  at 1 frame a second, its own clock) into one session with memory on, as
  fast as the engine allows; at the end of each minute asks a question
  (max --max-tokens), every fifth about an earlier moment ("What did you
  see N minutes ago?", N drawn from the minutes played). Before a question
  it waits until a caption is in flight where one is due, so the question
  has to abort it (the worst case for a person's question); after the
  answer it lets the captioner catch up.
  --baseline: a second session on the same frames with memory off asks the
  same questions, alternating with the first: what memory costs a question's
  first token, in the same run.

Figures: first-token time (the engine's, from the question's submission) of
the questions at minutes 1, 30 and 60 (the median of that minute's question
and its two neighbours); the largest prompt against --max-model-len; how
long a question waited for the caption it aborted (p95 over all questions,
0 where none was in flight); memory_hit_rate: the share of questions about
an earlier moment whose memory frames all lie within one scene of it; this
process's resident memory at minute 5 and at the end (the session, its scene
log and the engine's client side; vLLM's engine core is a process of its own).
Last line:
  longsession: minutes=… keyframes=… captions=… ttft_ms_min1=… ttft_ms_min30=… ttft_ms_min60=…
  prompt_tokens_max=… max_model_len=… question_delay_from_captions_ms_p95=… memory_hit_rate=…
  rss_mb_start=… rss_mb_end=… captions_aborted=… [ttft_ms_memory_on=… ttft_ms_memory_off=… ttft_ratio_memory_on_off=…]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import psutil  # noqa: E402
from engine import add_model_args, engine_for  # noqa: E402

from vidchat.conversation.answers import AnswerOptions, AnswerQueue  # noqa: E402
from vidchat.conversation.memory import Captioner, MemoryOptions  # noqa: E402
from vidchat.conversation.registry import Standalone  # noqa: E402
from vidchat.devtools.synthetic import long_stream  # noqa: E402
from vidchat.engine.local import LocalEngine  # noqa: E402
from vidchat.media.session import SessionSettings  # noqa: E402

log = logging.getLogger("bench.longsession")
RESULTS = ROOT / "bench" / "results"
T0 = 1000.0  # the stream's first frame on the session's clock


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] if values else 0.0


def around(by_minute: dict[int, float], minute: int) -> float | None:
    near = [by_minute[m] for m in (minute - 1, minute, minute + 1) if m in by_minute]
    return round(statistics.median(near), 1) if near else None


async def ask(entry: Any, question: str, options: AnswerOptions) -> dict[str, Any]:
    run = await entry.ask(question, options)
    done = await run.finish()
    if done.status != "completed":
        raise RuntimeError(f"the question ended {done.status}: {done.error}")
    return done.answer.summary()


async def until(predicate: Any, within: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not predicate():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def run(args: argparse.Namespace) -> dict[str, Any]:
    options = engine_for(args)
    options.max_model_len = args.max_model_len
    options.priority_scheduling = True
    engine = await asyncio.to_thread(LocalEngine.start, options)
    memory = MemoryOptions(caption_tokens=args.caption_tokens, tokens=args.memory_tokens, frames=args.memory_frames)
    host = Standalone(engine, answer_gate=AnswerQueue(), memory=memory)
    settings = dict(num_sample_frames=args.frames, max_frames=64)
    remembering = host.registry.create("replay", SessionSettings(memory=True, **settings))
    forgetting = host.registry.create("replay", SessionSettings(memory=False, **settings)) if args.baseline else None
    captioner = Captioner(host, memory)
    captioner.start()
    rng = random.Random(args.seed)
    answer = AnswerOptions(max_tokens=args.max_tokens, temperature=0.0)
    ttft: dict[int, float] = {}
    ttft_off: dict[int, float] = {}
    delays: list[float] = []
    hits: list[bool] = []
    prompt_max = 0
    rss_start = rss_mb()
    try:
        for t, frame, _ in long_stream(args.minutes, args.scene_s):
            for entry in filter(None, (remembering, forgetting)):
                entry.session.add_frame(frame, t=T0 + t)
            if (int(t) + 1) % 60:
                continue
            minute = (int(t) + 1) // 60
            back = rng.randint(1, minute - 1) if minute % 5 == 0 and minute > 1 else None
            question = f"What did you see {back} minutes ago?" if back else "What is happening now?"
            if remembering.session.scene_log.uncaptioned():
                await until(lambda: captioner.running, 30)  # the question arrives mid-caption
            aborted_before = len(captioner.stats.abort_ms)
            rec = await ask(remembering, question, answer)
            delays.append(captioner.stats.abort_ms[-1] if len(captioner.stats.abort_ms) > aborted_before else 0.0)
            ttft[minute] = rec["ttft_ms"]
            prompt_max = max(prompt_max, rec["prompt_tokens"])
            if back:
                moment = minute * 60 - back * 60
                frames = rec.get("memory_frames") or []
                hits.append(bool(frames) and all(abs(f["time_s"] - moment) <= args.scene_s for f in frames))
            if forgetting is not None:
                off = await ask(forgetting, question, answer)
                ttft_off[minute] = off["ttft_ms"]
            await until(lambda: not remembering.session.scene_log.uncaptioned(), 60)
            if minute == 5:
                rss_start = rss_mb()
            log.info("minute %d: ttft %.0f ms, prompt %d tokens, %d keyframes, %d captions", minute, rec["ttft_ms"],
                     rec["prompt_tokens"], len(remembering.session.scene_log), captioner.stats.written)
    finally:
        await captioner.stop()
        keyframes = len(remembering.session.scene_log)
        await host.registry.close_all()
        engine.shutdown()
    figures: dict[str, Any] = {
        "minutes": args.minutes, "keyframes": keyframes,
        "captions": captioner.stats.written,
        "ttft_ms_min1": around(ttft, 1), "ttft_ms_min30": around(ttft, 30),
        f"ttft_ms_min{args.minutes}": around(ttft, args.minutes),
        "prompt_tokens_max": prompt_max, "max_model_len": args.max_model_len,
        "question_delay_from_captions_ms_p95": round(pct(delays, 0.95), 1),
        "memory_hit_rate": round(sum(hits) / len(hits), 3) if hits else None,
        "rss_mb_start": round(rss_start), "rss_mb_end": round(rss_mb()),
        # After the fields, in its order: how many captions a question cut short.
        "captions_aborted": captioner.stats.aborted,
    }
    if ttft_off:
        on, off = statistics.median(ttft.values()), statistics.median(ttft_off.values())
        figures.update(ttft_ms_memory_on=round(on, 1), ttft_ms_memory_off=round(off, 1),
                       ttft_ratio_memory_on_off=round(on / off, 3))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(parser)
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--scene-s", type=float, default=30.0)
    parser.add_argument("--frames", type=int, default=8, help="live frames per question")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--caption-tokens", type=int, default=48)
    parser.add_argument("--memory-tokens", type=int, default=512)
    parser.add_argument("--memory-frames", type=int, default=2)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--baseline", action="store_true", help="also ask a memory-off session, alternating")
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for name in ("vllm", "vidchat"):
        logging.getLogger(name).setLevel(logging.WARNING)
    figures = asyncio.run(run(args))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "longsession.json").write_text(json.dumps(figures, indent=2))
    print("longsession: " + " ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
