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

This module is the library: the host each model's cases are asked on comes
in from whoever calls it (the command line's engine of its own for each
model, made by the app's ``qa_host`` module; the server's own for the page's Suites panel),
results come back as :class:`AskResult` and :class:`SuiteReport`, and
every session a run opens is closed however the run ends. The command line
(printing, exit statuses) is the app's ``qa_cli`` module.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import logging
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncContextManager, Callable

from vidchat.conversation.answers import AnswerOptions
from vidchat.conversation.bundles import BundleError, read_bundle
from vidchat.conversation.host import EngineRole
from vidchat.engine.interface import EngineError
from vidchat.engine.weights import model_name
from vidchat.qa.commands import changes_of
from vidchat.qa.replay import Answered, Outcome, ReplayHost, ReplayPlan, SettingsRefused, reask_bundle, replay_file
from vidchat.qa.suite_file import Case, Suite, SuiteError, read_suite
from vidchat.qa.suite_report import new_run_folder, prune_runs, write_reports

log = logging.getLogger("vidchat.qa.suite")

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
               baseline: str | None, accepting: bool = False,
               memory_frames: list[dict[str, Any]] | None = None) -> list[CheckResult]:
    """Every check of ``expect`` on ``answer``. ``baseline``: this model's
    answer in baseline.json (None: there is none, and same_as_baseline is
    not judged, saying so, rather than passing). ``accepting``: the run
    writes ``baseline`` as this model's baseline (--update-baseline).
    ``memory_frames``: the keyframes the ask got of its session's memory
    (its record's, vidchat.conversation.memory)."""
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
    if "memory_frames_within" in expect:
        results.append(_memory_within(expect["memory_frames_within"], memory_frames or []))
    return results


def _memory_within(span: list[float], frames: list[dict[str, Any]]) -> CheckResult:
    """Every memory frame the ask got lies in ``span`` (seconds of the clip: a
    frame's place in the played file, else its time from the session's start)."""
    start, end = float(span[0]), float(span[1])
    at = [f.get("source_s") if f.get("source_s") is not None else f.get("time_s") for f in frames]
    if not at:
        return CheckResult("memory_frames_within", False, f"no memory frames (wanted within {start:g}–{end:g} s)")
    ok = all(isinstance(t, (int, float)) and start <= t <= end for t in at)
    shown = ", ".join(f"{t:.1f}" if isinstance(t, (int, float)) else "?" for t in at)
    return CheckResult("memory_frames_within", ok, f"memory frames at {shown} s ({'' if ok else 'not '}within "
                       f"{start:g}–{end:g} s)")


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
    mark: dict[str, str] | None = None  # the QA verdict on the answer the case was made from ({"mark", "note"})

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.status != ERRORED:
            out.pop("error")
        return out


def _plan_for(case: Case, model: str, out_dir: Path, role: EngineRole,
              flag_defaults: AnswerOptions | None) -> ReplayPlan:
    """A replay plan for one case: its asks, its settings, its bundles' folder, its engine's role."""
    changes = changes_of(case.settings, f"case {case.name!r}: settings")
    asks = [(a.at, a.question or "") for a in case.asks if a.at is not None]
    return ReplayPlan(asks=asks, changes=changes, flag_defaults=flag_defaults, out_dir=str(out_dir),
                      model_option=model, role=role)


def _record(outcome: Outcome) -> dict[str, Any]:
    """replay's JSON line for an outcome: the answer's record, or {"t", "question", "error"}."""
    if isinstance(outcome, Answered):
        return outcome.record
    return {"t": outcome.t, "question": outcome.question, "error": outcome.reason}


