"""The doors: adapters between a wire format and the conversation core. The
page (Gradio), the WebRTC peers that feed it, the seed WebSocket protocol,
and the "what the model got" view. A door translates; rules live below it
(vidchat.conversation). Doors use the engine's interface, never an engine.
"""

from __future__ import annotations

import html
from typing import Any
from urllib.parse import unquote

# What the server (vidchat.app) and the doors agree on, so that no door
# imports the app: the header the access guard puts the caller's login in,
# the page's upload route and how long Gradio keeps uploads, and the error a
# new peer's ICE configuration may raise.

# Set by the guard on every request it lets through (vidchat.app.guard);
# a client's own header of that name is dropped first.
LOGIN_HEADER = "x-vidchat-login"

# Gradio's cleaning of its cache (gr.Blocks delete_cache): every 5 minutes, the
# page's files older than 15 minutes are deleted. The page reads an upload at
# once (a bundle is loaded as it arrives, then deleted), so the 15 minutes are
# for an API client between its upload and its call; it is also the longest an
# unread upload counts against its login's --max-upload-mb.
UPLOAD_DELETE_CACHE = (300, 900)

UPLOAD_ROUTE = "/gradio_api/upload"


def login_of(headers: Any) -> str | None:
    """The login the guard found for a request (None: none asked or none given),
    from the request's headers (a Starlette Headers or any mapping)."""
    value = headers.get(LOGIN_HEADER) if headers is not None else None
    return unquote(value) if value else None


class IceUnavailable(RuntimeError):
    """No ICE servers can be had for a new peer now (short-lived TURN
    credentials could not be minted); the message is safe to show and log."""


# The one way a value goes into the page's HTML: as text.
#
# Everything the page shows in markup it builds itself (the compare panel, the
# "what the model got" panel, notices) passes each value through :func:`as_text`,
# whatever it is and wherever it came from (a model's answer, a loaded bundle's
# manifest, a setting): quotes included, so a value is inert in an attribute too.

def as_text(value: Any) -> str:
    """``value`` as HTML text: str() of it, with <, >, &, " and ' escaped."""
    return html.escape(value if isinstance(value, str) else str(value), quote=True)
