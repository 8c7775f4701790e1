"""Who may use this server: logins, tokens, Origin and Host checks, body limits.

Everything a request must pass before it reaches a route lives here, as one
ASGI middleware in front of the whole app, so the rules are the same for the
page's HTTP calls, the WebRTC endpoints and the WebSocket protocol.

Credentials:

* ``--token`` is for programs: ``Authorization: Bearer <token>`` or a
  ``token`` query parameter (browsers cannot set WebSocket headers).
* A page that passed Gradio's login (``--auth``, Hugging Face sign-in, or the
  token typed as a password) is handed a *page token*: a signed, expiring
  credential for the same endpoints, so nobody types the server token into a
  browser and nobody who never logged in can start a camera session.

When no credential is configured (the localhost default), nothing is asked.

Which routes need what is decided here and nowhere else (:func:`route_kind`):
every route is guarded unless :data:`PUBLIC_ROUTES` names it, so a route
added later asks for a login until someone decides otherwise; operator
routes (:data:`OPERATOR_ROUTES`) need more than a login. Each request's
login is worked out once, here, and handed on in the ``x-vidchat-login``
header (what the client sent under that name is dropped), so the page's
functions and the HTTP routes can tell whose session a call names.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from starlette.requests import cookie_parser

log = logging.getLogger(__name__)

WS_PATH = "/v1/video/chat/stream"
# Routes anyone may fetch, as the route table spells them: the page shell and
# its static assets (what an anonymous visitor needs to see a login form or a
# Sign-in button), the login routes, and the health probes load balancers,
# the Space and the test harness poll. Everything else asks for a login.
PUBLIC_ROUTES = (
    "/", "/config", "/config/", "/favicon.ico", "/theme.css", "/gradio_api/theme.css", "/robots.txt",
    "/manifest.json", "/pwa_icon", "/pwa_icon/{size}",
    "/static/vidchat/{path:path}", "/static/{path:path}", "/assets/{path:path}", "/svelte/{path:path}",
    "/login", "/login/", "/logout", "/login/huggingface", "/login/callback",
    "/gradio_api/login_check", "/gradio_api/login_check/",
    "/healthz", "/readyz", "/api/health",
)
# Routes that change the replica for everyone: the server token, or a request
# made on this machine without going through a proxy; a page login never.
OPERATOR_ROUTES = ("/api/drain", "/api/prewarm", "/api/loop-lag/reset")
# Headers a reverse proxy adds: a request carrying one came from elsewhere.
FORWARDING_HEADERS = ("forwarded", "x-forwarded-for", "x-real-ip", "x-forwarded-host")
LOGIN_HEADER = "x-vidchat-login"
TOKEN_LOGIN = "token"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
PAGE_TOKEN_TTL_S = 12 * 3600
# Query parameters whose values are credentials or session handles: never in a log line.
SECRET_PARAMS = ("token", "session_id", "resume_token")


class AccessError(ValueError):
    """A bad access option (reported at start-up)."""


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_auth(entries: Iterable[str]) -> dict[str, str]:
    """USER:PASSWORD pairs, or paths of files holding one pair per line."""
    users: dict[str, str] = {}
    for entry in entries:
        entry = entry.strip()
        if not entry:
            continue
        if ":" not in entry:
            path = Path(entry).expanduser()
            if not path.is_file():
                raise AccessError(f"--auth {entry!r}: expected USER:PASSWORD or a file of such lines")
            lines = [ln.strip() for ln in path.read_text().splitlines()]
            users.update(parse_auth(ln for ln in lines if ln and not ln.startswith("#")))
            continue
        user, password = entry.split(":", 1)
        if not user or not password:
            raise AccessError("--auth: user name and password must both be non-empty")
        users[user] = password
    return users


def _route_regex(template: str) -> str:
    """A route template as a regex: ``{x:path}`` any rest, ``{x}`` one segment."""
    parts = re.split(r"(\{[^}]+\})", template)
    return "".join((".*" if part.endswith(":path}") else "[^/]+") if part.startswith("{") else re.escape(part)
                   for part in parts)


_PUBLIC_RE = re.compile("|".join(f"(?:{_route_regex(t)})" for t in PUBLIC_ROUTES))


def route_kind(path: str) -> str:
    """'public', 'operator' or 'login': what a request for ``path`` must bring."""
    if path in OPERATOR_ROUTES:
        return "operator"
    return "public" if _PUBLIC_RE.fullmatch(path) else "login"


def user_login(name: str) -> str:
    """The login of a person (a page password, a Hugging Face account, or a page token issued to either)."""
    return f"user:{name}"


def split_list(raw: str) -> list[str]:
    return [item.strip() for item in re.split(r"[,\s]+", raw or "") if item.strip()]


@dataclass
class Access:
    """The server's credentials and what they guard."""

    token: str = ""
    passwords: dict[str, str] = field(default_factory=dict)
    hf_oauth: bool = False
    hf_users: frozenset[str] = frozenset()
    # Signs page tokens; new each start, so a restart logs every page out.
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    @property
    def required(self) -> bool:
        """Whether the guarded endpoints ask for a credential at all."""
        return bool(self.token or self.passwords or self.hf_oauth)

    @property
    def page_login(self) -> bool:
        return self.required

    def gradio_auth(self) -> Callable[[str, str], bool] | None:
        """Gradio's login check for the page (None: no password login)."""
        if self.passwords:
            passwords = self.passwords
            return lambda user, password: hmac.compare_digest(
                passwords.get(user, "\x00").encode(), str(password).encode()) and user in passwords
        if self.token and not self.hf_oauth:
            # Token only: the page's login takes the token as its password.
            token = self.token
            return lambda user, password: hmac.compare_digest(token.encode(), str(password).encode())
        return None

    def hf_user_allowed(self, username: str | None) -> bool:
        if not username:
            return False
        return not self.hf_users or username.lower() in self.hf_users

    # -- page tokens -----------------------------------------------------------
    def page_token(self, user: str, now: float | None = None) -> str:
        expires = int((now or time.time()) + PAGE_TOKEN_TTL_S)
        body = base64.urlsafe_b64encode(json.dumps([user, expires]).encode()).decode().rstrip("=")
        return f"p.{body}.{self._sign(body)}"

    def _sign(self, body: str) -> str:
        return hmac.new(self.secret, body.encode(), hashlib.sha256).hexdigest()[:32]

    def page_user(self, token: str, now: float | None = None) -> str | None:
        """The user a page token was issued to, or None (forged, expired, malformed)."""
        try:
            prefix, body, signature = token.split(".")
        except ValueError:
            return None
        if prefix != "p" or not hmac.compare_digest(signature, self._sign(body)):
            return None
        try:
            user, expires = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except (ValueError, TypeError):
            return None
        if not isinstance(expires, int) or expires < (now or time.time()):
            return None
        return str(user)

    def accepts(self, presented: str | None) -> bool:
        if not self.required:
            return True
        if not presented:
            return False
        if self.token and hmac.compare_digest(self.token.encode(), presented.encode()):
            return True
        return self.page_user(presented) is not None


