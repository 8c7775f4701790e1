"""The access rules enforced: one ASGI middleware in front of the whole app
(Gradio's routes included) that checks Host and Origin, works out the
caller's login, asks what the route needs (vidchat.app.access.route_kind),
checks whose session (vidchat's, and Gradio's session hashes and event ids) a
request names, limits body sizes and each login's uploads."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
from typing import Any, Callable, NamedTuple
from urllib.parse import parse_qsl, quote, unquote_to_bytes, urlsplit

from starlette.formparsers import MultiPartException
from starlette.requests import cookie_parser

from vidchat.app.access import (
    TOKEN_LOGIN,
    Access,
    GradioHandles,
    PageLogins,
    Receive,
    Scope,
    Send,
    UploadQuota,
    is_operator,
    login_page,
    route_kind,
    user_login,
)
from vidchat.doors import LOGIN_HEADER, UPLOAD_DELETE_CACHE, UPLOAD_ROUTE

log = logging.getLogger(__name__)


class UploadStopped(MultiPartException):
    """Raised into Gradio's upload parser to end an upload: being its own
    parse error, it makes the parser delete the part files it has written
    (for any other exception, a client gone included, it leaves them on disk,
    where nothing would ever delete them)."""


def _host_name(host_header: str) -> str:
    if host_header.startswith("["):  # [::1]:7860
        return host_header[1 : host_header.find("]")] if "]" in host_header else host_header
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


# Page API routes that run one of the page's functions with the inputs in
# their JSON body, read to see whose session it names (/call/v2: by name).
_CALL_ROUTE = re.compile(r"/gradio_api/(?:queue/join|(?P<v2>call/v2/)(?P<v2name>[^/]+)|(?:call|run|api)/(?P<name>[^/]+))/?")
# Of those, the ones that answer with the event id they queued.
_QUEUES = re.compile(r"/gradio_api/(?:queue/join|call/(?:v2/)?[^/]+)/?")
# Gradio session hashes and event ids named in a URL (GET, or a stream's POST).
_HANDLE_IN_PATH = re.compile(r"/gradio_api/(?:heartbeat/(?P<hash>[^/]+)|call/(?:v2/)?[^/]+/(?P<event>[^/]+)"
                             r"|stream/(?P<stream>[^/]+)(?:/close)?)/?")
# Bodies up to this size are parsed on the event loop (well under a millisecond);
# larger ones, up to --max-body-bytes, in a worker thread.
PARSE_ON_LOOP_BYTES = 64 << 10


class BodyBound(NamedTuple):
    path: str  # a route, or all routes under it when it ends with "/" ("": any other)
    limit: int | None  # bytes; None: --max-body-bytes
    carries: str  # what such a body is, as its 413 says


# The one table of request-body bounds (docs/hosting.md gives the figures):
# each route's body is bounded by what its content needs, and refused with
# 413 before anything of it is parsed; the first entry that matches applies.
# One 16 MiB figure for every route once let a 117 KB "offer" be parsed. The
# page's file upload is not here: it is streamed within --max-upload-mb.
BODY_BOUNDS = (
    # A browser's SDP offer (one video, one audio track, a data channel and
    # their candidates) is a few KB; ten times that still fits.
    BodyBound("/webrtc/offer", 64 << 10, "a WebRTC offer"),
    # A question at its longest (64 Ki characters, 768 KiB JSON-escaped) and its settings.
    BodyBound("/gradio_api/", None, "a page call (a question and its settings, --max-body-bytes)"),
    BodyBound("/webrtc/ask", None, "the page's question and its settings (--max-body-bytes)"),
    # The page's reports (/webrtc/*), /api/*, suite and input routes: small JSON.
    BodyBound("", 64 << 10, "this route's request"),
)


def body_bound(path: str, max_body_bytes: int) -> tuple[int, str]:
    """(the largest body ``path`` takes, in bytes; what it carries), from BODY_BOUNDS."""
    route = path.rstrip("/") or "/"
    for bound in BODY_BOUNDS:
        if route == bound.path or (bound.path.endswith("/") and path.startswith(bound.path)) or not bound.path:
            return (max_body_bytes if bound.limit is None else bound.limit), bound.carries
    raise AssertionError("BODY_BOUNDS ends with a catch-all")


_SAFE_METHODS = ("GET", "HEAD")


class Guard:
    """ASGI middleware: Host, Origin, the caller's login, what the route
    needs (route_kind), body size, and whose session a request names, in
    that order; uploads against the login's quota."""

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
        self.handles = GradioHandles()
        self.uploads = UploadQuota(access.upload_bytes)

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
        method = scope.get("method", "GET")
        # Pages of other sites can make a browser send this server requests (a
        # local one included), "simple" ones with no preflight: anything that
        # may change something (starts a session, runs a page function,
        # stores an upload, changes the replica) comes from this server's own
        # page or an allowed origin only.
        if (origin is not None and (kind == "websocket" or method not in _SAFE_METHODS)
                and not self._origin_ok(origin, host, scope)):
            await _deny(scope, receive, send, 403, f"Origin {origin} is not allowed (add it to --allowed-origins)")
            return
        login, refusal = await self._login(scope, headers)
        scope = _with_login(scope, login)
        if (kind == "http" and method in _SAFE_METHODS and path == "/" and login is None
                and self.access.gradio_auth() is not None and not self.access.hf_oauth):
            await _html(send, login_page(self.access))  # not signed in yet: vidchat's own sign-in form
            return
        needs = route_kind(path)
        if needs == "operator" and (refusal is not None or not is_operator(login, (scope.get("client") or ("", 0))[0], headers)):
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
        if kind == "websocket":
            await self.app(scope, receive, send)
            return
        if not all(self.handles.claim(h, login) for h in _handles_in_url(scope, path)):
            await _deny(scope, receive, send, 403, "This page session belongs to another login")
            return
        if method == "POST" and path == UPLOAD_ROUTE:
            await _upload(self.app, self.uploads, scope, receive, send, headers, login)
            return
        body = await self._body(scope, receive, send, headers)
        if body is None:
            return
        if method == "POST" and path.startswith("/gradio_api/"):
            if not await self._may_send(body, login, _CALL_ROUTE.fullmatch(path)):
                log.info("refused a page call naming another login's session")
                await _deny(scope, receive, send, 403, "This session belongs to another login")
                return
            if login is not None and _QUEUES.fullmatch(path):
                scope, send = _uncompressed(scope), self._claiming_event_ids(send, login)
        await self.app(scope, _replay(body, receive), send)

    async def _login(self, scope: Scope, headers: dict[str, str]) -> tuple[str | None, tuple[int, str] | None]:
        """(the caller's login, or None; why a credential it presented was refused)."""
        access = self.access
        presented = _presented_token(headers, scope)
        if presented:
            # Bytes, as sent: a token is compared whatever characters it holds.
            if access.token and hmac.compare_digest(access.token.encode(), presented):
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

    async def _body(self, scope: Scope, receive: Receive, send: Send, headers: dict[str, str]) -> bytes | None:
        """The whole request body, at most its route's bound (body_bound);
        None when it was refused (413, answered) or the client went away."""
        limit, carries = body_bound(scope.get("path", ""), self.max_body_bytes)
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _deny(scope, receive, send, 413, f"Request body too large: {declared} bytes; {carries} takes "
                                                   f"at most {limit} bytes")
            return None
        buffered = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            buffered += message.get("body", b"")
            if len(buffered) > limit:
                await _deny(scope, receive, send, 413, f"Request body too large: over {limit} bytes, the most "
                                                       f"{carries} takes")
                return None
            if not message.get("more_body"):
                return bytes(buffered)

    async def _may_send(self, body: bytes, login: str | None, call: re.Match | None) -> bool:
        """Whether a page API body names only what ``login`` may use: no
        Gradio session or event of another login, and (a page function's
        call) no vidchat session another login opened."""
        if login is None and not call:
            return True  # nothing to tell apart
        try:
            payload = json.loads(body or b"{}") if len(body) <= PARSE_ON_LOOP_BYTES else \
                await asyncio.to_thread(json.loads, body)
        except ValueError:
            return True  # Gradio refuses it itself
        if not isinstance(payload, dict):
            return True
        v2 = bool(call and call.group("v2"))
        if not v2 and not all(self.handles.claim(payload.get(k), login) for k in ("session_hash", "event_id")):
            return False
        if not call:
            return True
        api_name = call.group("v2name") or call.group("name")
        fns = {self.page.fn_by_name.get(api_name)} if api_name else set()
        if not v2 and isinstance(payload.get("fn_index"), int):
            fns.add(payload["fn_index"])
        for fn in fns - {None}:
            for sid in self._session_args(fn, payload, v2):
                owner = self.owner_of(sid)
                if owner is not None and owner != login:
                    return False
        return True

    def _session_args(self, fn: int, payload: dict, v2: bool) -> list[str]:
        """The session ids a call of page function ``fn`` names."""
        position = self.page.session_inputs.get(fn)
        if position is None:
            return []
        if v2:  # named arguments
            name = self.page.session_params.get(fn)
            values = [payload.get(name)] if name is not None else list(payload.values())
        else:
            data = payload.get("data")
            values = [data[position]] if isinstance(data, list) and position < len(data) else []
        return [v for v in values if isinstance(v, str)]

    def _claiming_event_ids(self, send: Send, login: str) -> Send:
        """``send``, noting the event id a queued call answers with as ``login``'s."""
        answer = bytearray()

        async def claiming_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and len(answer) < 4096:
                answer.extend(message.get("body", b""))
                if not message.get("more_body"):
                    try:
                        event_id = json.loads(answer).get("event_id")
                    except (ValueError, AttributeError):
                        event_id = None
                    self.handles.claim(event_id, login)
            await send(message)

        return claiming_send

    def _origin_ok(self, origin: str, host: str, scope: Scope) -> bool:
        origin = origin.lower().rstrip("/")
        if self.any_origin or origin in self.allowed_origins:
            return True
        parts = urlsplit(origin)
        # Same origin: the page this server served, on the name it was reached by.
        return bool(parts.netloc) and parts.netloc == host.lower()


