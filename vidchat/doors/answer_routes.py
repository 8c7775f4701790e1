"""What the model got, for every answer, shown under the answer and served
to the page (the answers are kept by vidchat.conversation.runs).

Each answer's frames, audio and record are served at
``/inputs/<id>/…`` to the login that opened its session (vidchat.app.access:
the page's login cookie reaches them from ``<img>`` and ``<audio>`` tags,
which cannot carry a token); any other login gets 403. The id is kept out
of the access log. Nothing is written to disk: the files are encoded in
memory when asked for, and a zip of recorded bundles is streamed.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response, StreamingResponse
from PIL import Image

from vidchat.conversation import bundles, runs, suite_cases
from vidchat.conversation.bundles import audio_used, iter_zip_bundles, png_bytes, wav_bytes, write_bundle
from vidchat.conversation.runs import KEEP_PER_SESSION, find, record
from vidchat.conversation.safe_files import Unwritable, writable
from vidchat.doors import Server, as_text, login_of
from vidchat.engine.weights import model_name

if TYPE_CHECKING:
    from vidchat.conversation.answers import Answer
    from vidchat.conversation.conversation import Conversation
    from vidchat.conversation.runs import Done

log = logging.getLogger(__name__)


PATH_PREFIX = "/inputs/"

THUMB_SIZE = (128, 96)


def answer_url(answer_id: str, name: str) -> str:
    """Where a kept answer's ``name`` (record.json, bundle.zip, …) is served, as the doors link it."""
    return f"{PATH_PREFIX}{answer_id}/{name}"


def record_links(done: "Done", recording: bool, record_dir: Any) -> dict[str, Any]:
    """Where an answer's record is, as each socket door's last event of an
    answer says it: its answer_id and record_url; when the session records,
    its bundle (path under --record-dir, bundle_url), or record_error."""
    links: dict[str, Any] = {"answer_id": done.answer_id,
                             "record_url": answer_url(done.answer_id, "record.json") if done.answer_id else None}
    if recording and done.started:
        if done.bundle is not None:
            links.update(bundle=done.bundle.relative_to(record_dir).as_posix(),
                         bundle_url=answer_url(done.answer_id, "bundle.zip"))
        else:
            links.update(bundle=None, record_error=done.record_error or "Could not save the recording.")
    return links


def thumb_data_url(frame: np.ndarray, size: tuple[int, int] = THUMB_SIZE, quality: int = 75) -> str:
    """A frame as a small inline JPEG (a data URL): the page's thumbnails, never written to disk."""
    import base64

    img = Image.fromarray(frame)
    img.thumbnail(size)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def live_view(entry: "Conversation", n_frames: int = 6) -> dict[str, Any]:
    """For the page's live view: the newest kept frames (small, inline) and
    the time to first token, tokens/s and tokens of the session's recent answers."""
    session = entry.session
    start = session.timeline_start or 0.0
    runs = [{"index": i, "t": round(t - start, 2), "src": thumb_data_url(px)}
            for i, t, px in session.recent_kept(n_frames)]
    # A cut-short answer's tokens/s is not comparable with a finished one's:
    # each row says which it was, and which question (its number) it answered.
    answers = [{"n": a.ticket, "ttft_ms": a.summary().get("ttft_ms"), "tokens_per_s": a.reply.stats.tokens_per_s,
                "tokens": a.reply.stats.completion_tokens, "cancelled": bool(a.reply.stats.cancelled)}
               for a in entry.answers.values()]
    return {"kept": runs, "answers": answers}


def title(answer: "Answer") -> str:
    stats = answer.reply.stats
    audio = f" · {stats.audio_seconds:.1f} s audio" if stats.audio_seconds else ""
    frames = len(answer.sample.frames)
    # Where a question brings only some frames new (warm-ups encoded the
    # rest), the title says how many: what a slow first token comes from.
    new = f" ({answer.sample.new_frames} new)" if 0 < answer.sample.new_frames < frames else ""
    return f"What the model got: {frames} frames{new} as {answer.options.frames_as}{audio}"


