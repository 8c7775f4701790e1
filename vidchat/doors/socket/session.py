"""A socket door's session from the handshake to the close: what the seed
protocol (vidchat.doors.socket.seed.Connection) and the OpenAI Realtime door
(vidchat.doors.socket.realtime.RealtimeConnection) share, written once.

The lifecycle: a place in --max-sessions from the handshake on (a client
that never opens a session still counts), the door's own opening, the
message loop, and one shutdown that stops what asks, closes the session (the
running answer is aborted in vLLM) and waits for the answer's last event. The
loop: the idle timer (it does not run out while an answer streams), large
JSON parsed off the event loop, one handler per message type, and every
refusal told to the client while the session goes on.

What a door says is its own: its handlers, and the shape of its errors
(:meth:`SocketSession.refuse`: the seed protocol's are a message, the
Realtime API's carry a code and the client's event_id).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol

from vidchat.conversation import asking, events, modes
from vidchat.conversation.answers import AnswerOptions
from vidchat.conversation.asking import current_values
from vidchat.conversation.conversation import Conversation, UnknownStream, attach_stream, detach_stream
from vidchat.conversation.events import SCENE, TYPED, MemoryCaption
from vidchat.conversation.host import HostSettings
from vidchat.conversation.modes import SceneWatch, heard, scene_changes
from vidchat.conversation.registry import TooManySessions
from vidchat.conversation.runs import AnswerRun, Done, records_by_default
from vidchat.doors import DoorSettings, Server, login_of
from vidchat.doors import answer_routes as answer_inputs
from vidchat.doors.socket.config import (
    UPDATABLE_INFO,
    ConfigError,
    TurnDetection,
    WatchRequest,
    parse_config,
    wants_vidchat_events,
)
from vidchat.doors.socket.transport import (
    CLOSE_ERROR,
    CLOSE_FLUSH_S,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_TRY_LATER,
    TIMEOUT,
    Disconnected,
    SocketTransport,
    parse_message,
)
from vidchat.engine import NO_SPOKEN_QUESTIONS, EngineError
from vidchat.media.session import SessionSettings
from vidchat.media.vad import SpeechStarted, Utterance

if TYPE_CHECKING:
    from fastapi import WebSocket


log = logging.getLogger(__name__)


class Refusal(Exception):
    """A client message refused by its handler; the loop tells the client
    (:meth:`SocketSession.refuse`) and the session goes on."""

    def __init__(self, message: str, code: str = "invalid_value", param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.code, self.param, self.kind = message, code, param, kind


# A handler gets the message and when it arrived; what it returns, if
# anything, ends the session with that reason (the seed's video.done).
Handler = Callable[[Any, dict[str, Any], float], Awaitable[str | None]]


class SocketSession(SocketTransport):
    """One socket client's session; a door subclasses it with its handlers."""

    door = "ws"  # the registry's session kind, and the logs' name for the door
    noun = "message"  # what the door's clients send, as its errors say it
    # What a question before any frame should have done, in the seed
    # protocol's words, which its clients may match on.
    no_frames_hint = "Send video.frame before video.query."
    handlers: dict[str, Handler] = {}

    def __init__(self, state: Server, websocket: "WebSocket") -> None:
        super().__init__(websocket, send_timeout=state.settings.ws_send_timeout)
        self.state, self.settings = state, state.settings
        self.entry: Conversation | None = None
        self.reservation = None  # the place taken at the handshake, until the session holds it
        self.options = state.answer_defaults()
        self.last_input = time.monotonic()
        self.answer_task: asyncio.Task | None = None  # the answer streaming (stream_answer), one at a time
        # The client set its session's memory (vidchat.conversation.memory) itself: it gets
        # memory.caption as each keyframe is captioned. Other clients never see the event.
        self.memory_events = False
        self._captions_task: asyncio.Task | None = None

    @classmethod
    async def serve(cls, state: Server, websocket: "WebSocket") -> None:
        """Serve one client until it leaves, fails or times out."""
        try:
            await cls(state, websocket).run()
        except asyncio.CancelledError:
            raise
        except Exception:  # never let one client take the server down
            log.exception("%s session crashed", cls.door)

    # -- what a door provides ----------------------------------------------------

    async def open(self) -> bool:
        """Open the session (start_session); False when it was refused and closed."""
        raise NotImplementedError

    async def refuse(self, message: str, code: str = "invalid_value", param: str | None = None,
                     kind: str = "invalid_request_error", event_id: Any = None) -> bool:
        """Tell the client what was refused: the seed protocol's ``error
        {message}``; a door whose errors carry more overrides this."""
        return await self.error(message)

    async def stop_asking(self) -> None:
        """At the session's end, before it closes: nothing asks any more (turn detection, watch)."""

    # -- the answer streaming ----------------------------------------------------

    @property
    def answering(self) -> bool:
        """An answer streams: the idle timer waits for its end."""
        return self.answer_task is not None and not self.answer_task.done()

    def stream_answer(self, answer: Awaitable[None], name: str) -> None:
        """Stream an answer (the door's coroutine that says its run) as a task,
        so the client's messages go on meanwhile; the idle timer counts from its end.
        A door starts one only after :meth:`finish_answer`: its events never interleave."""

        async def streamed() -> None:
            try:
                await answer
            finally:
                self.last_input = time.monotonic()

        self.answer_task = asyncio.create_task(streamed(), name=name)

    async def finish_answer(self) -> None:
        """Wait for the answer task to send its last event (its reply aborted, or ending)."""
        task, self.answer_task = self.answer_task, None
        if task is not None:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                log.debug("%s %s: answer task ended with an error", self.door, self.peer, exc_info=True)

    # -- the lifecycle -----------------------------------------------------------

    async def run(self) -> None:
        """Serve the client from the handshake to the end of its session."""
        await self.ws.accept()
        try:
            self.reservation = self.state.registry.reserve(self.client_host)
        except TooManySessions as exc:
            await self.refuse_session(str(exc), "too many sessions")
            return
        reason = "refused"
        try:
            if await self.open():
                reason = await self._loop()
        except Disconnected:
            reason = self.stuck or "client disconnected"
        except asyncio.CancelledError:
            reason = "server shutting down"
            raise
        except Exception:
            log.exception("%s %s: session failed", self.door, self.peer)
            reason = "internal error"
            await self.refuse("Internal server error", "internal_error", kind="server_error")
            await self.close(CLOSE_ERROR, "internal error")
        finally:
            await self._shutdown(reason)

    async def refuse_session(self, message: str, why: str) -> bool:
        """No session now (too many, the model failed): say so, close with "try later"; False for open()."""
        self.give_place_back()
        await self.refuse(message, "session_refused", kind="server_error")
        await self.close(CLOSE_TRY_LATER, why)
        return False

    def model_down(self) -> str | None:
        """Why no session may open: the model failed to load or stays down.
        None while it runs, and while it loads or restarts: a session opened
        then is already a session (it takes frames; its questions wait for the model)."""
        ready, why = self.state.readiness()
        return why if not ready and self.state.engine_down else None

    def start_session(self, **settings: Any) -> Conversation:
        """The session, in the place taken at the handshake (raises TooManySessions)."""
        self.entry = self.state.new_session(self.door, reservation=self.reservation,
                                            owner=login_of(self.ws.headers), **settings)
        self.reservation = None
        events.bind(self.entry.session.id, self.door)  # the rest of this connection's log lines
        self.entry.closers.append(self.closed_by_server)
        self._captions_task = asyncio.create_task(self._say_captions(self.entry),
                                                  name=f"captions-{self.entry.session.id[:6]}")
        return self.entry

    def memory_set(self, session_changes: dict[str, Any]) -> None:
        """A session.config/update's settings: one that names ``memory`` opts the client in to memory.caption."""
        if "memory" in session_changes:
            self.memory_events = True

    async def _say_captions(self, entry: Conversation) -> None:
        """memory.caption for each keyframe captioned, while the client is opted in and memory is on."""
        async for event in entry.events():
            if isinstance(event, MemoryCaption) and self.memory_events and entry.session.settings.memory:
                await self.send({"type": "memory.caption", "seq": event.seq, "time_ms": event.time_ms,
                                 "caption": event.caption})

    async def closed_by_server(self) -> None:
        """The registry ended this session (time limit, shutdown): say why, then
        close, whatever the socket is doing: the reason goes only if there is
        room for it, and the close waits at most CLOSE_FLUSH_S, none of it on a
        send (a client that floods and reads nothing once kept its session
        past its --session-time-limit for good)."""
        if self.closed:
            return  # it ended from this side (the client left, video.done, idle): nothing to say
        sid = self.entry.session.id if self.entry is not None else ""
        reason = self.state.registry.closed_reason(sid) or "closed by the server"
        self.ending = True
        await self.refuse(f"Session ended: {reason}", "session_ended", kind="server_error")
        await self.close(1001, reason, flush_s=CLOSE_FLUSH_S)

    def give_place_back(self) -> None:
        """The place taken at the handshake, for a session that will not open."""
        reservation, self.reservation = self.reservation, None
        if reservation is not None:
            reservation.release()

    async def _shutdown(self, reason: str) -> None:
        self.give_place_back()
        if self._captions_task is not None:
            self._captions_task.cancel()
        self.stop_receiving()
        await self.stop_asking()
        if self.entry is not None:
            # Aborts the running answer's vLLM request and runs the closers.
            await self.state.registry.close(self.entry.session.id, reason)
        await self.finish_answer()  # the aborted answer's last event is sent
        self.entry = None
        await self.close(CLOSE_NORMAL, reason)

    # -- the message loop --------------------------------------------------------

    async def _parse(self, raw: str) -> Any:
        return await parse_message(raw)

    async def _loop(self) -> str:
        idle = self.settings.ws_idle_timeout
        self.last_input = time.monotonic()
        while not self.closed:
            # The idle timer counts from the last message or the end of the last
            # answer; a session watching a stream (--stream) has media without
            # its client saying anything, so it is not idle (a dead client is
            # still noticed by the WebSocket's own pings).
            answering = self.answering or getattr(self.entry, "stream", None) is not None
            raw = await self.receive(idle if answering else idle - (time.monotonic() - self.last_input))
            if raw is TIMEOUT:
                if answering or time.monotonic() - self.last_input < idle:
                    continue
                await self.refuse(f"Idle timeout: no {self.noun} received for {idle:g} s", "idle_timeout")
                await self.close(CLOSE_NORMAL, "idle timeout")
                return "idle timeout"
            arrived = self.last_input = time.monotonic()
            try:
                msg = await self._parse(raw)
            except ValueError as exc:
                await self.refuse(f"Invalid JSON: {exc}", "invalid_json")
                continue
            if not isinstance(msg, dict):
                await self.refuse(f"{self.noun.capitalize()}s must be JSON objects", "invalid_event")
                continue
            ended = await self._dispatch(msg, arrived)
            if ended:
                return ended
        return self.stuck or "client gone"

    async def _dispatch(self, msg: dict[str, Any], arrived: float) -> str | None:
        kind = msg.get("type")
        handler = self.handlers.get(kind) if isinstance(kind, str) else None
        try:
            if handler is None:
                raise Refusal(f"Unknown {self.noun} type: {kind}", "unknown_event", "type")
            return await handler(self, msg, arrived)
        except Refusal as exc:
            await self.refuse(exc.message, exc.code, exc.param, exc.kind, msg.get("event_id"))
        except (Disconnected, asyncio.CancelledError):
            raise
        except Exception as exc:  # one bad message never ends the session
            log.exception("%s %s: handling %s failed", self.door, self.peer, kind)
            await self.refuse(f"Internal error while handling {kind}: {type(exc).__name__}", "internal_error",
                              kind="server_error", event_id=msg.get("event_id"))
        return None


