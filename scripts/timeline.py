"""Where the last test run's wall time went: each worker's busy time and
idle tail, and the work units (a module, or a group sharing a fixture) by
time, from the lines tests/conftest.py writes to test-artifacts/timeline-*.jsonl.

Usage: .venv/bin/python scripts/timeline.py [--top N] [FOLDER]
"""

from __future__ import annotations

import argparse
import json
import logging
from collections import defaultdict
from pathlib import Path

log = logging.getLogger("timeline")


def read(folder: Path) -> list[dict]:
    lines = []
    for path in sorted(folder.glob("timeline-*.jsonl")):
        lines += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        raise SystemExit(f"no timeline-*.jsonl in {folder}: run the tests first")
    return lines


def report(lines: list[dict], top: int) -> list[str]:
    start = min(line["start"] for line in lines)
    end = max(line["end"] for line in lines)
    out = [f"run: {end - start:.0f} s from the first test's start to the last one's end"]
    by_worker: dict[str, list[dict]] = defaultdict(list)
    for line in lines:
        by_worker[line["worker"]].append(line)
    for worker, mine in sorted(by_worker.items()):
        busy = sum(line["end"] - line["start"] for line in mine)
        last = max(line["end"] for line in mine)
        out.append(f"{worker}: {len(mine)} tests, busy {busy:.0f} s, idle at the end {end - last:.0f} s")
    by_unit: dict[str, list[dict]] = defaultdict(list)
    for line in lines:
        by_unit[f"{line['worker']} {line['unit']}"].append(line)
    out.append(f"{'worker unit':<44}{'tests':>6}{'seconds':>9}{'from':>7}{'to':>7}")
    rows = [(sum(line["end"] - line["start"] for line in mine), name, mine) for name, mine in by_unit.items()]
    for seconds, name, mine in sorted(rows, key=lambda row: -row[0])[:top]:
        first = min(line["start"] for line in mine) - start
        last = max(line["end"] for line in mine) - start
        out.append(f"{name:<44}{len(mine):>6}{seconds:>9.0f}{first:>7.0f}{last:>7.0f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default="test-artifacts", type=Path)
    parser.add_argument("--top", type=int, default=25, help="work units listed, longest first")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for line in report(read(args.folder), args.top):
        log.info(line)


if __name__ == "__main__":
    main()
