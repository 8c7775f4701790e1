"""bench/gpu.py's rows run end to end on CPU, so the GPU benchmark is known
to work before a GPU is lent: the same rows and last line as
``bench/gpu.py --cpu-smoke``, on the suite's shared tiny omni engine (the
script itself starts its own)."""

from __future__ import annotations

import re
import sys

import pytest
from conftest import load_script

pytestmark = pytest.mark.engine


async def test_the_gpu_benchmarks_rows_run_on_cpu(omni_engine, capsys):
    bench = load_script("bench/gpu.py")
    # --cpu-smoke's settings: one repeat, 8-token answers.
    rows = await bench.engine_rows(omni_engine, "tiny", repeats=1, tokens=8)
    bench.table(rows)
    print(bench.summary(bench.device_name(), "tiny", rows))
    output = capsys.readouterr().out
    sys.stdout.write(output)  # shown with -s, and in the report of a failure
    lines = output.splitlines()
    table = {}
    for line in lines:
        found = re.match(r"^(\d+ frames.*?)\s{2,}([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\d+)\s+([\d.]+)$", line)
        if found:
            table[found.group(1)] = [float(x) for x in found.groups()[1:]]
    assert list(table) == ["1 frames", "8 frames", "16 frames", "16 frames, re-ask", "16 frames as video",
                           "16 frames + 5 s audio"], output
    prompt = {name: r[2] for name, r in table.items()}
    assert prompt["1 frames"] < prompt["8 frames"] < prompt["16 frames"] < prompt["16 frames + 5 s audio"]
    # The re-ask finds the first question's 16 frames in the prefix cache;
    # a new session finds nothing of another's.
    assert table["16 frames"][3] == 0 and table["16 frames, re-ask"][3] >= 0.9 * prompt["16 frames"]
    assert all(r[0] > 0 and r[1] > 0 for r in table.values())
    last = lines[-1]
    assert re.fullmatch(r"gpu: device=cpu ttft16_ms=[\d.]+ reask_ttft16_ms=[\d.]+ overhead_ms=[\d.]+ "
                        r"tok_s16=[\d.]+ model=tiny warm_cold_ms=[\d.]+ warm_warm_ms=[\d.]+ warm_slid1_ms=[\d.]+ "
                        r"warm_slid4_ms=[\d.]+ warm_text_ms=[\d.]+", last), last
    # The warm-up row (bench/warm.py's) ran on 448-px frames, and the warm
    # question found the frames in the prefix cache.
    warm_line = next(line for line in lines if line.startswith("images  cold"))
    cached = int(re.search(r"cached when warm (\d+)", warm_line).group(1))
    assert cached >= 0.8 * int(re.search(r"prompt tokens (\d+)", warm_line).group(1)), warm_line