def wall_clock(t: float) -> str:
    """A time.monotonic() moment as the time of day it was (HH:MM:SS.s)."""
    at = time.time() - (time.monotonic() - t)
    return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at % 1 * 10)}"


def frame_walls(answer: "Answer") -> list[str | None]:
    """Each frame's time of day when the question watched a stream (a live
    camera of the server's has no file position to show), else None each."""
    sample = answer.sample
    kind = (sample.source or {}).get("kind") if isinstance(sample.source, dict) else None
    if kind != "stream":
        return [None] * len(sample.timestamps)
    return [wall_clock(t) for t in sample.timestamps]


def frame_caption(index: Any, t: float | None, source_pos: float | None, at_jump: bool = False,
                  wall: str | None = None) -> str:
    """A frame's caption wherever the page shows one: its kept-frame number,
    its time on the session's timeline (seconds since its first media, as
    the record's frame_times) and, for a file, where in the file (marked
    "≈" where the frame was captured at a seek and may show its other side),
    or for a stream the time of day it came (``wall``)."""
    at = "" if t is None else f" · {t:.2f} s"
    if wall is not None:
        return f"#{as_text(index)}{at} · {as_text(wall)}"
    if source_pos is not None:
        pos = round(source_pos, 1)
        near = ("<span title='captured at a seek: it may show the other side of it'>≈</span>" if at_jump else "")
        at += f" · file {near}{int(pos // 60)}:{pos % 60:04.1f}"
    return f"#{as_text(index)}{at}"


def history_cut(answer: "Answer") -> str:
    """One line when the chat sent with the question was cut to fit the
    model's context (empty when it was sent whole)."""
    stats = answer.reply.stats
    total, sent = stats.history_turns_total or 0, stats.history_turns or 0
    if total <= sent:
        return ""
    context = getattr(getattr(answer.reply.engine, "options", None), "max_model_len", None)
    fit = f"the model's {context:,} tokens" if isinstance(context, int) else "the model's context"
    left = total - sent
    return (f"<p class='vc-history-cut'>{left} older {'turn' if left == 1 else 'turns'} of the chat left out "
            f"to fit {fit}: the model got the last {sent} of {total}.</p>")


def record_links_html(answer_id: str, recorded: bool) -> str:
    """Where the answer's record (and, when it was recorded, its bundle) downloads."""
    base = f"{PATH_PREFIX}{answer_id}"
    bundle = (f" · <a href='{base}/bundle.zip'>this answer's bundle (zip)</a> · "
              f"<a href='{base}/session-bundles.zip'>all recorded answers of this session (zip)</a>"
              if recorded else "")
    return (f"<a href='{base}/record.json' download='vidchat-answer-{answer_id[:8]}.json'>Download the record"
            f" (JSON)</a>{bundle}")


def new_frames_line(rec: dict) -> str:
    """How many of the answer's frames the engine encoded for it, and what
    its prefill cost: why an answer on a CPU was slow (or fast)."""
    frames, new = len(rec.get("frame_times") or ()), rec.get("frames_new")
    if not frames or new is None:
        return ""
    said = (f"{new} of {frames} frames new (encoded for this question)" if new
            else f"No frame new: the engine had encoded all {frames} before the question")
    swaps = []
    if rec.get("frames_substituted"):
        swaps.append(f"{rec['frames_substituted']} swapped for frames already encoded")
    if rec.get("frames_left_out"):
        swaps.append(f"{rec['frames_left_out']} left out (none encoded yet)")
    if swaps:
        said += " (" + ", ".join(swaps) + ")"
    if rec.get("prefill_ms") is not None:
        said += f" · encoding and prefill took {rec['prefill_ms']:.0f} ms"
    return f"<p class='vc-muted vc-new-frames'>{as_text(said)}</p>"


# What a QA person keeps of an answer, in its fold under it in the chat
# (static/js/suites.js posts them): a verdict, and Add to suite.

