"""QA suites: keep what you found on live video, re-run it against every model.

    python -m vidchat.suite run SUITE [--model M]... [--engine-url URL]... [--out DIR] [--update-baseline] [--jobs N]
    python -m vidchat.suite add SUITE BUNDLE [--name NAME] [--contains WORD]... [--same-as-baseline]

``run`` asks every case of the suite (vidchat.qa.suite_file) on every model:
one engine per model, started once and used for all its cases, models one
after another (memory), cases at once up to ``--jobs``. A video case plays
through replay's deterministic path (the file's own clock, each ask at its
second, the chat so far as history); a bundle case is re-asked with its
exact frames, audio and history. Each ask's answer is checked
(vidchat.qa.suite) and written to ``--out`` (default
``SUITE/runs/<UTC time>/``) as results.json, junit.xml and report.html
(vidchat.qa.suite_report), with each answer's recording bundle under
``bundles/``; without ``--out`` the oldest run folders beyond
``--suite-keep-runs`` are deleted. ``--update-baseline`` writes this run's
answers into SUITE/baseline.json and holds its same_as_baseline checks to
them. Exit status: 0 every check passed, 1 a check failed or an ask errored
(one with no baseline to judge it by included), 2 the suite (or a flag)
can't be read.

The app's options apply as in app.py (--cache-dir, --max-model-len, ...);
``--model`` may be given several times, and each ``--engine-url`` (a model
served elsewhere, vllm serve) is one more model, named by its URL.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import logging
import re
import secrets
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from vidchat.qa.commands import changes_of
from vidchat.qa.replay import USAGE, Run, _quiet, reask_bundle, replay_file, resolve, start_engine
from vidchat.qa.suite_file import BASELINE_FILE, Case, Suite, SuiteError, add_bundle, read_suite
from vidchat.qa.suite_report import new_run_folder, prune_runs

log = logging.getLogger(__name__)


# A suite ask's checks against the answer it got: each one ✓ or ✗ with a
# detail a person reads (what was expected, what came), or not judged at all
# (same_as_baseline with no baseline: the ask is an error, not a failure).

@dataclass(frozen=True)
class CheckResult:
    check: str
    ok: bool
    detail: str
    judged: bool = True  # False: there was nothing to judge the answer against

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.check, "ok": self.ok, "detail": self.detail}


def _words(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def run_checks(expect: dict[str, Any], answer: str, first_token_ms: float | None,
               baseline: str | None, accepting: bool = False) -> list[CheckResult]:
    """Every check of ``expect`` on ``answer``. ``baseline``: this model's
    answer in baseline.json (None: there is none, and same_as_baseline is
    not judged, saying so, rather than passing). ``accepting``: the run
    writes ``baseline`` as this model's baseline (--update-baseline)."""
    results: list[CheckResult] = []
    lowered = answer.casefold()
    for word in _words(expect.get("contains", [])):
        found = word.casefold() in lowered
        results.append(CheckResult("contains", found, f"{'has' if found else 'lacks'} {word!r}"))
    for word in _words(expect.get("not_contains", [])):
        found = word.casefold() in lowered
        results.append(CheckResult("not_contains", not found, f"{'has' if found else 'lacks'} {word!r}"))
    if "matches" in expect:
        hit = re.search(expect["matches"], answer)
        results.append(CheckResult("matches", hit is not None,
                                   f"/{expect['matches']}/ {'matched ' + repr(hit.group(0)) if hit else 'no match'}"))
    if "max_first_token_ms" in expect:
        limit = float(expect["max_first_token_ms"])
        ok = first_token_ms is not None and first_token_ms <= limit
        took = "no first token" if first_token_ms is None else f"first token after {first_token_ms:.0f} ms"
        results.append(CheckResult("max_first_token_ms", ok, f"{took} (at most {limit:g} ms)"))
    if expect.get("same_as_baseline"):
        if baseline is None:
            results.append(CheckResult("same_as_baseline", False,
                                       "no baseline for this model: run with --update-baseline first", judged=False))
        else:
            same = answer == baseline
            said = "differs from the baseline" if not same else (
                "accepted as the baseline (--update-baseline writes it)" if accepting else "the same as the baseline")
            results.append(CheckResult("same_as_baseline", same, said))
    return results


