"""The page's HTTP routes beside its WebRTC peer (vidchat.doors.webrtc):
the offer that makes a session's peer (or resumes the session with a new
one), closing it, the page's reports of where its video source is and that
a question is coming, Talk mode's state, the live strip and the stats.

Every route that names a session answers only the login that opened it
(403 for another's, 404 for none).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from typing import Any, AsyncIterator, Callable

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import StreamingResponse

from vidchat.doors.server_contract import IceUnavailable, login_of
from vidchat.conversation import Conversation
from vidchat.conversation.registry import TooManySessions
from vidchat.conversation.stream_source import UnknownStream, attach_stream, detach_stream
from vidchat.doors.session_stream import server_sent
from vidchat.doors.webrtc import Peer
from vidchat.doors.webrtc_requests import parse_source_report, read_json as _read_json, read_offer as _read_offer

log = logging.getLogger(__name__)
# Tasks started by a request and outliving it (held so they are not collected).
_background: set[asyncio.Task] = set()


# How long a session waits for its tab to come back after the tab went away
# (pagehide): a reload takes a second or two to offer again; a tab closed for
# good frees its place this long after, not at the idle timeout.
RELOAD_GRACE_S = 6.0


def _resumable(state, body: dict[str, Any], login: str | None) -> Conversation | None:
    """The session a reconnecting tab proves it owns, or None."""
    resume = body.get("resume")
    if not isinstance(resume, dict):
        return None
    sid, token = resume.get("session_id"), resume.get("token")
    if not isinstance(sid, str) or not isinstance(token, str):
        return None
    entry = state.registry.get_for(sid, login)
    if entry is None or entry.kind != "webrtc":
        return None
    return entry if hmac.compare_digest(token.encode(), entry.resume_token.encode()) else None


def talk_answer(entry: Conversation) -> dict[str, Any] | None:
    """The session's answer being generated, else its last one, as the page
    reads it aloud: its question number, its text so far, and whether it is done."""
    answer = entry.answer
    done = answer is None
    if answer is None and entry.answers:
        answer = next(reversed(entry.answers.values()))
    if answer is None:
        return None
    stats = answer.reply.stats
    return {"n": answer.ticket, "text": answer.reply.text, "done": done or stats.finish_reason is not None,
            "cancelled": bool(stats.cancelled), "spoken": answer.spoken is not None}


# How long the Talk stream stays silent at most (a proxy may close an idle stream).
TALK_KEEPALIVE_S = 15.0


def talk_state_of(entry: Conversation) -> dict[str, Any]:
    """Talk mode's state for the page: whether speech is under way, counters
    whose change means a turn began (the page stops reading aloud:
    barge-in) or ended, and the answer being read aloud."""
    listener = entry.talk
    out: dict[str, Any] = {"listening": False, "hearing": False, "speech_starts": 0, "utterances": 0,
                           "barge_ins": 0, "answer": talk_answer(entry)}
    if listener is not None and listener.running:
        out.update(listening=True, hearing=listener.hearing, speech_starts=listener.speech_starts,
                   utterances=listener.stats.utterances, barge_ins=listener.stats.barge_ins,
                   playback=listener.playback, level_dbfs=listener.level_dbfs,
                   # Seconds since the newest audio the session has (None: none yet): a
                   # microphone that sends nothing shows as such, not as silence.
                   audio_age_s=entry.session.audio_age_s())
    return out


def router(state) -> APIRouter:
    """The routes of the page's WebRTC side: its peer, where its video
    source is, its typing, Talk's state, the live strip and the stats."""
    api = APIRouter()
    peers: dict[str, Peer] = {}  # session id -> its current peer

    def mine(request: Request, sid: Any) -> Conversation:
        """The session a request names, if its login opened it: else 403 (another's) or 404."""
        entry = state.registry.get(sid) if isinstance(sid, str) else None
        if entry is None:
            raise HTTPException(404, "no such session (stopped or expired)")
        if state.registry.get_for(sid, login_of(request.headers)) is None:
            raise HTTPException(403, "this session belongs to another login")
        return entry

    _peer_routes(api, state, peers, mine)
    _page_report_routes(api, state, mine)
    _talk_routes(api, state, mine)
    _event_routes(api, mine)
    _view_routes(api, state, mine)
    return api


