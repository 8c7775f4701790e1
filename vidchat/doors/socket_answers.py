"""A socket session's questions and their answers: video.query (typed or
spoken, also while the model loads) in, the conversation's answer run out as
the seed protocol's ``response.*`` messages.

Kept apart from the connection (vidchat.doors.protocol), which owns the
session's lifetime and the message loop: this is one question at a time
being set up, its answer streamed as a task, and what each answer carries
(the session's history and recording switches).

Guarantees: every ``response.start`` is followed by exactly one
``response.text.done`` (also on errors and cancellation, then preceded by an
``error``); a new question's ``response.start`` comes after the previous
answer's ``response.text.done``, whether it was typed, spoken or heard.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from vidchat import conversation
from vidchat.conversation.session_events import SCENE, TYPED
from vidchat.conversation import answer_path
from vidchat.doors import inputs as answer_inputs
from vidchat.doors.protocol_config import ConfigError
from vidchat.engine import EngineError

log = logging.getLogger(__name__)

RECORD_OFF = "record: the server was started without --record-dir (nothing is written to disk without it)"


def check_record(settings: Any, on: Any) -> None:
    """Recording is taken only where the server was told where to write
    (--record-dir), at every door that can switch it on; raises ConfigError."""
    if on and not settings.record_dir:
        raise ConfigError(RECORD_OFF)


class Client(Protocol):
    """What the answers need of their connection (vidchat.doors.protocol.Connection)."""

    state: Any  # vidchat.app.state.AppState
    settings: Any  # vidchat.app.settings.Settings
    entry: Any  # vidchat.conversation.Conversation, None before the session opens
    options: answer_path.AnswerOptions
    media: Any  # vidchat.doors.socket_media.SocketMedia
    peer: str
    no_frames_hint: str  # what a question before any frame should have done, in this door's words
    vidchat_events: bool
    answering: bool  # its answer task streams (vidchat.doors.socket_session.SocketSession)
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
        self.record = False
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
        if not conn.state.ready:  # the model loads or restarts (or stays down: the wait says why)
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
                await conn.state.wait_engine()
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
            except answer_path.Superseded:
                return  # a newer question from elsewhere took over this session
            except answer_path.NoFrames as exc:
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

    async def _stream(self, run: conversation.AnswerRun, consumed: dict[str, Any] | None = None,
                      watched: bool = False) -> None:
        """The run said as the seed protocol's messages (SeedWords)."""
        try:
            await run.say(SeedWords(self, consumed, watched))
        except asyncio.CancelledError:
            pass  # the session's end: the run has aborted its reply

    async def _answered(self, done: conversation.Done) -> None:
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

    async def done(self, done: conversation.Done) -> None:
        if done.started:  # one that never started (replaced while it waited) says nothing
            await self._consumed()  # no output at all (cancelled, failed): still said once
            await self.answers._answered(done)

    async def _consumed(self) -> None:
        if self.consumed is not None:
            message, self.consumed = self.consumed, None
            await self.send(message)