async def _ask_case(case: Case, host: ReplayHost, model: str, out: Path, role: EngineRole,
                    flag_defaults: AnswerOptions | None) -> list[dict[str, Any]]:
    """The case's records, one per ask in the suite's order (an error record where it failed)."""
    folder = out / "bundles" / _safe(model) / _safe(case.name)
    folder.mkdir(parents=True, exist_ok=True)
    plan = _plan_for(case, model, folder, role, flag_defaults)
    if case.bundle is not None:
        try:
            bundle = await asyncio.to_thread(read_bundle, case.bundle)
        except (BundleError, OSError) as exc:
            return [{"error": f"{case.bundle}: not a bundle vidchat can read: {exc}"}]
        question = case.asks[0].question
        if question is not None and question != bundle.question:
            bundle = copy.copy(bundle)
            bundle.manifest = {**bundle.manifest, "question": question}
        try:
            result = await reask_bundle(host, plan, bundle)
        except SettingsRefused:
            return [{"error": f"{case.bundle}: its settings can't be asked on this model"}]
        return [_record(o) for o in result.outcomes[:1]] or [{"error": "no answer"}]
    if case.video is None or not case.video.is_file():
        return [{"error": f"{case.video}: no such clip"} for _ in case.asks]
    try:
        result = await replay_file(host, plan, str(case.video))
    except SettingsRefused:
        return [{"error": f"case {case.name!r}: its settings can't be asked on this model"} for _ in case.asks]
    except Exception as exc:  # noqa: BLE001 - a clip PyAV can't read is this case's error
        return [{"error": f"{case.video}: {exc}"} for _ in case.asks]
    return _in_ask_order(case, [_record(o) for o in result.outcomes])


def _in_ask_order(case: Case, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
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


Baseline = dict[str, Any]  # {model: {case: {ask index: answer}}} (baseline.json)


def _result(case: Case, index: int, model: str, rec: dict[str, Any], baseline: Baseline,
            accepting: bool = False) -> AskResult:
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
                        accepting=accepting, memory_frames=rec.get("memory_frames"))
    result.checks = [c.as_dict() for c in checks]
    unjudged = [c for c in checks if not c.judged]
    if unjudged:  # an ask that could not be judged is an error, not a failed check
        result.error = "; ".join(f"{c.check}: {c.detail}" for c in unjudged)
        return result
    result.status = PASSED if all(c.ok for c in checks) else FAILED_CHECK
    return result


Progress = Callable[["AskResult"], None]


def _no_progress(result: AskResult) -> None:
    """The default progress: results come back when the run ends."""


async def ask_cases(suite: Suite, host: ReplayHost, model: str, out: Path, jobs: int, baseline: Baseline,
                    progress: Progress = _no_progress, *, role: EngineRole = "main", accepting: bool = False,
                    flag_defaults: AnswerOptions | None = None) -> list[AskResult]:
    """Every case of the suite on the host's engine of ``role`` (looked up at
    each ask, so a restarted engine answers the rest), up to ``jobs`` cases
    at once, in the suite's order. The command line's runner and the page's
    Suites panel (:class:`SuiteRuns`, on the server's own engine and answer
    queue) both ask through it. ``accepting``: see _result. ``flag_defaults``:
    see ReplayPlan (the app's answer flags given explicitly change bundle
    cases' recorded options). Each case's session is closed when the case
    ends, however it ends."""
    room = asyncio.Semaphore(jobs)
    name = named(model, host, role)

    async def one(case: Case) -> list[AskResult]:
        async with room:
            records = await _ask_case(case, host, model, out, role, flag_defaults)
        # A case's clip or bundle by its path in the suite: the page shows errors, not the server's paths.
        records = [{**rec, "error": rec["error"].replace(f"{suite.root}/", "")} if "error" in rec else rec
                   for rec in records]
        results = [_result(case, i, name, rec, baseline, accepting) for i, rec in enumerate(records)]
        for r in results:
            progress(r)
        return results

    done = await asyncio.gather(*(one(c) for c in suite.cases))
    return [r for case_results in done for r in case_results]


