"""bench/gpu.py runs end to end on CPU (--cpu-smoke, the tiny model through
real vLLM), so the GPU benchmark is known to work before a GPU is lent."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine  # bench/gpu.py starts vLLM in its own process

ROOT = Path(__file__).resolve().parent.parent


def test_the_gpu_benchmark_runs_its_rows_on_cpu():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--cpu-smoke"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    rows = {}
    for line in lines:
        found = re.match(r"^(\d+ frames.*?)\s{2,}([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\d+)\s+([\d.]+)$", line)
        if found:
            rows[found.group(1)] = [float(x) for x in found.groups()[1:]]
    assert list(rows) == ["1 frames", "8 frames", "16 frames", "16 frames, re-ask", "16 frames as video",
                          "16 frames + 5 s audio"], out.stdout
    prompt = {name: r[2] for name, r in rows.items()}
    assert prompt["1 frames"] < prompt["8 frames"] < prompt["16 frames"] < prompt["16 frames + 5 s audio"]
    # The re-ask finds the first question's 16 frames in the prefix cache.
    assert rows["16 frames"][3] == 0 and rows["16 frames, re-ask"][3] >= 0.9 * prompt["16 frames"]
    assert all(r[0] > 0 and r[1] > 0 for r in rows.values())
    last = lines[-1]
    assert re.fullmatch(r"gpu: device=cpu ttft16_ms=[\d.]+ reask_ttft16_ms=[\d.]+ overhead_ms=[\d.]+ "
                        r"tok_s16=[\d.]+ model=tiny warm_cold_ms=[\d.]+ warm_warm_ms=[\d.]+ warm_slid1_ms=[\d.]+ "
                        r"warm_slid4_ms=[\d.]+ warm_text_ms=[\d.]+", last), last
    # The warm-up row (bench/warm.py's) ran on 448-px frames, and the warm
    # question found the frames in the prefix cache.
    warm_line = next(line for line in lines if line.startswith("images  cold"))
    cached = int(re.search(r"cached when warm (\d+)", warm_line).group(1))
    assert cached >= 0.8 * int(re.search(r"prompt tokens (\d+)", warm_line).group(1)), warm_line