# A socket session's questions and their answers: video.query (typed or
# spoken, also while the model loads) in, the conversation's answer run out as
# the seed protocol's ``response.*`` messages.
#
# Kept apart from the connection (vidchat.doors.socket.seed), which owns the
# session's lifetime and the message loop: this is one question at a time
# being set up, its answer streamed as a task, and what each answer carries
# (the session's history and recording switches).
#
# Guarantees: every ``response.start`` is followed by exactly one
# ``response.text.done`` (also on errors and cancellation, then preceded by an
# ``error``); a new question's ``response.start`` comes after the previous
# answer's ``response.text.done``, whether it was typed, spoken or heard.

RECORD_OFF = "record: the server was started without --record-dir (nothing is written to disk without it)"


def check_record(settings: HostSettings, on: object) -> None:
    """Recording is taken only where the server was told where to write
    (--record-dir), at every door that can switch it on; raises ConfigError."""
    if on and not settings.record_dir:
        raise ConfigError(RECORD_OFF)


class Client(Protocol):
    """What the answers need of their connection (vidchat.doors.socket.seed.Connection)."""

    state: Server
    settings: DoorSettings
    entry: Any  # vidchat.conversation.Conversation, None before the session opens
    options: asking.AnswerOptions
    media: Any  # vidchat.doors.socket.intake.SocketMedia
    peer: str
    no_frames_hint: str  # what a question before any frame should have done, in this door's words
    vidchat_events: bool
    answering: bool  # its answer task streams (vidchat.doors.socket.session.SocketSession)
    answer_task: asyncio.Task | None  # that task

    async def send(self, msg: dict[str, Any]) -> bool: ...

    async def error(self, message: str) -> bool: ...

    def stream_answer(self, answer: Any, name: str) -> None: ...

    async def finish_answer(self) -> None: ...


