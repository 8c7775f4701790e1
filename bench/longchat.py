"""Long-chat benchmark: questions once a chat has outgrown the model's
context, with the kept turns cut a step at a time (vidchat.engine.prompts)
against the latest cut that fits (a pair left out every question, the rule
before), in the same run, through real vLLM.

    .venv/bin/python bench/longchat.py [--questions 24]
    .venv/bin/python bench/longchat.py --preset smolvlm2-256m --true-size

Each rule gets a chat of its own, with its own cache salt (nothing one
cached serves the other), that already fills the context. Then
--questions questions in a row, as the page asks them: one new frame each,
the whole chat sent along, an 8-token answer added to the chat. The first
question of each is not counted (both pay a cold prefill). Rows: median and
p95 time to first token, the share of prompt tokens vLLM served from its
prefix cache, and how many questions moved the cut.

Last line: `longchat: preset=… questions=… median_ttft_ms=…
latest_cut_median_ttft_ms=… ttft_ratio=… cached_share=… latest_cut_cached_share=…`
(ttft_ratio: latest cut / step cut).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import add_model_args, engine_for, pct  # noqa: E402  (bench/engine.py: the same model choice)

from vidchat.engine import (
    Turn,  # noqa: E402
    prompts,
)
from vidchat.engine.local import LocalEngine  # noqa: E402

log = logging.getLogger("bench.longchat")
WORDS = ("red blue green door window table chair lamp person cup book plant left right moves stands "
         "near behind under light dark small large picture camera room").split()
ANSWER_TOKENS = 8
RULES = {"step": prompts.CUT_STEP_SHARE, "latest": 0.0}  # a share of 0: a step of one token


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def frame(rng: random.Random) -> np.ndarray:
    return np.random.default_rng(rng.randrange(1 << 30)).integers(0, 256, (240, 320, 3), dtype=np.uint8)


async def ask_in_turn(engine: LocalEngine, rule: str, questions: int, seed: int) -> list:
    """A chat that fills the context, then ``questions`` more: each question's ReplyStats."""
    prompts.CUT_STEP_SHARE = RULES[rule]
    rng = random.Random(seed)
    history: list[Turn] = []
    # Pairs of ~60 and ~25 words until the chat alone is over the context.
    while sum(len(t.text.split()) for t in history) * 1.3 < engine.options.max_model_len * 1.2:
        history += [Turn("user", sentence(rng, 60)), Turn("assistant", sentence(rng, 25))]
    stats = []
    for i in range(questions + 1):
        question = f"Question {i}: {sentence(rng, 30)}?"
        reply = engine.ask(question, [frame(rng)], history=list(history), max_tokens=ANSWER_TOKENS,
                           ignore_eos=True, temperature=0.0, cache_salt=f"longchat-{rule}-{seed}")
        async for _ in reply:
            pass
        if i:
            stats.append(reply.stats)
        history += [Turn("user", question), Turn("assistant", sentence(rng, ANSWER_TOKENS))]
    return stats


async def run(args: argparse.Namespace) -> None:
    engine = LocalEngine.start(engine_for(args))
    results = {}
    try:
        for rule in ("step", "latest"):
            results[rule] = await ask_in_turn(engine, rule, args.questions, seed=7 if rule == "step" else 8)
    finally:
        prompts.CUT_STEP_SHARE = RULES["step"]
        engine.shutdown()

    figures = {}
    print(f"{'rule':10}{'median ms':>12}{'p95 ms':>10}{'cached':>9}{'cut moved':>11}  (of {args.questions})")
    for rule, stats in results.items():
        ttft = [s.ttft_s * 1000 for s in stats]
        cached = sum(s.cached_tokens for s in stats) / max(1, sum(s.prompt_tokens for s in stats))
        left_out = [s.history_turns_total - s.history_turns for s in stats]
        moved = sum(a != b for a, b in zip(left_out, left_out[1:]))
        figures[rule] = statistics.median(ttft), cached
        print(f"{rule:10}{statistics.median(ttft):12.1f}{pct(ttft, .95):10.1f}{cached:9.0%}{moved:11d}")
    (step_ms, step_cached), (latest_ms, latest_cached) = figures["step"], figures["latest"]
    summary = {"preset": args.preset or args.model, "true_size": int(args.true_size), "questions": args.questions,
               "max_model_len": engine.options.max_model_len, "median_ttft_ms": f"{step_ms:.1f}",
               "latest_cut_median_ttft_ms": f"{latest_ms:.1f}", "ttft_ratio": f"{latest_ms / step_ms:.2f}",
               "cached_share": f"{step_cached:.2f}", "latest_cut_cached_share": f"{latest_cached:.2f}"}
    print("longchat: " + " ".join(f"{key}={value}" for key, value in summary.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=24)
    add_model_args(parser)
    args = parser.parse_args()
    args.frames = 1  # engine_for sizes --max-images by it
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