def mark_html(answer_id: str, mark: dict | None) -> str:
    """Good or bad, with a note (static/js/suites.js posts it; vidchat.conversation.bundles keeps it)."""
    said = ""
    if mark:
        said = f"marked {as_text(mark['mark'])}" + (f": {as_text(mark['note'])}" if mark.get("note") else "")
    pressed = (mark or {}).get("mark")
    return (f"<form class='vc-mark' data-answer='{as_text(answer_id)}'><span class='vc-mark-ask'>This answer is</span>"
            f"<button type='button' class='vc-btn' data-mark='good' aria-pressed='{str(pressed == 'good').lower()}'>"
            "✓ Good</button>"
            f"<button type='button' class='vc-btn' data-mark='bad' aria-pressed='{str(pressed == 'bad').lower()}'>"
            "✗ Bad</button>"
            "<input name='note' placeholder='why (optional)' aria-label='why this answer is good or bad'>"
            f"<span class='vc-mark-said' role='status'>{said}</span></form>")


def add_to_suite_html(answer_id: str) -> str:
    """Add to suite (static/js/suites.js shows it when the server has a --suite-dir)."""
    return (f"<form class='vc-add-suite' data-answer='{as_text(answer_id)}'>"
            "<input name='note' placeholder='note (what to look for)' aria-label='note'>"
            "<input name='expect' placeholder='expect these words (comma-separated)' aria-label='expect these words'>"
            "<button type='submit' class='vc-btn'>Add to suite</button>"
            "<span class='vc-add-suite-said' role='status'></span></form>")



def memory_html(answer: "Answer", rec: dict[str, Any]) -> str:
    """What the answer got of its session's memory (vidchat.conversation.memory): the keyframes
    that joined its frames, with their times, and the captions its prompt listed."""
    use = answer.memory
    if use is None:
        return ""
    tiles = "".join(
        f"<figure style='margin:0;width:96px'><img src='{thumb_data_url(f.pixels)}' alt='memory frame {f.seq}' "
        f"style='width:96px;height:auto;max-width:96px;border-radius:3px'>"
        f"<figcaption style='font-size:0.7rem;text-align:center'>{as_text(frame['time_s'])} s · "
        f"{as_text(frame['ago_s'])} s ago</figcaption></figure>"
        for f, frame in zip(use.frames, rec.get("memory_frames") or []))
    listed = len(use.captions)
    return (f"<div class='vc-memory-used'><p class='vc-muted'>Memory: {listed} caption{'s' * (listed != 1)} of "
            f"{use.keyframes} keyframes, {rec.get('memory_tokens')} tokens"
            + (f"; {len(use.frames)} keyframe{'s' * (len(use.frames) != 1)} for “{as_text(use.pointer.phrase)}”"
               if use.frames and use.pointer is not None else
               f"; {len(use.frames)} pinned keyframe{'s' * (len(use.frames) != 1)}" if use.frames else "")
            + "</p>"
            + (f"<div class='vc-frames' style='display:flex;flex-wrap:wrap;gap:6px'>{tiles}</div>" if tiles else "")
            + "</div>")


