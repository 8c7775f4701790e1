"""Which turns of a long chat go with a question, once the whole chat no
longer fits the model's context.

The oldest question-and-answer pairs are left out, and the cut is placed on
a coarse grid of the chat's running token count rather than as late as it
could be. While the chat grows, the cut then stays where it is: the turns
sent are the same prefix question after question (history comes before the
frames in the prompt), and vLLM serves that prefix from its cache. Cutting
one pair per question instead, as soon as the chat filled the context,
changed the prefix every time, and every later question prefilled its whole
history again (seconds a question on a CPU at full context).
"""

from __future__ import annotations

from typing import Sequence

# The grid's step, as a share of --max-model-len: the cut moves by about this
# much at a time, and leaves out at most this much more than it must.
CUT_STEP_SHARE = 1 / 8


def cut_step(max_model_len: int) -> int:
    """The grid's step in tokens: fixed per engine, so that a question whose
    own needs differ (frames, audio, its length) cuts on the same grid."""
    return max(1, int(max_model_len * CUT_STEP_SHARE))


def history_start(costs: Sequence[int], is_question: Sequence[bool], budget: int, step: int) -> int:
    """The index of the first turn to send: whole pairs (a kept answer keeps
    its question) whose ``costs`` (tokens each) fit ``budget``, cut where the
    chat's running count enters a new ``step``. 0 when the whole chat fits,
    ``len(costs)`` when not even the newest pair does. With ``step`` 1 it is
    the latest cut that fits, one pair at a time."""
    n = len(costs)
    start, remaining = 0, sum(costs)
    while start < n and remaining > budget:  # the latest cut that fits
        remaining -= costs[start]
        start += 1
        while start < n and not is_question[start]:
            remaining -= costs[start]
            start += 1
    if start in (0, n):
        return start
    running, step_before = 0, []
    for cost in costs:
        step_before.append(running // step)
        running += cost
    questions = [i for i in range(n) if is_question[i]]
    for previous, question in zip(questions, questions[1:]):
        if question >= start and step_before[question] != step_before[previous]:
            return question
    return start  # no step begins after it (a budget smaller than a step): the latest cut