async def _upload(app: Callable, quota: UploadQuota, scope: Scope, receive: Receive, send: Send,
                  headers: dict[str, str], login: str | None) -> None:
    """Gradio's upload, streamed to it (the one route --max-body-bytes
    leaves out) within what the login may keep (--max-upload-mb)."""
    key = login or "client:" + str((scope.get("client") or ("",))[0])
    held = await quota.refresh(key)
    declared = headers.get("content-length")
    size = int(declared) if declared is not None and declared.isdigit() else 0
    if held + size > quota.limit or quota.limit == 0:
        await _deny(scope, receive, send, 413, _over_quota(quota.limit, held, size))
        return
    received, done, stopped = 0, False, ""
    status, answer = 0, bytearray()

    async def counting_receive() -> dict[str, Any]:
        nonlocal received, done, stopped
        message = await receive()
        if message["type"] == "http.disconnect" and not done:
            stopped = "gone"
            raise UploadStopped("the client went away")
        if message["type"] == "http.request":
            chunk = len(message.get("body", b""))
            received += chunk
            quota.arriving(key, chunk)
            done = not message.get("more_body")
            if quota.held(key) > quota.limit:
                stopped = "quota"
                raise UploadStopped("over the upload quota")
        return message

    async def tracking_send(message: dict[str, Any]) -> None:
        nonlocal status
        if stopped:
            return  # Gradio's answer to the stop; the guard's goes instead
        if message["type"] == "http.response.start":
            status = message["status"]
        elif len(answer) < 1 << 20:
            answer.extend(message.get("body", b""))
        await send(message)

    try:
        await app(_uncompressed(scope), counting_receive, tracking_send)
    except UploadStopped:
        pass  # raised past Gradio's parser; its files are already deleted
    finally:
        quota.arriving(key, -received)
    if stopped == "quota":
        await _deny(scope, receive, send, 413, _over_quota(quota.limit, quota.held(key), max(size, received)))
    elif status == 200:
        try:
            paths = [p for p in json.loads(answer) if isinstance(p, str)]
        except (ValueError, TypeError):
            paths = []
        quota.record(key, paths, received)


