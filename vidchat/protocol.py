"""The seed WebSocket protocol at ``/v1/video/chat/stream``.

A client written for vllm-omni's streaming video endpoint works here
unchanged. This module only translates the wire format; frames, audio,
filtering and sampling live in :mod:`vidchat.session`, questions in
:mod:`vidchat.chat`.

Client → server (JSON text messages, one object each)::

    session.config  first, within --ws-config-timeout seconds:
                    model, modalities, max_frames (64), num_sample_frames (16),
                    evs_enabled (true), evs_threshold (0.95); upstream aliases
                    num_frames, enable_frame_filter, frame_filter_threshold,
                    system_prompt; vidchat extras sampling, sample_seconds,
                    keepalive_s, audio_mode, audio_last_seconds, frames_as,
                    max_tokens, temperature, include_audio, seed.
                    Unknown keys are ignored; a wrong type or value ends the session.
    session.update  the same keys (except model/modalities) between questions;
                    answered by session.updated, or an error (the session goes on)
    video.frame     data: base64 JPEG (any image PIL reads); optional pts_ms
    audio.chunk     data: base64 PCM16 little-endian mono 16 kHz; optional pts_ms
                    (pts_ms: capture time in milliseconds on the client's clock,
                    vllm-omni's newer field; without it, arrival time is used)
    video.query     text: the question (a new one cancels the one being answered)
    video.done      → response.evs_stats (EVS on), session.done, then the socket closes
    ping            → pong

Server → client::

    response.start, response.text.delta {delta}*, response.text.done {text, stats}
    response.evs_stats {retained_count, dropped_count, total_count, drop_rate}
    session.done, session.updated {settings}, pong, error {message}

vidchat extras (clients that don't know them can ignore them)::

    response.queued {position, ahead}   before response.start, whenever the
                    question waits for a place (--max-concurrent-answers);
                    ahead = questions in front of it, position = ahead + 1
    session.expiring {seconds_left}     30 s before --session-time-limit
                    ends the session (then error {message}, and the socket closes)

Access (see vidchat.access): with --token set, the handshake needs
``Authorization: Bearer <token>`` or ``?token=<token>``, else HTTP 401/403; a
browser page from another origin gets 403 unless --allowed-origins lists it.
The connection counts against --max-sessions from the handshake on.

Guarantees: every ``response.start`` is followed by exactly one
``response.text.done`` (also on errors and cancellation, then preceded by an
``error``); a new question's ``response.start`` comes after the previous
answer's ``response.text.done``. One lock serialises all sends.

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
import binascii
import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vidchat import answer_inputs, chat, wire
from vidchat.chat import Answer, AnswerOptions
from vidchat.clock import ClientClock
from vidchat.engine import EngineError
from vidchat.evs import FrameError
from vidchat.media import FRAMES_AS
from vidchat.workers import run_media
from vidchat.session import AUDIO_MODES, MAX_AUDIO_SECONDS, SAMPLING_STRATEGIES, SessionSettings
from vidchat.sessions import Entry, TooManySessions

if TYPE_CHECKING:
    from fastapi import WebSocket

    from vidchat.state import AppState

log = logging.getLogger(__name__)

# Messages longer than this are parsed and decoded in a worker thread, in
# slices that yield the interpreter lock (vidchat.wire): a 640×480 frame's
# JSON+base64 costs ~0.3 ms, an 8 MB one ~55 ms, which would stall every other
# session's frames and streamed tokens.
INLINE_PARSE_CHARS = 64 * 1024

# How long before --session-time-limit the client is told (session.expiring).
SESSION_END_WARNING_S = 30.0

# Close codes: normal end, a protocol violation, server busy, server error.
CLOSE_NORMAL, CLOSE_POLICY, CLOSE_TRY_LATER, CLOSE_ERROR = 1000, 1008, 1013, 1011


# ---------------------------------------------------------------------------
# session.config / session.update fields
# ---------------------------------------------------------------------------

NUMBER = (int, float)


@dataclass(frozen=True)
class _Field:
    kinds: tuple[type, ...]
    target: str  # "session" (SessionSettings), "answer" (AnswerOptions) or "info"
    attr: str
    nullable: bool = False
    choices: tuple[str, ...] = ()


FIELDS: dict[str, _Field] = {
    # the seed's fields
    "model": _Field((str,), "info", "model"),
    "modalities": _Field((list,), "info", "modalities"),
    "max_frames": _Field((int,), "session", "max_frames"),
    "num_sample_frames": _Field((int,), "session", "num_sample_frames"),
    "evs_enabled": _Field((bool,), "session", "evs_enabled"),
    "evs_threshold": _Field(NUMBER, "session", "evs_threshold"),
    # upstream's later additions
    "system_prompt": _Field((str,), "answer", "system_prompt", nullable=True),
    # vidchat's extras
    "sampling": _Field((str,), "session", "sampling", choices=SAMPLING_STRATEGIES),
    "sample_seconds": _Field(NUMBER, "session", "sample_seconds"),
    "keepalive_s": _Field(NUMBER, "session", "keepalive_s", nullable=True),
    "audio_mode": _Field((str,), "session", "audio_mode", choices=AUDIO_MODES),
    "audio_last_seconds": _Field(NUMBER, "session", "audio_last_seconds"),
    "frames_as": _Field((str,), "answer", "frames_as", choices=FRAMES_AS),
    "max_tokens": _Field((int,), "answer", "max_tokens"),
    "temperature": _Field(NUMBER, "answer", "temperature"),
    "include_audio": _Field((bool,), "answer", "include_audio"),
    "seed": _Field((int,), "answer", "seed", nullable=True),
}
# Upstream's later names for the seed's fields.
ALIASES = {
    "num_frames": "num_sample_frames",
    "enable_frame_filter": "evs_enabled",
    "frame_filter_threshold": "evs_threshold",
}


class ConfigError(ValueError):
    pass


def _type_name(kinds: tuple[type, ...], nullable: bool) -> str:
    return "/".join([k.__name__ for k in kinds] + (["null"] if nullable else []))


def _check_type(key: str, value: Any, spec: _Field) -> None:
    if value is None and spec.nullable:
        return
    # JSON true/false are Python bools, which isinstance() also counts as ints.
    ok = isinstance(value, spec.kinds) and (bool in spec.kinds or not isinstance(value, bool))
    if not ok:
        raise ConfigError(f"Invalid type for '{key}': expected {_type_name(spec.kinds, spec.nullable)}, "
                          f"got {type(value).__name__}")
    if spec.choices and value not in spec.choices:
        raise ConfigError(f"Invalid value for '{key}': expected one of {', '.join(spec.choices)}, got {value!r}")


@dataclass
class ConfigChanges:
    session: dict[str, Any] = dataclasses.field(default_factory=dict)
    answer: dict[str, Any] = dataclasses.field(default_factory=dict)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


def parse_config(msg: dict[str, Any]) -> ConfigChanges:
    """Type-check the known keys of a session.config/session.update message.

    Aliases map to the seed's names; unknown keys are ignored. Raises
    ConfigError with a message for the client. Ranges are checked where every
    door checks them: SessionSettings.validate and chat.check_options.
    """
    values: dict[str, Any] = {}
    for key, value in msg.items():
        name = ALIASES.get(key, key)
        spec = FIELDS.get(name)
        if spec is None:
            continue  # "type" and anything this server does not know
        _check_type(key, value, spec)
        if name in values and values[name] != value:
            other = name if key != name else next(a for a, n in ALIASES.items() if n == name and a in msg)
            raise ConfigError(f"'{key}' and '{other}' are the same setting but have different values; send one")
        values[name] = value

    changes = ConfigChanges()
    for name, value in values.items():
        spec = FIELDS[name]
        getattr(changes, spec.target)[spec.attr] = value
    answer = changes.answer
    if "system_prompt" in answer:
        answer["system_prompt"] = answer["system_prompt"] or None  # "" = no system prompt
    return changes


# ---------------------------------------------------------------------------
# One connection
# ---------------------------------------------------------------------------

class _Disconnected(Exception):
    pass


class _Timeout:
    pass


_TIMEOUT = _Timeout()


class Connection:
    """Drives one WebSocket client: a reader loop plus at most one answer task."""

    def __init__(self, state: "AppState", websocket: "WebSocket") -> None:
        self.state = state
        self.ws = websocket
        self.settings = state.settings
        self.entry: Entry | None = None
        self.options: AnswerOptions = state.answer_defaults()
        self.peer = f"{websocket.client.host}:{websocket.client.port}" if websocket.client else "?"
        self.clock = ClientClock()
        self._answer_task: asyncio.Task | None = None
        self._send_lock = asyncio.Lock()
        self._closed = False  # the socket is closed or broken: nothing more is sent
        self._recv: asyncio.Future | None = None
        self._last_input = time.monotonic()
        self.client_host = websocket.client.host if websocket.client else None
        self._reservation = None
        self._expiry_task: asyncio.Task | None = None

    # -- transport -----------------------------------------------------------

    async def send(self, msg: dict[str, Any]) -> bool:
        """Send one message; False if the client is gone.

        Shielded, so a message whose sending began is sent whole even if the
        caller is cancelled meanwhile."""
        return await asyncio.shield(self._send(msg))

    async def _send(self, msg: dict[str, Any]) -> bool:
        async with self._send_lock:
            if self._closed:
                return False
            text = json.dumps(msg, ensure_ascii=False)
            if not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:  # a lone surrogate from the client, echoed back
                    text = json.dumps(msg)  # escaped as \ud800: still valid JSON
            try:
                await self.ws.send_text(text)
                return True
            except Exception as exc:  # the client went away mid-send
                log.debug("ws %s: send failed: %r", self.peer, exc)
                self._closed = True
                return False

    async def error(self, message: str) -> bool:
        if len(message) > 500:  # e.g. an engine error quoting its whole input
            message = message[:497] + "..."
        log.info("ws %s: error sent: %s", self.peer, message)
        return await self.send({"type": "error", "message": message})

    async def close(self, code: int = CLOSE_NORMAL, reason: str = "") -> None:
        async with self._send_lock:
            if self._closed:
                return
            self._closed = True
            try:
                await self.ws.close(code=code, reason=reason[:120])
            except Exception:
                pass

    async def receive(self, timeout: float) -> str | _Timeout:
        """The next text message, or _TIMEOUT. A pending receive is kept across timeouts."""
        if self._recv is None:
            self._recv = asyncio.ensure_future(self.ws.receive())
        done, _ = await asyncio.wait({self._recv}, timeout=max(timeout, 0.0))
        if not done:
            return _TIMEOUT
        recv, self._recv = self._recv, None
        message = recv.result()
        if message["type"] == "websocket.disconnect":
            self._closed = True
            raise _Disconnected(message.get("code"))
        if message.get("text") is not None:
            return message["text"]
        data = message.get("bytes") or b""
        try:
            return data.decode("utf-8")  # tolerate JSON sent as a binary message
        except UnicodeDecodeError:
            return "\x00"  # not JSON: reported as such by the caller

    # -- lifecycle -----------------------------------------------------------

    async def run(self) -> None:
        await self.ws.accept()
        reason = "ended"
        try:
            # The place counts from the handshake: clients that never send
            # session.config still count against --max-sessions.
            self._reservation = self.state.registry.reserve(self.client_host)
        except TooManySessions as exc:
            await self.error(str(exc))
            await self.close(CLOSE_TRY_LATER, "too many sessions")
            return
        try:
            if not await self._configure():
                reason = "refused at configuration"
                return
            reason = await self._loop()
        except _Disconnected:
            reason = "client disconnected"
        except asyncio.CancelledError:
            reason = "server shutting down"
            raise
        except Exception:
            log.exception("ws %s: session failed", self.peer)
            reason = "internal error"
            await self.error("Internal server error")
            await self.close(CLOSE_ERROR, "internal error")
        finally:
            await self._shutdown(reason)

    async def _shutdown(self, reason: str) -> None:
        if self._reservation is not None:
            self._reservation.release()
        if self._expiry_task is not None:
            self._expiry_task.cancel()
        if self._recv is not None:
            self._recv.cancel()
        entry, self.entry = self.entry, None
        if entry is not None:
            # Aborts the answer's vLLM request and runs the closers.
            await self.state.registry.close(entry.session.id, reason)
            await self._finish_answer_task()
        await self.close(CLOSE_NORMAL, reason)

    async def _finish_answer_task(self) -> None:
        """Wait for the answer task to send its response.text.done (its reply is already aborted)."""
        task, self._answer_task = self._answer_task, None
        if task is not None:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                log.debug("ws %s: answer task ended with an error", self.peer, exc_info=True)

    async def _configure(self) -> bool:
        """Wait for session.config and open the session; False if the session must end."""
        raw = await self.receive(self.settings.ws_config_timeout)
        if raw is _TIMEOUT:
            await self.error(f"Timeout waiting for session.config "
                             f"(send it within {self.settings.ws_config_timeout:g} s of connecting)")
            await self.close(CLOSE_POLICY, "no session.config")
            return False
        try:
            msg = await self._parse(raw)
        except ValueError as exc:
            await self.error(f"Invalid JSON in session.config: {exc}")
            await self.close(CLOSE_POLICY, "invalid session.config")
            return False
        if not isinstance(msg, dict) or msg.get("type") != "session.config":
            got = msg.get("type") if isinstance(msg, dict) else type(msg).__name__
            await self.error(f"Expected session.config, got: {got}")
            await self.close(CLOSE_POLICY, "expected session.config")
            return False
        try:
            changes = parse_config(msg)
            settings = self._session_settings(changes.session)
        except ValueError as exc:  # ConfigError, SessionSettings.validate
            await self.error(str(exc))
            await self.close(CLOSE_POLICY, "invalid session.config")
            return False
        try:
            # While the model loads the session waits here (the options are
            # checked against the engine's limits).
            await self.state.wait_engine()
        except EngineError as exc:
            await self.error(str(exc))
            await self.close(CLOSE_TRY_LATER, "engine not running")
            return False
        try:
            options = self._answer_options(changes.answer, settings)
        except ValueError as exc:  # OptionError
            await self.error(str(exc))
            await self.close(CLOSE_POLICY, "invalid session.config")
            return False
        try:
            self.entry = self.state.new_session("ws", settings=settings, reservation=self._reservation)
        except TooManySessions as exc:
            await self.error(str(exc))
            await self.close(CLOSE_TRY_LATER, "too many sessions")
            return False
        self._reservation = None
        self.options = options
        self.entry.closers.append(self._closed_by_server)
        if self.entry.deadline is not None:
            self._expiry_task = asyncio.create_task(self._announce_end(self.entry))
        log.info("ws %s: session %s… started: model=%r max_frames=%d sample=%d(%s) evs=%s/%.2f frames_as=%s",
                 self.peer, self.entry.session.id[:6], changes.info.get("model", ""), settings.max_frames,
                 settings.num_sample_frames, settings.sampling, settings.evs_enabled, settings.evs_threshold,
                 options.frames_as)
        return True

    async def _closed_by_server(self) -> None:
        """The registry ended this session (time limit, shutdown): say why, then close."""
        sid = self.entry.session.id if self.entry is not None else ""
        reason = self.state.registry.closed_reason(sid) or "closed by the server"
        await self.error(f"Session ended: {reason}")
        await self.close(1001, reason)

    async def _announce_end(self, entry: Entry) -> None:
        """Warn before --session-time-limit ends the session (the reaper ends it)."""
        left = entry.time_left() or 0.0
        warn_at = min(SESSION_END_WARNING_S, left / 2)
        await asyncio.sleep(max(0.0, left - warn_at))
        await self.send({"type": "session.expiring", "seconds_left": round(entry.time_left() or 0.0, 1)})

    def _session_settings(self, changes: dict[str, Any]) -> SessionSettings:
        cap = min(self.settings.ws_max_audio_seconds, MAX_AUDIO_SECONDS)
        settings = dataclasses.replace(SessionSettings(audio_seconds=cap), **changes)
        settings.validate()
        return settings

    def _answer_options(self, changes: dict[str, Any], sampling: SessionSettings) -> AnswerOptions:
        options = self.options.updated(**changes)
        chat.check_options(options, self.state.engine, sampling)
        return options

    # -- the message loop ------------------------------------------------------

    @property
    def _answering(self) -> bool:
        return self._answer_task is not None and not self._answer_task.done()

    async def _parse(self, raw: str) -> Any:
        """json.loads, in a worker thread for large messages (raises ValueError,
        also for JSON nested too deeply for the parser, and for a top-level
        string holding a lone UTF-16 surrogate such as "\\ud800": valid JSON
        syntax, but not text, and it breaks the tokenizer and our replies)."""

        def parse(big: bool) -> Any:
            try:
                msg = wire.parse(raw) if big else json.loads(raw)
            except RecursionError:
                raise ValueError("nested too deeply") from None
            if isinstance(msg, dict):
                for key, value in msg.items():
                    # isascii() is O(1) in CPython: only non-ASCII strings are encoded.
                    for text in (key, value):
                        if isinstance(text, str) and not text.isascii():
                            try:
                                text.encode("utf-8")
                            except UnicodeEncodeError:
                                raise ValueError(f"{key!r} is not valid Unicode (a lone surrogate)") from None
            return msg

        if len(raw) > INLINE_PARSE_CHARS:
            return await run_media(parse, True)
        return parse(False)

    async def _loop(self) -> str:
        idle_timeout = self.settings.ws_idle_timeout
        self._last_input = time.monotonic()
        while not self._closed:
            # The idle timer counts from the last message or the end of the last answer.
            wait = idle_timeout if self._answering else idle_timeout - (time.monotonic() - self._last_input)
            raw = await self.receive(wait)
            if raw is _TIMEOUT:
                if self._answering or time.monotonic() - self._last_input < idle_timeout:
                    continue
                await self.error(f"Idle timeout: no message received for {idle_timeout:g} s")
                await self.close(CLOSE_NORMAL, "idle timeout")
                return "idle timeout"
            arrived = self._last_input = time.monotonic()
            try:
                msg = await self._parse(raw)
            except ValueError as exc:
                await self.error(f"Invalid JSON: {exc}")
                continue
            if not isinstance(msg, dict):
                await self.error("Messages must be JSON objects")
                continue
            kind = msg.get("type")
            try:
                if kind == "video.done":
                    await self._on_done()
                    return "finished (video.done)"
                handler = self._handlers.get(kind) if isinstance(kind, str) else None
                if handler is None:
                    await self.error(f"Unknown message type: {kind}")
                    continue
                if kind in ("video.frame", "audio.chunk"):
                    await handler(self, msg, arrived)
                else:
                    await handler(self, msg)
            except (_Disconnected, asyncio.CancelledError):
                raise
            except Exception as exc:  # one bad message never ends the session
                log.exception("ws %s: handling %s failed", self.peer, kind)
                await self.error(f"Internal error while handling {kind}: {type(exc).__name__}")
        return "client gone"

    async def _media_time(self, msg: dict[str, Any], kind: str, arrived: float) -> tuple[bool, float | None]:
        """(ok, time on the session's timeline) from the message's optional pts_ms."""
        pts = msg.get("pts_ms")
        if pts is None:
            return True, None
        # A range check, not math.isfinite: that raises OverflowError for a huge JSON integer.
        if isinstance(pts, bool) or not isinstance(pts, (int, float)) or not -1e15 < pts < 1e15:
            await self.error(f"{kind} 'pts_ms' must be a number of milliseconds, got {pts!r}")
            return False, None
        return True, self.clock.place(float(pts), arrived)

    async def _on_frame(self, msg: dict[str, Any], arrived: float) -> None:
        ok, t = await self._media_time(msg, "video.frame", arrived)
        if not ok:
            return
        data = await self._b64(msg, "video.frame", self.settings.ws_max_frame_bytes)
        if data is None:
            return
        try:
            # Even a 640×480 JPEG takes milliseconds to filter and store: never on the loop.
            await run_media(self.entry.session.add_jpeg, data, t)
        except FrameError as exc:
            await self.error(f"Invalid image in video.frame: {exc}")

    async def _on_audio(self, msg: dict[str, Any], arrived: float) -> None:
        ok, t = await self._media_time(msg, "audio.chunk", arrived)
        if not ok:
            return
        data = await self._b64(msg, "audio.chunk", None)
        if data is None:
            return
        try:
            self.entry.session.add_pcm16(data, t)
        except ValueError as exc:
            await self.error(f"Invalid audio in audio.chunk: {exc}")

    async def _b64(self, msg: dict[str, Any], kind: str, limit: int | None) -> bytes | None:
        """Decode msg['data'] (base64, optionally a data: URL); errors are sent and give None."""
        text = msg.get("data", "")
        if not isinstance(text, (str, wire.BigText)):
            await self.error(f"{kind} requires 'data' as a base64 string, got {type(text).__name__}")
            return None
        head = text.head(200) if isinstance(text, wire.BigText) else text[:200]
        if head.startswith("data:") and "," in head:
            comma = head.index(",") + 1
            text = text.skip(comma) if isinstance(text, wire.BigText) else text[comma:]
        if not text:
            await self.error(f"{kind} has no data")
            return None
        if limit is not None and len(text) > (limit + 2) // 3 * 4 + 64:  # too large even before decoding
            estimate = len(text) * 3 // 4
            await self.error(f"Frame too large: about {estimate} bytes (limit {limit})")
            return None
        try:
            if len(text) > INLINE_PARSE_CHARS:
                data = await run_media(wire.b64decode, text)
            else:
                data = wire.b64decode(text)
        except (binascii.Error, ValueError):
            await self.error(f"Invalid base64 in {kind}")
            return None
        if limit is not None and len(data) > limit:
            await self.error(f"Frame too large: {len(data)} bytes (limit {limit})")
            return None
        return data

    async def _on_query(self, msg: dict[str, Any]) -> None:
        text = msg.get("text", "")
        if not isinstance(text, str) or not text.strip():
            await self.error("video.query requires a non-empty 'text' field")
            return
        entry = self.entry
        # A new question replaces the one being answered; that one still ends
        # with its response.text.done before this one's response.start.
        await entry.cancel_answer()
        await self._finish_answer_task()
        try:
            # Samples the buffer now: frames arriving from here on count for the next question.
            answer = await chat.ask(self.state.engine, entry, text, self.options, queue=self.state.answer_gate)
        except chat.Superseded:
            return  # a newer question from elsewhere took over this session
        except EngineError as exc:  # NoFrames included
            await self.error(str(exc))
            return
        self._answer_task = asyncio.create_task(self._answer(answer), name=f"answer-{entry.session.id[:6]}")

    async def _answer(self, answer: Answer) -> None:
        reply = answer.reply
        parts: list[str] = []
        error: str | None = None
        try:
            await answer.wait_turn(self._tell_queued)
        except chat.Abandoned:
            return  # replaced or ended while it waited: it never started
        try:
            await self.send({"type": "response.start"})
            async for delta in reply:
                parts.append(delta)
                if not await self.send({"type": "response.text.delta", "delta": delta}):
                    break  # the client is gone: stop generating
        except asyncio.CancelledError:
            pass  # the session's end: still close the response
        except EngineError as exc:
            error = str(exc)
        except Exception:
            log.exception("ws %s: answer failed", self.peer)
            error = "Query processing failed"
        finally:
            try:
                await asyncio.shield(reply.aclose())  # aborts the vLLM request if still running
            except Exception:
                log.debug("aborting the reply failed", exc_info=True)
            if self.entry is not None:
                chat.release(self.entry, answer)
        if error:
            await self.error(error)
        stats = answer.summary()
        if self.entry is not None:
            # The same record, with the frames and audio, at /inputs/<answer_id>/ (vidchat.answer_inputs).
            stats["answer_id"] = answer_inputs.remember(self.entry, answer)
        await self.send({"type": "response.text.done", "text": "".join(parts), "stats": stats})
        self._last_input = time.monotonic()
        log.info("ws %s: answered: %d tokens, %d frames, %.1f s audio%s", self.peer,
                 stats.get("completion_tokens", 0), stats.get("frames", 0), stats.get("audio_seconds", 0.0),
                 " (cancelled)" if stats.get("cancelled") else "")

    async def _tell_queued(self, ahead: int) -> None:
        await self.send({"type": "response.queued", "position": ahead + 1, "ahead": ahead})

    async def _on_done(self) -> None:
        # Like the seed, an answer still streaming is finished before the stats.
        task = self._answer_task
        if task is not None:
            try:
                await asyncio.shield(task)
            except Exception:  # already logged by the task
                pass
        evs_stats = self.entry.session.stats.get("evs")
        if evs_stats is not None:
            keys = ("retained_count", "dropped_count", "total_count", "drop_rate")
            await self.send({"type": "response.evs_stats", **{k: evs_stats[k] for k in keys}})
        await self.send({"type": "session.done"})
        await self.close(CLOSE_NORMAL, "session done")

    async def _on_ping(self, msg: dict[str, Any]) -> None:
        await self.send({"type": "pong"})

    async def _on_update(self, msg: dict[str, Any]) -> None:
        try:
            changes = parse_config(msg)
            if changes.info:
                raise ConfigError(f"{', '.join(sorted(changes.info))} can only be set in session.config")
            options = self.options.updated(**changes.answer)
            chat.apply_settings(self.entry.session, self.state.engine, options, changes.session)
        except ValueError as exc:  # ConfigError, OptionError or the settings' own check: nothing was changed
            await self.error(f"session.update rejected: {exc}")
            return
        self.options = options
        await self.send({"type": "session.updated", "settings": self.describe()})

    async def _on_second_config(self, msg: dict[str, Any]) -> None:
        await self.error("session.config was already received; send session.update to change settings")

    def describe(self) -> dict[str, Any]:
        settings = dataclasses.asdict(self.entry.session.settings)
        options = self.options
        settings.update(frames_as=options.frames_as, max_tokens=options.max_tokens,
                        temperature=options.temperature, include_audio=options.include_audio,
                        system_prompt=options.system_prompt, seed=options.seed)
        return settings

    _handlers = {
        "video.frame": _on_frame,
        "audio.chunk": _on_audio,
        "video.query": _on_query,
        "ping": _on_ping,
        "session.update": _on_update,
        "session.config": _on_second_config,
    }


async def serve(state: "AppState", websocket: "WebSocket") -> None:
    """Serve one client of the seed protocol until it ends, fails or times out."""
    try:
        await Connection(state, websocket).run()
    except asyncio.CancelledError:
        raise
    except Exception:  # never let one client take the server down
        log.exception("ws session crashed")
