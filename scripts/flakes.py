"""Flake hunt: rerun the tests with the most waits and timing checks, several times.

    scripts/flakes.sh [--top 30] [--runs 5] [--workers 1] [--list]

A test's score counts, in its own body and in the module helpers it calls,
the places where the outcome can depend on timing: waits for a condition
(eventually, wait_for_function, wait_for_answer, until, ...), deadlines
(asyncio.wait_for, timeout=), clock reads (time.monotonic, perf_counter) and
assertions on durations. The top --top tests run --runs times (each run in one
pytest process, so the shared server and engines are reused); the report
lists every test that failed in any run. Exit status 1 if one did.
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WAITS = {"eventually", "eventually_async", "wait_for_function", "wait_for_selector", "wait_for_answer", "until",
         "until_idle", "wait_for", "stats_when", "session_gone", "no_sessions_left", "until_remote_idle",
         "recv", "wait", "wait_turn"}
CLOCKS = {"monotonic", "perf_counter", "time"}


def _name(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _own_score(node: ast.AST) -> tuple[int, set[str]]:
    score, called = 0, set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            name = _name(sub)
            called.add(name or "")
            if name in WAITS or name in CLOCKS or name == "wait_for":
                score += 1
            score += sum(1 for kw in sub.keywords if kw.arg in ("timeout", "within"))
        elif isinstance(sub, ast.Assert):
            text = ast.unparse(sub.test)
            score += any(k in text for k in ("_ms", "_s ", "_s)", "seconds", "elapsed", "lag", "ttft"))
    return score, called


def scores() -> list[tuple[int, str]]:
    ranked = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        funcs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        own = {name: _own_score(f) for name, f in funcs.items()}
        for name in funcs:
            if not name.startswith("test_"):
                continue
            score, called = own[name]
            score += sum(own[h][0] for h in called if h in own and not h.startswith("test_"))
            ranked.append((score, f"tests/{path.name}::{name}"))
    return sorted(ranked, key=lambda r: (-r[0], r[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--list", action="store_true", help="print the chosen tests and their scores, run nothing")
    # The same load as make test's (its TEST_WORKERS): a test that only fails
    # beside another worker is found where CI would find it.
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist workers (make flakes: make test's)")
    args = parser.parse_args()
    chosen = scores()[: args.top]
    if args.list:
        for score, test in chosen:
            print(f"{score:4d}  {test}")
        return 0
    failures: collections.Counter = collections.Counter()
    runs_of: collections.Counter = collections.Counter()
    for run in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.xml"
            xdist = ["-n", str(args.workers), "--dist", "loadfile"] if args.workers > 1 else []
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *xdist,
                                   f"--junitxml={report}", *[t for _, t in chosen]], cwd=ROOT)
            import xml.etree.ElementTree as ET

            for case in ET.parse(report).iter("testcase"):
                test = f"{case.get('classname')}::{case.get('name')}"
                runs_of[test] += 1
                if case.find("failure") is not None or case.find("error") is not None:
                    failures[test] += 1
        print(f"flakes: run {run}/{args.runs} exit {proc.returncode}; failing so far: {dict(failures)}", flush=True)
    print(json.dumps({"tests": len(runs_of), "runs": args.runs, "failed": dict(failures)}, indent=2))
    print(f"flakes: tests={len(chosen)} runs={args.runs} workers={args.workers} executions={sum(runs_of.values())} "
          f"failures={sum(failures.values())} flaky={len(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
