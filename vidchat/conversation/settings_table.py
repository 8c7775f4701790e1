"""The one table of a question's settings: each sampling and answer field
once, with its type, range, the page's label and the socket's names.

Every door reads it: the socket's session.config/update
(vidchat.doors.protocol_config), the page's settings panel and /ask API
(vidchat.doors.page.page_request), replay's ``--set`` and a bundle's manifest
(vidchat.conversation.chat.checked_settings), and the checks of the settings themselves
(SessionSettings.validate, chat.check_options). So a value is refused the
same way, with the same reason, wherever it comes from; only the name in the
message differs (the page's label on the page, the field's name elsewhere).

A leaf: it imports nothing of vidchat's but the media constants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vidchat.engine import SEED_RANGE
from vidchat.media import FRAMES_AS
from vidchat.media.numbers import is_int, is_number  # noqa: F401 (the table's checks; doors take them from here)

MAX_FRAMES_LIMIT = 1024  # frames a session may keep, and sample for one question
SAMPLING_STRATEGIES = ("uniform", "stable", "latest_frames", "latest_seconds")
# What the page shows for each strategy (its value stays the name above, which
# every door and the protocol use), and what it does, shown while it is chosen.
SAMPLING_CHOICES = (
    ("uniform", "Spread over all kept frames",
     "Frames spread evenly over everything kept, oldest to newest."),
    ("stable", "Spread, reusing the last picks",
     "Spread over everything kept like the first choice, but a new frame changes only the newest pick, "
     "so questions share their prompt's start and answer sooner."),
    ("latest_frames", "The newest frames", "The newest kept frames, one after another."),
    ("latest_seconds", "Spread over the last seconds",
     "Frames spread over the last seconds set below (and the frame on screen as they began)."),
)
AUDIO_MODES = ("frames", "last")
MAX_TEMPERATURE = 100.0




class SettingValueError(ValueError):
    """A field's value out of its range or choices; ``field`` is its name in
    the table, so a door can point at the field as its own client set it."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Setting:
    """One field. ``kind``: int, number, bool, choice or text; ``low``/``high``
    bound it (``low_open``: strictly above ``low``); ``target``: the
    SessionSettings ("session") or AnswerOptions ("answer") attribute."""

    name: str
    target: str
    kind: str
    label: str  # the page's label for it
    rule: str  # what a good value is, as the refusal says it
    origin: str = "vidchat"  # seed, vllm-omni or vidchat (the README's protocol table)
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    nullable: bool = False
    choices: tuple[str, ...] = ()
    # (value, what the page shows, what it does) for each of ``choices`` the page offers by name.
    choice_labels: tuple[tuple[str, str, str], ...] = ()
    aliases: tuple[str, ...] = ()  # upstream's later names for it (session.config)

    def json_kinds(self) -> tuple[type, ...]:
        """The JSON types session.config takes for it (ranges come later)."""
        return {"int": (int,), "number": (int, float), "bool": (bool,), "choice": (str,), "text": (str,)}[self.kind]

    def page_choices(self) -> list[tuple[str, str]]:
        """The page's (label, value) pairs: a picker shows the label and sends the value."""
        labels = {value: label for value, label, _ in self.choice_labels}
        return [(labels.get(value, value), value) for value in self.choices]

    def choice_help(self, value: Any) -> str:
        """What the chosen value does, as the page's help under the picker says it."""
        return next((help_text for v, _, help_text in self.choice_labels if v == value), "")

    def problem(self, value: Any, high: float | None = None) -> str | None:
        """Why ``value`` is refused (None: it is good). ``high``: a bound known
        only at run time (max_tokens: the model's context)."""
        if value is None:
            return None if self.nullable else "missing"
        high = self.high if high is None else high
        if self.kind == "bool":
            return None if isinstance(value, bool) else "bad"
        if self.kind == "choice":
            return None if value in self.choices else "bad"
        if self.kind == "text":
            return None if isinstance(value, str) else "bad"
        if not (is_int(value) if self.kind == "int" else is_number(value)):
            return "bad"
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return "bad"
        if high is not None and value > high:
            return "bad"
        return None

    def check(self, value: Any, *, name: str | None = None, high: float | None = None) -> None:
        """Raise ValueError naming the field (``name``: another name for it, e.g. the page's label)."""
        if self.problem(value, high) is not None:
            rule = self.rule.format(high=f"{high:g}" if isinstance(high, float) else high) if high is not None \
                else self.rule
            shown = type(value).__name__ if self.kind == "text" else repr(value)
            raise SettingValueError(f"{name or self.name} must be {rule}, got {shown}", self.name)

    def from_page(self, raw: Any, high: float | None = None) -> Any:
        """A page widget's (or the /ask API's) value, read as this field's
        type and checked; refusals name the page's label."""
        value = raw
        if self.kind == "int":
            value = _whole(self.label, raw)
        elif self.kind == "number":
            value = page_number(self.label, raw)
        elif self.kind == "bool":
            value = bool(raw)
        self.check(value, name=self.label, high=high)
        return value


