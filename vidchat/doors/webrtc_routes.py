"""The page's HTTP routes beside its WebRTC peer (vidchat.doors.webrtc):
the offer that makes a session's peer (or resumes the session with a new
one), closing it, the page's reports of where its video source is and that
a question is coming, Talk mode's state, the live strip and the stats.

Every route that names a session answers only the login that opened it
(403 for another's, 404 for none).
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import json
import logging
import posixpath
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Coroutine

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, StreamingResponse
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Receive, Scope, Send

from vidchat.conversation.conversation import Conversation, UnknownStream, attach_stream, detach_stream
from vidchat.conversation.events import (
    AnswerEvent,
    ChatCleared,
    Closed,
    Notice,
    QuestionAsked,
    QuestionRefused,
    SceneChanged,
    SessionEvent,
    SettingsChanged,
    SoundLevel,
    SourceState,
    SpeechStarted,
    SpeechStopped,
    Subscription,
    Utterance,
)
from vidchat.conversation.registry import SessionRegistry, TooManySessions
from vidchat.conversation.runs import Delta, Done, Queued, Started
from vidchat.doors import IceUnavailable, Server, login_of
from vidchat.doors.page.chat import chat_draws
from vidchat.doors.page.questions import ask_typed
from vidchat.doors.webrtc import Peer
from vidchat.media import is_number
from vidchat.media.clock import SENT_SOURCE_KINDS

log = logging.getLogger(__name__)


# The page's WebRTC requests read and checked (vidchat.doors.webrtc_routes
# serves them): a JSON body, an offer (one video and one audio track at most;
# a tab watching a stream may send only a data channel), and a report of where
# its video source is.

async def read_json(request: Request) -> dict[str, Any]:
    # sendBeacon posts text/plain, so parse the body whatever its type says.
    try:
        body = json.loads(await request.body() or b"{}")
    except json.JSONDecodeError:
        raise HTTPException(400, "body must be JSON")
    if not isinstance(body, dict):
        raise HTTPException(400, "body must be a JSON object")
    return body


async def read_offer(request: Request) -> dict[str, Any]:
    body = await read_json(request)
    if body.get("type") != "offer" or not isinstance(body.get("sdp"), str):
        raise HTTPException(400, "expected {type: 'offer', sdp: '...'}")
    sections = [line.split(None, 1)[0][2:] for line in body["sdp"].splitlines() if line.startswith("m=") and " " in line]
    counts = collections.Counter(sections)
    stream = body.get("stream")
    if stream is not None and (not isinstance(stream, str) or not stream):
        raise HTTPException(400, "stream must be the name of one of the server's streams (GET /api/streams)")
    # A tab watching a stream may send no media of its own: a data channel keeps its connection.
    channels = counts["application"] if stream else 0
    if not counts["video"] and not counts["audio"] and not channels:
        raise HTTPException(400, "the offer carries no audio or video track")
    if counts["video"] > 1 or counts["audio"] > 1 or channels > 1 or \
            len(sections) > counts["video"] + counts["audio"] + channels:
        raise HTTPException(400, f"an offer may carry one video and one audio track; this one has "
                                 f"{', '.join(f'{n} {kind}' for kind, n in counts.items())}")
    return body


SOURCE_NAME_MAX = 200

SOURCE_RATE_MAX = 16.0  # browsers refuse playbackRate above 16


def parse_source_report(body: dict[str, Any]) -> dict[str, Any]:
    """A page's /webrtc/source report as :meth:`vidchat.media.session.Session.set_source`
    arguments; raises ValueError naming the first bad field."""
    sid = body.get("session_id")
    if not isinstance(sid, str) or not sid:
        raise ValueError("session_id must be the session's id (text)")
    kind = body.get("kind")
    if kind not in SENT_SOURCE_KINDS:
        raise ValueError(f"kind must be one of {', '.join(SENT_SOURCE_KINDS)}, got {kind!r}")
    out: dict[str, Any] = {"session_id": sid, "kind": kind}
    at = body.get("at")
    if at is not None:
        if not is_number(at) or at <= 0:
            raise ValueError(f"at must be the page's time in ms since the Unix epoch, or null, got {at!r}")
        out["at_sender_s"] = float(at) / 1000.0
    if kind != "file":
        return out
    name = body.get("name")
    if name is not None and not isinstance(name, str):
        raise ValueError(f"name must be the file's name (text) or null, got {type(name).__name__}")
    if name:
        # Only the base name: a path would say more about the viewer's disk than the record needs.
        name = posixpath.basename(name.replace("\\", "/")).strip()[:SOURCE_NAME_MAX] or None
    position = body.get("position")
    if not is_number(position) or position < 0:
        raise ValueError(f"position must be a number of seconds >= 0, got {position!r}")
    playing = body.get("playing", True)
    if not isinstance(playing, bool):
        raise ValueError(f"playing must be true or false, got {playing!r}")
    rate = body.get("rate", 1.0)
    if not is_number(rate) or not 0 < rate <= SOURCE_RATE_MAX:
        raise ValueError(f"rate must be a number in (0, {SOURCE_RATE_MAX:g}], got {rate!r}")
    duration = body.get("duration")
    if duration is not None and (not is_number(duration) or duration <= 0):
        raise ValueError(f"duration must be a positive number of seconds or null, got {duration!r}")
    loop = body.get("loop", False)
    if not isinstance(loop, bool):
        raise ValueError(f"loop must be true or false, got {loop!r}")
    out.update(name=name, position_s=float(position), playing=playing, rate=float(rate),
               duration_s=None if duration is None else float(duration), loop=loop)
    return out


# The session's events (vidchat.conversation.events) as the page
# reads them: server-sent events, one per event, named by what happened, with
# a JSON body. The door only translates; what happens is the conversation's.

# A comment line this often keeps a proxy from closing a quiet stream.
KEEPALIVE_S = 15.0


def wire(event: SessionEvent) -> tuple[str, dict[str, Any]]:
    """(event name, body) of one session event."""
    if isinstance(event, QuestionAsked):
        return "question.asked", {"ticket": event.ticket, "question": event.question, "cause": event.cause,
                                  "at": event.at, "spoken_seconds": event.spoken_seconds}
    if isinstance(event, QuestionRefused):
        return "question.refused", {"ticket": event.ticket, "why": event.why, "reason": event.reason}
    if isinstance(event, ChatCleared):
        return "chat.cleared", {}
    if isinstance(event, Notice):
        return "notice", {"text": event.text}
    if isinstance(event, AnswerEvent):
        side = {"side": True} if event.side else {"ticket": event.ticket}
        inner = event.event
        if isinstance(inner, Queued):
            return "answer.queued", {"ahead": inner.ahead, **side}
        if isinstance(inner, Started):
            return "answer.started", {"question": inner.answer.question, **side}
        if isinstance(inner, Delta):
            return "answer.delta", {"text": inner.text, **side}
        if isinstance(inner, Done):
            return "answer.done", {"answer_id": event.answer_id, "status": inner.status, "error": inner.error,
                                   "text": inner.text, **side}
    if isinstance(event, SpeechStarted):
        return "speech.started", {"t": event.start}
    if isinstance(event, SpeechStopped):
        return "speech.stopped", {"t": event.t}
    if isinstance(event, Utterance):
        return "utterance", {"start": event.start, "end": event.end}
    if isinstance(event, SoundLevel):
        return "sound.level", {"dbfs": event.dbfs, "t": event.t}
    if isinstance(event, SceneChanged):
        return "scene.changed", {"t": event.t}
    if isinstance(event, SettingsChanged):
        return "settings.changed", dict(event.values)
    if isinstance(event, SourceState):
        return "source.state", {"state": event.state, "why": event.why}
    if isinstance(event, Closed):
        return "closed", {"reason": event.reason}
    return "unknown", {}


async def server_sent(events: Subscription) -> AsyncIterator[bytes]:
    """The stream, until the session closes (``closed`` is its last event)."""
    yield b": vidchat session events\n\n"  # at once: the page knows it is subscribed
    while True:
        event = await events.get(timeout=KEEPALIVE_S)
        if event is None:
            yield b": keepalive\n\n"
            continue
        name, body = wire(event)
        yield f"event: {name}\ndata: {json.dumps(body, default=str)}\n\n".encode()
        if isinstance(event, Closed):
            return


# Tasks started by a request and outliving it (held so they are not collected).
_background: set[asyncio.Task] = set()


def _in_background(work: Coroutine[Any, Any, object]) -> None:
    """Run ``work`` beyond the request that started it."""
    task = asyncio.ensure_future(work)
    _background.add(task)
    task.add_done_callback(_background.discard)


# How long a session waits for its tab to come back after the tab went away
# (pagehide): a reloaded page asks for the page again at once, well within
# this (ReturningTabs); a tab closed for good frees its place this long
# after, not at the idle timeout.
RELOAD_GRACE_S = 6.0
# How long the session then waits for that page's offer or claim, which
# comes once Gradio has drawn the page: a second or two here, 6 s on a loaded
# 2-core machine, longer on a phone's network. Past it the session, its chat
# and a running answer are gone.
RETURNING_GRACE_S = 60.0
# A reload asks for the page just before its old page goes away (the old one
# unloads once the new one's answer arrives): a request for the page longer
# than this before the tab went away was another tab's, and changes nothing.
PAGE_BEFORE_LEAVING_S = 10.0
# The cookie the page keeps of its browser's live sessions (static/js/state.js):
# their ids, dot-separated, which a reload's request for the page carries,
# before the reloading tab goes away. Ids only: they grant nothing, they only
# keep a session that goes into its grace a while longer.
RETURNING_COOKIE = "vidchat_returning"


class ReturningTabs:
    """ASGI middleware: a request for the page carrying RETURNING_COOKIE may
    be one of those tabs reloading, so those sessions, if their tab goes
    away now, wait RETURNING_GRACE_S for its offer or claim instead of the
    reload grace. The page's own scripts cannot say so: Gradio runs them
    only after its own, which on a slow machine or network arrive after the
    grace. Only a tab that goes away within PAGE_BEFORE_LEAVING_S of the
    request (or after it) waits: a new tab's request names the browser's
    other sessions too, and one of them closed within those seconds waits
    longer to end, nothing more."""

    def __init__(self, app: ASGIApp, registry: SessionRegistry) -> None:
        self.app, self.registry = app, registry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == "/":
            cookie = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"cookie"), "")
            for sid in cookie_parser(cookie).get(RETURNING_COOKIE, "").split(".")[:8]:
                entry = self.registry.get(sid) if sid else None
                if entry is not None:
                    entry.returning_until = time.monotonic() + RETURNING_GRACE_S
        await self.app(scope, receive, send)


def _resumable(state: Server, body: dict[str, Any], login: str | None) -> Conversation | None:
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


def router(state: Server) -> APIRouter:
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
    _event_routes(api, state, peers, mine)
    _ask_route(api, state, mine)
    _view_routes(api, state, mine)
    return api


def _peer_routes(api: APIRouter, state: Server, peers: dict[str, Peer],
                 mine: Callable[[Request, Any], Conversation]) -> None:
    """/webrtc/offer (a new session's peer, or a resumed one's) and /webrtc/close."""

    @api.post("/webrtc/offer")
    async def offer(request: Request) -> dict[str, Any]:
        body = await read_offer(request)
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
            entry.paused = False
        else:
            try:
                entry = state.new_session("webrtc", client=request.client.host if request.client else None,
                                          owner=login_of(request.headers))
            except TooManySessions as exc:
                raise HTTPException(503, str(exc))
        sid = entry.session.id
        _attached(entry)
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


    @api.post("/webrtc/close")
    async def close(request: Request) -> dict[str, Any]:
        """``pause: true`` (the page's Stop): the peer ends, the session
        with its chat and kept answers waits for the tab's next Start (also
        the claim of a paused tab after its reload). ``reload_grace: true``
        (the tab went away, perhaps to reload): its peer ends at once, and
        the session RELOAD_GRACE_S later unless the tab came back for it.
        Neither: the session ends (a tab that gives it up)."""
        body = await read_json(request)
        sid = str(body.get("session_id", ""))
        entry = state.registry.get(sid)
        if entry is not None:
            mine(request, sid)
        if body.get("pause") is True:
            if entry is None:
                raise HTTPException(404, "no such session (it ended: Clear, the time limit, or idle too long)")
            peer = peers.get(sid)
            if peer is not None:
                await peer.close()
            detach_stream(entry, state.streams)
            entry.paused = True
            _attached(entry)
            if entry.chat_readers == 0:  # its tab is not reading its chat: gone, or reloading
                _paused_tab_left(state, peers, entry)
            return {"closed": False, "paused": True}
        if body.get("reload_grace") is True and entry is not None:
            peer = peers.get(sid)
            if peer is not None:
                await peer.close()
            _in_background(_close_unless_resumed(state, peers, sid, entry.attachments))
            return {"closed": False, "closes_in_s": RELOAD_GRACE_S}
        closed = await state.registry.close(sid, "closed by its client")
        return {"closed": closed}


def _check_stream(state: Server, body: dict[str, Any]) -> None:
    """An offer naming a stream names one of the server's (HTTPException 400 naming it otherwise)."""
    if body.get("stream"):
        try:
            state.streams.check(body["stream"])
        except UnknownStream as exc:
            raise HTTPException(400, str(exc)) from None