class SocketAnswers:
    """One connection's questions, each answer streamed as its answer task."""

    def __init__(self, conn: Client) -> None:
        self.conn = conn
        # One question is set up at a time (typed, spoken in the query, or
        # heard by the listener); closed when the session ends.
        self._lock = asyncio.Lock()
        self.closed = False
        self.watched = False  # the running answer was asked by the watch
        self.notice: str | None = None  # said once, in the next response.start
        # record: each answer saved as a bundle. history: earlier questions
        # and answers (the conversation's, on the server) go with each
        # question, within the model's context.
        self.record = records_by_default(conn.settings)
        self.keep_history = False
        self.waiting: asyncio.Task | None = None  # a question asked while the model loads
        self.audio_mark = float("-inf")  # where the last question's audio ended (undated audio: the seed's rule)

    def set_history(self, on: bool) -> None:
        self.keep_history = bool(on)
        if not on and self.conn.entry is not None:
            # Off forgets: turned on again, the chat starts afresh (nor does the next warm-up carry it).
            self.conn.entry.clear()

    def set_record(self, on: bool) -> None:
        check_record(self.conn.settings, on)
        self.record = bool(on)

    async def on_query(self, msg: dict[str, Any]) -> None:
        """video.query: a typed question, or a spoken one (audio_data)."""
        conn = self.conn
        if conn.state.engine_now() is None:  # the model loads or restarts (or stays down: the wait says why)
            await self._query_when_ready(msg)
            return
        text = msg.get("text", "")
        spoken = msg.get("audio_data")
        if spoken is None or spoken == "":  # the seed's typed question (vllm-omni also ignores an empty one)
            if not isinstance(text, str) or not text.strip():
                await conn.error("video.query requires a non-empty 'text' field")
                return
            await self.ask(text)
            return
        # A spoken question: the audio is the question; text, if any, follows it in the prompt.
        if text is None:
            text = ""
        if not isinstance(text, str):
            await conn.error(f"video.query 'text' must be a string, got {type(text).__name__}")
            return
        audio = await conn.media.question_audio(msg)
        if audio is not None:
            await self.ask(text if text.strip() else "", question_audio=audio)

    async def _query_when_ready(self, msg: dict[str, Any]) -> None:
        """A question asked while the model loads waits for it, in a task of
        its own (frames keep arriving and are acked meanwhile); a newer
        question replaces it. A client that opted into vidchat's events is
        told it waits (response.waiting)."""
        conn = self.conn
        previous, self.waiting = self.waiting, None
        if previous is not None:
            previous.cancel()
        if conn.vidchat_events:
            await conn.send({"type": "response.waiting", "reason": "model_loading",
                             "message": conn.state.readiness()[1]})

        async def when_ready() -> None:
            try:
                await conn.state.engine_for()
            except EngineError as exc:
                await conn.error(str(exc))
                return
            await self.on_query(msg)

        self.waiting = asyncio.create_task(when_ready(), name="query-waits-for-the-model")

    async def ask(self, text: str, watched: bool = False, **how: Any) -> None:
        """Ask a question about the session (typed, or spoken: ``how`` is
        the conversation's question_audio= or spoken=) and stream its answer
        as a task. One question is set up at a time; the conversation's
        preemption rule ends the running answer, with its
        response.text.done, before the new one's response.start."""
        conn = self.conn
        async with self._lock:
            entry = conn.entry
            if self.closed or entry is None:
                return
            if not how and not conn.media.audio_dated and entry.session.settings.audio_mode == "frames":
                # Undated audio (the seed's clients): all of it since the previous question.
                how["sample"] = entry.session.sample(audio_after=self.audio_mark)
            try:
                # Samples the buffer now: frames arriving from here on count for the next question.
                # continues_chat: with history on, the question carries the
                # conversation's chat, and its own turn is kept for the next.
                run = await entry.ask(
                    text, conn.options, record=self.record, continues_chat=self.keep_history,
                    cause=SCENE if watched else TYPED, **how)
            except asking.Superseded:
                return  # a newer question from elsewhere took over this session
            except asking.NoFrames as exc:
                await conn.error(exc.said_with(conn.no_frames_hint))
                return
            except EngineError as exc:  # NO_SPOKEN_QUESTIONS included
                await conn.error(str(exc))
                return
            sample = run.answer.sample
            if sample.audio_end is not None:
                self.audio_mark = sample.audio_end
            await conn.finish_answer()  # its Done is delivered: the task only logs now
            consumed = conn.media.consumed(run.answer.sample) if conn.media.names_frames else None
            self.watched = watched
            conn.stream_answer(self._stream(run, consumed, watched), f"answer-{entry.session.id[:6]}")

    async def ask_logged(self, text: str, **how: Any) -> None:
        """ask(), for questions nobody typed (heard, watched): a failure is logged, not raised."""
        try:
            await self.ask(text, **how)
        except Exception:
            log.exception("ws %s: asking a spoken question failed", self.conn.peer)

    async def _stream(self, run: AnswerRun, consumed: dict[str, Any] | None = None,
                      watched: bool = False) -> None:
        """The run said as the seed protocol's messages (SeedWords)."""
        try:
            await run.say(SeedWords(self, consumed, watched))
        except asyncio.CancelledError:
            pass  # the session's end: the run has aborted its reply

    async def _answered(self, done: Done) -> None:
        conn = self.conn
        if done.error:
            await conn.error(done.error)
        stats = {**done.answer.summary(), **answer_inputs.record_links(done, self.record, conn.settings.record_dir)}
        if "record_error" in stats:
            await conn.error(stats["record_error"])
        text = done.text
        await conn.send({"type": "response.text.done", "text": text, "stats": stats})
        log.info("ws %s: answered: %d tokens, %d frames, %.1f s audio%s", conn.peer,
                 stats.get("completion_tokens", 0), stats.get("frames", 0), stats.get("audio_seconds", 0.0),
                 " (cancelled)" if stats.get("cancelled") else "")

    async def _tell_queued(self, ahead: int) -> None:
        if not self.conn.vidchat_events:
            return  # a seed or vllm-omni client just waits for its response.start
        await self.conn.send({"type": "response.queued", "position": ahead + 1, "ahead": ahead})

    async def end_watched(self) -> None:
        """Cancel a watched answer still streaming, once a watched question
        being set up is set up, and wait for its response.text.done."""
        async with self._lock:
            if self.watched and self.conn.answering:
                await self.conn.entry.cancel()
                await self.conn.finish_answer()

    async def close(self) -> None:
        """No more questions; a question being set up finishes first."""
        async with self._lock:
            self.closed = True


