"""A value as a number, the way every door and setting checks one: a JSON
true/false (a Python bool, which is an int) is never a number, and a number
is finite. One definition for the settings table, the session's settings,
the media clock, the doors' fields and Talk's settings."""

from __future__ import annotations

import math
from typing import Any


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int or a finite float, never a bool (math.isfinite is not asked
    of ints: it raises OverflowError for a huge JSON integer)."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