def _watch_stream(state: Server, entry: Conversation, name: str | None) -> None:
    """The page's Source menu chose a stream (the server brings its frames), or its own media."""
    if name:
        attach_stream(entry, state.streams, name)
    else:
        detach_stream(entry, state.streams)


async def _disconnected(request: Request) -> None:
    """Returns once the client of a streamed response has closed its
    connection (its request, a GET, has no body left to read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _attached(entry: Conversation) -> None:
    """A tab attached itself to the session: one that went away later is
    gone unless it comes back, whatever an earlier page load said."""
    entry.attachments += 1
    entry.returning_until = 0.0


async def _close_unless_resumed(state: Server, peers: dict[str, Peer], sid: str, attachments: int) -> None:
    started, waiting = time.monotonic(), False
    await asyncio.sleep(RELOAD_GRACE_S)  # a timer: the reloaded tab's resume or claim, if it comes, attaches it
    while True:
        entry = state.registry.get(sid)
        if entry is None:
            return
        if peers.get(sid) is not None or entry.attachments != attachments:
            log.info("session %s… kept: its tab came back within %.1f s", sid[:6], time.monotonic() - started)
            return
        requested_at = entry.returning_until - RETURNING_GRACE_S  # its browser's last request for the page
        left = entry.returning_until - time.monotonic()
        if left <= 0 or requested_at < started - PAGE_BEFORE_LEAVING_S:
            break
        if not waiting:
            log.info("session %s… its tab is loading again: it waits up to %.0f s more for it", sid[:6], left)
            waiting = True
        await asyncio.sleep(min(left, 0.5))  # its page is loading again: its offer or claim is on the way
    await state.registry.close(sid, "the tab went away")


def _page_report_routes(api: APIRouter, state: Server, mine: Callable[[Request, Any], Conversation]) -> None:
    """What the page tells about its session: where its video source is, and that a question is coming."""

    @api.post("/webrtc/source")
    async def source(request: Request) -> dict[str, Any]:
        """Where the page's video source is: a file's position, or a switch to camera or screen."""
        body = await read_json(request)
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
        (vidchat.conversation.warmup). ``"enter": true``: the question was just sent; its
        sample is taken now, as the user pressed Enter, and warmed."""
        body = await read_json(request)
        entry = mine(request, str(body.get("session_id", "")))
        if state.prewarmer is not None:
            state.prewarmer.question_coming(entry.session.id)
            if body.get("enter") is True:
                # Answered at once: the page's few connections are for its question.
                _in_background(state.prewarmer.question_now(entry.session.id))
        return {"ok": True, "prewarm": state.prewarmer.mode if state.prewarmer else "off"}