class SeedWords:
    """One answer run in the seed protocol's messages. Its Done is said
    within the run's loop: the run counts as delivered (a newer question may
    start) only once its response.text.done is sent."""

    def __init__(self, answers: SocketAnswers, consumed: dict[str, Any] | None, watched: bool) -> None:
        self.answers, self.send = answers, answers.conn.send
        self.consumed, self.watched = consumed, watched

    async def queued(self, ahead: int) -> None:
        await self.answers._tell_queued(ahead)

    async def started(self, answer: Any) -> None:
        start: dict[str, Any] = {"type": "response.start"}
        if self.watched:  # asked by the standing question, not by the client
            start["watch"] = True
        if self.answers.notice is not None:
            start["notice"], self.answers.notice = self.answers.notice, None
        await self.send(start)

    async def delta(self, text: str) -> bool:
        await self._consumed()  # as vllm-omni: at the model's first output
        return await self.send({"type": "response.text.delta", "delta": text})

    async def done(self, done: Done) -> None:
        if done.started:  # one that never started (replaced while it waited) says nothing
            await self._consumed()  # no output at all (cancelled, failed): still said once
            await self.answers._answered(done)

    async def _consumed(self) -> None:
        if self.consumed is not None:
            message, self.consumed = self.consumed, None
            await self.send(message)