def details_html(answer: "Answer", answer_id: str, recorded: bool = False) -> str:
    """The collapsed panel under an answer. Thumbnails are inline (small);
    full frames, audio and the record are links to /inputs/<id>/."""
    rec = answer.summary()
    base = f"{PATH_PREFIX}{answer_id}"
    tiles = []
    source_times = rec.get("frame_source_times") or [None] * len(rec["frame_times"])
    at_jump = rec.get("frame_source_at_jump") or [False] * len(rec["frame_times"])
    walls = frame_walls(answer)
    for k, (frame, t, idx, pos, near, wall) in enumerate(zip(answer.sample.frames, rec["frame_times"],
                                                             rec["frame_indices"], source_times, at_jump, walls)):
        tiles.append(
            f"<a href='{base}/frame/{k}.png' target='_blank' rel='noopener' title='open full size'>"
            # Inline sizes: the chat's own styles make message images full width.
            f"<figure style='margin:0;width:96px'><img src='{thumb_data_url(frame)}' alt='frame {as_text(idx)}' "
            f"style='width:96px;height:auto;max-width:96px;border-radius:3px'>"
            f"<figcaption style='font-size:0.7rem;text-align:center'>{frame_caption(idx, t, pos, near, wall)}</figcaption></figure></a>"
        )
    audio = ""
    if audio_used(answer) is not None and rec.get("audio_span"):
        start, end = rec["audio_span"]
        audio = (f"<p>Audio {start:.2f}–{end:.2f} s ({rec['audio_seconds']:.1f} s): "
                 f"<audio controls preload='none' src='{base}/audio.wav'></audio></p>")
    params = {k: rec.get(k) for k in ("seed", "temperature", "max_tokens", "frames_as", "video_fps", "include_audio")}
    cached = f" ({rec['cached_tokens']} from the cache)" if rec.get("cached_tokens") else ""
    numbers = (f"{as_text(rec.get('prompt_tokens'))} prompt tokens{as_text(cached)} · first token "
               f"{as_text(rec.get('ttft_ms'))} ms"
               + (f" · {rec['tokens_per_s']:.1f} tokens/s" if rec.get("tokens_per_s") else ""))
    return (
        "<div class='vc-inputs'>"
        f"{mark_html(answer_id, getattr(answer, 'mark', None))}{add_to_suite_html(answer_id)}"
        f"<div class='vc-frames' style='display:flex;flex-wrap:wrap;gap:6px'>{''.join(tiles)}</div>{audio}"
        f"{memory_html(answer, rec)}{history_cut(answer)}{new_frames_line(rec)}"
        f"<p class='vc-muted'>Model <code>{as_text(str(rec.get('model_name') or rec.get('model')))}</code>"
        f"{' @ ' + as_text(rec['model_revision']) if rec.get('model_revision') else ''} · {numbers}</p>"
        f"<p class='vc-muted'>Sampling: <code>{as_text(json.dumps(params))}</code></p>"
        f"<p class='vc-muted'>inputs_sha256 <code>{as_text(rec.get('inputs_sha256'))}</code></p>"
        f"<details><summary>Prompt as the model's template rendered it</summary>"
        f"<pre class='vc-prompt'>{as_text(rec.get('prompt') or '')}</pre></details>"
        f"<p>{record_links_html(answer_id, recorded)}</p></div>"
    )


def _owned(request: Request, entry: "Conversation") -> None:
    if entry.owner is not None and entry.owner != login_of(request.headers):
        raise HTTPException(403, "this answer belongs to another login's session")


def owned_answer(state: Server, request: Request, answer_id: str) -> "tuple[Conversation, Answer]":
    """A kept answer and its session, for the login that opened that session
    (HTTPException 404 or 403 otherwise)."""
    entry, answer = find(state.registry, answer_id)
    if answer is None:
        raise HTTPException(404, "no such answer (its session ended, or it is older than the last "
                                 f"{KEEP_PER_SESSION})")
    _owned(request, entry)
    return entry, answer


def router(state: Server) -> APIRouter:
    api = APIRouter()
    owned = _owned

    def lookup(request: Request, answer_id: str) -> "Answer":
        return owned_answer(state, request, answer_id)[1]

    @api.get(PATH_PREFIX + "{answer_id}/frame/{k}.png")
    async def frame(request: Request, answer_id: str, k: int) -> Response:
        answer = lookup(request, answer_id)
        if not 0 <= k < len(answer.sample.frames):
            raise HTTPException(404, "no such frame")
        import asyncio

        data = await asyncio.to_thread(png_bytes, answer.sample.frames[k])
        return Response(data, media_type="image/png", headers={"Cache-Control": "private, max-age=3600"})

    @api.get(PATH_PREFIX + "{answer_id}/audio.wav")
    async def audio(request: Request, answer_id: str) -> Response:
        samples = audio_used(lookup(request, answer_id))
        if samples is None:
            raise HTTPException(404, "this answer got no audio")
        data, _ = wav_bytes(samples)
        return Response(data, media_type="audio/wav")

    def recorded(request: Request, answer_id: str) -> tuple[list, list]:
        for entry in state.registry.entries():
            if answer_id in entry.bundles:
                owned(request, entry)
                return [entry.bundles[answer_id]], list(entry.bundles.values())
        raise HTTPException(404, "this answer was not recorded (turn Record on; the server needs --record-dir)")

    def zipped(paths: list, filename: str) -> StreamingResponse:
        # A sync iterator: Starlette runs it in a worker thread, piece by piece.
        return StreamingResponse(iter_zip_bundles(paths), media_type="application/zip",
                                 headers={"Content-Disposition": f"attachment; filename={filename}"})

    @api.get(PATH_PREFIX + "{answer_id}/bundle.zip")
    async def bundle_zip(request: Request, answer_id: str) -> Response:
        mine, _ = recorded(request, answer_id)
        return zipped(mine, f"vidchat-bundle-{answer_id[:8]}.zip")

    @api.get(PATH_PREFIX + "{answer_id}/session-bundles.zip")
    async def session_zip(request: Request, answer_id: str) -> Response:
        _, all_of_session = recorded(request, answer_id)
        return zipped(all_of_session, "vidchat-session-bundles.zip")

    @api.get(PATH_PREFIX + "{answer_id}/record.json")
    async def record_json(request: Request, answer_id: str) -> Response:
        rec = record(lookup(request, answer_id), answer_id)
        return Response(json.dumps(rec, ensure_ascii=False, indent=1), media_type="application/json",
                        headers={"Content-Disposition": f"attachment; filename=vidchat-answer-{answer_id[:8]}.json"})

    return api


