"""The page's Suites panel (with --suite-dir, docs/suites.md): the suite's
cases (``GET /suites``), a run on the server's model or --compare-model's
(``POST /suites/run {"engine": "main" | "compare"}``), its progress
(``GET /suites/runs/<id>``) and its report.html, each served only to the
login that started the run (vidchat.qa.suite_runs runs it). In the app, not
among the doors: it drives the QA runner, which a door never imports."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse

from vidchat.doors.server_contract import login_of
from vidchat.doors.suite_routes import json_body, needs_suite
from vidchat.engine import EngineError
from vidchat.qa.suite_file import SuiteError
from vidchat.qa.suite_runs import FINISHED, RUNNING, SuiteBusy, SuiteRuns


def _case_row(case: Any) -> dict[str, Any]:
    return {"name": case.name, "kind": "bundle" if case.bundle is not None else "video",
            "questions": [a.question or "(the recorded question)" for a in case.asks], "note": case.note,
            "mark": case.mark}


def router(state: Any) -> APIRouter:
    api = APIRouter()
    runs = state.suite_runs = SuiteRuns(state)  # the server cancels a run still going at shutdown

    def owned_run(request: Request, run_id: str) -> Any:
        run = runs.runs.get(run_id)
        if run is None:
            raise HTTPException(404, "no such suite run (the server keeps the last few)")
        if run.owner is not None and run.owner != login_of(request.headers):
            raise HTTPException(403, "this suite run belongs to another login")
        return run

    @api.get("/suites")
    async def suite_cases_list(request: Request) -> dict[str, Any]:
        """The suite's cases, the models it can run on, and the caller's newest run."""
        needs_suite(state)
        # The suite's folder by its name: the server's paths are not the page's business.
        out: dict[str, Any] = {"folder": runs.root.name, "engines": ["main"] + (["compare"] if
                               state.compare_model_path else []), "cases": [], "error": None}
        try:
            suite = await asyncio.to_thread(runs.read)
            out.update(suite=suite.name, cases=[_case_row(c) for c in suite.cases])
        except SuiteError as exc:
            out["error"] = str(exc)
        mine = [r for r in runs.runs.values() if r.owner is None or r.owner == login_of(request.headers)]
        out["run"] = mine[-1].as_dict() if mine else None
        return out

    @api.post("/suites/run")
    async def run_suite(request: Request) -> dict[str, Any]:
        """Run the suite on the server's model (``{"engine": "main"}``) or the second one (``"compare"``)."""
        needs_suite(state)
        body = await json_body(request, '{"engine": "main" | "compare"}')
        which = body.get("engine", "main")
        if which not in ("main", "compare"):
            raise HTTPException(400, f'engine must be "main" or "compare", got {which!r}')
        try:
            run = await runs.start(which, login_of(request.headers))
        except SuiteBusy as exc:
            raise HTTPException(409, str(exc)) from None
        except SuiteError as exc:
            raise HTTPException(400, str(exc)) from None
        except EngineError as exc:
            raise HTTPException(503, str(exc)) from None
        return run.as_dict()

    @api.get("/suites/runs/{run_id}")
    async def suite_run(request: Request, run_id: str) -> dict[str, Any]:
        return owned_run(request, run_id).as_dict()

    @api.get("/suites/runs/{run_id}/report.html")
    async def suite_report(request: Request, run_id: str) -> FileResponse:
        run = owned_run(request, run_id)
        report = run.out / "report.html"
        if run.state != FINISHED or not report.is_file():
            raise HTTPException(404, "the run has no report yet" if run.state == RUNNING else
                                f"the run ended without a report: {run.error}")
        return FileResponse(report, media_type="text/html; charset=utf-8")

    return api