# A socket session's watch (``session.update {"watch": …}``): a standing
# question asked at scene changes, its answers sent unasked as ordinary
# ``response.start`` … ``response.text.done`` with ``"watch": true``.
#
# When to ask is the conversation's (scene_changes, never cutting an answer
# short); this only switches it on and off for the connection.

WATCH_NEEDS_EVS = "watch needs evs_enabled: the frame filter is what sees scene changes"


class SocketWatch:
    """The standing question of one connection and the task asking it."""

    def __init__(self, conn: Client, answers: SocketAnswers) -> None:
        self.conn, self.answers = conn, answers
        self.request: WatchRequest | None = None
        self._task: asyncio.Task | None = None

    def describe(self) -> dict[str, Any] | None:
        return self.request.describe() if self.request is not None else None

    async def set(self, watch: WatchRequest | None) -> None:
        """Start, change or stop asking the standing question at scene
        changes. A watched answer still streaming ends first (cancelled, its
        response.text.done sent), as unticking Watch on the page ends it."""
        session = self.conn.entry.session
        if watch is not None and not session.settings.evs_enabled:
            raise ConfigError(WATCH_NEEDS_EVS)
        self.request = watch
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
            await self.answers.end_watched()
        if watch is not None:
            watcher = SceneWatch(session, watch.every_s)
            self._task = asyncio.create_task(self._watching(watcher, watch), name=f"watch-ws-{session.id[:6]}")

    def stop(self) -> None:
        """No more watched questions (the session ends)."""
        self.request = None
        if self._task is not None:
            self._task.cancel()

    async def _watching(self, watcher: SceneWatch, watch: WatchRequest) -> None:
        """Ask the standing question at each (rate-limited) scene change. An
        answer already streaming (typed, spoken or watched) is never cut
        short by a scene change: the change is asked about once it ends."""
        conn = self.conn
        try:
            talking = conn.entry
            async for _ in scene_changes(talking, watcher, lambda: self.request is not watch or self.answers.closed):
                await asyncio.shield(self.answers.ask_logged(watch.question, watched=True))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("ws %s: watching failed", conn.peer)


