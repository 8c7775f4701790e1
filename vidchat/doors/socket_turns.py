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

from vidchat import conversation
from vidchat.conversation import talk
from vidchat.doors.protocol_config import TurnDetection
from vidchat.doors.socket_answers import Client, SocketAnswers
from vidchat.engine import NO_SPOKEN_QUESTIONS
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
        self._listener: talk.Listener | None = None
        self._task: asyncio.Task | None = None

    def hears(self) -> bool:
        """Whether the running model takes spoken questions."""
        return bool(getattr(self.conn.state.engine, "accepts_audio", False))

    def describe(self) -> dict[str, Any] | None:
        return self.turns.describe() if self.turns is not None else None

    async def start(self, turns: TurnDetection | None) -> None:
        """session.config's turn_detection, once the model runs."""
        if turns is None:
            return
        if self.hears():
            await self.set(turns)
        else:  # typed questions still work: the session goes on
            await self.conn.error(f"turn_detection is off: {NO_SPOKEN_QUESTIONS}")

    async def set(self, turns: TurnDetection | None) -> None:
        """Start, change or stop server-side turn detection."""
        self.turns = turns
        entry = self.conn.entry
        if turns is None:
            await self.stop()
            if entry is not None:
                await talk.stop(entry)
            return
        listener = talk.listener(entry, turns.settings, turns.interrupt_response,
                                 on_speech=talk.speech_warms(self.conn.state, entry))
        if listener is not self._listener or self._task is None or self._task.done():
            await self.stop()
            self._listener = listener
            self._task = asyncio.create_task(self._talk(listener), name=f"talk-ws-{entry.session.id[:6]}")

    async def stop(self) -> None:
        """End the task that asks utterances (the session's listener stays)."""
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
            async for event in conversation.of(conn.state, conn.entry).heard(listener, starts=True):
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
