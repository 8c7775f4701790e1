"""QA suite benchmark: what a suite run costs beyond the asks themselves.

    .venv/bin/python bench/suite.py [--cases 10] [--asks 2] [--jobs 4]

A suite of --cases video cases with --asks asks each (a generated 4-s clip
per case, temperature 0, 6 tokens an answer) is run on the tiny model with
``python -m vidchat.suite run`` twice, with --jobs 1 and with --jobs N; the
baseline, in the same run, is the same asks of the same clips through
``python -m vidchat.replay`` (all clips in one command, so one engine start
each). Each is timed whole (engine start included, the same in all three):
per-ask time = wall time / asks.

Last line: ``suite: asks=… per_ask_ms=… replay_per_ask_ms=… ratio=… jobs=…``
(per_ask_ms and ratio: --jobs 1 against replay, the suite's own overhead;
the table also shows --jobs N).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

ENGINE_ARGS = ["--model", "tiny", "--max-model-len", "4096", "--kv-cache-gb", "0.25", "--max-images", "16"]


def _timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if res.returncode not in (0, 1):  # 1: a check failed, which the timing does not mind
        raise RuntimeError(f"{' '.join(cmd[:4])} … exited {res.returncode}: {res.stderr[-2000:]}")
    return wall


def build(root: Path, cases: int, asks: int) -> list[tuple[float, str]]:
    """The suite's folder: one clip per case (each a moving box), the same asks in each."""
    from test_replay import make_clip  # the replay tests' clip maker

    questions = [(round(1.0 + i * 2.5 / max(1, asks), 2), f"Question {i + 1}: what moves?") for i in range(asks)]
    (root / "clips").mkdir(parents=True)
    lines = ['name = "bench"', "[settings]", "temperature = 0", "max_tokens = 6", "num_sample_frames = 4"]
    for c in range(cases):
        make_clip(root / "clips" / f"clip{c}.mp4")
        lines += ["[[case]]", f'name = "case{c}"', f'video = "clips/clip{c}.mp4"']
        for at, q in questions:
            lines += ["  [[case.ask]]", f"  at = {at}", f"  question = {json.dumps(q)}",
                      '  expect = { not_contains = ["zzzq"] }']
    (root / "suite.toml").write_text("\n".join(lines) + "\n")
    return questions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10)
    parser.add_argument("--asks", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vidchat-suite-bench-") as tmp:
        root = Path(tmp) / "suite"
        questions = build(root, args.cases, args.asks)
        total = args.cases * args.asks
        replay_cmd = [sys.executable, "-m", "vidchat.replay", *[str(p) for p in sorted((root / "clips").iterdir())],
                      *ENGINE_ARGS, "--set", "temperature=0", "--set", "max_tokens=6", "--set", "num_sample_frames=4",
                      "--json", *[a for at, q in questions for a in ("--ask", f"{at}:{q}")]]
        replay_s = _timed(replay_cmd)
        suite_cmd = [sys.executable, "-m", "vidchat.suite", "run", str(root), *ENGINE_ARGS]
        one_s = _timed([*suite_cmd, "--jobs", "1", "--out", str(Path(tmp) / "one")])
        many_s = _timed([*suite_cmd, "--jobs", str(args.jobs), "--out", str(Path(tmp) / "many")])
        answered = json.loads((Path(tmp) / "many" / "results.json").read_text())["summary"]
    per = {name: s * 1000 / total for name, s in (("replay", replay_s), ("one", one_s), ("many", many_s))}
    print(f"{'run':<28}{'wall s':>10}{'per ask ms':>12}{'vs replay':>11}")
    for label, key, wall in (("replay (baseline)", "replay", replay_s), ("suite --jobs 1", "one", one_s),
                             (f"suite --jobs {args.jobs}", "many", many_s)):
        print(f"{label:<28}{wall:>10.1f}{per[key]:>12.0f}{per[key] / per['replay']:>11.2f}")
    print(f"asks passed {answered['passed']}, failed {answered['failed']}, errors {answered['errors']}")
    print(f"suite: asks={total} per_ask_ms={per['one']:.0f} replay_per_ask_ms={per['replay']:.0f} "
          f"ratio={per['one'] / per['replay']:.2f} jobs={args.jobs} per_ask_ms_jobs={per['many']:.0f} "
          f"ratio_jobs={per['many'] / per['replay']:.2f}")


if __name__ == "__main__":
    main()
