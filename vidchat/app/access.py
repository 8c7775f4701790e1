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
login is worked out once, by the middleware that enforces these rules
(:mod:`vidchat.app.guard`), and handed on in the ``x-vidchat-login`` header
(what the client sent under that name is dropped), so the page's functions
and the HTTP routes can tell whose session a call names
(vidchat.doors.login_of).
Keeping credentials out of the server's own logs is :mod:`vidchat.app.logs`.
"""

from __future__ import annotations

import asyncio
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
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable

from vidchat.doors import UPLOAD_DELETE_CACHE

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

TOKEN_LOGIN = "token"

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")

PAGE_TOKEN_TTL_S = 12 * 3600

# Query parameters whose values are credentials or session handles: never in a log line.
SECRET_PARAMS = ("token", "session_id", "resume_token")

# Each uploaded file counts at least this much: a flood of tiny files costs
# inodes and directories on disk, and records here, that its bytes would not.
MIN_UPLOAD_CHARGE = 64 << 10


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


def is_operator(login: str | None, client_host: str, headers: Any) -> bool:
    """Whether a request may use the operator routes (and see /api/health's
    process details): the server token, or a call made on this machine
    without going through a proxy; a page login never."""
    if login is not None:
        return login == TOKEN_LOGIN
    return is_loopback(client_host or "") and not is_forwarded(headers)


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
    # What one login may keep of its uploads at once (--max-upload-mb), in bytes.
    upload_bytes: int = 64 << 20
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

    def page_user(self, token: str | bytes, now: float | None = None) -> str | None:
        """The user a page token was issued to, or None (forged, expired, malformed)."""
        # A presented token is whatever a client sent: a page token is ASCII,
        # and anything else is simply not one (compare_digest raises on a
        # non-ASCII str, which would make a bad token a server error).
        if isinstance(token, bytes):
            if not token.isascii():
                return None
            token = token.decode("ascii")
        try:
            prefix, body, signature = token.split(".")
        except ValueError:
            return None
        if prefix != "p" or not hmac.compare_digest(signature.encode(), self._sign(body).encode()):
            return None
        try:
            user, expires = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except (ValueError, TypeError):
            return None
        if not isinstance(expires, int) or expires < (now or time.time()):
            return None
        return str(user)

    def accepts(self, presented: str | bytes | None) -> bool:
        if not self.required:
            return True
        if not presented:
            return False
        raw = presented if isinstance(presented, bytes) else presented.encode()
        if self.token and hmac.compare_digest(self.token.encode(), raw):
            return True
        return self.page_user(presented) is not None


def build_access(settings: Any) -> Access:
    hf_mode = settings.hf_oauth
    on_space = bool(os.environ.get("SPACE_ID"))
    hf_oauth = hf_mode == "on" or (hf_mode == "auto" and on_space and bool(os.environ.get("OAUTH_CLIENT_ID")))
    users = frozenset(u.lower() for u in split_list(settings.hf_users))
    if users and not hf_oauth:
        raise AccessError("--hf-users needs Hugging Face sign-in (--hf-oauth on, or a Space with hf_oauth: true)")
    return Access(token=settings.token, passwords=parse_auth(settings.auth), hf_oauth=hf_oauth, hf_users=users,
                  upload_bytes=int(settings.max_upload_mb * 2**20))


def default_allowed_hosts(bind_host: str) -> list[str]:
    """Host headers accepted when --allowed-hosts is empty: on a loopback bind,
    only loopback names (this is what defeats DNS rebinding); otherwise any,
    since the server cannot know the names it is reached by."""
    if is_loopback(bind_host):
        return sorted({*LOOPBACK_NAMES, bind_host})
    return ["*"]


def is_forwarded(headers: Any) -> bool:
    return any(headers.get(name) for name in FORWARDING_HEADERS)


@dataclass
class _Upload:
    at: float
    charged: int
    paths: tuple[str, ...]


def _all_gone(groups: list[tuple[str, ...]]) -> list[bool]:
    return [not any(os.path.lexists(p) for p in paths) for paths in groups]


class UploadQuota:
    """What each login keeps of its uploads, against --max-upload-mb.

    An upload stays on disk until something deletes it (vidchat once a bundle
    is read, Gradio's cache cleaning once it is older than its age, a restart),
    and none of them tells the guard. So each upload is recorded with the paths
    Gradio answered and the bytes it took, and counts until none of its files
    is left: looked up (in a worker thread) when its login uploads again, and
    dropped without a look once older than the cleaning's age plus a round,
    when Gradio has deleted it, so logins that never come back leave nothing
    here. Bytes still arriving count too: two uploads at once cannot both
    pass. Keyed by the guard (a login, or the client address when the server
    asks for none)."""

    def __init__(self, limit: int, lifetime_s: float = sum(UPLOAD_DELETE_CACHE) + 60,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.lifetime_s = lifetime_s
        self._clock = clock
        self._kept: dict[str, list[_Upload]] = {}
        self._arriving: dict[str, int] = {}

    def held(self, key: str) -> int:
        """Bytes counted against ``key`` now (kept and arriving)."""
        return sum(u.charged for u in self._kept.get(key, ())) + self._arriving.get(key, 0)

    async def refresh(self, key: str) -> int:
        """held(key), after forgetting uploads that are gone."""
        oldest = self._clock() - self.lifetime_s
        for name in list(self._kept):
            self._kept[name] = [u for u in self._kept[name] if u.at >= oldest]
            if not self._kept[name]:
                del self._kept[name]
        uploads = list(self._kept.get(key, ()))
        if uploads:
            gone = await asyncio.to_thread(_all_gone, [u.paths for u in uploads])
            dropped = {id(u) for u, g in zip(uploads, gone) if g}
            left = [u for u in self._kept.get(key, ()) if id(u) not in dropped]
            if left:
                self._kept[key] = left
            else:
                self._kept.pop(key, None)
        return self.held(key)

    def arriving(self, key: str, n: int) -> None:
        """Count ``n`` more bytes (fewer, when negative) of uploads on their way."""
        total = self._arriving.get(key, 0) + n
        if total > 0:
            self._arriving[key] = total
        else:
            self._arriving.pop(key, None)

    def record(self, key: str, paths: list[str], received: int) -> None:
        """An upload Gradio stored: its files, and the request's bytes."""
        if paths:
            charged = max(received, MIN_UPLOAD_CHARGE * len(paths))
            self._kept.setdefault(key, []).append(_Upload(self._clock(), charged, tuple(paths)))


# What the guard reads of the mounted Gradio page: who logged in (Gradio's
# password-login cookie, its Hugging Face sign-in session), which of the
# page's functions take a session id, and which login first named each of
# Gradio's session hashes and event ids.

Scope = dict[str, Any]

Receive = Callable[[], Awaitable[dict[str, Any]]]

Send = Callable[[dict[str, Any]], Awaitable[None]]


# The page's sign-in, for a password (--auth) or token login: vidchat's own
# form in front of Gradio's POST /login (Gradio's own form clears both fields
# after a wrong password; this one keeps the user name and says what went
# wrong). A Hugging Face login keeps Gradio's page and its sign-in button.
LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>vidchat: sign in</title>
<style>
  body { margin: 0; min-height: 100vh; display: grid; place-items: center; background: #f4f5f7;
         font: 16px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328; }
  form { box-sizing: border-box; width: min(360px, calc(100vw - 32px)); background: #fff; border: 1px solid #d8dbe0; border-radius: 10px;
         padding: 24px; display: flex; flex-direction: column; gap: 12px; box-shadow: 0 1px 3px rgba(0,0,0,.06); }
  h1 { font-size: 1.3rem; margin: 0 0 4px; }
  label { display: flex; flex-direction: column; gap: 4px; font-size: .9rem; }
  input { font: inherit; padding: 8px 10px; border: 1px solid #c9ccd1; border-radius: 6px; }
  button { font: inherit; font-weight: 600; padding: 9px; border: 0; border-radius: 6px; background: #4f46e5;
           color: #fff; cursor: pointer; }
  #said { margin: 0; min-height: 1.4em; color: #a93226; font-size: .9rem; }
  .hint { margin: 0; color: #57606a; font-size: .85rem; }
</style></head>
<body><form id="login" autocomplete="on">
  <h1>vidchat</h1>
  <p class="hint">{hint}</p>
  <label{user_hidden}>User name <input name="username" autocomplete="username" autofocus></label>
  <label>{password_label} <input name="password" type="password" autocomplete="current-password" required></label>
  <p id="said" role="alert"></p>
  <button type="submit">Login</button>
</form>
<script>
  const form = document.getElementById("login");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const said = document.getElementById("said");
    said.textContent = "";
    let status = 0;
    try { status = (await fetch("login", { method: "POST", body: new FormData(form) })).status; } catch (_) {}
    if (status === 200) { location.reload(); return; }
    said.textContent = status === 400 ? "Incorrect user name or password: try again."
      : status ? `The server refused the login (HTTP ${status}).` : "The server did not answer: try again.";
    const password = form.elements.password;
    password.value = "";  // the user name stays as typed
    password.focus();
  });
</script></body></html>
"""


def login_page(access: Access) -> str:
    """The sign-in page for a password or token login (the server's own, see LOGIN_PAGE)."""
    token_only = not access.passwords
    return (LOGIN_PAGE.replace("{hint}", "Sign in with the server's token." if token_only else
                               "Sign in with a user name and password of this server (--auth).")
            .replace("{user_hidden}", " hidden" if token_only else "")
            .replace("{password_label}", "Token" if token_only else "Password"))


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
    names = {}
    for endpoint, spec in blocks.get_api_info().get("named_endpoints", {}).items():
        fn_index = fn_by_name.get(endpoint.lstrip("/"), -1)
        fn = blocks.fns.get(fn_index)  # Blocks.fns: each event's function by its fn_index
        position = session_inputs.get(fn_index) if fn is not None else None
        if position is None or fn.inputs[position].skip_api:
            continue
        index = sum(1 for block in fn.inputs[:position] if not block.skip_api)
        params = spec.get("parameters", [])
        if index < len(params) and isinstance(params[index].get("parameter_name"), str):
            names[fn_index] = params[index]["parameter_name"]
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