def _talk_routes(api: APIRouter, state: Server, mine: Callable[[Request, Any], Conversation]) -> None:
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
                        if await request.is_disconnected():
                            return  # the tab went (a write to it may be dropped without a word)
                        yield (json.dumps(current) + "\n").encode()
                    events.pending()

        return StreamingResponse(lines(), media_type="application/x-ndjson",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    @api.post("/webrtc/talk")
    async def talk_playback(request: Request) -> dict[str, Any]:
        """The page started or stopped reading an answer aloud: its own voice,
        coming back through the microphone, must not be taken for a question."""
        body = await read_json(request)
        entry = mine(request, str(body.get("session_id", "")))
        speaking = body.get("speaking")
        if not isinstance(speaking, bool):
            raise HTTPException(400, "'speaking' must be true or false")
        if entry.talk is not None:
            entry.talk.set_playback(speaking)
        return {"ok": True, "listening": entry.talk is not None and entry.talk.running}


def _event_routes(api: APIRouter, state, peers: dict[str, Peer],
                  mine: Callable[[Request, Any], Conversation]) -> None:
    """The session's one event stream, for the page (and its chat's view of it)."""

    @api.get("/webrtc/events")
    async def session_events(request: Request, session_id: str, view: str = "") -> StreamingResponse:
        """The session's one event stream, as server-sent events
        (vidchat.doors.webrtc_routes): speech, utterances, scene changes,
        each answer's queued/started/delta/done, settings changes, and
        ``closed`` last. Subscribed as the request arrives: nothing after it is missed.
        ``view=chat``: the same events said as the page's chat panel draws
        them (vidchat.doors.page.chat.chat_draws: ``chat.draw``,
        ``inputs.view``, ``closed``), from the chat the session has so far."""
        entry = mine(request, session_id)
        if view == "chat":
            return StreamingResponse(_chat_sent(entry, request), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
        if view:
            raise HTTPException(400, "view must be 'chat' or left out")
        events = entry.event_hub.subscribe()

        async def stream() -> AsyncIterator[bytes]:
            try:
                async for chunk in server_sent(events):
                    yield chunk
            finally:
                events.close()

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    async def _chat_sent(entry: Conversation, request: Request) -> AsyncIterator[bytes]:
        if entry.paused:
            _attached(entry)  # a stopped tab reading its chat again (after a blip) is still there
        draws = chat_draws(state, entry)
        pending: asyncio.Future[tuple[str, dict[str, Any]]] | None = None
        # The tab's connection closing, noticed as it happens (a write to a
        # closed connection is dropped without a word, so the next draw or
        # keepalive would not tell): a stopped tab closed for good frees its
        # session after the reload grace, not a keepalive later.
        gone = asyncio.ensure_future(_disconnected(request))
        entry.chat_readers += 1
        try:
            yield b": vidchat chat\n\n"  # at once: the page knows it is subscribed
            while True:
                # A draw, or a comment line every KEEPALIVE_S while nothing changes.
                pending = pending or asyncio.ensure_future(draws.__anext__())
                done, _ = await asyncio.wait({pending, gone}, timeout=KEEPALIVE_S,
                                             return_when=asyncio.FIRST_COMPLETED)
                if gone.done():
                    return
                if pending not in done:
                    yield b": keepalive\n\n"
                    continue
                try:
                    name, body = pending.result()
                except StopAsyncIteration:
                    return
                finally:
                    pending = None
                yield f"event: {name}\ndata: {json.dumps(body, default=str)}\n\n".encode()
        finally:
            # First, before any await: a stream ended by the tab's going is
            # cancelled, and the awaits below may be cut short.
            entry.chat_readers -= 1
            _paused_tab_left(state, peers, entry)
            gone.cancel()
            if pending is not None:  # the tab went: the draw under way ends before the draws close
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
            await draws.aclose()


def _paused_tab_left(state: Server, peers: dict[str, Peer], entry: Conversation) -> None:
    """A stopped tab's chat stream ended (the tab closed, crashed or
    reloads; a tab closed by its browser may send no pagehide beacon): its
    session waits RELOAD_GRACE_S for the tab to claim it again, as a
    running tab's does, then ends instead of waiting for the idle timeout."""
    if entry.paused and not entry.closed:  # a tab that comes back for it reads its chat again
        log.info("session %s… stopped, and its tab stopped reading: it ends in %g s unless the tab comes back",
                 entry.session.id[:6], RELOAD_GRACE_S)
        _in_background(_close_unless_resumed(state, peers, entry.session.id, entry.attachments))


def _ask_route(api: APIRouter, state: Server, mine: Callable[[Request, Any], Conversation]) -> None:
    """The page's typed question (its chat shows it from the session's events)."""

    @api.post("/webrtc/ask")
    async def ask(request: Request) -> dict[str, Any]:
        """The page's typed question, one request: ``{session_id, question,
        settings}`` (settings by the settings table's names, as the page's
        controls hold them; one left out is the page's default). Answers
        ``{"ticket": n}`` at once: the question's outcome comes as the
        session's events (``question.asked`` with this ticket first), which
        the chat draws; or ``{"refused": why}`` when its settings were not
        accepted (nothing was asked)."""
        body = await read_json(request)
        entry = mine(request, str(body.get("session_id", "")))
        try:
            return await ask_typed(state, entry, body.get("question"), body.get("settings"))
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None


def _view_routes(api: APIRouter, state: Server, mine: Callable[[Request, Any], Conversation]) -> None:
    """What the page shows of its session: the live strip and the stats line."""

    @api.get("/webrtc/live")
    async def live(request: Request, session_id: str) -> dict[str, Any]:
        """The live view's strip of kept frames and answer timings (polled every few seconds)."""
        from vidchat.doors.answer_routes import live_view

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
        out["watch"] = entry.modes.watch_status()  # what watching is doing (None: not watching)
        out["away"] = entry.away  # its tab went away (it may come back): no warm-ups meanwhile
        out["paused"] = entry.paused  # its tab stopped its source: the session waits for Start
        if entry.media is not None:
            out["media"] = entry.media.as_dict()
        out["gpu"] = state.gpu_figures()  # empty without a GPU
        if entry.stream is not None:  # the stream it watches: its state, fps, size and latency
            out["stream"] = entry.stream.snapshot()
        return out


# --media-dir: video files the page may pick as a source.
#
# The browser plays the file itself and sends it over the session's peer like a
# camera, so this module only lists the folder and serves its files. Only
# regular files directly inside the folder, with a video or audio extension,
# are listed or served: no subfolders, no links out, nothing else on the disk.

MEDIA_EXTENSIONS = frozenset({".mp4", ".webm", ".mkv", ".mov", ".ogv", ".ogg", ".m4v", ".mp3", ".wav", ".m4a"})


def media_files(folder: str) -> dict[str, Path]:
    """Name -> path of the playable files directly in `folder` (empty when unset)."""
    if not folder:
        return {}
    root = Path(folder).expanduser().resolve()
    if not root.is_dir():
        return {}
    out = {}
    for path in sorted(root.iterdir()):
        if path.suffix.lower() in MEDIA_EXTENSIONS and path.is_file() and not path.is_symlink() \
                and path.resolve().parent == root:
            out[path.name] = path
    return out


def media_dir_router(state: Server) -> APIRouter:
    api = APIRouter()

    @api.get("/api/media")
    async def listing() -> dict[str, Any]:
        files = media_files(state.settings.media_dir)
        return {"files": [{"name": name, "bytes": path.stat().st_size} for name, path in files.items()]}

    @api.get("/media/{name}")
    async def media(name: str) -> FileResponse:
        path = media_files(state.settings.media_dir).get(name)
        if path is None:
            raise HTTPException(404, "no such file in --media-dir")
        return FileResponse(path)

    return api