# A socket session's settings messages: ``session.config`` opens the
# session, ``session.update`` changes it, ``session.updated`` describes it.
#
# What each field means and how it is checked is vidchat.doors.socket.config
# (read from the one settings table); this applies the fields to one
# connection: its session, its answer options, and the switches of its
# answers, turn detection and watch. A session opened while the model loads is
# already a session; what needs the running model is finished once it runs.

# The one-time notice for clients that asked for spoken answers (modalities
# with "audio"): this server answers in text only.
NO_AUDIO_OUTPUT_NOTICE = "spoken output is not available: answers come as text"


class SessionConfig:
    """session.config and session.update for one connection
    (vidchat.doors.socket.seed.Connection: its transport, session and parts)."""

    def __init__(self, conn: SocketSession) -> None:
        self.conn = conn
        self.loading_task: asyncio.Task | None = None  # opened while the model loaded: runs once it is ready

    async def _refuse(self, message: str, code: int, reason: str) -> bool:
        """Tell the client why its session can't open, and close; False for open()."""
        self.conn.give_place_back()  # at once: the close may take a while, and a refused client holds nothing
        await self.conn.error(message)
        await self.conn.close(code, reason)
        return False

    async def _read(self) -> dict[str, Any] | None:
        """The client's session.config; None (refused and closed) when it sent none in time."""
        conn = self.conn
        raw = await conn.receive(conn.settings.ws_config_timeout)
        if raw is TIMEOUT:
            await self._refuse(f"Timeout waiting for session.config (send it within "
                               f"{conn.settings.ws_config_timeout:g} s of connecting)", CLOSE_POLICY,
                               "no session.config")
            return None
        try:
            msg = await parse_message(raw)
        except ValueError as exc:
            await self._refuse(f"Invalid JSON in session.config: {exc}", CLOSE_POLICY, "invalid session.config")
            return None
        if not isinstance(msg, dict) or msg.get("type") != "session.config":
            got = msg.get("type") if isinstance(msg, dict) else type(msg).__name__
            await self._refuse(f"Expected session.config, got: {got}", CLOSE_POLICY, "expected session.config")
            return None
        return msg

    async def open(self) -> bool:
        """Wait for session.config and open the session; False if the session must end."""
        conn, state = self.conn, self.conn.state
        msg = await self._read()
        if msg is None:
            return False
        try:
            changes = parse_config(msg)
            settings = self._session_settings(changes.session)
        except ValueError as exc:  # ConfigError, SessionSettings.validate, the memory budget
            return await self._refuse(str(exc), CLOSE_POLICY, "invalid session.config")
        # While the model loads the session is already a session: it takes
        # and acks frames, and a question waits for the model (SocketAnswers).
        down = conn.model_down()
        if down is not None:
            return await self._refuse(down, CLOSE_TRY_LATER, "engine not running")
        try:
            # Checked against the engine's limits once it runs (see _after_load).
            options = self._answer_options(changes.answer, settings)
        except ValueError as exc:  # OptionError
            return await self._refuse(str(exc), CLOSE_POLICY, "invalid session.config")
        conn.memory_set(changes.session)
        try:
            conn.start_session(settings=settings)  # in the handshake's place; told when the server ends it
        except TooManySessions as exc:
            return await self._refuse(str(exc), CLOSE_TRY_LATER, "too many sessions")
        conn.options = options
        conn.vidchat_events = wants_vidchat_events(msg)
        if "audio" in (changes.info.get("modalities") or []):
            conn.answers.notice = NO_AUDIO_OUTPUT_NOTICE
        try:
            conn.answers.set_record(changes.info.get("record", records_by_default(conn.settings)))
            conn.answers.set_history(changes.info.get("history", False))
            await conn.watch.set(changes.info.get("watch"))
        except ValueError as exc:  # the session goes on, as with turn_detection
            await conn.error(str(exc))
        if changes.info.get("source") is not None:
            await self._watch_stream(changes.info["source"])
        if state.engine_now() is None:  # its limits are known once it runs
            self.loading_task = asyncio.create_task(self._after_load())
        if changes.info.get("turn_detection") is not None:
            await conn.turns.request(changes.info["turn_detection"])
        if conn.vidchat_events:
            conn.announce_end()
        log.info("ws %s: session %s… started: model=%r max_frames=%d sample=%d(%s) evs=%s/%.2f frames_as=%s",
                 conn.peer, conn.entry.session.id[:6], changes.info.get("model", ""), settings.max_frames,
                 settings.num_sample_frames, settings.sampling, settings.evs_enabled, settings.evs_threshold,
                 options.frames_as)
        return True

    async def _watch_stream(self, name: str | None) -> None:
        """Attach the session to the server's stream ``name`` (None: no stream);
        an unknown name is an error and the session goes on without a source."""
        conn = self.conn
        if name is None:
            detach_stream(conn.entry, conn.state.streams)
            return
        try:
            attach_stream(conn.entry, conn.state.streams, name)
        except UnknownStream as exc:
            await conn.error(f"source: {exc}")

    async def _after_load(self) -> None:
        """A session opened while the model loaded: once it runs, the
        options are checked against its limits (turn detection waits by itself)."""
        conn = self.conn
        try:
            engine = await conn.state.engine_for()
        except EngineError as exc:
            await self._refuse(str(exc), CLOSE_TRY_LATER, "engine not running")
            return
        try:
            asking.check_options(conn.options, engine, conn.entry.session.settings)
        except ValueError as exc:  # the session goes on: its questions get the same error
            await conn.error(f"session.config: {exc}")

    def _session_settings(self, changes: dict[str, Any]) -> SessionSettings:
        # The seed's defaults, but the server's sampling rule and memory (vidchat
        # settings the seed protocol does not have: the CPU presets' 'stable', --memory).
        server = self.conn.state.registry.default_settings()
        base = SessionSettings(audio_seconds=self.conn.settings.ws_max_audio_seconds, sampling=server.sampling,
                               memory=server.memory)
        settings = dataclasses.replace(base, **changes)
        settings.validate()
        self.conn.state.check_frame_budget(settings.max_frames)
        return settings

    def _answer_options(self, changes: dict[str, Any], sampling: SessionSettings) -> AnswerOptions:
        options = self.conn.options.updated(**changes)
        asking.check_options(options, self.conn.state.engine_now(), sampling)
        return options

    async def update(self, msg: dict[str, Any]) -> None:
        """session.update: every change is checked before any is made, then
        applied and answered with session.updated."""
        conn = self.conn
        try:
            changes = parse_config(msg)
            fixed = sorted(set(changes.info) - set(UPDATABLE_INFO))
            if fixed:
                raise ConfigError(f"{', '.join(fixed)} can only be set in session.config")
            conn.turns.check(changes.info.get("turn_detection"))
            check_record(conn.settings, changes.info.get("record"))
            watch = changes.info["watch"] if "watch" in changes.info else conn.watch.request
            if watch is not None and not changes.session.get("evs_enabled", conn.entry.session.settings.evs_enabled):
                raise ConfigError(WATCH_NEEDS_EVS)
            options = conn.options.updated(**changes.answer)
            asking.apply_settings(conn.entry.session, conn.state.engine_now(), options, changes.session,
                                       conn.entry.event_hub)
        except ValueError as exc:  # ConfigError, OptionError or the settings' own check: nothing was changed
            await conn.error(f"session.update rejected: {exc}")
            return
        conn.options = options
        conn.memory_set(changes.session)
        if "record" in changes.info:
            conn.answers.set_record(changes.info["record"])
        if "history" in changes.info:
            conn.answers.set_history(changes.info["history"])
        if "watch" in changes.info and not conn.answers.closed:
            await conn.watch.set(changes.info["watch"])
        if "source" in changes.info:
            await self._watch_stream(changes.info["source"])
        # session.update is vidchat's own message: its sender knows vidchat.
        known = conn.vidchat_events
        conn.vidchat_events = wants_vidchat_events(msg, already=True)
        if conn.vidchat_events and not known:
            conn.announce_end()
        if "turn_detection" in changes.info and not conn.answers.closed:
            await conn.turns.request(changes.info["turn_detection"])
        # The session's id: what GET /sessions/<id>/memory takes (vidchat.doors.memory_routes).
        await conn.send({"type": "session.updated", "session_id": conn.entry.session.id, "settings": self.describe()})

    def describe(self) -> dict[str, Any]:
        """The session's settings as session.updated reports them."""
        conn = self.conn
        session = conn.entry.session.settings
        # Beyond the table's fields, the session's own (audio_seconds …) as the seed reported them.
        return {**dataclasses.asdict(session), **current_values(session, conn.options),
                "turn_detection": conn.turns.describe(), "watch": conn.watch.describe(),
                "record": conn.answers.record, "history": conn.answers.keep_history,
                "source": None if conn.entry.stream is None else {"stream": conn.entry.stream.name}}


