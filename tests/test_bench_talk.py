"""bench/talk.py runs end to end on the tiny omni model through real vLLM
(a short run: its rows, their order, and the last line reviewers read)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parent.parent


def test_the_talk_benchmark_reports_its_rows_and_last_line():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "talk.py"), "--utterances", "3", "--warmup", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    rows = {}
    for line in lines:
        found = re.match(r"^(\S.*? -> .+?)\s{2,}([\d.]+)\s+([\d.]+)$", line)
        if found:
            rows[found.group(1)] = (float(found.group(2)), float(found.group(3)))
    assert list(rows) == ["speech end -> utterance (VAD)", "utterance -> first token", "speech end -> first token",
                          "typed question -> first token"], out.stdout
    decision = rows["speech end -> utterance (VAD)"][0]
    assert decision >= 500  # the detector waits for the 500 ms pause that ends a question
    assert rows["speech end -> first token"][0] >= decision
    last = lines[-1]
    found = re.fullmatch(r"talk: end_to_first_token_ms=([\d.]+) vad_ms_per_s=([\d.]+) false_triggers=(\d+) "
                         r"p95_ms=[\d.]+ typed_ttft_ms=[\d.]+ silence_ms=500", last)
    assert found, last
    assert int(found.group(3)) == 0, out.stdout  # silence, noise, tones and the page's echo never triggered
    # The echo gate's table: at 20 dB below the user's voice the page's own voice is kept out by the gate only.
    table = re.findall(r"^\s+([-+]\d+) dB\s+(\d+)\s+(\d+)$", out.stdout, re.M)
    echo = {int(level): (int(without), int(gated)) for level, without, gated in table}
    assert list(echo) == [-30, -25, -20, -15, -10, -6], out.stdout
    assert echo[-20] == (1, 0) and echo[-25] == (1, 0)
