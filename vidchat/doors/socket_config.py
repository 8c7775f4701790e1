"""A socket session's settings messages: ``session.config`` opens the
session, ``session.update`` changes it, ``session.updated`` describes it.

What each field means and how it is checked is vidchat.doors.protocol_config
(read from the one settings table); this applies the fields to one
connection: its session, its answer options, and the switches of its
answers, turn detection and watch. A session opened while the model loads is
already a session; what needs the running model is finished once it runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from vidchat.conversation import answer_path
from vidchat.conversation.answer_path import AnswerOptions
from vidchat.media.session import SessionSettings
from vidchat.conversation.settings_table import current_values
from vidchat.conversation.registry import TooManySessions
from vidchat.conversation.stream_source import UnknownStream, attach_stream, detach_stream
from vidchat.doors.protocol_config import UPDATABLE_INFO, ConfigError, parse_config, wants_vidchat_events
from vidchat.doors.socket_answers import check_record
from vidchat.doors.socket_transport import CLOSE_POLICY, CLOSE_TRY_LATER, TIMEOUT, parse_message
from vidchat.doors.socket_watch import WATCH_NEEDS_EVS
from vidchat.engine import EngineError

log = logging.getLogger(__name__)

# The one-time notice for clients that asked for spoken answers (modalities
# with "audio"): this server answers in text only.
NO_AUDIO_OUTPUT_NOTICE = "spoken output is not available: answers come as text"


class SessionConfig:
    """session.config and session.update for one connection
    (vidchat.doors.protocol.Connection: its transport, session and parts)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.loading_task: asyncio.Task | None = None  # opened while the model loaded: runs once it is ready

    async def _refuse(self, message: str, code: int, reason: str) -> bool:
        """Tell the client why its session can't open, and close; False for open()."""
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
        try:
            conn.start_session(settings=settings)  # in the handshake's place; told when the server ends it
        except TooManySessions as exc:
            return await self._refuse(str(exc), CLOSE_TRY_LATER, "too many sessions")
        conn.options = options
        conn.vidchat_events = wants_vidchat_events(msg)
        if "audio" in (changes.info.get("modalities") or []):
            conn.answers.notice = NO_AUDIO_OUTPUT_NOTICE
        try:
            conn.answers.set_record(changes.info.get("record", False))
            conn.answers.set_history(changes.info.get("history", False))
            await conn.watch.set(changes.info.get("watch"))
        except ValueError as exc:  # the session goes on, as with turn_detection
            await conn.error(str(exc))
        if changes.info.get("source") is not None:
            await self._watch_stream(changes.info["source"])
        if state.engine is None:  # its limits are known once it runs
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
            engine = await conn.state.wait_engine()
        except EngineError as exc:
            await self._refuse(str(exc), CLOSE_TRY_LATER, "engine not running")
            return
        try:
            answer_path.check_options(conn.options, engine, conn.entry.session.settings)
        except ValueError as exc:  # the session goes on: its questions get the same error
            await conn.error(f"session.config: {exc}")

    def _session_settings(self, changes: dict[str, Any]) -> SessionSettings:
        # The seed's defaults, but the server's sampling rule (a vidchat
        # setting the seed protocol does not have: the CPU presets' 'stable').
        base = SessionSettings(audio_seconds=self.conn.settings.ws_max_audio_seconds,
                               sampling=self.conn.state.registry.default_settings().sampling)
        settings = dataclasses.replace(base, **changes)
        settings.validate()
        self.conn.state.check_frame_budget(settings.max_frames)
        return settings

    def _answer_options(self, changes: dict[str, Any], sampling: SessionSettings) -> AnswerOptions:
        options = self.conn.options.updated(**changes)
        answer_path.check_options(options, self.conn.state.engine, sampling)
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
            answer_path.apply_settings(conn.entry.session, conn.state.engine, options, changes.session,
                                       conn.entry.event_hub)
        except ValueError as exc:  # ConfigError, OptionError or the settings' own check: nothing was changed
            await conn.error(f"session.update rejected: {exc}")
            return
        conn.options = options
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
        await conn.send({"type": "session.updated", "settings": self.describe()})

    def describe(self) -> dict[str, Any]:
        """The session's settings as session.updated reports them."""
        conn = self.conn
        session = conn.entry.session.settings
        # Beyond the table's fields, the session's own (audio_seconds …) as the seed reported them.
        return {**dataclasses.asdict(session), **current_values(session, conn.options),
                "turn_detection": conn.turns.describe(), "watch": conn.watch.describe(),
                "record": conn.answers.record, "history": conn.answers.keep_history,
                "source": None if conn.entry.stream is None else {"stream": conn.entry.stream.name}}