def build_access(settings: Any) -> Access:
    hf_mode = settings.hf_oauth
    on_space = bool(os.environ.get("SPACE_ID"))
    hf_oauth = hf_mode == "on" or (hf_mode == "auto" and on_space and bool(os.environ.get("OAUTH_CLIENT_ID")))
    users = frozenset(u.lower() for u in split_list(settings.hf_users))
    if users and not hf_oauth:
        raise AccessError("--hf-users needs Hugging Face sign-in (--hf-oauth on, or a Space with hf_oauth: true)")
    return Access(token=settings.token, passwords=parse_auth(settings.auth), hf_oauth=hf_oauth, hf_users=users)


def default_allowed_hosts(bind_host: str) -> list[str]:
    """Host headers accepted when --allowed-hosts is empty: on a loopback bind,
    only loopback names (this is what defeats DNS rebinding); otherwise any,
    since the server cannot know the names it is reached by."""
    if is_loopback(bind_host):
        return sorted({*LOOPBACK_NAMES, bind_host})
    return ["*"]


def redact_query(target: str) -> str:
    """A request target with credential, session-id and answer-id values blanked."""
    target = re.sub(r"^/inputs/[^/?]+", "/inputs/…", target)
    path, sep, query = target.partition("?")
    if not sep:
        return target
    pairs = parse_qsl(query, keep_blank_values=True)
    return path + "?" + "&".join(f"{k}={'…' if k in SECRET_PARAMS else v}" for k, v in pairs)


class RedactAccessLog(logging.Filter):
    """Keeps tokens and session ids out of uvicorn's request lines (the HTTP
    access log and its WebSocket "accepted"/"rejected" lines)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(_has_secret(a) for a in args):
            record.args = tuple(redact_query(a) if _has_secret(a) else a for a in args)
        return True


def _has_secret(arg: Any) -> bool:
    return isinstance(arg, str) and ("?" in arg or arg.startswith("/inputs/"))


# What an open page (and a health check) asks every second or so: kept out
# of the access log when it succeeds (826 lines a minute with Talk on, once),
# so the log holds what a person would read. At --log-level debug they stay.
POLLED_PATHS = ("/webrtc/stats", "/webrtc/live", "/webrtc/talk", "/api/health", "/readyz",
                "/gradio_api/heartbeat/")


class QuietPolling(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not (isinstance(args, tuple) and len(args) >= 5) or logging.getLogger("vidchat").isEnabledFor(
                logging.DEBUG):
            return True
        _, method, path, _, status = args[:5]
        if method != "GET" or not isinstance(status, int) or not isinstance(path, str):
            return True
        path = path.split("?", 1)[0]
        if status == 503 and path in ("/api/health", "/readyz"):
            return False  # "not ready yet", asked over and over while the model loads
        return status >= 400 or not path.startswith(POLLED_PATHS)


def install_log_redaction() -> None:
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactAccessLog) for f in logger.filters):
            logger.addFilter(RedactAccessLog())
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, QuietPolling) for f in access.filters):
        access.addFilter(QuietPolling())


# ---------------------------------------------------------------------------
# The middleware
# ---------------------------------------------------------------------------

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


def login_of(headers: Any) -> str | None:
    """The login the guard found for a request (None: none asked or none given),
    from the request's headers (a Starlette Headers or any mapping)."""
    value = headers.get(LOGIN_HEADER) if headers is not None else None
    return unquote(value) if value else None


def is_forwarded(headers: Any) -> bool:
    return any(headers.get(name) for name in FORWARDING_HEADERS)


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
