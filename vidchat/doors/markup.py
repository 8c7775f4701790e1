"""The one way a value goes into the page's HTML: as text.

Everything the page shows in markup it builds itself (the compare panel, the
"what the model got" panel, notices) passes each value through :func:`as_text`,
whatever it is and wherever it came from (a model's answer, a loaded bundle's
manifest, a setting): quotes included, so a value is inert in an attribute too.
"""

from __future__ import annotations

import html
from typing import Any


def as_text(value: Any) -> str:
    """``value`` as HTML text: str() of it, with <, >, &, " and ' escaped."""
    return html.escape(value if isinstance(value, str) else str(value), quote=True)
