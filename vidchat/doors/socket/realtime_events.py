"""The OpenAI Realtime door's wire format: what its client events may hold
(sessions and responses; items are :mod:`vidchat.doors.socket.realtime`),
and its server events, as the official SDK's types (``openai.types.realtime``,
GA names) define them. Pure, no I/O: the door (:mod:`vidchat.doors.socket.realtime`)
reads and sends them.

vidchat's additions are extra fields, never renamed events: ``session.vidchat``
(the settings table's fields, and ``record``), ``pts_ms`` on an
``input_image`` part, ``vidchat`` on ``conversation.item.added`` (what became
of each frame) and on ``response.done`` (the answer record).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from vidchat.conversation.asking import ALIASES, SETTINGS, SettingTypeError, read_settings
from vidchat.conversation.runs import CANCELLED, COMPLETED
from vidchat.doors.socket.config import ConfigError, parse_turn_detection
from vidchat.doors.socket.session import Refusal

SEMANTIC_VAD = "semantic_vad"  # the API's model-judged turn detection: not served (server_vad is)

INPUT_RATES = (24_000, 16_000)  # audio/pcm rates taken (24 kHz is the API's; 16 kHz is the session's own)

UNSET: Any = object()  # a field the event did not carry

# What of the answer record rides on response.done (the whole one is /inputs/<answer_id>/record.json).
RECORD_KEYS = ("frames", "frame_indices", "frame_times", "frame_sizes", "inputs_sha256", "audio_seconds",
               "audio_span", "spoken_question", "prompt_tokens", "cached_tokens", "completion_tokens", "ttft_ms",
               "finish_reason", "frames_as", "temperature", "seed", "model")

# ... and, where the session's memory was on (vidchat.conversation.memory), what it got of it.
MEMORY_KEYS = ("memory_tokens", "memory_frames", "history_folded")


# The API's client events this server does not serve, and why: each is
# answered with an error naming it (code unsupported_event), and the session goes on.
_NO_ITEMS = ("items are not kept as a conversation: an image item is a frame in the session's buffer, "
             "text and audio items wait for the next response.create")

NOT_SERVED = {
    "conversation.item.retrieve": _NO_ITEMS,
    "conversation.item.delete": _NO_ITEMS,
    "conversation.item.truncate": "answers are text only: there is no audio to truncate",
    "output_audio_buffer.clear": "answers are text only: there is no output audio",
    "transcription_session.update": "transcription is not served",
}


# A client event refused: the shared loop's Refusal, sent as ``error {error: {type, code, message, param, event_id}}``.
EventError = Refusal


def not_served(kind: str) -> EventError:
    return EventError(f"{kind} is not served here: {NOT_SERVED[kind]}", "unsupported_event", "type")


def error_event(event_id: str, exc: EventError, client_event_id: Any = None) -> dict[str, Any]:
    return {"type": "error", "event_id": event_id,
            "error": {"type": exc.kind, "code": exc.code, "message": exc.message, "param": exc.param,
                      "event_id": client_event_id if isinstance(client_event_id, str) else None}}


def new_id(prefix: str) -> str:
    """An item's, response's or session's id: unguessable (event ids are numbered, per connection)."""
    return f"{prefix}_{secrets.token_hex(8)}"


@dataclass
class SessionUpdate:
    """What a session.update changes; UNSET fields stay as they are."""

    answer: dict[str, Any]  # instructions, max_output_tokens, output_modalities (answer_fields)
    input_rate: Any = UNSET
    turn_detection: Any = UNSET  # TurnDetection or None (off)
    record: Any = UNSET
    stream: Any = UNSET  # a stream's name, or None (the client's own frames)
    settings: dict[str, dict[str, Any]] = field(default_factory=lambda: {"session": {}, "answer": {}})
    # Fields asked for that vidchat can't honour (tools, transcription, semantic_vad), by param:
    # the rest of the update still applies; session.updated leaves these out and names them.
    left_out: list[str] = field(default_factory=list)


def max_tokens(value: Any, param: str) -> int | None:
    """max_output_tokens as an int, or None for "inf" (the server's default)."""
    if value == "inf":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EventError(f"{param} must be a positive integer or \"inf\", got {value!r}", param=param)
    return value


def modalities(value: Any, param: str) -> list[str]:
    if not isinstance(value, list) or not value or any(m not in ("text", "audio") for m in value):
        raise EventError(f"{param} must be a list of \"text\" and/or \"audio\", got {value!r}", param=param)
    return value


