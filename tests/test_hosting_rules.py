"""Hosting, round 2 (issue 21), the rules without a server: which routes are
public (checked against the app's real route table in each access mode),
the guard's login header and page-call check on a stand-in app, vidchat's
extra events, the per-session memory budget, bundle manifests as untrusted
input, the decoded-size budget, the one escaping helper and the streamed zip."""

from __future__ import annotations

import asyncio
import io
import json
import time
import zipfile

import hostile_bundles as hb
import pytest
from starlette.routing import Mount

from vidchat import doors
from vidchat.app import access
from vidchat.app.access import OPERATOR_ROUTES, PUBLIC_ROUTES, Access, PageLogins, route_kind, user_login
from vidchat.app.guard import Guard
from vidchat.app.settings import forwarded_allow_ips, parse_settings
from vidchat.conversation import bundles
from vidchat.doors import as_text
from vidchat.doors.socket.config import wants_vidchat_events
from vidchat.media.session import Session, SessionSettings, check_frame_budget, session_budget_bytes

pytestmark = pytest.mark.unit

# Routes only an HF sign-in app has (Gradio adds them with OAuth); the others
# must appear in the route table of the plain app.
HF_ONLY = {"/login/huggingface", "/login/callback"}


def build_app(args: list[str], monkeypatch=None, space: bool = False):
    """The app as app.py assembles it (no engine is started)."""
    from vidchat.app.server import create_app
    from vidchat.app.state import AppState

    if space:
        import gradio.oauth

        for name, value in (("SYSTEM", "spaces"), ("SPACE_ID", "someone/vidchat"), ("OAUTH_CLIENT_ID", "cid"),
                            ("OAUTH_CLIENT_SECRET", "secret"), ("OPENID_PROVIDER_URL", "https://hf.invalid"),
                            ("OAUTH_SCOPES", "openid profile")):
            monkeypatch.setenv(name, value)
            if hasattr(gradio.oauth, name):
                monkeypatch.setattr(gradio.oauth, name, value)
    settings = parse_settings(["--model", "tiny", *args])
    state = AppState(settings=settings, model_path="tiny", access=access.build_access(settings))
    return create_app(state), state


def route_paths(app) -> set[str]:
    """Every route template of the app, the mounted Gradio page's included."""
    out: set[str] = set()

    def walk(routes, prefix=""):
        for route in routes:
            if isinstance(route, Mount):
                if hasattr(route.app, "routes"):
                    walk(route.app.routes, prefix + route.path)
                else:  # a static folder
                    out.add(prefix + route.path + "/{path:path}")
            else:
                out.add(prefix + route.path)

    walk(app.routes)
    return out


def sample_path(template: str) -> str:
    """A concrete path the route would serve."""
    import re

    path = re.sub(r"\{[^}]+:path\}", "some/file.js", template)
    return re.sub(r"\{[^}]+\}", "x1", path)


MODES = {"none": [], "token": ["--token", "t0k"], "auth": ["--auth", "alice:pw"]}


@pytest.mark.parametrize("mode", [*MODES, "hf"])
def test_every_route_of_the_real_table_is_public_only_when_listed(mode, monkeypatch):
    app, _ = build_app(MODES.get(mode, []), monkeypatch, space=mode == "hf")
    paths = route_paths(app)
    assert "/gradio_api/upload" in paths and "/gradio_api/call/{api_name}" in paths  # the page's API is there
    for template in paths:
        expected = ("public" if template in PUBLIC_ROUTES else
                    "operator" if template in OPERATOR_ROUTES else "login")
        assert route_kind(sample_path(template)) == expected, template
    if mode == "hf":
        assert HF_ONLY <= paths
    # No entry of the list names a route that does not exist (a stale public entry).
    missing = set(PUBLIC_ROUTES) - paths - HF_ONLY
    assert not missing, missing


@pytest.mark.parametrize("path", [
    "/gradio_api/upload", "/gradio_api/call/reask", "/gradio_api/queue/join", "/gradio_api/file=/etc/passwd",
    "/inputs/abc/record.json", "/openapi.json", "//gradio_api/upload", "/healthz/", "/monitoring",
    "/a-route-added-later", "/gradio_api/info",
])
def test_anything_not_listed_needs_a_login(path):
    assert route_kind(path) == "login"


