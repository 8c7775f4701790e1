"""What the guard reads of the mounted Gradio page: who logged in (Gradio's
password-login cookie, its Hugging Face sign-in session), which of the
page's functions take a session id, and which login first named each of
Gradio's session hashes and event ids."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any, Awaitable, Callable

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class PageLogins:
    """What the guard reads from the mounted Gradio page: Gradio's own record
    of who logged in (its password-login cookie, its Hugging Face sign-in
    session) and which of the page's functions take a session id, at which
    place in their inputs. Filled in by vidchat.doors.page once the page is mounted."""

    def __init__(self) -> None:
        self.gradio_app: Any = None
        self._session_middleware: Any = None
        self.session_inputs: dict[int, int] = {}  # fn_index -> position of the session id in its inputs
        self.fn_by_name: dict[str, int] = {}  # api_name -> fn_index
        self.session_params: dict[int, str] = {}  # fn_index -> the session id's name in /call/v2's named arguments

    def attach(self, gradio_app: Any, session_inputs: dict[int, int], fn_by_name: dict[str, int]) -> None:
        self.gradio_app = gradio_app
        self.session_inputs, self.fn_by_name = dict(session_inputs), dict(fn_by_name)
        try:
            self.session_params = _session_params(gradio_app.get_blocks(), self.session_inputs, self.fn_by_name)
        except Exception:  # noqa: BLE001 - the guard then checks every named argument instead
            log.warning("could not read the page's API parameter names", exc_info=True)
        # The HF sign-in session is the cookie of the SessionMiddleware Gradio
        # added for OAuth: read with that very middleware and its settings.
        for middleware in getattr(gradio_app, "user_middleware", []):
            if getattr(middleware.cls, "__name__", "") == "SessionMiddleware":
                self._session_middleware = middleware

    def password_user(self, cookies: dict[str, str]) -> str | None:
        app = self.gradio_app
        if app is None or not getattr(app, "tokens", None):
            return None
        cookie_id = getattr(app, "cookie_id", "")
        for name in (f"access-token-{cookie_id}", f"access-token-unsecure-{cookie_id}"):
            user = app.tokens.get(cookies.get(name))
            if user is not None:  # "" too: a token-only login may leave the name empty
                return str(user)
        return None

    async def hf_user(self, scope: Scope, cookies: dict[str, str]) -> str | None:
        """The signed-in Hugging Face user name of a request, or None."""
        middleware = self._session_middleware
        if middleware is None or "session" not in cookies:
            return None
        found: dict[str, Any] = {}

        async def capture(inner: Scope, receive: Receive, send: Send) -> None:
            found.update(inner.get("session") or {})

        reader = middleware.cls(capture, *middleware.args, **middleware.kwargs)
        await reader(dict(scope, type="http"), _no_receive, _no_send)
        info = found.get("oauth_info")
        if not isinstance(info, dict):
            return None
        expires = info.get("expires_at")
        if isinstance(expires, (int, float)) and expires < time.time():
            return None
        name = (info.get("userinfo") or {}).get("preferred_username")
        return name if isinstance(name, str) and name else None


def _session_params(blocks: Any, session_inputs: dict[int, int], fn_by_name: dict[str, int]) -> dict[int, str]:
    """fn_index -> the name /call/v2 takes the session id by: the API info
    Gradio maps named arguments through, which lists a function's inputs
    in order, leaving out those hidden from the API."""
    fns = {fn._id: fn for fn in blocks.fns.values()}
    names = {}
    for endpoint, spec in blocks.get_api_info().get("named_endpoints", {}).items():
        fn = fns.get(fn_by_name.get(endpoint.lstrip("/"), -1))
        position = session_inputs.get(fn._id) if fn is not None else None
        if position is None or fn.inputs[position].skip_api:
            continue
        index = sum(1 for block in fn.inputs[:position] if not block.skip_api)
        params = spec.get("parameters", [])
        if index < len(params) and isinstance(params[index].get("parameter_name"), str):
            names[fn._id] = params[index]["parameter_name"]
    return names


class GradioHandles:
    """Which login first named each Gradio session hash and event id.

    Gradio's own routes take these from anyone: /cancel stops, /queue/data
    and /call/<name>/<id> stream out, /heartbeat closes whatever they name.
    Each is random and first named by the tab or client that made it, so the
    first login to name one owns it, and any other is refused. The oldest are
    forgotten past ``limit`` (finished events, closed tabs) to bound memory."""

    def __init__(self, limit: int = 16384) -> None:
        self.limit = limit
        self._owners: OrderedDict[str, str] = OrderedDict()

    def claim(self, handle: Any, login: str | None) -> bool:
        """Whether ``login`` may name ``handle`` (it owns it from now on if nobody did)."""
        if login is None or not isinstance(handle, str) or not handle:
            return True  # no logins to tell apart
        owner = self._owners.get(handle)
        if owner is None:
            self._owners[handle] = login
            if len(self._owners) > self.limit:
                self._owners.popitem(last=False)
            return True
        self._owners.move_to_end(handle)
        return owner == login


async def _no_receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}


async def _no_send(message: dict[str, Any]) -> None:
    return None
