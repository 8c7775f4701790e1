"""Which turns of a long chat go with a question (vidchat.engine.prompts):
whole pairs that fit, cut on a grid so that what is kept stays the same
prefix while the chat grows."""

from __future__ import annotations

import random

import pytest

from vidchat.engine.prompts import cut_step, history_start

pytestmark = pytest.mark.unit


def latest_cut(costs: list[int], is_question: list[bool], budget: int) -> int:
    """The rule before the grid: the oldest pair goes as soon as the chat does not fit."""
    start = 0
    while start < len(costs) and sum(costs[start:]) > budget:
        start += 1
        while start < len(costs) and not is_question[start]:
            start += 1
    return start


def chat(pairs: int, seed: int = 0) -> tuple[list[int], list[bool]]:
    rng = random.Random(seed)
    costs, is_question = [], []
    for _ in range(pairs):
        costs += [rng.randint(20, 60), rng.randint(5, 40)]
        is_question += [True, False]
    return costs, is_question


def test_a_chat_that_fits_is_sent_whole_and_one_that_cannot_is_not_sent():
    costs, is_question = chat(10)
    assert history_start(costs, is_question, sum(costs), 100) == 0
    assert history_start([], [], 100, 10) == 0
    assert history_start(costs, is_question, 10, 100) == len(costs)  # not even the newest pair fits


def test_step_one_is_the_latest_cut_that_fits():
    for seed in range(20):
        costs, is_question = chat(40, seed)
        for budget in (100, 500, 1000, 2000):
            assert history_start(costs, is_question, budget, 1) == latest_cut(costs, is_question, budget)


def test_the_cut_keeps_whole_pairs_within_the_budget_and_leaves_out_at_most_a_step_more():
    for seed in range(20):
        costs, is_question = chat(60, seed)
        for budget, step in ((1500, 256), (2000, 512), (800, 100)):
            start = history_start(costs, is_question, budget, step)
            latest = latest_cut(costs, is_question, budget)
            assert start >= latest and is_question[start]
            assert sum(costs[start:]) <= budget
            # what the grid leaves out beyond the latest cut: less than a step and one pair
            assert sum(costs[latest:start]) < step + max(costs) * 2


def test_while_the_chat_grows_the_cut_stays_put_and_moves_a_step_at_a_time():
    """A hundred questions into a full context: with the grid the turns sent
    change their start a few times; cutting a pair each question changed it
    every time the chat grew."""
    costs, is_question = chat(100, seed=3)
    budget, step = 1500, cut_step(2048)  # 256 tokens
    starts, latest = [], []
    for pairs in range(1, 101):
        n = 2 * pairs
        starts.append(history_start(costs[:n], is_question[:n], budget, step))
        latest.append(latest_cut(costs[:n], is_question[:n], budget))
    assert starts == sorted(starts)  # never back: a cut turn stays cut
    moved = sum(a != b for a, b in zip(starts, starts[1:]))
    moved_latest = sum(a != b for a, b in zip(latest, latest[1:]))
    full = sum(s > 0 for s in latest)  # questions after the context filled
    assert full > 50 and moved_latest > full // 2  # most questions moved it
    # pairs of ~63 tokens and a 256-token step: it moves about every fourth question
    assert moved <= sum(costs) // step + 1 and moved * 3 < moved_latest
    print(f"{full} questions at full context: the kept turns' start moved {moved} times, "
          f"against {moved_latest} with the latest cut")


def test_the_step_is_an_eighth_of_the_context():
    assert cut_step(4096) == 512 and cut_step(32768) == 4096 and cut_step(4) == 1


def test_a_chat_of_many_turns_is_cut_to_what_the_prompt_itself_can_hold(tiny_omni_path):
    """Each turn is counted alone, with a fixed allowance for its markup; the
    tiny model's small vocabulary spells the markup in about half a token
    more a turn, which a few hundred short turns add up to more than the
    margin: the kept turns are checked against the rendered prompt."""
    from transformers import AutoProcessor

    from vidchat.engine import EngineOptions, ModelEngine, Turn
    from vidchat.engine.prompts import family_of, model_type_of

    processor = AutoProcessor.from_pretrained(tiny_omni_path)
    options = EngineOptions(model=str(tiny_omni_path), max_model_len=4096)
    engine = ModelEngine(options, processor, str(tiny_omni_path), 0.0, family_of(model_type_of(str(tiny_omni_path))),
                         "test", True, True)
    engine.tokens_per_frame = 60
    rng = random.Random(1)
    words = "red blue green door window table chair lamp person cup book plant left right".split()
    history = []
    for _ in range(300):
        history += [Turn("user", " ".join(rng.choice(words) for _ in range(4))),
                    Turn("assistant", " ".join(rng.choice(words) for _ in range(2)))]
    for frames in (0, 1, 4):
        kept = engine.fit_history(history, "What now?", frames, "images", 0, 0.0, 16, None)
        prompt = engine.build_prompt("What now?", n_frames=frames, history=kept)
        needed = len(processor.tokenizer(prompt)["input_ids"]) + frames * engine.tokens_per_frame + 16
        assert kept and kept[0].role == "user" and len(kept) < len(history)
        assert needed <= options.max_model_len, (frames, needed)
        assert needed > options.max_model_len - cut_step(options.max_model_len) - 200  # not cut far short

    # The rendered prompt is the check only near the limit: a chat that
    # surely fits is sent whole after one render (the prompt without it).
    renders = []
    build_prompt = engine.build_prompt
    engine.build_prompt = lambda *args, **kwargs: renders.append(kwargs.get("history")) or build_prompt(*args, **kwargs)
    assert engine.fit_history(history[:40], "What now?", 4, "images", 0, 0.0, 16, None) == history[:40]
    assert renders == [None]
    renders.clear()
    engine.fit_history(history, "What now?", 4, "images", 0, 0.0, 16, None)
    assert len(renders) >= 2 and renders[1]  # near the limit: the kept turns rendered and counted
