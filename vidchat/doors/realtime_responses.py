"""The Realtime door's responses: ``response.create`` checked and started
one at a time, each the connection's answer task, said as response events.

The connection (:class:`vidchat.doors.realtime.RealtimeConnection`) takes
the client's items into the pending question; a response takes that
question, asks the conversation and streams the run as
``response.created`` … ``response.done`` (shapes: :mod:`vidchat.doors.realtime_events`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from vidchat import conversation
from vidchat.conversation import answer_path
from vidchat.doors import realtime_events as rt
from vidchat.doors import realtime_items as items
from vidchat.doors.inputs import record_links
from vidchat.engine import EngineError

log = logging.getLogger(__name__)


class Client(Protocol):
    """What the responses need of their connection (vidchat.doors.realtime.RealtimeConnection)."""

    state: Any  # vidchat.app.state.AppState
    settings: Any  # vidchat.app.settings.Settings
    entry: Any  # the session's conversation, None before the session opens
    options: answer_path.AnswerOptions
    question: items.Question  # the text and audio items since the last response
    record: bool
    peer: str
    closed: bool
    answering: bool  # its answer task streams (vidchat.doors.socket_session.SocketSession)

    async def emit(self, *events: dict[str, Any]) -> bool: ...

    async def refuse(self, message: str, code: str = ..., param: str | None = ..., kind: str = ...,
                     event_id: Any = ...) -> bool: ...

    def next_item(self, item_id: str) -> str | None: ...

    def audio_notice(self, fields: dict[str, Any]) -> dict[str, Any]: ...

    def stream_answer(self, answer: Any, name: str) -> None: ...

    async def finish_answer(self) -> None: ...


class RealtimeResponses:
    """One connection's responses, one at a time, each the connection's
    answer task: it asks the conversation and says the run as response
    events (:class:`RealtimeResponse`). Every ``response.created`` is followed by
    exactly one ``response.done``; a new response starts only after the
    previous one's, whoever starts it (the client, server VAD)."""

    def __init__(self, conn: Client) -> None:
        self.conn = conn
        # Starting a response waits (for the previous one to wind down) with
        # no answer task to show for it: the lock is what says one is starting.
        self._lock = asyncio.Lock()
        self.current: RealtimeResponse | None = None  # the newest response started

    @property
    def busy(self) -> bool:
        """A response is under way, or being started: a client's response.create is refused."""
        return self.conn.answering or self._lock.locked()

    async def cancel(self, why: str) -> None:
        if self.current is not None:
            await self.current.cancel(why)

    async def create(self, request: Any) -> None:
        """A client's response.create (``request``: its ``response``), checked,
        then started on the pending question; raises rt.EventError."""
        conn = self.conn
        if self.busy:
            raise rt.EventError("a response is in progress: cancel it first, or wait for its response.done",
                                "conversation_already_has_active_response")
        fields, metadata = rt.response_fields(request), rt.response_metadata(request)
        continues_chat = rt.in_conversation(request)
        options = rt.answer_options(conn.options, fields, conn.state.answer_defaults().max_tokens)
        try:
            answer_path.check_options(options, conn.state.engine)
        except ValueError as exc:
            raise rt.setting_refused(exc, "response", fields) from None
        if not conn.question:
            raise rt.EventError("nothing to answer: add an input_text, input_audio or input_image item (or commit "
                                "the audio buffer) since the last response before response.create",
                                "empty_conversation")
        # Image items alone: answered on the frames, with no text question.
        text, audio = conn.question.take()
        await self.start(text, options, conn.audio_notice(fields), metadata, question_audio=audio,
                         continues_chat=continues_chat)

    async def cancel_asked(self) -> None:
        """A client's response.cancel: its response.done says cancelled."""
        if not self.busy:
            raise rt.EventError("no response is in progress", "response_cancel_not_active")
        await self.cancel("client_cancelled")

    async def start(self, question: str, options: answer_path.AnswerOptions, notice: dict[str, Any] | None = None,
                    metadata: dict[str, str] | None = None, **how: Any) -> None:
        """Start a response, once the previous one has sent its response.done
        (cancelled, if it still runs); ``notice`` rides on its response.created,
        ``metadata`` (response.create's) on its response.created and response.done."""
        conn = self.conn
        async with self._lock:
            previous = self.current
            if previous is not None and conn.answering:
                await previous.cancel()
            await conn.finish_answer()
            if conn.entry is None or conn.closed:
                return
            response = self.current = RealtimeResponse(conn, options.max_tokens, metadata)
            conn.stream_answer(response.answer(question, options, notice or {}, how), f"realtime-{response.say.id}")


