"""The server's own routes: what a load balancer and an operator ask of a
replica (/healthz, /readyz, /api/drain), what runs and how well
(/api/health, /metrics, the switches the benchmarks use), and what the page
needs to connect (/api/config, /api/streams). The doors' routes are theirs (vidchat.doors).
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import re
import threading
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from vidchat.app import metrics as app_metrics
from vidchat.app.access import is_operator
from vidchat.app.ice_servers import TurnError
from vidchat.app.metrics import LoopWatch
from vidchat.app.qa_host import flag_defaults
from vidchat.app.state import AppState
from vidchat.doors import login_of
from vidchat.doors.answer_routes import json_body, needs_suite
from vidchat.doors.page.chat import model_label, second_model_label
from vidchat.engine import EngineError
from vidchat.qa.suite import FINISHED, RUNNING, SuiteBusy, SuiteRuns
from vidchat.qa.suite_file import SuiteError

log = logging.getLogger(__name__)


def replica_routes(app: FastAPI, state: AppState) -> None:
    """What a load balancer and an operator ask of a replica: is it up, is it ready, drain it."""

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        """The process serves (whatever the model is doing)."""
        return {"ok": True}

    @app.get("/readyz")
    async def readyz(page: bool = False) -> JSONResponse:
        """The engine is loaded and alive and the replica takes new sessions:
        200; else 503 with the reason. A load balancer routes new sessions
        only to replicas answering 200; ``draining`` and ``sessions`` tell
        an operator when a drained replica is empty and can be stopped.
        ``?page=1`` (the page's own poll while the model loads): the same
        body with 200, as the browser logs every 503 it fetches as a console
        error, one a second for the whole load."""
        ready, reason = state.readiness()
        registry = state.registry
        replicas = await replica_health(state)
        if ready and replicas is not None and not any(r["healthy"] for r in replicas):
            ready, reason = False, "no model server of --engine-url answers"
        if ready and registry.draining:
            ready, reason = False, f"draining: {len(registry)} session(s) still open"
        return JSONResponse({"ready": ready, "reason": reason, "draining": registry.draining,
                             "sessions": len(registry), "replicas": replicas}, status_code=200 if ready or page else 503)

    @app.post("/api/drain")
    async def drain(body: dict[str, Any]) -> JSONResponse:
        """Start (``{"draining": true}``) or stop draining this replica: no
        new sessions; open ones carry on. An operator route (vidchat.app.access):
        the server token, or a call on this machine without a proxy."""
        draining = body.get("draining") if isinstance(body, dict) else None
        if not isinstance(draining, bool):
            return JSONResponse({"detail": "draining must be true or false"}, status_code=400)
        state.registry.draining = draining
        log.info("replica %s: %d session(s) open", "draining" if draining else "taking new sessions again",
                 len(state.registry))
        return JSONResponse({"draining": draining, "sessions": len(state.registry)})


def running_routes(app: FastAPI, state: AppState, loop_watch: LoopWatch) -> None:
    """What runs and how well: health (engine, answers, warm-ups, loop lag) and the switches the benchmarks use."""

    @app.get("/api/health")
    async def health(request: Request) -> JSONResponse:
        """Liveness and counts for anyone (a public route: load balancers
        and the Space poll it); the model, the engines' caches, warm-ups and
        the process's tasks and threads only for an operator (the server
        token, or a call on this machine not through a proxy)."""
        client = request.client.host if request.client else ""
        operator = is_operator(login_of(request.headers), client, request.headers)
        body = _health_counts(state)
        if operator:
            body.update(await _health_details(state, loop_watch))
        return JSONResponse(body, status_code=200 if state.ready else 503)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        """Prometheus's text format: vidchat's families and the engine's vllm: ones (vidchat.app.metrics)."""
        return Response(app_metrics.exposition(), media_type=app_metrics.CONTENT_TYPE)

    @app.post("/api/prewarm")
    async def set_prewarm(body: dict[str, Any]) -> JSONResponse:
        """Switch warm-ups at run time (the latency report compares on and off in one run)."""
        mode = body.get("mode") if isinstance(body, dict) else None
        try:
            await state.prewarmer.set_mode(mode)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse(state.prewarmer.snapshot())

    @app.post("/api/loop-lag/reset")
    async def reset_loop_lag() -> dict[str, Any]:
        """Start a new loop-lag window (for bench/looplag.py)."""
        loop_watch.reset()
        return {"reset": True}


def _health_counts(state: AppState) -> dict[str, Any]:
    """/api/health for anyone: whether it serves, and how many sessions and answers."""
    return {
        "ok": state.ready,
        "status": state.readiness()[1],
        "sessions": len(state.registry),
        "sessions_by_kind": state.registry.count_by_kind(),
        "answers": state.answer_gate.snapshot(),
        "questions_asked": state.answer_gate.asked,
    }


