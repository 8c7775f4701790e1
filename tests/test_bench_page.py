"""bench/page.py (the page's latency report) runs its rows end to end: a
short run of it on the suite's shared server, in Chromium."""

from __future__ import annotations

import re

import pytest
from conftest import load_script

pytestmark = pytest.mark.browser


async def test_the_page_report_runs_its_rows_and_prints_its_line(server, tmp_path, capsys):
    bench = load_script("bench/page.py")
    # Typed at once, not at a person's pace: the rows are timed from Enter.
    report = await bench.measure(server, questions=2, still_questions=1, work=tmp_path, typing_ms=0, first_questions=1)
    bench.print_report(report, "tiny")
    lines = capsys.readouterr().out.splitlines()
    print("\n".join(lines))
    rows = [line.split("  ")[0].strip() for line in lines[1:1 + len(bench.ROWS)]]
    assert rows == [label for label, _ in bench.ROWS], lines
    for _, key in bench.ROWS:
        row = report[key]
        assert row["questions_with_streamed_text"] >= 1 and row["enter_to_first_token_ms"]["median"] > 0, row
        parts = row["breakdown_median_ms"]
        assert set(parts) == {"enter_to_server_event", "server_event_to_first_token", "first_token_to_visible"}
        assert 0 <= row["new_frames"]["median"] <= row["new_frames"]["max"] <= 16, row
    # The old default's row ran with uniform sampling; the others with the server's (the tiny model: uniform too).
    assert report["old_default"]["sampling"] == "uniform" and report["prewarm_auto"]["sampling"] == "uniform"
    # Off: the page's Enter never has the server take a sample. Auto: what
    # --prewarm auto chose at start-up (off on the tiny model, whose frames
    # cost next to nothing to encode).
    assert report["prewarm_off"]["samples_taken_at_enter"] == 0
    assert report["still_prewarm_off"]["samples_taken_at_enter"] == 0
    chosen = report["prewarm"]["chosen"]
    assert report["prewarm"]["setting"] == "auto" and chosen == "off", report["prewarm"]
    assert report["prewarm_auto"]["mode_run"] == report["still_prewarm_auto"]["mode_run"] == chosen
    assert lines[-3].startswith("latency: {") and lines[-2].startswith("ratios: moving auto/off=")
    assert re.fullmatch(r"page: preset=tiny median_ms_off=[\d.]+ median_ms_auto=[\d.]+ "
                        r"p95_ms_auto=[\d.]+ still_median_ms_auto=[\d.]+ old_median_ms=[\d.]+ "
                        r"frame_encode_ms=[\d.]+ first_question_ms=[\d.]+ new_frames_median=[\d.]+", lines[-1]), lines[-1]