def _peer_routes(api: APIRouter, state, peers: dict[str, Peer], mine: Callable[[Request, Any], Conversation]) -> None:
    """/webrtc/offer (a new session's peer, or a resumed one's) and /webrtc/close."""

    @api.post("/webrtc/offer")
    async def offer(request: Request) -> dict[str, Any]:
        body = await _read_offer(request)
        _check_stream(state, body)  # before any session exists
        try:
            # Before any session exists: a relay that can't be had leaves nothing behind.
            ice_servers = await state.ice_config()
        except IceUnavailable as exc:
            raise HTTPException(503, f"Cannot connect from behind NAT now: {exc}.")
        entry = _resumable(state, body, login_of(request.headers))
        resumed = entry is not None
        if resumed:
            old = peers.get(entry.session.id)
            if old is not None:
                await old.close()
        else:
            try:
                entry = state.new_session("webrtc", client=request.client.host if request.client else None,
                                          owner=login_of(request.headers))
            except TooManySessions as exc:
                raise HTTPException(503, str(exc))
        sid = entry.session.id
        peer = Peer(state, entry, peers, ice_servers)
        try:
            local = await peer.answer(body["sdp"])
        except Exception as exc:
            await state.registry.close(sid, "bad offer")
            raise HTTPException(400, f"could not use this offer: {exc}")
        entry.session.last_activity = time.monotonic()
        _watch_stream(state, entry, body.get("stream"))
        peer.watch_connect(state.settings.connect_timeout)
        log.info("session %s… %s", sid[:6], "resumed by its tab" if resumed else "peer created")
        return {"sdp": local.sdp, "type": local.type, "session_id": sid,
                "resume_token": entry.resume_token, "resumed": resumed}

    lingering: set[asyncio.Task] = set()

    @api.post("/webrtc/close")
    async def close(request: Request) -> dict[str, Any]:
        """Stop (the session ends), or ``reload_grace: true`` (the tab went
        away, perhaps to reload): its peer ends at once, and the session
        RELOAD_GRACE_S later unless the tab came back for it (a resume)."""
        body = await _read_json(request)
        sid = str(body.get("session_id", ""))
        if state.registry.get(sid) is not None:
            mine(request, sid)
        if body.get("reload_grace") is True and state.registry.get(sid) is not None:
            peer = peers.get(sid)
            if peer is not None:
                await peer.close()
            task = asyncio.create_task(_close_unless_resumed(state, peers, sid))
            lingering.add(task)
            task.add_done_callback(lingering.discard)
            return {"closed": False, "closes_in_s": RELOAD_GRACE_S}
        closed = await state.registry.close(sid, "stopped by the page")
        return {"closed": closed}


def _check_stream(state, body: dict[str, Any]) -> None:
    """An offer naming a stream names one of the server's (HTTPException 400 naming it otherwise)."""
    if body.get("stream"):
        try:
            state.streams.check(body["stream"])
        except UnknownStream as exc:
            raise HTTPException(400, str(exc)) from None


def _watch_stream(state, entry: Conversation, name: str | None) -> None:
    """The page's Source menu chose a stream (the server brings its frames), or its own media."""
    if name:
        attach_stream(entry, state.streams, name)
    else:
        detach_stream(entry, state.streams)


async def _close_unless_resumed(state, peers: dict[str, Peer], sid: str) -> None:
    await asyncio.sleep(RELOAD_GRACE_S)  # a timer: the reloaded tab's resume, if it comes, makes a new peer
    if state.registry.get(sid) is not None and peers.get(sid) is None:
        await state.registry.close(sid, "the tab went away")


def _page_report_routes(api: APIRouter, state, mine: Callable[[Request, Any], Conversation]) -> None:
    """What the page tells about its session: where its video source is, and that a question is coming."""

    @api.post("/webrtc/source")
    async def source(request: Request) -> dict[str, Any]:
        """Where the page's video source is: a file's position, or a switch to camera or screen."""
        body = await _read_json(request)
        try:
            report = parse_source_report(body)
        except ValueError as exc:
            raise HTTPException(400, str(exc))
        entry = mine(request, report.pop("session_id"))
        # Placed by the page's clock when the session knows how it maps onto
        # the frames' (see the module's docstring), else by arrival.
        arrival = time.monotonic()
        placed, by_sender = entry.session.set_source(**report)
        # Where the report landed relative to its arrival: the video path's lead.
        return {"ok": True, "placed_by": "sender clock" if by_sender else "arrival",
                "placed_ms": round((placed - arrival) * 1000, 1)}

    @api.post("/webrtc/typing")
    async def typing(request: Request) -> dict[str, Any]:
        """The page's user is typing a question: warm this session's prompt now
        (vidchat.conversation.prewarm). ``"enter": true``: the question was just sent; its
        sample is taken now, as the user pressed Enter, and warmed."""
        body = await _read_json(request)
        entry = mine(request, str(body.get("session_id", "")))
        if state.prewarmer is not None:
            state.prewarmer.question_coming(entry.session.id)
            if body.get("enter") is True:
                # Answered at once: the page's few connections are for its question.
                task = asyncio.ensure_future(state.prewarmer.question_now(entry.session.id))
                _background.add(task)
                task.add_done_callback(_background.discard)
        return {"ok": True, "prewarm": state.prewarmer.mode if state.prewarmer else "off"}


