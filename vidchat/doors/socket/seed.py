"""The seed WebSocket protocol at ``/v1/video/chat/stream``, and vllm-omni's newer fields.

A client written for vllm-omni's streaming video endpoint works here
unchanged, the seed's clients and the newer ones alike: every newer message
goes only to clients that use the newer fields. This module only translates
the wire format; frames, audio, filtering and sampling live in
:mod:`vidchat.media.session`, questions in :mod:`vidchat.conversation.asking`, turn detection in
:mod:`vidchat.conversation.modes`, what session.config may set in :mod:`vidchat.doors.socket.config`.
The connection is the seed's messages over the session lifetime and message
loop every socket door shares (:mod:`~vidchat.doors.socket.session`); the rest of
the door is one module per idea: :mod:`~vidchat.doors.socket.transport`
(messages in and out), :mod:`~vidchat.doors.socket.intake` (frames, audio,
acks), :mod:`~vidchat.doors.socket.session` (questions and their answers),
:mod:`~vidchat.doors.socket.session` (turn detection), :mod:`~vidchat.doors.socket.session`
(the standing question), :mod:`~vidchat.doors.socket.session` (session.config
and session.update). Origins: [seed], [omni] (vllm-omni's newer streaming
video handler), [rt] (vllm-omni's /v1/realtime server VAD, OpenAI Realtime's
names), [vc] (vidchat's own).

The messages, their fields and each one's origin are tabled once, in the
docs/protocol.md (what session.config may set is
:mod:`vidchat.doors.socket.config`, read from the one settings table).

Access (see vidchat.app.access): with --token set, the handshake needs
``Authorization: Bearer <token>`` or ``?token=<token>``, else HTTP 401/403; a
browser page from another origin gets 403 unless --allowed-origins lists it.
The connection counts against --max-sessions from the handshake on.

Guarantees: every ``response.start`` is followed by exactly one
``response.text.done`` (also on errors and cancellation, then preceded by an
``error``); a new question's ``response.start`` comes after the previous
answer's ``response.text.done``, whether it was typed, spoken or heard (one
question is set up at a time). One lock serialises all sends.

Differences from the seed, on purpose: a frame that is not an image, bad
base64 or an oversize frame is reported and the session goes on; the answer
runs as a task, so frames keep arriving while it streams (they count for the
next question); a disconnect, a new question or the session's end aborts the
running generation in vLLM; the idle timer does not run out while an answer
is streaming; audio reaches the model as float samples, aligned with the
sampled frames (not cleared after each question).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from vidchat.conversation import modes
from vidchat.conversation.conversation import Conversation
from vidchat.doors import Server
from vidchat.doors.socket.intake import SocketMedia
from vidchat.doors.socket.session import SessionConfig, SocketAnswers, SocketSession, SocketTurns, SocketWatch
from vidchat.doors.socket.transport import CLOSE_NORMAL

if TYPE_CHECKING:
    from fastapi import WebSocket

log = logging.getLogger(__name__)


# How long before --session-time-limit the client is told (session.expiring).
SESSION_END_WARNING_S = 30.0


class Connection(SocketSession):
    """Drives one WebSocket client: the shared lifecycle and message loop
    (vidchat.doors.socket.session), the seed protocol's messages, and at most
    one answer task."""

    door, noun = "ws", "message"

    def __init__(self, state: Server, websocket: "WebSocket") -> None:
        super().__init__(state, websocket)
        self.media = SocketMedia(self)
        self.answers = SocketAnswers(self)
        self.turns = SocketTurns(self, self.answers)
        self.watch = SocketWatch(self, self.answers)
        self.config = SessionConfig(self)
        self._expiry_task: asyncio.Task | None = None
        # The client knows vidchat (protocol_config.wants_vidchat_events): only
        # then is it sent response.queued and session.expiring.
        self.vidchat_events = False

    # -- lifecycle -----------------------------------------------------------

    async def open(self) -> bool:
        return await self.config.open()  # session.config first

    async def stop_asking(self) -> None:
        if self._expiry_task is not None:
            self._expiry_task.cancel()
        for task in (self.config.loading_task, self.answers.waiting):
            if task is not None:
                task.cancel()
        await self._stop_asking()

    async def _stop_asking(self) -> None:
        """No more questions: turn detection and watch stop, and a question being set up finishes first."""
        await self.turns.stop()
        self.watch.stop()
        await self.answers.close()
        if self.entry is not None:
            await modes.stop(self.entry)

    def announce_end(self) -> None:
        """Warn the client before --session-time-limit ends its session (once, if it has a limit)."""
        if self.entry.deadline is not None and self._expiry_task is None:
            self._expiry_task = asyncio.create_task(self._announce_end(self.entry))

    async def _announce_end(self, entry: Conversation) -> None:
        left = entry.time_left() or 0.0
        warn_at = min(SESSION_END_WARNING_S, left / 2)
        await asyncio.sleep(max(0.0, left - warn_at))
        await self.send({"type": "session.expiring", "seconds_left": round(entry.time_left() or 0.0, 1)})

    # -- the messages ------------------------------------------------------------

    async def _on_done(self, msg: dict[str, Any], arrived: float) -> str:
        waiting = self.answers.waiting
        if waiting is not None:  # a question asked while the model loaded is still answered
            await asyncio.wait({waiting})
        await self._stop_asking()
        # Like the seed, an answer still streaming is finished before the stats.
        task = self.answer_task
        if task is not None:
            try:
                await asyncio.shield(task)
            except Exception:  # already logged by the task
                pass
        evs_stats = self.entry.session.stats.get("evs")
        if evs_stats is not None:
            keys = ("retained_count", "dropped_count", "total_count", "drop_rate")
            # rate_dropped_count: frames over --ws-max-fps, dropped before the filter saw them.
            await self.send({"type": "response.evs_stats", **{k: evs_stats[k] for k in keys},
                             "rate_dropped_count": self.entry.session.frames_rate_dropped})
        await self.send({"type": "session.done"})
        await self.close(CLOSE_NORMAL, "session done")
        return "finished (video.done)"

    async def _on_ping(self, msg: dict[str, Any], arrived: float) -> None:
        await self.send({"type": "pong"})

    async def _on_second_config(self, msg: dict[str, Any], arrived: float) -> None:
        await self.error("session.config was already received; send session.update to change settings")

    handlers = {
        "video.frame": lambda self, msg, arrived: self.media.on_frame(msg, arrived),
        "audio.chunk": lambda self, msg, arrived: self.media.on_audio(msg, arrived),
        "video.query": lambda self, msg, arrived: self.answers.on_query(msg),
        "video.done": _on_done,
        "ping": _on_ping,
        "session.update": lambda self, msg, arrived: self.config.update(msg),
        "session.config": _on_second_config,
    }