def instructions_of(value: Any, param: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise EventError(f"{param} must be a string, got {type(value).__name__}", param=param)
    return value or None


# What a session and a response both take, each with its check.
ANSWER_FIELDS = {"instructions": instructions_of, "max_output_tokens": max_tokens, "output_modalities": modalities}


def answer_fields(values: dict[str, Any], where: str) -> dict[str, Any]:
    """``values``' ANSWER_FIELDS, checked (``where``: "session" or "response", as refusals name them).
    A null is no change, as an absent field is: ``response.create {response:
    {instructions: null}}`` (what LiveKit's plugin sends) keeps the session's
    instructions, where taking it as "none" left the model without its system prompt."""
    return {key: check(values[key], f"{where}.{key}") for key, check in ANSWER_FIELDS.items()
            if values.get(key) is not None}


def answer_options(options: Any, fields: dict[str, Any], default_max_tokens: int) -> Any:
    """AnswerOptions with a session's or a response's answer_fields (max_output_tokens "inf": the server's default)."""
    if "instructions" in fields:
        options = options.updated(system_prompt=fields["instructions"])
    if "max_output_tokens" in fields:
        options = options.updated(max_tokens=fields["max_output_tokens"] or default_max_tokens)
    return options


def setting_refused(exc: ValueError, where: str, fields: dict[str, Any]) -> EventError:
    """A value the one settings check refused, pointed at as this door's
    client set it: max_tokens as ``<where>.max_output_tokens`` when that is
    what it sent, another field of a session.update under session.vidchat."""
    field, message = getattr(exc, "field", None), str(exc)
    if field == "max_tokens" and "max_output_tokens" in fields:
        return EventError(message.replace("max_tokens", "max_output_tokens", 1), param=f"{where}.max_output_tokens")
    return EventError(message, param=f"session.vidchat.{field}" if field and where == "session" else where)


def parse_session(session: Any) -> SessionUpdate:
    """session.update's ``session``, checked; raises EventError naming the bad field."""
    if not isinstance(session, dict):
        raise EventError("session.update needs a 'session' object", param="session")
    if session.get("type", "realtime") != "realtime":
        raise EventError(f"only realtime sessions are served, got type {session.get('type')!r}", param="session.type")
    update = SessionUpdate(answer_fields(session, "session"))
    audio = session.get("audio") or {}
    if not isinstance(audio, dict):
        raise EventError("session.audio must be an object", param="session.audio")
    audio_in = audio.get("input") or {}
    if not isinstance(audio_in, dict):
        raise EventError("session.audio.input must be an object", param="session.audio.input")
    # Published clients ask for these by default (openai-agents, LiveKit's
    # plugin): refusing the whole update for them threw away the instructions
    # and limits that came with them. Left out, and named; a malformed one is still an error.
    for where, value, kind in (("session.tools", session.get("tools"), list),
                               ("session.audio.input.transcription", audio_in.get("transcription"), dict)):
        if value is not None and not isinstance(value, kind):
            raise EventError(f"{where} must be {'a list' if kind is list else 'an object'} or null", param=where)
        if value:
            update.left_out.append(where)
    if "format" in audio_in:
        update.input_rate = _input_rate(audio_in["format"])
    detection = audio_in.get("turn_detection")
    if isinstance(detection, dict) and detection.get("type") == SEMANTIC_VAD:
        update.left_out.append("session.audio.input.turn_detection")  # turn detection stays as it was
    elif "turn_detection" in audio_in:
        try:  # the seed door's server_vad, whose names are OpenAI's
            update.turn_detection = parse_turn_detection(detection)
        except ConfigError as exc:
            raise EventError(str(exc), param="session.audio.input.turn_detection") from None
    if "vidchat" in session:
        _vidchat(session["vidchat"], update)
    return update


def input_format(rate: int) -> dict[str, Any]:
    """audio.input.format as the session describes it. The GA type's PCM
    rate is 24000 only: another rate taken is said in a vidchat extra."""
    if rate == INPUT_RATES[0]:
        return {"type": "audio/pcm", "rate": rate}
    return {"type": "audio/pcm", "vidchat": {"rate": rate}}


def _input_rate(fmt: Any) -> int:
    param = "session.audio.input.format"
    if not isinstance(fmt, dict) or fmt.get("type", "audio/pcm") != "audio/pcm":
        raise EventError(f"{param}: only audio/pcm (PCM16 mono) is taken", "unsupported_audio_format", param)
    extra = fmt.get("vidchat") if isinstance(fmt.get("vidchat"), dict) else {}  # how input_format says 16 kHz
    rate = fmt.get("rate", extra.get("rate", INPUT_RATES[0]))
    if rate not in INPUT_RATES:
        raise EventError(f"{param}.rate must be one of {', '.join(map(str, INPUT_RATES))}, got {rate!r}",
                         "unsupported_audio_format", f"{param}.rate")
    return rate


def _vidchat(values: Any, update: SessionUpdate) -> None:
    """session.vidchat: the settings table's fields (by name or alias), ``record`` and ``stream``."""
    if not isinstance(values, dict):
        raise EventError("session.vidchat must be an object", param="session.vidchat")
    unknown = sorted(k for k in values if k not in SETTINGS and k not in ALIASES and k not in ("record", "stream"))
    if unknown:
        raise EventError(f"session.vidchat: unknown setting(s) {', '.join(unknown)}; known: "
                         f"{', '.join([*SETTINGS, 'record', 'stream'])}", param="session.vidchat")
    if "stream" in values:
        if values["stream"] is not None and (not isinstance(values["stream"], str) or not values["stream"]):
            raise EventError("session.vidchat.stream must be a stream's name (GET /api/streams) or null",
                             param="session.vidchat.stream")
        update.stream = values["stream"]
    if "record" in values:
        if not isinstance(values["record"], bool):
            raise EventError("session.vidchat.record must be true or false", param="session.vidchat.record")
        update.record = values["record"]
    try:
        update.settings = read_settings(values)
    except SettingTypeError as exc:
        raise EventError(f"session.vidchat: {exc}", param="session.vidchat") from None


def response_fields(params: Any) -> dict[str, Any]:
    """response.create's ``response``: this response's answer_fields (raises EventError)."""
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise EventError("response must be an object", param="response")
    unserved(params, "tools", "response.tools", "function calling (tools) is not served here")
    unserved(params, "input", "response.input", "not supported: add items to the conversation")
    return answer_fields(params, "response")


def response_metadata(params: Any) -> dict[str, str] | None:
    """response.create's ``response.metadata``, echoed on the response's
    response.created and response.done: clients match their requests to
    responses by it (LiveKit's plugin by ``client_event_id``). The API's
    limits: up to 16 pairs, keys up to 64 characters, string values up to 512."""
    value = params.get("metadata") if isinstance(params, dict) else None
    if value is None:
        return None
    param = "response.metadata"
    if (not isinstance(value, dict) or len(value) > 16
            or any(not isinstance(k, str) or len(k) > 64 or not isinstance(v, str) or len(v) > 512
                   for k, v in value.items())):
        raise EventError(f"{param} must be an object of at most 16 string values (keys up to 64 characters, "
                         "values up to 512)", param=param)
    return value


def in_conversation(params: Any) -> bool:
    """response.create's ``response.conversation``: "auto" (the default) asks
    with the conversation's exchanges so far and adds this one to them; "none"
    answers outside it (the API's out-of-band response). Raises EventError."""
    value = (params or {}).get("conversation", "auto") if isinstance(params, dict) else "auto"
    if value not in ("auto", "none"):
        raise EventError(f"response.conversation must be \"auto\" or \"none\", got {value!r}",
                         param="response.conversation")
    return value == "auto"


def unserved(values: dict[str, Any], key: str, param: str, why: str) -> None:
    """A field asking for what is not served is refused, never silently ignored (empty or null: nothing asked)."""
    if values.get(key):
        raise EventError(f"{param}: {why}", "unsupported", param)


def message_item(item_id: str, role: str, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    """A conversation item (realtime.item): the user's, or the assistant's answer."""
    return {"id": item_id, "object": "realtime.item", "type": "message", "role": role, "status": status,
            "content": content}


def item_events(item: dict[str, Any], previous: str | None, *stages: str) -> list[dict[str, Any]]:
    """conversation.item.<stage> ("added", "done") for ``item``, which follows ``previous`` in the conversation."""
    return [{"type": f"conversation.item.{stage}", "previous_item_id": previous, "item": item} for stage in stages]


def usage(stats: dict[str, Any] | None) -> dict[str, Any] | None:
    if stats is None:
        return None
    given, made = stats.get("prompt_tokens", 0), stats.get("completion_tokens", 0)
    return {"total_tokens": given + made, "input_tokens": given, "output_tokens": made,
            "input_token_details": {"cached_tokens": stats.get("cached_tokens", 0), "text_tokens": None,
                                    "image_tokens": None, "audio_tokens": None},
            "output_token_details": {"text_tokens": made, "audio_tokens": 0}}


def response(response_id: str, status: str, *, output: list[dict[str, Any]] = (), max_output_tokens: Any = None,
             stats: dict[str, Any] | None = None, reason: str | None = None,
             error: str | None = None, metadata: dict[str, str] | None = None) -> dict[str, Any]:
    """The realtime.response object of response.created (in_progress) and response.done."""
    details = None
    if status in ("cancelled", "failed", "incomplete"):
        details = {"type": status, "reason": reason,
                   "error": {"type": "server_error", "code": "answer_failed", "message": error} if error else None}
    return {"id": response_id, "object": "realtime.response", "status": status, "status_details": details,
            "output": list(output), "output_modalities": ["text"], "conversation_id": None,
            "max_output_tokens": "inf" if max_output_tokens is None else max_output_tokens,
            "usage": usage(stats), "metadata": metadata}


class ResponseEvents:
    """One response's server events, in the order the API sends them: created;
    output item, conversation item and content part added; text deltas; text,
    part, item done; response.done (always, once)."""

    def __init__(self, response_id: str, max_output_tokens: int | None,
                 metadata: dict[str, str] | None = None) -> None:
        self.id, self.max_output_tokens, self.metadata = response_id, max_output_tokens, metadata
        self.item_id = new_id("item")
        self.previous_item: str | None = None  # what the answer's item follows: its .added and .done say the same

    def _item(self, stage: str, text: str | None, status: str, previous: str | None) -> list[dict[str, Any]]:
        """The answer's item ``stage`` ("added", "done"): as the response's output and as the conversation's item."""
        item = message_item(self.item_id, "assistant", status, [] if text is None else
                            [{"type": "output_text", "text": text}])
        return [{"type": f"response.output_item.{stage}", "response_id": self.id, "output_index": 0, "item": item},
                *item_events(item, previous, stage)]

    def _part(self, kind: str, **fields: Any) -> dict[str, Any]:
        """An event of the answer's one text part."""
        return {"type": kind, "response_id": self.id, "item_id": self.item_id, "output_index": 0,
                "content_index": 0, **fields}

    def created(self) -> dict[str, Any]:
        return {"type": "response.created", "response": response(
            self.id, "in_progress", max_output_tokens=self.max_output_tokens, metadata=self.metadata)}

    def started(self, previous_item: str | None) -> list[dict[str, Any]]:
        self.previous_item = previous_item
        return [*self._item("added", None, "in_progress", previous_item),
                self._part("response.content_part.added", part={"type": "text", "text": ""})]

    def delta(self, text: str) -> dict[str, Any]:
        return self._part("response.output_text.delta", delta=text)

    def finished(self, done: Any, cancelled_by: str | None, links: dict[str, Any]) -> list[dict[str, Any]]:
        """The events that end the response, from the conversation's Done
        (``cancelled_by``: the reason, if it was cancelled; ``links``: where
        its record is, vidchat.doors.answer_routes.record_links)."""
        summary = done.answer.summary()
        status, reason = done.status, None
        if status == CANCELLED:
            reason = cancelled_by
        elif status == COMPLETED and summary.get("finish_reason") == "length":
            status, reason = "incomplete", "max_output_tokens"
        # The vidchat extra: what the model was given, and where the whole record is.
        record = {**{key: summary.get(key) for key in RECORD_KEYS},
                  **{key: summary[key] for key in MEMORY_KEYS if key in summary}, **links}
        return self.done(status, text=done.text if done.started else None, reason=reason, error=done.error,
                         stats=summary if done.started else None, record=record)

    def done(self, status: str, *, text: str | None, reason: str | None = None, error: str | None = None,
             stats: dict[str, Any] | None = None, record: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """``text`` None: the response never started (nothing was generated)."""
        events: list[dict[str, Any]] = []
        if text is not None:
            events = [self._part("response.output_text.done", text=text),
                      self._part("response.content_part.done", part={"type": "text", "text": text}),
                      *self._item("done", text, "completed" if status == "completed" else "incomplete",
                                  self.previous_item)]
        done: dict[str, Any] = {"type": "response.done", "response": response(
            self.id, status, output=[events[-1]["item"]] if events else [], max_output_tokens=self.max_output_tokens,
            stats=stats, reason=reason, error=error, metadata=self.metadata)}
        if record is not None:
            done["vidchat"] = record
        return [*events, done]
