"""bench/soak.py runs end to end (issue 45): a few seconds of its three
doors on the tiny model, through real vLLM, aiortc and the openai SDK, to
check that it works, drains, and prints the line reviewers read. No timed
assertion: the figures of a run this short say nothing about leaks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import CACHE_DIR, ROOT

pytestmark = pytest.mark.engine

LAST_LINE = re.compile(r"soak: minutes=([\d.]+) sessions=(\d+) answers=(\d+) errors=(\d+) "
                       r"rss_slope_mb_per_h=(-?[\d.]+|n/a) engine_rss_slope_mb_per_h=(-?[\d.]+|n/a) "
                       r"fds_end_minus_start=(-?\d+|n/a) tasks_end_minus_start=(-?\d+|n/a)")


@pytest.mark.timeout(400)
def test_the_soak_runs_its_three_doors_drains_and_prints_its_line(tmp_path):
    env = dict(os.environ, VIDCHAT_CACHE_DIR=str(CACHE_DIR))
    run = subprocess.run(
        [sys.executable, "bench/soak.py", "--minutes", "0.25", "--sessions", "3", "--ask-every", "3",
         "--churn-every", "8", "--sample-every", "3", "--settle-minutes", "0", "--max-tokens", "4",
         "--settle-tasks", "3"],  # aiortc's last tasks take ~20 s to end; this checks that the soak works
        cwd=ROOT, capture_output=True, text=True, timeout=380, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    last = run.stdout.strip().splitlines()[-1]
    found = LAST_LINE.fullmatch(last)
    assert found, last
    minutes, sessions, answers, errors = found.group(1), int(found.group(2)), int(found.group(3)), int(found.group(4))
    assert minutes == "0.25" and sessions == 3
    report = json.loads((ROOT / "bench" / "results" / "soak.json").read_text())
    assert errors == 0, report["problems"]
    assert answers >= 3, report  # every asking door answered at least once
    assert report["opened"]["page"] >= 1 and report["opened"]["socket"] >= 1 and report["opened"]["realtime"] >= 1
    samples = report["samples"]
    assert len(samples) >= 3 and samples[-1]["sessions"] == 0  # drained at the end
    assert all(s["server"]["rss_mb"] and s["engine"]["rss_mb"] for s in samples)
