"""What a WebSocket client may set: the fields of ``session.config`` and
``session.update`` (the seed's, vllm-omni's later names and additions, and
vidchat's own), type-checked and mapped onto the session's settings, the
answer options, or ``turn_detection`` (server-side turns, vidchat.conversation.modes).
The message table is the docs/protocol.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from vidchat.conversation.asking import SETTINGS, SettingTypeError, check_json_type, read_settings
from vidchat.conversation.modes import DEFAULT_EVERY_S
from vidchat.media.vad import TurnSettings

MAX_WATCH_EVERY_S = 3600.0


NUMBER = (int, float)


@dataclass(frozen=True)
class _Field:
    kinds: tuple[type, ...]
    target: str  # "session" (SessionSettings), "answer" (AnswerOptions) or "info"
    attr: str
    nullable: bool = False
    choices: tuple[str, ...] = ()


# Each question setting comes from vidchat.conversation.asking (its type here,
# its range where every door checks it); the rest are this door's own.
FIELDS: dict[str, _Field] = {
    # the seed's informational fields
    "model": _Field((str,), "info", "model"),
    "modalities": _Field((list,), "info", "modalities"),
    **{name: _Field(spec.json_kinds(), spec.target, name, spec.nullable, spec.choices)
       for name, spec in SETTINGS.items()},
    "turn_detection": _Field((dict,), "info", "turn_detection", nullable=True),
    "vidchat_events": _Field((bool,), "info", "vidchat_events"),
    "watch": _Field((dict,), "info", "watch", nullable=True),
    "record": _Field((bool,), "info", "record"),
    "history": _Field((bool,), "info", "history"),
    "source": _Field((dict,), "info", "source", nullable=True),
}

# The fields whose origin is vidchat ("vidchat" in docs/protocol.md's table): a
# client that sends one knows vidchat, and is sent vidchat's extra events.
VIDCHAT_FIELDS = frozenset({name for name, spec in SETTINGS.items() if spec.origin == "vidchat"}
                           | {"watch", "record", "history", "source"})

# Keys of session.config that session.update may change as well.
UPDATABLE_INFO = ("turn_detection", "watch", "record", "history", "source")


class ConfigError(ValueError):
    pass


def _check_type(key: str, value: Any, spec: _Field) -> None:
    try:
        check_json_type(key, value, spec.kinds, spec.nullable, spec.choices)
    except SettingTypeError as exc:
        raise ConfigError(str(exc)) from None


def wants_vidchat_events(msg: dict[str, Any], already: bool = False) -> bool:
    """Whether a client gets vidchat's extra events (response.queued,
    session.expiring, any later one) after this session.config/update: it
    said so (``vidchat_events``: true, or false to stay without), or it used
    a field of vidchat's own. A seed or vllm-omni client gets none."""
    if isinstance(msg.get("vidchat_events"), bool):
        return msg["vidchat_events"]
    # By the name sent: upstream's aliases (use_audio_in_video…) are not vidchat's.
    return already or any(key in VIDCHAT_FIELDS for key in msg)


@dataclass
class ConfigChanges:
    session: dict[str, Any] = dataclasses.field(default_factory=dict)
    answer: dict[str, Any] = dataclasses.field(default_factory=dict)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


def parse_config(msg: dict[str, Any]) -> ConfigChanges:
    """Type-check the known keys of a session.config/session.update message.

    Aliases map to the seed's names; unknown keys are ignored. Raises
    ConfigError with a message for the client. Ranges are checked where every
    door checks them: SessionSettings.validate and answer_path.check_options.
    """
    try:
        settings = read_settings(msg)
    except SettingTypeError as exc:
        raise ConfigError(str(exc)) from None
    changes = ConfigChanges(session=settings["session"], answer=settings["answer"])
    for key, value in msg.items():
        spec = FIELDS.get(key)
        if spec is None or spec.target != "info":
            continue  # "type", the table's fields (read above) and anything this server does not know
        _check_type(key, value, spec)
        changes.info[spec.attr] = value
    if "turn_detection" in changes.info:
        changes.info["turn_detection"] = parse_turn_detection(changes.info["turn_detection"])
    if "watch" in changes.info:
        changes.info["watch"] = parse_watch(changes.info["watch"])
    if "source" in changes.info:
        changes.info["source"] = parse_source(changes.info["source"])
    return changes