log = logging.getLogger("vidchat.qa.suite")

PASSED, FAILED_CHECK, ERRORED = "passed", "failed", "error"


@dataclass
class AskResult:
    """One ask of one case on one model: results.json's row."""

    case: str
    ask: int
    model: str
    question: str
    answer: str = ""
    status: str = ERRORED
    checks: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    first_token_ms: float | None = None
    tokens: int | None = None
    frames: int | None = None
    inputs_sha256: str | None = None
    changed_from_baseline: bool | None = None
    frame_times: list[float] = field(default_factory=list)
    bundle: str | None = None  # the answer's recording, under the run's folder (the report's thumbnails)
    note: str = ""  # the case's note
    mark: dict | None = None  # the QA verdict on the answer the case was made from ({"mark", "note"})

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.status != ERRORED:
            out.pop("error")
        return out


class _Capture:
    """replay's Output, kept instead of printed: the records of one case's asks."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def answer(self, rec: dict[str, Any]) -> None:
        self.records.append(rec)

    def failure(self, t: float | None, question: str, reason: str, watch: bool = False) -> None:
        self.records.append({"t": t, "question": question, "error": reason})


def _run_for(case: Case, settings: Any, model: str, out_dir: Path, role: str) -> Run:
    """A replay Run for one case: its asks, its settings, its bundles' folder, its engine's role."""
    changes = changes_of(case.settings, f"case {case.name!r}: settings")
    asks = [types.SimpleNamespace(at=a.at, text=a.question) for a in case.asks if a.at is not None]
    args = types.SimpleNamespace(ask=asks, every=[], no_history=False, watch_every=None)
    return Run(args, settings, model, changes, str(out_dir), _Capture(), role=role)


async def _ask_case(case: Case, state: Any, settings: Any, model: str, out: Path, role: str) -> list[dict]:
    """The case's records, one per ask in the suite's order (an error record where it failed)."""
    from vidchat.conversation.bundles import BundleError, read_bundle

    folder = out / "bundles" / _safe(model) / _safe(case.name)
    folder.mkdir(parents=True, exist_ok=True)
    run = _run_for(case, settings, model, folder, role)
    if case.bundle is not None:
        try:
            bundle = await asyncio.to_thread(read_bundle, case.bundle)
        except (BundleError, OSError) as exc:
            return [{"error": f"{case.bundle}: not a bundle vidchat can read: {exc}"}]
        question = case.asks[0].question
        if question is not None and question != bundle.question:
            bundle = copy.copy(bundle)
            bundle.manifest = {**bundle.manifest, "question": question}
        code = await reask_bundle(run, state, bundle)
        if code == USAGE and not run.output.records:
            return [{"error": f"{case.bundle}: its settings can't be asked on this model"}]
        return run.output.records[:1] or [{"error": "no answer"}]
    if not case.video.is_file():
        return [{"error": f"{case.video}: no such clip"} for _ in case.asks]
    try:
        code = await replay_file(run, state, str(case.video))
    except Exception as exc:  # noqa: BLE001 - a clip PyAV can't read is this case's error
        return [{"error": f"{case.video}: {exc}"} for _ in case.asks]
    if code == USAGE:
        return [{"error": f"case {case.name!r}: its settings can't be asked on this model"} for _ in case.asks]
    return _in_ask_order(case, run.output.records)


def _in_ask_order(case: Case, records: list[dict]) -> list[dict]:
    """Replay answers in time order; the suite reports in its own order."""
    left = list(records)
    ordered = []
    for ask in case.asks:
        match = next((r for r in left if r.get("question") == ask.question and r.get("t") == ask.at), None)
        if match is None:
            ordered.append({"error": f"asked at {ask.at:g} s, but replay gave no answer for it"})
            continue
        left.remove(match)
        ordered.append(match)
    return ordered


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80] or "_"


def _result(case: Case, index: int, model: str, rec: dict, baseline: dict, accepting: bool = False) -> AskResult:
    """One ask's row. ``accepting``: this run writes its answers as the
    baseline (--update-baseline), so same_as_baseline holds it to the answer
    it accepts, not to the one it replaces."""
    ask = case.asks[index]
    question = rec.get("question") or ask.question or ""
    result = AskResult(case.name, index, model, question, note=case.note, mark=case.mark)
    if "error" in rec:
        result.error = rec["error"]
        return result
    before = baseline.get(model, {}).get(case.name, {}).get(str(index))
    result.answer = rec.get("answer", "")
    result.first_token_ms = rec.get("ttft_ms")
    result.tokens = rec.get("completion_tokens")
    result.frames = len(rec.get("frame_indices") or [])
    result.frame_times = list(rec.get("frame_times") or [])
    result.inputs_sha256 = rec.get("inputs_sha256")
    result.bundle = rec.get("bundle")
    result.changed_from_baseline = None if before is None else result.answer != before
    checks = run_checks(ask.expect, result.answer, result.first_token_ms, result.answer if accepting else before,
                        accepting=accepting)
    result.checks = [c.as_dict() for c in checks]
    unjudged = [c for c in checks if not c.judged]
    if unjudged:  # an ask that could not be judged is an error, not a failed check
        result.error = "; ".join(f"{c.check}: {c.detail}" for c in unjudged)
        return result
    result.status = PASSED if all(c.ok for c in checks) else FAILED_CHECK
    return result


async def ask_cases(suite: Suite, state: Any, settings: Any, model: str, out: Path, jobs: int, baseline: dict,
                    progress: Callable[[AskResult], None] = lambda r: None, *, role: str = "main",
                    accepting: bool = False) -> list[AskResult]:
    """Every case of the suite on the app's engine of ``role`` (looked up at
    each ask, so a restarted engine answers the rest), up to ``jobs`` cases
    at once, in the suite's order. The command line's runner and the page's
    Suites panel (vidchat.qa.suite, on the server's own engine and
    answer queue) both ask through it. ``accepting``: see _result."""
    room = asyncio.Semaphore(jobs)

    async def one(case: Case) -> list[AskResult]:
        async with room:
            records = await _ask_case(case, state, settings, model, out, role)
        # A case's clip or bundle by its path in the suite: the page shows errors, not the server's paths.
        records = [{**rec, "error": rec["error"].replace(f"{suite.root}/", "")} if "error" in rec else rec
                   for rec in records]
        results = [_result(case, i, model, rec, baseline, accepting) for i, rec in enumerate(records)]
        for r in results:
            progress(r)
        return results

    done = await asyncio.gather(*(one(c) for c in suite.cases))
    return [r for case_results in done for r in case_results]


async def _run_model(suite: Suite, settings: Any, model: str, out: Path, jobs: int, baseline: dict,
                     progress: Callable[[AskResult], None], accepting: bool) -> list[AskResult]:
    from vidchat.engine import EngineError

    settings = (dataclasses.replace(settings, engine_url=model, model="auto") if _is_url(model)
                else dataclasses.replace(settings, model=model, engine_url=""))
    try:
        settings, model_path, banner = resolve(settings)
        state, engine = await start_engine(settings, model, model_path, banner)
    except (EngineError, ValueError) as exc:
        return [AskResult(c.name, i, model, a.question or "", error=f"model {model}: {exc}")
                for c in suite.cases for i, a in enumerate(c.asks)]
    try:
        return await ask_cases(suite, state, settings, model, out, jobs, baseline, progress, accepting=accepting)
    finally:
        await state.registry.close_all()
        engine.shutdown()


def asks_in(suite: Suite) -> int:
    """How many asks one model's run of the suite makes."""
    return sum(len(c.asks) for c in suite.cases)