def _whole(label: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{label} must be a whole number, got {value!r}")
    if isinstance(value, int):
        return value  # exact: through float, 2**63 - 1 would round up out of the seed's range
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value.strip())
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{label} must be a whole number, got {value!r}") from None
    if not math.isfinite(number) or number != int(number):
        raise ValueError(f"{label} must be a whole number, got {value!r}")
    return int(number)


def page_number(label: str, value: Any) -> float:
    """A page widget's value as a finite number (ValueError naming ``label``)."""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        raise ValueError(f"{label} must be a number, got {value!r}")
    return number


def _table(*settings: Setting) -> dict[str, Setting]:
    return {s.name: s for s in settings}


SETTINGS: dict[str, Setting] = _table(
    # How the session keeps and samples frames (vidchat.conversation.session.SessionSettings).
    Setting("max_frames", "session", "int", "Max frames kept", f"an integer in 1..{MAX_FRAMES_LIMIT}",
            origin="seed", low=1, high=MAX_FRAMES_LIMIT),
    Setting("num_sample_frames", "session", "int", "Frames per question", f"an integer in 1..{MAX_FRAMES_LIMIT}",
            origin="seed", low=1, high=MAX_FRAMES_LIMIT, aliases=("num_frames",)),
    Setting("evs_enabled", "session", "bool", "Drop near-duplicate frames", "true or false", origin="seed",
            aliases=("enable_frame_filter",)),
    Setting("evs_threshold", "session", "number", "Filter threshold", "a number in [0, 1]", origin="seed",
            low=0.0, high=1.0, aliases=("frame_filter_threshold",)),
    Setting("sampling", "session", "choice", "Sampling", "one of " + ", ".join(SAMPLING_STRATEGIES),
            choices=SAMPLING_STRATEGIES, choice_labels=SAMPLING_CHOICES),
    Setting("sample_seconds", "session", "number", "Window of the last seconds", "a positive number",
            low=0.0, low_open=True),
    Setting("keepalive_s", "session", "number", "Keep-alive", "null or a positive number of seconds",
            low=0.0, low_open=True, nullable=True),
    Setting("audio_mode", "session", "choice", "Audio", "one of " + ", ".join(AUDIO_MODES), choices=AUDIO_MODES),
    Setting("audio_last_seconds", "session", "number", "Audio seconds", "a positive number",
            low=0.0, low_open=True),
    # How the model answers (vidchat.conversation.chat.AnswerOptions).
    Setting("frames_as", "answer", "choice", "Send frames as", "one of " + ", ".join(FRAMES_AS), choices=FRAMES_AS),
    Setting("max_tokens", "answer", "int", "Max tokens", "a whole number in 1..{high}", low=1),
    Setting("temperature", "answer", "number", "Temperature", f"a number in 0..{MAX_TEMPERATURE:g}",
            low=0.0, high=MAX_TEMPERATURE),
    Setting("include_audio", "answer", "bool", "Include audio", "true or false", aliases=("use_audio_in_video",)),
    Setting("seed", "answer", "int", "Seed", "a whole number that fits a signed 64-bit integer",
            low=SEED_RANGE[0], high=SEED_RANGE[1], nullable=True),
    Setting("system_prompt", "answer", "text", "System prompt", "text", origin="vllm-omni", nullable=True),
)
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
    (SessionSettings.validate, chat.check_options). Raises SettingTypeError."""
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