# What a QA person keeps of an answer, from the page (docs/suites.md):
#
# - its verdict, good or bad with a note (``POST /inputs/<id>/mark``): kept in
#   its record, written into its bundle when it was recorded, carried into a
#   case made from it (vidchat.conversation.bundles);
# - Add to suite (with --suite-dir): a kept answer of the caller's own session
#   saved as a bundle in the suite's folder, a case that re-asks it appended
#   to its suite.toml, and its answer kept as the server's model's baseline
#   (vidchat.conversation.suite_cases, the rule ``vidchat suite add`` follows too);
# - the Suites panel (with --suite-dir): the suite's cases (``GET /suites``), a
#   run on the server's model or --compare-model's (``POST /suites/run``), its
#   progress (``GET /suites/runs/<id>``) and its report.html, each served to the
#   login that started it only (vidchat.qa.suite).

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


def needs_suite(state: Server) -> None:
    """HTTPException 404 on a server without --suite-dir."""
    if not state.settings.suite_dir:
        raise HTTPException(404, "this server keeps no suite (start it with --suite-dir DIR)")


def _add(state: Server, entry: Conversation, answer: Answer, login: str | None, note: str,
         words: list[str]) -> dict[str, Any]:
    """Write the bundle, the case and the baseline, whole or not at all (in a worker thread: files)."""
    root = Path(state.settings.suite_dir)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", answer.question.lower()).strip("-")[:40] or "answer"

    # Filed as the answering model's: a second model's answer is its baseline,
    # not the main model's; under the model's one name, as `vidchat suite run
    # --model NAME` looks it up.
    option = runs.model_option(state.settings, answer)
    model = model_name(option)

    def save(bundles: Path, name: str) -> Path:
        return Path(write_bundle(bundles, answer, source="page", model_option=option,
                                 engine_options=answer.reply.engine.options, name=name))

    name, target = suite_cases.add_case(root, slug, save, model=model, answer=answer.reply.text,
                                        login=login, max_cases=state.settings.suite_max_cases, contains=words,
                                        note=note, mark=answer.mark)
    log.info("session %s…: answer added to the suite %s as case %s", entry.session.id[:6], root, name)
    # Paths relative to the suite's folder: the server's own layout is not the caller's to see.
    return {"case": name, "suite": suite_cases.SUITE_FILE, "bundle": target.relative_to(root).as_posix(),
            "model": model, "baseline": suite_cases.keeps_baseline(answer.mark)}


def suite_router(state: Server) -> APIRouter:
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
            verdict = bundles.checked(body.get("mark"), body.get("note", ""))
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        try:
            bundle = await asyncio.to_thread(bundles.mark_answer, entry, answer_id, answer, verdict)
        except (OSError, ValueError) as exc:
            raise HTTPException(500, f"marked, but its recording could not be updated: {exc}") from None
        return {"mark": verdict, "bundle": bundle}

    return api