def summary_of(results: list[AskResult]) -> dict[str, int]:
    """results.json's summary: asks passed, failed and errored."""
    summary = {status: sum(r.status == status for r in results) for status in (PASSED, FAILED_CHECK)}
    summary["errors"] = sum(r.status == ERRORED for r in results)
    return summary


def _progress(stream: Any) -> Any:
    """A line per ask on a terminal; nothing otherwise."""
    if not stream.isatty():
        return lambda result: None

    def say(result: AskResult) -> None:
        mark = {"passed": "✓", "failed": "✗", "error": "!"}[result.status]
        print(f"{mark} {result.model} · {result.case} #{result.ask}: {result.error or result.answer[:60]!r}",
              file=stream, flush=True)

    return say


def _update_baseline(suite: Suite, results: list[AskResult]) -> None:
    """The answers into baseline.json, read and written whole under the suite's
    lock file, so an Add to suite on a server meanwhile loses no entry."""
    from vidchat.conversation.suite_cases import edit_baseline

    def keep(baseline: dict) -> None:
        for r in results:
            if r.status != ERRORED:
                baseline.setdefault(r.model, {}).setdefault(r.case, {})[str(r.ask)] = r.answer

    edit_baseline(suite.root, keep)


def report_of(suite: Suite, models: list[str], results: list[AskResult],
              baseline_written: bool = False) -> dict[str, Any]:
    """results.json's content."""
    return {"suite": suite.name, "models": models, "asks": [r.as_dict() for r in results],
            "summary": summary_of(results), "baseline_written": baseline_written}