def test_operator_routes_and_public_routes():
    assert {route_kind(p) for p in OPERATOR_ROUTES} == {"operator"}
    for path in ("/", "/healthz", "/readyz", "/api/health", "/static/vidchat/vidchat.js", "/assets/index-1.js",
                 "/login", "/login/huggingface", "/config"):
        assert route_kind(path) == "public", path


# ---- the guard on a stand-in app ------------------------------------------------------

def run_guard(guard: Guard, path: str, headers: dict[str, str] | None = None, method: str = "GET",
              body: bytes = b"", client: str = "127.0.0.1") -> tuple[int, dict, bytes]:
    """(status, the scope the app got or {}, the body it read)."""
    seen: dict = {}

    async def app(scope, receive, send):
        seen.update(scope)
        message = await receive()
        seen["body"] = message.get("body", b"")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    guard.app = app
    sent: list = []
    raw = [(k.lower().encode(), v.encode()) for k, v in {"host": "127.0.0.1:7860", **(headers or {})}.items()]
    scope = {"type": "http", "method": method, "path": path, "headers": raw, "query_string": b"",
             "client": (client, 5555)}
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(guard(scope, receive, send))
    return sent[0]["status"], seen, seen.get("body", b"")


def guard_with(access_: Access, owners: dict[str, str] | None = None) -> Guard:
    page = PageLogins()
    page.session_inputs, page.fn_by_name = {3: 2}, {"ask": 3}
    return Guard(None, access_, ["127.0.0.1"], [], 64 * 1024, page=page, owner_of=(owners or {}).get)


def test_the_login_header_is_the_guards_own():
    guard = guard_with(Access(token="t0k"))
    status, scope, _ = run_guard(guard, "/gradio_api/info", {"X-Vidchat-Login": "token"})
    assert status == 401 and not scope  # a client cannot claim a login
    status, scope, _ = run_guard(guard, "/gradio_api/info", {"Authorization": "Bearer t0k",
                                                              "X-Vidchat-Login": "user:mallory"})
    logins = [v for k, v in scope["headers"] if k == b"x-vidchat-login"]
    assert status == 200 and logins == [b"token"]
    page_token = guard.access.page_token("alice")
    status, scope, _ = run_guard(guard, "/webrtc/stats", {"Authorization": f"Bearer {page_token}"})
    assert status == 200 and doors.login_of({"x-vidchat-login": dict(scope["headers"])[b"x-vidchat-login"]
                                             .decode()}) == user_login("alice")
    assert run_guard(guard, "/webrtc/stats", {"Authorization": "Bearer p.forged.sig"})[0] == 403


def test_a_page_call_naming_another_logins_session_is_refused_before_it_runs():
    guard = guard_with(Access(token="t0k"), owners={"sid-of-alice": user_login("alice")})
    alice = {"Authorization": f"Bearer {Access.page_token(guard.access, 'alice')}"}
    body = json.dumps({"data": ["q", [], "sid-of-alice"]}).encode()
    for path, payload in (("/gradio_api/call/ask", body),
                          ("/gradio_api/queue/join", json.dumps({"data": ["q", [], "sid-of-alice"],
                                                                  "fn_index": 3}).encode())):
        status, scope, _ = run_guard(guard, path, {"Authorization": "Bearer t0k"}, "POST", payload)
        assert status == 403 and not scope, path
        status, _, passed = run_guard(guard, path, alice, "POST", payload)
        assert status == 200 and passed == payload  # the owner's call goes on, its body intact
    other = json.dumps({"data": ["q", [], "not-a-session"]}).encode()
    assert run_guard(guard, "/gradio_api/call/ask", {"Authorization": "Bearer t0k"}, "POST", other)[0] == 200


def test_operator_routes_take_the_token_or_a_local_call_without_a_proxy():
    guard = guard_with(Access(token="t0k", passwords={"alice": "pw"}))
    page = {"Authorization": f"Bearer {guard.access.page_token('alice')}"}
    for path in OPERATOR_ROUTES:
        assert run_guard(guard, path, page, "POST", b"{}")[0] == 403, path
        assert run_guard(guard, path, {"X-Forwarded-For": "203.0.113.9"}, "POST", b"{}")[0] == 403
        assert run_guard(guard, path, {}, "POST", b"{}", client="203.0.113.9")[0] == 403
        assert run_guard(guard, path, {"Origin": "https://evil.example"}, "POST", b"{}")[0] == 403
        assert run_guard(guard, path, {}, "POST", b"{}")[0] == 200
        assert run_guard(guard, path, {"Authorization": "Bearer t0k", "X-Forwarded-For": "203.0.113.9"},
                         "POST", b"{}", client="203.0.113.9")[0] == 200


