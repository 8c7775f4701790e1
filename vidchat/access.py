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
from urllib.parse import parse_qsl, urlsplit

log = logging.getLogger(__name__)

WS_PATH = "/v1/video/chat/stream"
# Probes that must answer without credentials (load balancers, the Space).
HEALTH_PATHS = frozenset({"/healthz", "/readyz", "/api/health"})
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


def install_log_redaction() -> None:
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactAccessLog) for f in logger.filters):
            logger.addFilter(RedactAccessLog())


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


class Guard:
    """ASGI middleware: Host, Origin, credentials and body size, in that order."""

    def __init__(self, app: Callable, access: Access, allowed_hosts: list[str], allowed_origins: list[str],
                 max_body_bytes: int) -> None:
        self.app = app
        self.access = access
        self.any_host = "*" in allowed_hosts
        self.allowed_hosts = {h.lower().strip("[]") for h in allowed_hosts}
        self.any_origin = "*" in allowed_origins
        self.allowed_origins = {o.lower().rstrip("/") for o in allowed_origins}
        self.max_body_bytes = max_body_bytes

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
        checks_origin = kind == "websocket" or (scope.get("method") == "POST" and path.startswith("/webrtc/"))
        if origin is not None and checks_origin and not self._origin_ok(origin, host, scope):
            await _deny(scope, receive, send, 403, f"Origin {origin} is not allowed (add it to --allowed-origins)")
            return
        if self._guarded(path) and self.access.required:
            presented = _presented_token(headers, scope)
            if not presented:
                await _deny(scope, receive, send, 401, "This server needs a token: send 'Authorization: Bearer <token>' "
                                               "or add ?token=<token> (the page gets one when you log in)")
                return
            if not self.access.accepts(presented):
                await _deny(scope, receive, send, 403, "Invalid or expired token")
                return
        if kind == "http" and (path.startswith("/webrtc/") or path.startswith("/api/")):
            await self._limited(scope, receive, send, headers)
            return
        await self.app(scope, receive, send)

    @staticmethod
    def _guarded(path: str) -> bool:
        if path in HEALTH_PATHS:
            return False
        return path == WS_PATH or path.startswith(("/webrtc/", "/api/", "/media/"))

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