def run_suite(suite: Suite, settings: Any, models: list[str], out: Path, jobs: int = 4,
              update_baseline: bool = False, progress: Callable[[AskResult], None] = lambda r: None) -> dict[str, Any]:
    """Every case on every model; writes the reports into ``out`` and returns
    results.json's content. With ``update_baseline`` the answers become the
    baseline first, and the run's same_as_baseline checks hold them to it."""
    from vidchat.qa.suite_report import write_reports

    baseline = suite.baseline()
    out.mkdir(parents=True, exist_ok=True)
    results: list[AskResult] = []
    for model in models:  # one after another: one engine in memory at a time
        results += asyncio.run(_run_model(suite, settings, model, out, jobs, baseline, progress, update_baseline))
    if update_baseline:
        _update_baseline(suite, results)
    report = report_of(suite, models, results, baseline_written=update_baseline)
    write_reports(out, report, baseline)
    return report


def _split_models(argv: list[str]) -> tuple[list[str], list[str]]:
    """The repeatable --model and --engine-url (each a model, named by its
    URL) out of the app's flags, where each is given once."""
    models, rest, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--model", "--engine-url") and i + 1 < len(argv):
            models.append(argv[i + 1])
            i += 2
            continue
        if arg.startswith(("--model=", "--engine-url=")):
            models.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
        i += 1
    return models, rest


def _is_url(model: str) -> bool:
    return model.startswith(("http://", "https://"))


def _run_parser() -> argparse.ArgumentParser:
    from vidchat.app.settings import build_parser as app_parser

    parser = app_parser()
    parser.prog = "python -m vidchat.suite run"
    parser.description = "Ask every case of a QA suite on every model; write results.json, junit.xml, report.html."
    parser.set_defaults(log_level="warning")
    g = parser.add_argument_group("suite")
    g.add_argument("suite", metavar="SUITE", help="the suite's folder (suite.toml at its root)")
    g.add_argument("--out", default=None, help="where the reports go (default SUITE/runs/<UTC time>/)")
    g.add_argument("--update-baseline", action="store_true", help="write this run's answers into SUITE/baseline.json")
    g.add_argument("--jobs", type=int, default=4, help="cases asked at once on a model (default 4)")
    g.add_argument("-v", "--verbose", action="store_true", help="log progress (and vLLM's own log) on stderr")
    return parser


def _main_run(argv: list[str]) -> int:
    from vidchat.app.settings import settings_from_args

    models, rest = _split_models(argv)
    parser = _run_parser()
    args = parser.parse_args(rest)
    settings = settings_from_args(parser, args)
    _quiet(args.verbose, settings.log_level)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    try:
        suite = read_suite(args.suite)
    except SuiteError as exc:
        print(f"vidchat.suite: {exc}", file=sys.stderr)
        return USAGE
    out = Path(args.out) if args.out else new_run_folder(suite.root / "runs")
    report = run_suite(suite, settings, models or [settings.model], out, args.jobs, args.update_baseline,
                       _progress(sys.stderr))
    if not args.out:
        prune_runs(suite.root / "runs", settings.suite_keep_runs)
    s = report["summary"]
    print(f"suite {suite.name}: {s['passed']} passed, {s['failed']} failed, {s['errors']} errors "
          f"({len(report['asks'])} asks on {len(report['models'])} model(s)); report: {out / 'report.html'}")
    if args.update_baseline:
        print(f"baseline written: {suite.root / BASELINE_FILE} (this run's answers, which its checks held to)")
    return 0 if s["failed"] == 0 and s["errors"] == 0 else 1