# A socket session's server-side turn detection (``turn_detection``):
# where the client's speech starts and stops, as OpenAI Realtime's
# ``input_audio_buffer.speech_started``/``speech_stopped``, and each finished
# utterance asked the way video.query asks a question.
#
# The listener and barge-in are the conversation's (vidchat.conversation.modes);
# this only switches them on and off for the connection and says what they hear.

class SocketTurns:
    """Turn detection for one connection: its settings, the session's listener
    and the task that asks each utterance."""

    def __init__(self, conn: Client, answers: SocketAnswers) -> None:
        self.conn, self.answers = conn, answers
        self.turns: TurnDetection | None = None
        # Asked for while the model loads: started once it runs (what the model hears is known then).
        self.after_load: TurnDetection | None = None
        self._loading: asyncio.Task | None = None
        self._listener: modes.Listener | None = None
        self._task: asyncio.Task | None = None

    def hears(self) -> bool:
        """Whether the running model takes spoken questions."""
        engine = self.conn.state.engine_now()
        return engine is not None and engine.accepts_audio

    def describe(self) -> dict[str, Any] | None:
        turns = self.turns if self.turns is not None else self.after_load
        return turns.describe() if turns is not None else None

    def check(self, turns: TurnDetection | None) -> None:
        """Raises ConfigError when the running model takes no spoken questions
        (while it loads that is known only once it runs: :meth:`request`)."""
        if turns is not None and self.conn.state.engine_now() is not None and not self.hears():
            raise ConfigError(f"turn_detection: {NO_SPOKEN_QUESTIONS}")

    async def request(self, turns: TurnDetection | None) -> None:
        """A door's turn_detection (null: off), for every socket door: set
        now, or, while the model loads, once it runs; then a model that
        takes no spoken questions is said in an error, and the session goes on."""
        if self.conn.state.engine_now() is None:
            self.after_load = turns
            if self._loading is None:
                self._loading = asyncio.create_task(self._when_loaded(), name="turns-wait-for-the-model")
        elif turns is not None and not self.hears():  # typed questions still work
            await self.conn.error(f"turn_detection is off: {NO_SPOKEN_QUESTIONS}")
        else:
            await self.set(turns)

    async def _when_loaded(self) -> None:
        try:
            await self.conn.state.engine_for()
        except EngineError:
            return  # the model failed: the door ends the session
        self._loading = None
        turns, self.after_load = self.after_load, None
        if self.conn.entry is not None and turns is not None:
            await self.request(turns)

    async def set(self, turns: TurnDetection | None) -> None:
        """Start, change or stop server-side turn detection."""
        self.turns = turns
        entry = self.conn.entry
        if turns is None:
            await self._stop_asking()
            if entry is not None:
                await modes.stop(entry)
            return
        listener = modes.listener(entry, turns.settings, turns.interrupt_response,
                                 on_speech=modes.speech_warms(self.conn.state, entry))
        if listener is not self._listener or self._task is None or self._task.done():
            await self._stop_asking()
            self._listener = listener
            self._task = asyncio.create_task(self._talk(listener), name=f"talk-ws-{entry.session.id[:6]}")

    async def stop(self) -> None:
        """At the session's end: no more turns, asked or waiting for the model (the session's listener stays)."""
        if self._loading is not None:
            self._loading.cancel()
        await self._stop_asking()

    async def _stop_asking(self) -> None:
        """End the task that asks utterances."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})

    def timeline_ms(self, t: float) -> int | None:
        """A time on the session's timeline in ms since its first media (None before any)."""
        entry = self.conn.entry
        start = entry.session.timeline_start if entry is not None else None
        return None if start is None else round((t - start) * 1000)

    async def _talk(self, listener: modes.Listener) -> None:
        """Say where the client's speech starts and stops, and ask each
        finished utterance: the loop every socket door shares; what is said
        is the door's (:meth:`speech_started`, :meth:`utterance`)."""
        conn = self.conn
        try:
            async for event in heard(listener, starts=True):
                if isinstance(event, SpeechStarted):
                    await self.speech_started(event)
                elif isinstance(event, Utterance):
                    await self.utterance(event)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("ws %s: turn detection failed", conn.peer)

    async def speech_started(self, event: SpeechStarted) -> None:
        """The seed door's word for it (another door overrides this)."""
        await self.conn.send({"type": "input_audio_buffer.speech_started",
                              "audio_start_ms": self.timeline_ms(event.start)})

    async def utterance(self, event: Utterance) -> None:
        """Say the speech stopped, and ask the utterance the way video.query asks a question."""
        await self.conn.send({"type": "input_audio_buffer.speech_stopped",
                              "audio_start_ms": self.timeline_ms(event.start),
                              "audio_end_ms": self.timeline_ms(event.end), "cut": event.cut})
        turns = self.turns
        if turns is not None and turns.create_response:
            await self.answer_streams_on()
            # Shielded: the session's end waits for a question being
            # set up (SocketAnswers.close) instead of cutting it in half.
            await asyncio.shield(self.answers.ask_logged("", spoken=event))

    async def answer_streams_on(self) -> None:
        """Without ``interrupt_response`` the client's speech does not cut the
        answer streaming: its utterance is asked once that answer has ended
        (asking at once would cancel it, as any newer question does)."""
        task = self.conn.answer_task
        if self.turns is not None and not self.turns.interrupt_response and task is not None:
            await asyncio.wait({task})