async def _health_details(state: AppState, loop_watch: LoopWatch) -> dict[str, Any]:
    """/api/health's figures for an operator: the models, the engines' work and caches, the process."""
    engine, ok = state.engine, state.ready
    return {
        "model": state.model_path,
        "model_name": model_label(state),  # its one name, as records, reports and baselines say it
        "banner": state.banner,
        "running_requests": engine.running_requests if ok else None,
        "compare_model": ({"model": state.compare_model_path, "model_name": second_model_label(state),
                           "status": state.compare_readiness()[1],
                           "running_requests": state.compare_engine.running_requests
                           if state.compare_readiness()[0] else None}
                          if state.compare_model_path else None),
        "running_warmups": engine.running_warmups if ok else None,
        "prewarm": state.prewarmer.snapshot() if state.prewarmer else None,
        # The memory's captions (vidchat.conversation.memory) and new sessions' default (--memory).
        "memory": {"setting": state.settings.memory, "new_sessions": state.registry.default_settings().memory,
                   **(state.captioner.snapshot() if state.captioner else {})},
        # How many frames vLLM's encoder cache holds (vidchat.engine.local.encoder_cache_budget).
        "encoder_cache": ({"tokens": engine.encoder_cache_tokens, "tokens_per_frame": engine.tokens_per_frame,
                           "frames": engine.encoder_cache_tokens // engine.tokens_per_frame}
                          if ok and engine.tokens_per_frame and engine.encoder_cache_tokens else None),
        "loop_lag": loop_watch.snapshot(),
        # What a leak would grow (bench/soak.py samples it with the process's RSS and fds).
        "process": _process_figures(),
        # --engine-url: each model server's health (null in-process).
        "replicas": await replica_health(state),
    }


def _process_figures() -> dict[str, Any]:
    """Tasks (by what they run) and threads: what a leak would grow."""
    tasks = collections.Counter(getattr(t.get_coro(), "__qualname__", "?") for t in asyncio.all_tasks())
    # Numbers stripped: a pool's threads count under one name.
    threads = collections.Counter(re.sub(r"\d+", "N", t.name) for t in threading.enumerate())
    return {"asyncio_tasks": sum(tasks.values()), "threads": threading.active_count(),
            "asyncio_tasks_by_coroutine": dict(tasks), "threads_by_name": dict(threads),
            # Whether the start-up's objects were set aside (vidchat.app.server._freeze_startup_objects)
            # and how often the collector's full pass ran since.
            "gc_frozen_objects": gc.get_freeze_count(), "gc_full_collections": gc.get_stats()[-1]["collections"]}


def client_config_route(app: FastAPI, state: AppState) -> None:
    """What the page needs to connect: ICE servers, the banner, readiness and the session's time limit."""

    @app.get("/api/config")
    async def client_config() -> Any:
        # Fetched when the user presses Start, so short-lived TURN credentials
        # are fresh rather than baked into the page.
        ready, status = state.readiness()
        try:
            servers = await state.ice_config()
        except TurnError as exc:
            log.error("%s", exc)
            return JSONResponse({"detail": f"Cannot connect from behind NAT now: {exc}."}, status_code=503)
        # Only what a browser's RTCPeerConnection uses: no other field of the
        # configured servers (notes, account ids) reaches the page.
        ice = [{k: v for k, v in server.items() if k in ("urls", "username", "credential")} for server in servers]
        return {"iceServers": ice, "banner": state.banner, "ready": ready, "status": status,
                "sessionTimeLimit": state.session_time_limit, "streams": state.streams.names()}

    @app.get("/api/streams")
    async def streams() -> list[dict[str, Any]]:
        """Each --stream by name: its state, fps, size, last frame's age, sessions and error (never its URL)."""
        return state.streams.snapshot()


async def replica_health(state: AppState) -> list[dict[str, Any]] | None:
    """Each model server's health (--engine-url), or None (in-process, or still loading)."""
    engine = state.engine
    if engine is None or engine.is_dead:
        return None
    return await engine.replica_health()


# The page's Suites panel (with --suite-dir, docs/suites.md): the suite's
# cases (``GET /suites``), a run on the server's model or --compare-model's
# (``POST /suites/run {"engine": "main" | "compare"}``), its progress
# (``GET /suites/runs/<id>``) and its report.html, each served only to the
# login that started the run (vidchat.qa.suite runs it). In the app, not
# among the doors: it drives the QA runner, which a door never imports.

def _case_row(case: Any) -> dict[str, Any]:
    return {"name": case.name, "kind": "bundle" if case.bundle is not None else "video",
            "questions": [a.question or "(the recorded question)" for a in case.asks], "note": case.note,
            "mark": case.mark}


def router(state: AppState) -> APIRouter:
    api = APIRouter()
    # The server's own host; the server cancels a run still going at shutdown.
    runs = state.suite_runs = SuiteRuns(state, flag_defaults=flag_defaults())

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
