"""A socket session's server-side turn detection (``turn_detection``):
where the client's speech starts and stops, as OpenAI Realtime's
``input_audio_buffer.speech_started``/``speech_stopped``, and each finished
utterance asked the way video.query asks a question.

The listener and barge-in are the conversation's (vidchat.conversation.talk);
this only switches them on and off for the connection and says what they hear.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from vidchat.conversation import talk
from vidchat.conversation.modes import heard
from vidchat.doors.protocol_config import ConfigError, TurnDetection
from vidchat.doors.socket_answers import Client, SocketAnswers
from vidchat.engine import NO_SPOKEN_QUESTIONS, EngineError
from vidchat.media.vad import SpeechStarted, Utterance

log = logging.getLogger(__name__)


class SocketTurns:
    """Turn detection for one connection: its settings, the session's listener
    and the task that asks each utterance."""

    def __init__(self, conn: Client, answers: SocketAnswers) -> None:
        self.conn, self.answers = conn, answers
        self.turns: TurnDetection | None = None
        # Asked for while the model loads: started once it runs (what the model hears is known then).
        self.after_load: TurnDetection | None = None
        self._loading: asyncio.Task | None = None
        self._listener: talk.Listener | None = None
        self._task: asyncio.Task | None = None

    def hears(self) -> bool:
        """Whether the running model takes spoken questions."""
        return bool(getattr(self.conn.state.engine, "accepts_audio", False))

    def describe(self) -> dict[str, Any] | None:
        turns = self.turns if self.turns is not None else self.after_load
        return turns.describe() if turns is not None else None

    def check(self, turns: TurnDetection | None) -> None:
        """Raises ConfigError when the running model takes no spoken questions
        (while it loads that is known only once it runs: :meth:`request`)."""
        if turns is not None and self.conn.state.engine is not None and not self.hears():
            raise ConfigError(f"turn_detection: {NO_SPOKEN_QUESTIONS}")

    async def request(self, turns: TurnDetection | None) -> None:
        """A door's turn_detection (null: off), for every socket door: set
        now, or, while the model loads, once it runs; then a model that
        takes no spoken questions is said in an error, and the session goes on."""
        if not self.conn.state.ready:
            self.after_load = turns
            if self._loading is None:
                self._loading = asyncio.create_task(self._when_loaded(), name="turns-wait-for-the-model")
        elif turns is not None and not self.hears():  # typed questions still work
            await self.conn.error(f"turn_detection is off: {NO_SPOKEN_QUESTIONS}")
        else:
            await self.set(turns)

    async def _when_loaded(self) -> None:
        try:
            await self.conn.state.wait_engine()
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
                await talk.stop(entry)
            return
        listener = talk.listener(entry, turns.settings, turns.interrupt_response,
                                 on_speech=talk.speech_warms(self.conn.state, entry))
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

    async def _talk(self, listener: talk.Listener) -> None:
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
