"""bench/talk.py runs end to end on the tiny omni model through real vLLM
(a short run on the suite's shared omni engine: its rows, their order, and
the last line reviewers read)."""

from __future__ import annotations

import re
import sys

import pytest
from conftest import load_script

pytestmark = pytest.mark.engine


async def test_the_talk_benchmark_reports_its_rows_and_last_line(omni_engine, capsys):
    bench = load_script("bench/talk.py")
    last = await bench.report(omni_engine, bench.parse_args(["--utterances", "3", "--warmup", "1"]))
    print(last)
    output = capsys.readouterr().out
    sys.stdout.write(output)  # shown with -s, and in the report of a failure
    lines = output.splitlines()
    rows = {}
    for line in lines:
        found = re.match(r"^(\S.*? -> .+?)\s{2,}([\d.]+)\s+([\d.]+)$", line)
        if found:
            rows[found.group(1)] = (float(found.group(2)), float(found.group(3)))
    assert list(rows) == ["speech end -> utterance (VAD)", "utterance -> first token", "speech end -> first token",
                          "typed question -> first token"], output
    decision = rows["speech end -> utterance (VAD)"][0]
    assert decision >= 500  # the detector waits for the 500 ms pause that ends a question
    assert rows["speech end -> first token"][0] >= decision
    last = lines[-1]
    found = re.fullmatch(r"talk: end_to_first_token_ms=([\d.]+) vad_ms_per_s=([\d.]+) false_triggers=(\d+) "
                         r"p95_ms=[\d.]+ typed_ttft_ms=[\d.]+ silence_ms=500", last)
    assert found, last
    assert int(found.group(3)) == 0, output  # silence, noise, tones and the page's echo never triggered
    # The echo gate's table: at 20 dB below the user's voice the page's own voice is kept out by the gate only.
    table = re.findall(r"^\s+([-+]\d+) dB\s+(\d+)\s+(\d+)$", output, re.M)
    echo = {int(level): (int(without), int(gated)) for level, without, gated in table}
    assert list(echo) == [-30, -25, -20, -15, -10, -6], output
    assert echo[-20] == (1, 0) and echo[-25] == (1, 0)