def named(model: str, host: ReplayHost, role: EngineRole = "main") -> str:
    """The model's one name, as its baselines, results and reports know it:
    what the host resolved its --model (or --compare-model) to, so 'auto'
    and 'tiny-omni' are filed under the model they chose (an --engine-url
    run keeps its URL)."""
    settings = host.settings
    resolved = settings.compare_model if role == "compare" else settings.model
    return model if resolved == "auto" else model_name(resolved)


# A host for one model, opened for its cases and closed after them (its
# engine stopped, its sessions closed): the command line opens an engine of
# its own per model (the app's qa_host module). Raises EngineError, or ValueError
# for a model it can't resolve.
OpenHost = Callable[[str], AsyncContextManager[ReplayHost]]


async def run_model(suite: Suite, model: str, open_host: OpenHost, out: Path, jobs: int, baseline: Baseline,
                    progress: Progress = _no_progress, accepting: bool = False,
                    flag_defaults: AnswerOptions | None = None) -> list[AskResult]:
    """Every case on one model, on a host opened for it; a model whose host
    can't be opened gives each ask an error saying why."""
    results: list[AskResult]
    async with contextlib.AsyncExitStack() as stack:
        try:
            host = await stack.enter_async_context(open_host(model))
        except (EngineError, ValueError) as exc:
            results = [AskResult(c.name, i, model_name(model), a.question or "", error=f"model {model}: {exc}")
                       for c in suite.cases for i, a in enumerate(c.asks)]
        else:
            results = await ask_cases(suite, host, model, out, jobs, baseline, progress, accepting=accepting,
                                      flag_defaults=flag_defaults)
    return results


def asks_in(suite: Suite) -> int:
    """How many asks one model's run of the suite makes."""
    return sum(len(c.asks) for c in suite.cases)


def summary_of(results: list[AskResult]) -> dict[str, int]:
    """results.json's summary: asks passed, failed and errored."""
    summary = {status: sum(r.status == status for r in results) for status in (PASSED, FAILED_CHECK)}
    summary["errors"] = sum(r.status == ERRORED for r in results)
    return summary


def _update_baseline(suite: Suite, results: list[AskResult]) -> None:
    """The answers into baseline.json, read and written whole under the suite's
    lock file, so an Add to suite on a server meanwhile loses no entry."""
    from vidchat.conversation.suite_cases import edit_baseline

    def keep(baseline: Baseline) -> None:
        for r in results:
            if r.status != ERRORED:
                baseline.setdefault(r.model, {}).setdefault(r.case, {})[str(r.ask)] = r.answer

    edit_baseline(suite.root, keep)


def report_of(suite: Suite, models: list[str], results: list[AskResult],
              baseline_written: bool = False) -> dict[str, Any]:
    """results.json's content."""
    return {"suite": suite.name, "models": models, "asks": [r.as_dict() for r in results],
            "summary": summary_of(results), "baseline_written": baseline_written}


@dataclass(frozen=True)
class SuiteReport:
    """A finished run of a suite on its models (results.json is :meth:`as_dict`)."""

    suite: Suite
    models: list[str]
    results: list[AskResult]
    out: Path  # where its reports were written
    baseline_written: bool = False

    @property
    def summary(self) -> dict[str, int]:
        return summary_of(self.results)

    @property
    def ok(self) -> bool:
        """Every check passed and no ask errored."""
        s = self.summary
        return s[FAILED_CHECK] == 0 and s["errors"] == 0

    def as_dict(self) -> dict[str, Any]:
        return report_of(self.suite, self.models, self.results, self.baseline_written)


