"""One setting's rule: its type, range, the page's label and the socket's
names, and how a value is read from the page or checked from data. The
table of every setting is vidchat.conversation.settings_table; the session's
half of it (how frames are kept and sampled) is vidchat.media.session_settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vidchat.media.numbers import is_int, is_number


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
    origin: str = "vidchat"  # seed, vllm-omni or vidchat (docs/protocol.md's table)
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