def _talk_routes(api: APIRouter, state, mine: Callable[[Request, Any], Conversation]) -> None:
    """Talk mode's state for the page (once, or streamed) and the page's reading aloud."""

    @api.get("/webrtc/talk")
    async def talk_state(request: Request, session_id: str) -> dict[str, Any]:
        """Talk mode's state once (the page follows /webrtc/talk/stream)."""
        return talk_state_of(mine(request, session_id))

    @api.get("/webrtc/talk/stream")
    async def talk_stream(request: Request, session_id: str) -> StreamingResponse:
        """Talk mode's state pushed to the page while Talk is on, one JSON
        line each time it changes (a line every TALK_KEEPALIVE_S at the
        least), until the session ends or the page stops reading: one
        request for the whole of Talk, not seven a second."""
        entry = mine(request, session_id)

        async def lines() -> AsyncIterator[bytes]:
            # Driven by the session's events (speech, the answer's deltas, Talk
            # on or off): the state is redrawn once per burst of them, and
            # said again every TALK_KEEPALIVE_S when nothing happens.
            last = None
            with entry.event_hub.subscribe() as events:
                while state.registry.get(session_id) is entry:
                    current = talk_state_of(entry)
                    if current != last:
                        last = current
                        yield (json.dumps(current) + "\n").encode()
                    if await events.get(timeout=TALK_KEEPALIVE_S) is None:
                        yield (json.dumps(current) + "\n").encode()
                    events.pending()

        return StreamingResponse(lines(), media_type="application/x-ndjson",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    @api.post("/webrtc/talk")
    async def talk_playback(request: Request) -> dict[str, Any]:
        """The page started or stopped reading an answer aloud: its own voice,
        coming back through the microphone, must not be taken for a question."""
        body = await _read_json(request)
        entry = mine(request, str(body.get("session_id", "")))
        speaking = body.get("speaking")
        if not isinstance(speaking, bool):
            raise HTTPException(400, "'speaking' must be true or false")
        if entry.talk is not None:
            entry.talk.set_playback(speaking)
        return {"ok": True, "listening": entry.talk is not None and entry.talk.running}


def _event_routes(api: APIRouter, mine: Callable[[Request, Any], Conversation]) -> None:
    """The session's one event stream, for the page."""

    @api.get("/webrtc/events")
    async def session_events(request: Request, session_id: str) -> StreamingResponse:
        """The session's one event stream, as server-sent events
        (vidchat.doors.session_stream): speech, utterances, scene changes,
        each answer's queued/started/delta/done, settings changes, and
        ``closed`` last. Subscribed as the request arrives: nothing after it is missed."""
        events = mine(request, session_id).event_hub.subscribe()

        async def stream() -> AsyncIterator[bytes]:
            try:
                async for chunk in server_sent(events):
                    yield chunk
            finally:
                events.close()

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


def _view_routes(api: APIRouter, state, mine: Callable[[Request, Any], Conversation]) -> None:
    """What the page shows of its session: the live strip and the stats line."""

    @api.get("/webrtc/live")
    async def live(request: Request, session_id: str) -> dict[str, Any]:
        """The live view's strip of kept frames and answer timings (polled every few seconds)."""
        from vidchat.doors.inputs import live_view

        entry = mine(request, session_id)
        return await asyncio.to_thread(live_view, entry)

    @api.get("/webrtc/stats")
    async def session_stats(request: Request, session_id: str) -> dict[str, Any]:
        entry = state.registry.get(session_id)
        if entry is not None:
            mine(request, session_id)
        else:
            reason = state.registry.closed_reason(session_id)
            raise HTTPException(404, f"session ended: {reason}" if reason else "no such session (stopped or expired)")
        out = dict(entry.session.stats)
        left = entry.time_left()
        out["time_left_s"] = None if left is None else round(left, 1)
        out["watching"] = entry.modes.watching
        out["away"] = entry.away  # its tab went away (it may come back): no warm-ups meanwhile
        if entry.media is not None:
            out["media"] = entry.media.as_dict()
        out["gpu"] = state.gpu_figures()  # empty without a GPU
        if entry.stream is not None:  # the stream it watches: its state, fps, size and latency
            out["stream"] = entry.stream.snapshot()
        return out
