"""The access rules enforced: one ASGI middleware in front of the whole app
(Gradio's routes included) that checks Host and Origin, works out the
caller's login, asks what the route needs (vidchat.app.access.route_kind),
checks whose session a page call names, and limits body sizes."""

from __future__ import annotations

import hmac
import json
import logging
import re
import time
from typing import Any, Awaitable, Callable
from urllib.parse import parse_qsl, quote, urlsplit

from starlette.requests import cookie_parser

from vidchat.app.access import (
    LOGIN_HEADER, OPERATOR_ROUTES, TOKEN_LOGIN, Access, is_forwarded, is_loopback, route_kind, user_login,
)

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class BodyTooLarge(Exception):
    pass


def _host_name(host_header: str) -> str:
    if host_header.startswith("["):  # [::1]:7860
        return host_header[1 : host_header.find("]")] if "]" in host_header else host_header
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


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

    def attach(self, gradio_app: Any, session_inputs: dict[int, int], fn_by_name: dict[str, int]) -> None:
        self.gradio_app = gradio_app
        self.session_inputs, self.fn_by_name = dict(session_inputs), dict(fn_by_name)
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


async def _no_receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}


async def _no_send(message: dict[str, Any]) -> None:
    return None



# Page API routes that run one of the page's functions with the inputs in
# their JSON body; the body is read (up to this size) to see whose session it names.
_CALL_ROUTE = re.compile(r"/gradio_api/(?:queue/join|(?:call/v2|call|run|api)/(?P<name>[^/]+))/?")
MAX_CALL_BODY = 32 << 20


