"""The doors: adapters between a wire format and the conversation core. The
page (Gradio), the WebRTC peers that feed it, the seed WebSocket protocol,
and the "what the model got" view. A door translates; rules live below it
(vidchat.conversation). Doors use the engine's interface, never an engine.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote

from vidchat.conversation.host import Host, HostSettings

if TYPE_CHECKING:
    from vidchat.conversation.conversation import Conversation
    from vidchat.conversation.registry import SessionRegistry
    from vidchat.engine.interface import ChatEngine
    from vidchat.media.streams import Streams

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


# What a door may use of the server (vidchat.app.state.AppState): the host
# every conversation asks with, and what only a door needs besides (the
# options of its wire, the streams, new sessions, ICE for a new peer).
# Named here so that no door imports the app.

class DoorSettings(HostSettings, Protocol):
    """The server's options the doors read (a subset of vidchat.app.settings.Settings)."""

    @property
    def ws_send_timeout(self) -> float: ...

    @property
    def ws_config_timeout(self) -> float: ...

    @property
    def ws_idle_timeout(self) -> float: ...

    @property
    def ws_max_audio_seconds(self) -> float: ...

    @property
    def ws_max_fps(self) -> float: ...

    @property
    def ws_max_frame_bytes(self) -> int: ...

    @property
    def connect_timeout(self) -> float: ...

    @property
    def media_dir(self) -> str: ...

    @property
    def suite_max_cases(self) -> int: ...


class Server(Host, Protocol):
    """The server as the doors see it: a :class:`vidchat.conversation.host.Host`, and more."""

    @property
    def settings(self) -> DoorSettings: ...

    @property
    def registry(self) -> SessionRegistry: ...  # the doors find their conversations in it

    @property
    def streams(self) -> Streams: ...  # --stream: the live streams a session may watch

    @property
    def model_path(self) -> str: ...  # the main model, as the Realtime door names it

    @property
    def ice_servers(self) -> list[dict[str, Any]]: ...  # the static ones (ice_config adds minted TURN)

    @property
    def engine_down(self) -> bool:
        """The main engine failed to load or died for good: no point waiting for it."""
        ...

    def new_session(self, kind: str, **kwargs: Any) -> Conversation:
        """Register a session with the server's limits (raises TooManySessions, or ValueError)."""
        ...

    def check_frame_budget(self, max_frames: int) -> None:
        """Raise ValueError when ``max_frames`` stored frames would not fit --max-session-mb."""
        ...

    def frames_kept_limit(self) -> int:
        """The most frames a session may keep: what --max-session-mb holds at the stored size."""
        ...

    async def ice_config(self) -> list[dict[str, Any]]:
        """ICE servers for a new peer (raises IceUnavailable when TURN cannot be minted)."""
        ...

    def gpu_figures(self) -> list[dict[str, Any]]:
        """Each GPU's memory and utilisation now (empty without a GPU)."""
        ...


class PageServer(Server, Protocol):
    """What the page (vidchat.doors.page) uses of the server besides a door's:
    the sign-in it mounts with, the banners it shows, the engines' states."""

    banner: str | None  # the model's banner (random weights, a suggested model)
    tiny: bool
    compare_model_path: str  # "" without --compare-model
    compare_tiny: bool
    engine: ChatEngine | None
    compare_engine: ChatEngine | None
    page_app: Any  # the mounted Gradio app (its own type)
    # vidchat.app.access's Access and PageLogins: the app's sign-in rules,
    # which the page hands to Gradio as they are.
    access: Any
    page_logins: Any

    @property
    def ready(self) -> bool: ...

    async def wait_engine(self, timeout: float | None = None) -> ChatEngine: ...

    def compare_readiness(self) -> tuple[bool, str]: ...

    def store_limit_text(self) -> str: ...


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