def _over_quota(limit: int, held: int, size: int) -> str:
    if limit == 0:
        return "Uploads are off on this server (--max-upload-mb 0)"
    return (f"Upload refused: a login keeps at most {_size(limit)} of uploads here (--max-upload-mb); "
            f"{_size(held)} of its uploads are kept now and this one is {_size(size)}. An upload is deleted "
            f"once it is read (a bundle), any other within {sum(UPLOAD_DELETE_CACHE) // 60} minutes.")


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MB" if n >= 1 << 20 else f"{max(n, 0) / 1024:.0f} KB"


def _uncompressed(scope: Scope) -> Scope:
    """The scope without Accept-Encoding: an answer the guard reads (a few
    paths or an event id) must not come back compressed by Gradio."""
    return dict(scope, headers=[(k, v) for k, v in scope["headers"] if k.lower() != b"accept-encoding"])


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the buffered body first, then the client's own messages."""
    replayed = False

    async def replay() -> dict[str, Any]:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _handles_in_url(scope: Scope, path: str) -> list[str]:
    """The Gradio session hashes and event ids a request's URL names."""
    found = []
    if path == "/gradio_api/queue/data":
        found += [v for k, v in parse_qsl(scope.get("query_string", b"").decode("latin-1")) if k == "session_hash"]
    elif path.startswith("/gradio_api/") and (match := _HANDLE_IN_PATH.fullmatch(path)):
        if scope.get("method") in _SAFE_METHODS or match.group("stream"):
            found += [h for h in match.groups() if h]
    return found


def _with_login(scope: Scope, login: str | None) -> Scope:
    """The scope with the guard's finding as its only x-vidchat-login header."""
    kept = [(k, v) for k, v in scope.get("headers", []) if k.lower() != LOGIN_HEADER.encode()]
    if login is not None:
        kept.append((LOGIN_HEADER.encode(), quote(login, safe="").encode("latin-1")))
    return dict(scope, headers=kept)


def _presented_token(headers: dict[str, str], scope: Scope) -> bytes | None:
    """The token a request presents, as the bytes it sent (a ?token= percent-decoded)."""
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip().encode("latin-1")  # the header's own bytes back
    # Read from the raw query: parse_qsl cannot give bytes back for a query with non-ASCII in it.
    for pair in scope.get("query_string", b"").split(b"&"):
        key, _, value = pair.partition(b"=")
        if unquote_to_bytes(key.replace(b"+", b" ")) == b"token":
            return unquote_to_bytes(value.replace(b"+", b" "))
    return None


async def _html(send: Send, page: str) -> None:
    body = page.encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/html; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})


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