class Guard:
    """ASGI middleware: Host, Origin, the caller's login, what the route
    needs (route_kind), whose session a page call names, and body size, in
    that order."""

    def __init__(self, app: Callable, access: Access, allowed_hosts: list[str], allowed_origins: list[str],
                 max_body_bytes: int, page: PageLogins | None = None,
                 owner_of: Callable[[str], str | None] | None = None) -> None:
        self.app = app
        self.access = access
        self.any_host = "*" in allowed_hosts
        self.allowed_hosts = {h.lower().strip("[]") for h in allowed_hosts}
        self.any_origin = "*" in allowed_origins
        self.allowed_origins = {o.lower().rstrip("/") for o in allowed_origins}
        self.max_body_bytes = max_body_bytes
        self.page = page or PageLogins()
        self.owner_of = owner_of or (lambda sid: None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        path = scope.get("path", "")
        host = headers.get("host", "")
        if not self.any_host and _host_name(host).lower() not in self.allowed_hosts:
            await _deny(scope, receive, send, 400, f"Host {host!r} is not served here (see --allowed-hosts)")
            return
        origin = headers.get("origin")
        # Pages of other sites can make a browser post to this server (a local
        # one included): the doors that start sessions or change the replica
        # take posts from this server's own page only.
        checks_origin = kind == "websocket" or (scope.get("method") == "POST" and (
            path.startswith("/webrtc/") or path in OPERATOR_ROUTES))
        if origin is not None and checks_origin and not self._origin_ok(origin, host, scope):
            await _deny(scope, receive, send, 403, f"Origin {origin} is not allowed (add it to --allowed-origins)")
            return
        login, refusal = await self._login(scope, headers)
        scope = _with_login(scope, login)
        needs = route_kind(path)
        if needs == "operator" and (refusal is not None or not self._operator_ok(scope, headers, login)):
            await _deny(scope, receive, send, 403, "Operator endpoint: send the server token (Authorization: "
                                                   "Bearer), or call it from the server's own machine, not "
                                                   "through a proxy")
            return
        if needs == "login" and self.access.required and login is None:
            # The page shows a refused page call to its visitor: no markup in that one.
            status, message = refusal or ((401, "Sign in first: this page answers signed-in users only") if
                                          path.startswith("/gradio_api/") else
                                          (401, "This server needs a login: sign in on the page, or send "
                                                "'Authorization: Bearer <token>' or ?token=<token>"))
            await _deny(scope, receive, send, status, message)
            return
        if kind == "http" and scope.get("method") == "POST" and (call := _CALL_ROUTE.fullmatch(path)):
            await self._page_call(scope, receive, send, login, call.group("name"))
            return
        if kind == "http" and (path.startswith("/webrtc/") or path.startswith("/api/")):
            await self._limited(scope, receive, send, headers)
            return
        await self.app(scope, receive, send)

    async def _login(self, scope: Scope, headers: dict[str, str]) -> tuple[str | None, tuple[int, str] | None]:
        """(the caller's login, or None; why a credential it presented was refused)."""
        access = self.access
        presented = _presented_token(headers, scope)
        if presented:
            if access.token and hmac.compare_digest(access.token.encode(), presented.encode()):
                return TOKEN_LOGIN, None
            user = access.page_user(presented)
            if user is not None:
                return user_login(user), None
            return None, (403, "Invalid or expired token")
        if not access.required:
            return None, None
        cookies = cookie_parser(headers.get("cookie", ""))
        user = self.page.password_user(cookies)
        if user is not None:
            return user_login(user), None
        if access.hf_oauth:
            user = await self.page.hf_user(scope, cookies)
            if user is not None:
                if not access.hf_user_allowed(user):
                    return None, (403, f"The Hugging Face user {user!r} is not on this server's --hf-users")
                return user_login(user), None
        return None, None

    def _operator_ok(self, scope: Scope, headers: dict[str, str], login: str | None) -> bool:
        if login is not None:  # the server token, or a page's login: that never suffices
            return login == TOKEN_LOGIN
        client = (scope.get("client") or ("", 0))[0]
        return is_loopback(client or "") and not is_forwarded(headers)

    async def _page_call(self, scope: Scope, receive: Receive, send: Send, login: str | None,
                         api_name: str | None) -> None:
        """A page function run over HTTP: refused (403) when it names a
        session that another login opened; else passed on with its body."""
        buffered = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            buffered += message.get("body", b"")
            if len(buffered) > MAX_CALL_BODY:
                await _deny(scope, receive, send, 413, f"Request body too large (limit {MAX_CALL_BODY} bytes)")
                return
            if not message.get("more_body"):
                break
        body = bytes(buffered)
        if not self._may_call(body, login, api_name):
            log.info("refused a page call naming another login's session")
            await _deny(scope, receive, send, 403, "This session belongs to another login")
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    def _may_call(self, body: bytes, login: str | None, api_name: str | None) -> bool:
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            return True  # Gradio refuses it itself
        if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
            return True
        fns = {self.page.fn_by_name.get(api_name)} if api_name else set()
        if isinstance(payload.get("fn_index"), int):
            fns.add(payload["fn_index"])
        data = payload["data"]
        for fn in fns:
            position = self.page.session_inputs.get(fn)
            if position is None or position >= len(data) or not isinstance(data[position], str):
                continue
            owner = self.owner_of(data[position])
            if owner is not None and owner != login:
                return False
        return True

    def _origin_ok(self, origin: str, host: str, scope: Scope) -> bool:
        origin = origin.lower().rstrip("/")
        if self.any_origin or origin in self.allowed_origins:
            return True
        parts = urlsplit(origin)
        # Same origin: the page this server served, on the name it was reached by.
        return bool(parts.netloc) and parts.netloc == host.lower()

    async def _limited(self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str]) -> None:
        limit = self.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _deny(scope, receive, send, 413, f"Request body too large: {declared} bytes (limit {limit}, --max-body-bytes)")
            return
        received = 0
        started = False

        async def counting_receive() -> dict[str, Any]:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge()
            return message

        async def tracking_send(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await _deny(scope, receive, send, 413, f"Request body too large (limit {limit} bytes, --max-body-bytes)")


def _with_login(scope: Scope, login: str | None) -> Scope:
    """The scope with the guard's finding as its only x-vidchat-login header."""
    kept = [(k, v) for k, v in scope.get("headers", []) if k.lower() != LOGIN_HEADER.encode()]
    if login is not None:
        kept.append((LOGIN_HEADER.encode(), quote(login, safe="").encode("latin-1")))
    return dict(scope, headers=kept)


def _presented_token(headers: dict[str, str], scope: Scope) -> str | None:
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    for key, value in parse_qsl(scope.get("query_string", b"").decode("latin-1")):
        if key == "token":
            return value
    return None


async def _deny(scope: Scope, receive: Receive, send: Send, status: int, message: str) -> None:
    body = json.dumps({"detail": message}).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if scope["type"] == "websocket":
        await receive()  # websocket.connect: the handshake must be read before it is answered
        if "websocket.http.response" in scope.get("extensions", {}):
            await send({"type": "websocket.http.response.start", "status": status, "headers": head})
            await send({"type": "websocket.http.response.body", "body": body})
        else:  # the server then answers the handshake with 403
            await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
        log.info("refused a WebSocket handshake: %d %s", status, message)
        return
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})
