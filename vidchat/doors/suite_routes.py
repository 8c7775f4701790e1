"""What a QA person keeps of an answer, from the page (docs/suites.md):

- its verdict, good or bad with a note (``POST /inputs/<id>/mark``): kept in
  its record, written into its bundle when it was recorded, carried into a
  case made from it (vidchat.conversation.answer_marks);
- Add to suite (with --suite-dir): a kept answer of the caller's own session
  saved as a bundle in the suite's folder, a case that re-asks it appended
  to its suite.toml, and its answer kept as the server's model's baseline
  (vidchat.conversation.suite_cases, the rule ``vidchat suite add`` follows too);
- the Suites panel (with --suite-dir): the suite's cases (``GET /suites``), a
  run on the server's model or --compare-model's (``POST /suites/run``), its
  progress (``GET /suites/runs/<id>``) and its report.html, each served to the
  login that started it only (vidchat.qa.suite_runs)."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request

from vidchat.conversation import answer_marks, kept, suite_cases
from vidchat.conversation.recording import write_bundle
from vidchat.conversation.safe_files import Unwritable, writable
from vidchat.doors.inputs import PATH_PREFIX, owned_answer
from vidchat.doors.server_contract import login_of

log = logging.getLogger(__name__)

MAX_NOTE = 500  # characters of a note, and of the expected words together


def _text(body: Any, name: str) -> str:
    value = body.get(name, "") if isinstance(body, dict) else None
    if not isinstance(value, str) or len(value) > MAX_NOTE:
        raise HTTPException(400, f"{name} must be text of at most {MAX_NOTE} characters")
    try:
        return writable(name, value).strip()
    except Unwritable as exc:
        raise HTTPException(400, str(exc)) from None


async def json_body(request: Request, shape: str) -> dict[str, Any]:
    """The request's JSON object; HTTPException 400 saying ``shape`` otherwise."""
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise HTTPException(400, f"the body must be a JSON object: {shape}")
    return body


def needs_suite(state: Any) -> None:
    """HTTPException 404 on a server without --suite-dir."""
    if not state.settings.suite_dir:
        raise HTTPException(404, "this server keeps no suite (start it with --suite-dir DIR)")


def _add(state: Any, entry: Any, answer: Any, login: str | None, note: str, words: list[str]) -> dict[str, Any]:
    """Write the bundle, the case and the baseline, whole or not at all (in a worker thread: files)."""
    root = Path(state.settings.suite_dir)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", answer.question.lower()).strip("-")[:40] or "answer"

    # Filed as the answering model's: a second model's answer is its baseline, not the main model's.
    model = kept.model_option(state.settings, answer)

    def save(bundles: Path, name: str) -> Path:
        return Path(write_bundle(bundles, answer, source="page", model_option=model,
                                 engine_options=answer.reply.engine.options, name=name))

    name, target = suite_cases.add_case(root, slug, save, model=model, answer=answer.reply.text,
                                        login=login, max_cases=state.settings.suite_max_cases, contains=words,
                                        note=note, mark=answer.mark)
    log.info("session %s…: answer added to the suite %s as case %s", entry.session.id[:6], root, name)
    # Paths relative to the suite's folder: the server's own layout is not the caller's to see.
    return {"case": name, "suite": suite_cases.SUITE_FILE, "bundle": target.relative_to(root).as_posix(),
            "model": model}


def router(state: Any) -> APIRouter:
    api = APIRouter()

    @api.post(PATH_PREFIX + "{answer_id}/add-to-suite")
    async def add_to_suite(request: Request, answer_id: str) -> dict[str, Any]:
        needs_suite(state)
        entry, answer = owned_answer(state, request, answer_id)
        body = await json_body(request, '{"note": …, "expect": …}')
        note, expect = _text(body, "note"), _text(body, "expect")
        words = [w.strip() for w in expect.split(",") if w.strip()]
        try:
            return await asyncio.to_thread(_add, state, entry, answer, login_of(request.headers), note, words)
        except Unwritable as exc:
            raise HTTPException(400, str(exc)) from None
        except suite_cases.TooManyCases as exc:
            raise HTTPException(403, str(exc)) from None
        except suite_cases.SuiteConflict as exc:
            raise HTTPException(409, str(exc)) from None
        except OSError as exc:
            raise HTTPException(500, f"could not write to the suite: {exc}") from None

    @api.post(PATH_PREFIX + "{answer_id}/mark")
    async def mark(request: Request, answer_id: str) -> dict[str, Any]:
        """Mark the answer good or bad with a note (``{"mark": "good" | "bad" | "", "note": …}``; empty takes it back)."""
        entry, answer = owned_answer(state, request, answer_id)
        body = await json_body(request, '{"mark": "good" | "bad", "note": …}')
        try:
            verdict = answer_marks.checked(body.get("mark"), body.get("note", ""))
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        try:
            bundle = await asyncio.to_thread(answer_marks.mark_answer, entry, answer_id, answer, verdict)
        except (OSError, ValueError) as exc:
            raise HTTPException(500, f"marked, but its recording could not be updated: {exc}") from None
        return {"mark": verdict, "bundle": bundle}

    return api