def run_suite(suite: Suite, models: list[str], open_host: OpenHost, out: Path, jobs: int = 4,
              update_baseline: bool = False, progress: Progress = _no_progress,
              flag_defaults: AnswerOptions | None = None) -> SuiteReport:
    """Every case on every model, each on a host ``open_host`` opens for it;
    writes the reports into ``out``. With ``update_baseline`` the answers
    become the baseline first, and the run's same_as_baseline checks hold
    them to it. Raises SuiteError for a baseline that can't be read."""
    baseline = suite.baseline()
    out.mkdir(parents=True, exist_ok=True)
    results: list[AskResult] = []
    for model in models:  # one after another: one engine in memory at a time
        results += asyncio.run(run_model(suite, model, open_host, out, jobs, baseline, progress, update_baseline,
                                         flag_defaults))
    if update_baseline:
        _update_baseline(suite, results)
    names = list(dict.fromkeys([r.model for r in results] or [model_name(m) for m in models]))
    report = SuiteReport(suite, names, results, out, baseline_written=update_baseline)
    write_reports(out, report.as_dict(), baseline)
    return report


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
    engine: EngineRole  # which of the server's engines answers
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
    """The server's suite runs (the app's routes serve them), on the
    server's own host. ``flag_defaults``: see ReplayPlan."""

    def __init__(self, host: ReplayHost, flag_defaults: AnswerOptions | None = None) -> None:
        self.host = host
        self.flag_defaults = flag_defaults
        self.runs: dict[str, SuiteRun] = {}
        self._task: asyncio.Task[None] | None = None  # the running one (asyncio keeps only weak references to tasks)
        # Held from the check that none runs until the new run is registered:
        # the suite is read in a thread in between, where a second request
        # would otherwise pass the same check.
        self._starting = asyncio.Lock()
        self.closed = False

    @property
    def root(self) -> Path:
        return Path(self.host.settings.suite_dir)

    def read(self) -> Suite:
        """The suite as it is on disk now (raises SuiteError)."""
        if not (self.root / "suite.toml").is_file():
            return Suite(name=self.root.name, root=self.root, cases=())
        return read_suite(self.root)

    def running(self) -> SuiteRun | None:
        return next((r for r in self.runs.values() if r.state == RUNNING), None)

    def _model(self, which: EngineRole) -> str:
        """The model of ``which`` engine, when it can take a run now (raises
        EngineError saying why not). Only checked here: each ask looks the
        engine up when it asks (Host.engine_for), so a run goes on with
        the engine its keeper restarted."""
        ready, reason = self.host.readiness(which)
        if not ready:
            raise EngineError(reason)
        settings = self.host.settings
        return settings.compare_model if which == "compare" else settings.model

    async def start(self, which: EngineRole, owner: str | None) -> SuiteRun:
        """Start a run of the suite on the server's model (``main``) or the
        second one (``compare``); raises SuiteBusy, SuiteError or EngineError."""
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
        try:
            baseline = await asyncio.to_thread(suite.baseline)
            results = await ask_cases(suite, self.host, run.model, run.out, JOBS, baseline, run.results.append,
                                      role=run.engine, flag_defaults=self.flag_defaults)
            report = report_of(suite, [named(run.model, self.host, run.engine)], results)
            await asyncio.to_thread(write_reports, run.out, report, baseline)
            await self._prune(suite)  # before the run says it ended: whoever waits for that sees the tidied folder
            run.state = FINISHED
        except asyncio.CancelledError:
            run.state, run.error = FAILED, "the server shut down during the run"
            raise
        except Exception as exc:  # noqa: BLE001 - the run fails, the server goes on
            log.exception("suite %s: the run on %s failed", suite.name, run.model)
            await self._prune(suite)
            run.state, run.error = FAILED, f"{type(exc).__name__}: {exc}"
        finally:
            run.ended = time.time()
            s = summary_of(run.results)
            log.info("suite %s on %s: %s%s, %d passed, %d failed, %d errors", suite.name, run.model, run.state,
                     f" ({run.error})" if run.error else "", s["passed"], s["failed"], s["errors"])

    async def _prune(self, suite: Suite) -> None:
        """Old run folders beyond --suite-keep-runs go."""
        try:
            await asyncio.to_thread(prune_runs, self.root / "runs", self.host.settings.suite_keep_runs)
        except OSError as exc:  # the run's outcome stands; the disk is tidied at the next one
            log.warning("suite %s: old runs not pruned: %s", suite.name, exc)
