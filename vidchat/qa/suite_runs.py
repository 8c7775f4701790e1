"""The page's Suites panel, on the server (docs/suites.md): the suite of
``--suite-dir`` run on the server's own model (or ``--compare-model``'s),
through the command line's runner (vidchat.qa.suite.ask_cases), so its asks
share the engine and the fair answer queue with live sessions instead of
loading a model of their own. One run at a time per server: a suite run is a
burst of asks, and two at once would only halve each other's speed. A run
belongs to the login that started it: only that login is shown its progress
and served its report. Each run has a folder of its own under DIR/runs/
(the oldest beyond --suite-keep-runs are deleted), and a run still going
when the server shuts down is cancelled and awaited (SuiteRuns.close)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vidchat.qa.suite import AskResult, asks_in, ask_cases, report_of, summary_of
from vidchat.qa.suite_file import Suite, SuiteError, read_suite
from vidchat.qa.suite_report import new_run_folder, prune_runs

log = logging.getLogger(__name__)

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
    """The server's suite runs (vidchat.doors.suite_routes serves them)."""

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