def test_forwarded_allow_ips_resolution():
    assert forwarded_allow_ips(parse_settings([]), on_space=False) == "127.0.0.1,::1"
    assert forwarded_allow_ips(parse_settings([]), on_space=True) == "*"
    assert forwarded_allow_ips(parse_settings(["--forwarded-allow-ips", "10.0.0.2"]), on_space=True) == "10.0.0.2"


def test_forwarded_allow_ips_from_the_environment(monkeypatch):
    monkeypatch.setenv("VIDCHAT_FORWARDED_ALLOW_IPS", "10.1.2.3")
    assert parse_settings([]).forwarded_allow_ips == "10.1.2.3"


# ---- vidchat's extra events ------------------------------------------------------------

def test_only_clients_that_know_vidchat_get_its_extra_events():
    seed = {"type": "session.config", "model": "m", "max_frames": 16, "num_sample_frames": 4,
            "evs_enabled": True, "evs_threshold": 0.95}
    omni = {"type": "session.config", "num_frames": 4, "enable_frame_filter": True, "system_prompt": "x",
            "use_audio_in_video": True}
    assert not wants_vidchat_events(seed) and not wants_vidchat_events(omni)
    assert wants_vidchat_events({**seed, "vidchat_events": True})
    assert wants_vidchat_events({**seed, "max_tokens": 8}) and wants_vidchat_events({"keepalive_s": 5})
    assert not wants_vidchat_events({"max_tokens": 8, "vidchat_events": False})
    assert wants_vidchat_events({"type": "session.update"}, already=True)


def test_vidchat_events_must_be_a_bool():
    from vidchat.doors.socket.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match="vidchat_events"):
        parse_config({"vidchat_events": "yes"})


# ---- the per-session memory budget ---------------------------------------------------------

def test_the_default_budget_holds_64_frames_at_the_stored_size():
    budget = session_budget_bytes(0, 320 * 240)
    assert 15 * 2**20 <= budget < 16 * 2**20  # a little over 15 MB
    check_frame_budget(64, 320 * 240, budget)
    with pytest.raises(ValueError, match=r"max_frames 1024 .*--max-session-mb"):
        check_frame_budget(1024, 320 * 240, budget)
    assert session_budget_bytes(100, 320 * 240) == 100 * 2**20


def test_a_session_refuses_settings_over_its_budget_and_keeps_its_own():
    budget = session_budget_bytes(0, 320 * 240)
    session = Session("s", SessionSettings(max_frames=64), store_max_pixels=320 * 240, max_bytes=budget)
    with pytest.raises(ValueError, match="--max-session-mb"):
        session.update_settings(max_frames=256)
    assert session.settings.max_frames == 64
    with pytest.raises(ValueError, match="max_frames"):
        Session("t", SessionSettings(max_frames=1024), store_max_pixels=320 * 240, max_bytes=budget)


# ---- bundles as untrusted input -------------------------------------------------------------

def test_markup_in_every_string_field_is_read_as_text(tmp_path):
    bundle = bundles.read_bundle(hb.hostile_zip(tmp_path / "hostile.zip"))
    answer = bundles.recorded_answer(bundle)
    from vidchat.doors.page import compare_html

    page = compare_html(answer, None, "", "note")
    assert "<img" not in page and "<script" not in page and "<svg" not in page
    assert as_text(hb.MARKUP) in page  # shown, as text


@pytest.mark.parametrize("group, name", hb.NUMBER_FIELDS)
def test_markup_in_a_number_field_is_refused_by_name(tmp_path, group, name):
    pixels = hb.frames()
    meta = hb.with_value(hb.manifest(pixels), group, name, hb.MARKUP)
    with pytest.raises(bundles.BundleError) as refused:
        bundles.read_bundle(hb.write_zip(tmp_path / "b.zip", pixels, meta))
    assert f"'{name}'" in str(refused.value) or f".{name}" in str(refused.value), refused.value