def parse_source(value: dict[str, Any] | None) -> str | None:
    """``source``: ``{"stream": NAME}`` (one of the server's --stream) or null
    (the client's own frames); the stream's name."""
    if value is None:
        return None
    if set(value) != {"stream"} or not isinstance(value["stream"], str) or not value["stream"]:
        raise ConfigError('source must be {"stream": NAME} (a stream of this server, GET /api/streams) or null')
    return value["stream"]


@dataclass(frozen=True)
class WatchRequest:
    question: str
    every_s: float

    def describe(self) -> dict[str, Any]:
        return {"question": self.question, "every_s": self.every_s}


def parse_watch(value: dict[str, Any] | None) -> WatchRequest | None:
    """``{"question": "…", "every_s": N}`` (every_s defaults to the page's
    10 s); null: no watching."""
    if value is None:
        return None
    question = value.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ConfigError("watch.question must be a non-empty string")
    every = value.get("every_s", DEFAULT_EVERY_S)
    if not isinstance(every, NUMBER) or isinstance(every, bool):
        raise ConfigError(f"Invalid type for 'watch.every_s': expected number, got {type(every).__name__}")
    if not (0 < every <= MAX_WATCH_EVERY_S) or every != every:
        raise ConfigError(f"watch.every_s must be more than 0 and at most {MAX_WATCH_EVERY_S:g} seconds, "
                          f"got {every!r}")
    return WatchRequest(question.strip(), float(every))


# Wire name → (TurnSettings field, factor from the wire's unit). threshold,
# silence_duration_ms and prefix_padding_ms are OpenAI Realtime's (and
# vllm-omni's /v1/realtime) names; the others are vidchat's.
TURN_FIELDS: dict[str, tuple[str, float]] = {
    "threshold": ("threshold", 1.0),
    "silence_duration_ms": ("min_silence_s", 0.001),
    "prefix_padding_ms": ("pad_s", 0.001),
    "min_speech_duration_ms": ("min_speech_s", 0.001),
    "max_utterance_ms": ("max_utterance_s", 0.001),
}

TURN_FLAGS = ("interrupt_response", "create_response")


@dataclass(frozen=True)
class TurnDetection:
    """A socket's server_vad settings: when an utterance is a turn
    (vidchat.media.vad.TurnSettings), whether speech stops the running answer
    (barge-in) and whether a finished utterance is asked."""

    settings: TurnSettings = dataclasses.field(default_factory=TurnSettings)
    interrupt_response: bool = True
    create_response: bool = True

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "server_vad"}
        for wire_name, (attr, factor) in TURN_FIELDS.items():
            value = getattr(self.settings, attr)
            out[wire_name] = value if factor == 1.0 else round(value / factor)
        out.update(interrupt_response=self.interrupt_response, create_response=self.create_response)
        return out


def parse_turn_detection(value: Any) -> TurnDetection | None:
    """``turn_detection`` as sent (null: off), by both socket doors (its
    names are OpenAI Realtime's); raises ConfigError naming the bad field.

    Missing fields keep vidchat's defaults (vidchat.media.vad.TurnSettings); ranges
    are TurnSettings.validate()'s; unknown keys are ignored."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError("turn_detection must be an object or null")
    kind = value.get("type", "server_vad")
    if kind != "server_vad":
        raise ConfigError(f"Invalid value for 'turn_detection.type': only 'server_vad' is supported, got {kind!r}")
    changes: dict[str, float] = {}
    for wire_name, (attr, factor) in TURN_FIELDS.items():
        if wire_name not in value:
            continue
        number = value[wire_name]
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise ConfigError(f"Invalid type for 'turn_detection.{wire_name}': expected number, "
                              f"got {type(number).__name__}")
        changes[attr] = number * factor
    flags: dict[str, bool] = {}
    for name in TURN_FLAGS:
        if name in value:
            if not isinstance(value[name], bool):
                raise ConfigError(f"Invalid type for 'turn_detection.{name}': expected bool, "
                                  f"got {type(value[name]).__name__}")
            flags[name] = value[name]
    settings = dataclasses.replace(TurnSettings(), **changes)
    try:
        settings.validate()
    except (ValueError, OverflowError) as exc:
        attr = str(exc).split(" ", 1)[0]
        wire_name = next((w for w, (a, _) in TURN_FIELDS.items() if a == attr), attr)
        raise ConfigError(f"Invalid value for 'turn_detection.{wire_name}' "
                          f"({value.get(wire_name)!r}): {exc}") from None
    return TurnDetection(settings, **flags)
