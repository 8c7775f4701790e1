"""The one table of a question's settings: each sampling and answer field
once, with its type, range, the page's label and the socket's names.

Every door reads it: the socket's session.config/update
(vidchat.doors.protocol_config), the page's settings panel and /ask API
(vidchat.doors.page.page_request), replay's ``--set`` and a bundle's manifest
(vidchat.conversation.answer_path.checked_settings), and the checks of the settings themselves
(SessionSettings.validate, answer_path.check_options). So a value is refused the
same way, with the same reason, wherever it comes from; only the name in the
message differs (the page's label on the page, the field's name elsewhere).

The session's rows (how frames are kept and sampled) are
vidchat.media.session_settings, beside the media session that applies them;
this module adds the answer's rows and the rules for settings given as data.
"""

from __future__ import annotations

from typing import Any

from vidchat.engine import SEED_RANGE
from vidchat.media import FRAMES_AS
from vidchat.media.numbers import is_int, is_number  # noqa: F401 (the table's checks; doors take them from here)
from vidchat.media.session_settings import (  # noqa: F401 (the whole table's names, as the doors take them)
    AUDIO_MODES, MAX_FRAMES_LIMIT, SAMPLING_CHOICES, SAMPLING_STRATEGIES, SESSION_SETTINGS,
)
from vidchat.media.setting import Setting, SettingValueError, page_number  # noqa: F401

MAX_TEMPERATURE = 100.0


def _table(*settings: Setting) -> dict[str, Setting]:
    return {s.name: s for s in settings}


SETTINGS: dict[str, Setting] = {**SESSION_SETTINGS, **_table(
    # How the model answers (vidchat.conversation.answer_path.AnswerOptions).
    Setting("frames_as", "answer", "choice", "Send frames as", "one of " + ", ".join(FRAMES_AS), choices=FRAMES_AS),
    Setting("max_tokens", "answer", "int", "Max tokens", "a whole number in 1..{high}", low=1),
    Setting("temperature", "answer", "number", "Temperature", f"a number in 0..{MAX_TEMPERATURE:g}",
            low=0.0, high=MAX_TEMPERATURE),
    Setting("include_audio", "answer", "bool", "Include audio", "true or false", aliases=("use_audio_in_video",)),
    Setting("seed", "answer", "int", "Seed", "a whole number that fits a signed 64-bit integer",
            low=SEED_RANGE[0], high=SEED_RANGE[1], nullable=True),
    Setting("system_prompt", "answer", "text", "System prompt", "text", origin="vllm-omni", nullable=True),
)}
# Where the model's context is not known (a bundle read without a model), max_tokens is only bounded by this.
UNBOUNDED_MAX_TOKENS = 1 << 20

# ---- what one question may carry, at every door ----
# A question's text and the chat history sent with it. Without a cap, a seed
# client's video.query could be as large as a WebSocket message (18 MB) and
# the page's history whatever its client posts; each question tokenizes all
# of it. The caps are far above any chat a model's context holds (the engine
# cuts history to fit): 64 K characters is ~16 K tokens, and 1 MiB of history
# is several hundred long answers.
MAX_QUESTION_CHARS = 64 * 1024
MAX_HISTORY_TURNS = 1024
MAX_HISTORY_CHARS = 1 << 20


def question_problem(question: str, history: Any = ()) -> SettingValueError | None:
    """Why a question (its text, and the history sent with it) is refused,
    naming the field ("question" or "history"); None when it is within the caps.
    ``history``: turns with a ``text`` (or role/content dicts)."""
    if isinstance(question, str) and len(question) > MAX_QUESTION_CHARS:
        return SettingValueError(f"question must be at most {MAX_QUESTION_CHARS} characters, "
                                 f"got {len(question)}", "question")
    turns = list(history or ())
    if len(turns) > MAX_HISTORY_TURNS:
        return SettingValueError(f"history must be at most {MAX_HISTORY_TURNS} turns, got {len(turns)}", "history")
    chars = sum(len(_turn_text(turn)) for turn in turns)
    if chars > MAX_HISTORY_CHARS:
        return SettingValueError(f"history must be at most {MAX_HISTORY_CHARS} characters in all, got {chars}",
                                 "history")
    return None


def _turn_text(turn: Any) -> str:
    text = turn.get("content", "") if isinstance(turn, dict) else getattr(turn, "text", "")
    return text if isinstance(text, str) else str(text)


def check_all(target: str, values: Any, high: dict[str, float] | None = None) -> None:
    """Check every field of ``target`` ("session" or "answer") that ``values``
    (a SessionSettings or AnswerOptions) has; ValueError names the first bad one."""
    for setting in SETTINGS.values():
        if setting.target == target and hasattr(values, setting.name):
            setting.check(getattr(values, setting.name), high=(high or {}).get(setting.name))


def current_values(settings: Any, options: Any) -> dict[str, Any]:
    """Every field's value now, by its name: from ``settings`` (a
    SessionSettings) or ``options`` (an AnswerOptions), as a door reports
    the effective session (the seed's session.updated, the Realtime API's
    session.vidchat)."""
    return {name: getattr(settings if spec.target == "session" else options, name) for name, spec in SETTINGS.items()}


# ---- settings given as data (session.config, session.update, a bundle's manifest) ----

# Upstream's later names for the seed's fields (use_audio_in_video is
# vllm-omni's name for what vidchat calls include_audio).
ALIASES = {alias: name for name, spec in SETTINGS.items() for alias in spec.aliases}


class SettingTypeError(ValueError):
    """A value of the wrong JSON type or outside a field's choices; the message names the key as sent."""


def type_name(kinds: tuple[type, ...], nullable: bool) -> str:
    return "/".join([k.__name__ for k in kinds] + (["null"] if nullable else []))


def check_json_type(key: str, value: Any, kinds: tuple[type, ...], nullable: bool = False,
                    choices: tuple[str, ...] = ()) -> None:
    if value is None and nullable:
        return
    # JSON true/false are Python bools, which isinstance() also counts as ints.
    ok = isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))
    if not ok:
        raise SettingTypeError(f"Invalid type for '{key}': expected {type_name(kinds, nullable)}, "
                               f"got {type(value).__name__}")
    if choices and value not in choices:
        raise SettingTypeError(f"Invalid value for '{key}': expected one of {', '.join(choices)}, got {value!r}")


def read_settings(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The table's fields among ``values`` (by name or alias), type-checked,
    grouped by target: {"session": {...}, "answer": {...}}. Unknown keys are
    ignored; ranges are checked later, where every door checks them
    (SessionSettings.validate, answer_path.check_options). Raises SettingTypeError."""
    named: dict[str, Any] = {}
    for key, value in values.items():
        name = ALIASES.get(key, key)
        spec = SETTINGS.get(name)
        if spec is None:
            continue
        check_json_type(key, value, spec.json_kinds(), spec.nullable, spec.choices)
        if name in named and named[name] != value:
            other = name if key != name else next(a for a, n in ALIASES.items() if n == name and a in values)
            raise SettingTypeError(f"'{key}' and '{other}' are the same setting but have different values; send one")
        named[name] = value
    out: dict[str, dict[str, Any]] = {"session": {}, "answer": {}}
    for name, value in named.items():
        out[SETTINGS[name].target][name] = value
    if "system_prompt" in out["answer"]:
        out["answer"]["system_prompt"] = out["answer"]["system_prompt"] or None  # "" = no system prompt
    return out