@pytest.mark.parametrize("group, name, value", [
    ("settings", "temperature", 101.0), ("settings", "max_tokens", 0), ("settings", "seed", 1 << 70),
    ("settings", "temperature", True), ("tokens", "prompt_tokens", -1), ("timings", "ttft_ms", -5),
    ("settings", "num_sample_frames", 100_000), ("", "history", [{"role": "system", "content": "x"}]),
    ("", "history", "<b>"), ("frames", "height", 0),
])
def test_wrong_types_and_ranges_are_refused_like_any_bad_setting(tmp_path, group, name, value):
    pixels = hb.frames()
    meta = hb.with_value(hb.manifest(pixels), group, name, value)
    with pytest.raises(bundles.BundleError, match=name):
        bundles.read_bundle(hb.write_zip(tmp_path / "b.zip", pixels, meta))


def test_a_bundle_whose_frames_would_decode_past_the_budget_is_refused_before_decoding(tmp_path):
    meta = hb.manifest([hb.frames(1)[0]] * bundles.MAX_BUNDLE_FRAMES)
    for entry in meta["frames"]:
        entry["width"] = entry["height"] = 4096
    path = hb.write_zip(tmp_path / "bomb.zip", [], meta)  # no frame files: it must not get that far
    started = time.perf_counter()
    with pytest.raises(bundles.BundleError, match=r"would decode to 49152 MB.*at most 512 MB"):
        bundles.read_bundle(path)
    assert time.perf_counter() - started < 1.0


def test_a_frame_whose_header_lies_about_its_size_is_refused_before_decoding(tmp_path):
    pixels = hb.frames(2, (64, 48))
    meta = hb.manifest(pixels)
    meta["frames"][1]["width"], meta["frames"][1]["height"] = 32, 24  # the file is 64x48
    with pytest.raises(bundles.BundleError, match="the manifest says 32x24"):
        bundles.read_bundle(hb.write_zip(tmp_path / "b.zip", pixels, meta))


def test_the_escaping_helper_escapes_quotes_and_any_value():
    assert as_text("<a href='x' title=\"y\">&") == "&lt;a href=&#x27;x&#x27; title=&quot;y&quot;&gt;&amp;"
    assert as_text(3.5) == "3.5" and as_text(None) == "None"


# ---- the streamed zip -------------------------------------------------------------------------

def test_the_bundles_zip_is_streamed_in_pieces_and_reads_back(tmp_path):
    folders = []
    for n in range(3):
        pixels = hb.frames(3, (64, 48))
        zipped = hb.write_zip(tmp_path / f"{n}.zip", pixels, hb.manifest(pixels))
        folder = tmp_path / f"000{n + 1}"
        folder.mkdir()
        with zipfile.ZipFile(zipped) as zf:
            for member in zf.namelist():
                (folder / member.split("/", 1)[1]).write_bytes(zf.read(member))
        folders.append(folder)
    pieces = list(bundles.iter_zip_bundles(folders, chunk=256))
    assert len([p for p in pieces if p]) > len(folders) * 4  # written as it goes, not at the end
    data = b"".join(pieces)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert zf.testzip() is None
        assert sorted({n.split("/")[0] for n in zf.namelist()}) == ["0001", "0002", "0003"]
    one = tmp_path / "one.zip"
    one.write_bytes(bundles.zip_bundles(folders[:1]))
    assert bundles.read_bundle(one).digest() == bundles.read_bundle(one).inputs_sha256


def test_a_sessions_bundles_are_bounded_in_memory(tmp_path):
    from vidchat.conversation import runs
    from vidchat.conversation.conversation import Conversation

    entry = Conversation(Session("s"), kind="ws")
    for n in range(runs.KEEP_BUNDLES_PER_SESSION + 5):
        runs.keep_bundle(entry, f"a{n}", tmp_path / f"b{n}")
    assert len(entry.bundles) == runs.KEEP_BUNDLES_PER_SESSION
    assert "a0" not in entry.bundles and f"a{runs.KEEP_BUNDLES_PER_SESSION + 4}" in entry.bundles


def test_the_docs_document_the_public_routes_and_the_new_limits():
    from conftest import ROOT

    readme = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    for words in ("--forwarded-allow-ips", "VIDCHAT_FORWARDED_ALLOW_IPS", "--max-session-mb", "vidchat_events",
                  "512 MB", "`/gradio_api/*`"):
        assert words in readme, words
    for route in ("/", "/healthz", "/readyz", "/api/health", *OPERATOR_ROUTES):
        assert f"`{route}`" in readme, route