def _main_add(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m vidchat.suite add",
                                     description="Copy a recorded bundle into a suite as a case.")
    parser.add_argument("suite", metavar="SUITE")
    parser.add_argument("bundle", metavar="BUNDLE", help="a bundle folder or zip (the page's, a socket's or replay's)")
    parser.add_argument("--name", default=None, help="the case's name (default: the bundle's)")
    parser.add_argument("--contains", action="append", default=[], metavar="WORD",
                        help="expect the answer to contain WORD (repeatable)")
    parser.add_argument("--same-as-baseline", action="store_true", help="expect this model's baseline answer")
    parser.add_argument("--note", default="", help="a note kept with the case")
    args = parser.parse_args(argv)
    from vidchat.conversation.bundles import BundleError, read_bundle

    try:
        read_bundle(args.bundle)  # refused now, not at the next run
        case = add_bundle(args.suite, args.bundle, name=args.name, contains=args.contains,
                          same_as_baseline=args.same_as_baseline, note=args.note)
    except (SuiteError, BundleError, OSError, ValueError) as exc:  # ValueError: a note or name TOML can't hold
        print(f"vidchat.suite: {exc}", file=sys.stderr)
        return USAGE
    print(f"added case {case.name!r} ({case.bundle}) to {Path(args.suite) / 'suite.toml'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"run": _main_run, "add": _main_add}
    if not argv or argv[0] not in commands:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return USAGE
    return commands[argv[0]](argv[1:])


# The page's Suites panel, on the server (docs/suites.md): the suite of
# ``--suite-dir`` run on the server's own model (or ``--compare-model``'s),
# through the command line's runner (vidchat.qa.suite.ask_cases), so its asks
# share the engine and the fair answer queue with live sessions instead of
# loading a model of their own. One run at a time per server: a suite run is a
# burst of asks, and two at once would only halve each other's speed. A run
# belongs to the login that started it: only that login is shown its progress
# and served its report. Each run has a folder of its own under DIR/runs/
# (the oldest beyond --suite-keep-runs are deleted), and a run still going
# when the server shuts down is cancelled and awaited (SuiteRuns.close).

RUNNING, FINISHED, FAILED = "running", "finished", "failed"

JOBS = 2  # cases at once: a live session's next question waits behind at most this many asks

KEEP_RUNS = 8  # finished runs whose progress and report stay reachable from the page


class SuiteBusy(RuntimeError):
    """A run is going on already."""


@dataclass
class SuiteRun:
    id: str
    owner: str | None
    engine: str  # "main" or "compare"
    model: str  # the model as the baseline names it (the server's --model or --compare-model)
    suite: str
    total: int
    out: Path
    folder: str  # ``out`` relative to the suite's folder, as the page is shown it (not the server's paths)
    state: str = RUNNING
    results: list[AskResult] = field(default_factory=list)
    error: str | None = None
    started: float = field(default_factory=time.time)
    ended: float | None = None

    def done_text(self) -> str:
        return f"{len(self.results)} of {self.total} asks done, on {self.model}"

    def as_dict(self) -> dict[str, Any]:
        rows = [{k: v for k, v in dataclasses.asdict(r).items()
                 if k in ("case", "ask", "question", "answer", "status", "checks", "error", "first_token_ms",
                          "changed_from_baseline")} for r in self.results]
        return {"run": self.id, "suite": self.suite, "engine": self.engine, "model": self.model,
                "state": self.state, "done": len(self.results), "total": self.total, "asks": rows,
                "summary": summary_of(self.results), "error": self.error,
                "report": f"/suites/runs/{self.id}/report.html" if self.state == FINISHED else None,
                "folder": self.folder}


class SuiteRuns:
    """The server's suite runs (vidchat.doors.answer_routes serves them)."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.runs: dict[str, SuiteRun] = {}
        self._task: asyncio.Task | None = None  # the running one (asyncio keeps only weak references to tasks)
        # Held from the check that none runs until the new run is registered:
        # the suite is read in a thread in between, where a second request
        # would otherwise pass the same check.
        self._starting = asyncio.Lock()
        self.closed = False

    @property
    def root(self) -> Path:
        return Path(self.state.settings.suite_dir)

    def read(self) -> Suite:
        """The suite as it is on disk now (raises SuiteError)."""
        if not (self.root / "suite.toml").is_file():
            return Suite(name=self.root.name, root=self.root, cases=())
        return read_suite(self.root)

    def running(self) -> SuiteRun | None:
        return next((r for r in self.runs.values() if r.state == RUNNING), None)

    def _model(self, which: str) -> str:
        """The model of ``which`` engine, when it can take a run now (raises
        EngineError saying why not). Only checked here: each ask looks the
        engine up when it asks (AppState.engine_for), so a run goes on with
        the engine its keeper restarted."""
        from vidchat.engine import EngineError

        state = self.state
        ready, reason = state.compare_readiness() if which == "compare" else state.readiness()
        if not ready:
            raise EngineError(reason)
        return state.settings.compare_model if which == "compare" else state.settings.model

    async def start(self, which: str, owner: str | None) -> SuiteRun:
        """Start a run of the suite on the server's model (``main``) or the
        second one (``compare``); raises SuiteBusy, SuiteError or EngineError."""
        from vidchat.engine import EngineError

        async with self._starting:
            if self.closed:
                raise EngineError("the server is shutting down")
            if (busy := self.running()) is not None:
                raise SuiteBusy(f"run {busy.id} of this suite is going on ({busy.done_text()}, started "
                                f"{time.time() - busy.started:.0f} s ago); wait for it to end")
            model = self._model(which)
            suite = await asyncio.to_thread(self.read)
            if not suite.cases:
                raise SuiteError(f"{self.root / 'suite.toml'}: no case yet (add one with Add to suite)")
            out = await asyncio.to_thread(new_run_folder, self.root / "runs", f"-{which}")
            run = SuiteRun(secrets.token_urlsafe(9), owner, which, model, suite.name, asks_in(suite), out,
                           str(out.relative_to(self.root)))
            self.runs[run.id] = run
            for old in [r for r in self.runs.values() if r.state != RUNNING][:-KEEP_RUNS]:
                self.runs.pop(old.id, None)
            self._task = asyncio.create_task(self._run(run, suite), name=f"suite run {run.id}")
        log.info("suite %s: run %s on %s (%s) started, %d asks, reports into %s", suite.name, run.id, which, model,
                 run.total, run.folder)
        return run

    async def close(self) -> None:
        """At shutdown, before the sessions close and the engines stop: a run
        still going is cancelled (its sessions close as its cases end) and
        awaited, instead of asking a stopping engine until the loop ends."""
        async with self._starting:
            self.closed = True
        task, going = self._task, self.running()
        if task is not None and not task.done():
            if going is not None:
                log.info("suite %s: cancelling run %s at shutdown (%s)", going.suite, going.id, going.done_text())
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self, run: SuiteRun, suite: Suite) -> None:
        from vidchat.qa.suite_report import write_reports

        try:
            baseline = await asyncio.to_thread(suite.baseline)
            results = await ask_cases(suite, self.state, self.state.settings, run.model, run.out, JOBS,
                                      baseline, run.results.append, role=run.engine)
            report = report_of(suite, [run.model], results)
            await asyncio.to_thread(write_reports, run.out, report, baseline)
            run.state = FINISHED
        except asyncio.CancelledError:
            run.state, run.error = FAILED, "the server shut down during the run"
            raise
        except Exception as exc:  # noqa: BLE001 - the run fails, the server goes on
            log.exception("suite %s: the run on %s failed", suite.name, run.model)
            run.state, run.error = FAILED, f"{type(exc).__name__}: {exc}"
        finally:
            run.ended = time.time()
            s = summary_of(run.results)
            log.info("suite %s on %s: %s%s, %d passed, %d failed, %d errors", suite.name, run.model, run.state,
                     f" ({run.error})" if run.error else "", s["passed"], s["failed"], s["errors"])
        try:
            await asyncio.to_thread(prune_runs, self.root / "runs", self.state.settings.suite_keep_runs)
        except OSError as exc:  # the run's outcome stands; the disk is tidied at the next one
            log.warning("suite %s: old runs not pruned: %s", suite.name, exc)
