"""bench/page.py (the page's latency report) runs its rows end to end: a
short run of it on the suite's shared server, in Chromium."""

from __future__ import annotations

import importlib.util
import re

import pytest

from conftest import ROOT

pytestmark = pytest.mark.browser


def _bench_page():
    spec = importlib.util.spec_from_file_location("bench_page", ROOT / "bench" / "page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_page_report_runs_its_rows_and_prints_its_line(server, tmp_path, capsys):
    bench = _bench_page()
    report = await bench.measure(server, questions=2, still_questions=2, work=tmp_path)
    bench.print_report(report, "tiny")
    lines = capsys.readouterr().out.splitlines()
    print("\n".join(lines))
    rows = [line.split("  ")[0].strip() for line in lines[1:6]]
    assert rows == [label for label, _ in bench.ROWS], lines
    for _, key in bench.ROWS:
        row = report[key]
        assert row["questions_with_streamed_text"] >= 1 and row["enter_to_first_token_ms"]["median"] > 0, row
        parts = row["breakdown_median_ms"]
        assert set(parts) == {"enter_to_server_event", "server_event_to_first_token", "first_token_to_visible"}
    # Warm-ups on: the page's Enter has the server take the sample at once; off: never.
    # Not every question of a row uses its pin: the first after the row's
    # sampling change was pinned with the old settings, and on a loaded
    # machine a question can overtake its own Enter report (it then samples
    # on arrival, as designed); over the three rows with warm-ups on, some do.
    assert report["prewarm_off"]["samples_taken_at_enter"] == 0
    assert report["still_prewarm_off"]["samples_taken_at_enter"] == 0
    assert sum(report[key]["samples_taken_at_enter"]
               for key in ("prewarm_idle", "still_prewarm_idle", "still_prewarm_idle_no_audio")) >= 1
    assert lines[-2].startswith("latency: {")
    assert re.fullmatch(r"page: preset=tiny questions=2 median_ms_off=[\d.]+ median_ms_idle=[\d.]+ "
                        r"p95_ms_idle=[\d.]+ still_median_ms_off=[\d.]+ still_median_ms_idle=[\d.]+", lines[-1]), lines[-1]