class RealtimeResponse:
    """One response: its ids, its answer run once asked, and the run's
    Words (vidchat.conversation.Words). Bound to this response, so its
    events carry its own ids whatever starts after it."""

    def __init__(self, conn: Client, max_output_tokens: int | None, metadata: dict[str, str] | None = None) -> None:
        self.conn = conn
        self.say = rt.ResponseEvents(rt.new_id("resp"), max_output_tokens, metadata)
        self.run: conversation.AnswerRun | None = None
        # Cancelled while it was set up (no run yet): the run is cancelled once there is one.
        self.cancelled = False
        self.cancel_reason: str | None = None
        self.ended = False  # its response.done was sent

    async def cancel(self, why: str | None = None) -> None:
        if not self.cancelled:
            self.cancelled, self.cancel_reason = True, why
        if self.run is not None:
            await self.run.cancel(why)

    async def answer(self, question: str, options: answer_path.AnswerOptions, notice: dict[str, Any],
                     how: dict[str, Any]) -> None:
        """The response from its response.created to its response.done, whatever breaks between."""
        conn, say = self.conn, self.say
        await conn.emit({**say.created(), **notice})
        try:
            await self._answer(question, options, how)
        except EngineError as exc:
            await self._failed(str(exc))
        except Exception as exc:  # noqa: BLE001 - the client still gets its response.done, and the session goes on
            log.exception("realtime %s: response %s failed", conn.peer, say.id)
            await self._failed(f"Query processing failed ({type(exc).__name__})")  # the log has the traceback

    async def _answer(self, question: str, options: answer_path.AnswerOptions, how: dict[str, Any]) -> None:
        conn = self.conn
        await conn.state.wait_engine()
        try:
            # The Realtime conversation's items are the conversation's chat,
            # kept on the server: each response is asked with the exchanges
            # before it and joins them, unless it was made outside the
            # conversation (response.conversation "none").
            how = dict(how)
            self.run = await conn.entry.ask(
                question, options, record=conn.record, frames_optional=True,
                continues_chat=how.pop("continues_chat", True), **how)
        except answer_path.Superseded:
            await self._end(self.say.done("cancelled", text=None, reason=self.cancel_reason))
            return
        if self.cancelled:
            await self.run.cancel(self.cancel_reason)
        await self.run.say(self)

    async def _end(self, events: list[dict[str, Any]]) -> None:
        """Send the events that end the response (the last is its response.done), once."""
        if not self.ended:
            self.ended = True
            await self.conn.emit(*events)

    async def _failed(self, why: str) -> None:
        if self.ended:
            return  # it broke after its response.done: the client has its end
        await self.conn.refuse(why, "answer_failed", kind="server_error")
        # Why, as the API says it: status_details.error (its reason is for cancelled and incomplete ones).
        await self._end(self.say.done("failed", text=None, error=why))

    # -- the run's Words ---------------------------------------------------------------

    async def queued(self, ahead: int) -> None:
        pass  # the response was created; it starts when it has its place

    async def started(self, answer: Any) -> None:
        await self.conn.emit(*self.say.started(self.conn.next_item(self.say.item_id)))

    async def delta(self, text: str) -> bool:
        return await self.conn.emit(self.say.delta(text))

    async def done(self, done: conversation.Done) -> None:
        conn = self.conn
        if done.error:
            await conn.refuse(done.error, "answer_failed", kind="server_error")
        # Why it was cancelled, if it was (the first cause): the client's
        # response.cancel, or speech (server VAD's barge-in, talk.BARGED_IN).
        record = record_links(done, conn.record, conn.settings.record_dir)
        ending = self.say.finished(done, done.answer.cancelled_by, record)
        await self._end(ending)
        log.info("realtime %s: response %s: %s", conn.peer, self.say.id, ending[-1]["response"]["status"])
