"""--turn cloudflare: credentials minted from a local stand-in for the
credential service (its contract: Bearer token, ttl, {"iceServers": [...]}),
cached until shortly before expiry, refreshed, never logged."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from urllib.parse import parse_qs, urlparse

import pytest
from starlette.testclient import TestClient

from vidchat.app.ice_servers import TurnError, TurnMinter, minter_from
from vidchat.app.settings import check_space_relay

pytestmark = pytest.mark.unit

KEY_ID, KEY_TOKEN, HF_TOKEN = "key-123", "cf-secret-token-abc", "hf_secret_token_xyz"


class StandIn:
    """Cloudflare's key API and the HF-token service, as far as vidchat uses them."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.status = 200
        self.payload_override: dict | None = None
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, method: str) -> None:
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else {}
                call = {"method": method, "path": url.path, "auth": self.headers.get("Authorization"),
                        "ttl": body.get("ttl") or int(parse_qs(url.query).get("ttl", ["0"])[0])}
                stand_in.calls.append(call)
                n = len(stand_in.calls)
                payload = stand_in.payload_override or {"iceServers": [
                    {"urls": ["stun:stun.example:3478"]},
                    {"urls": ["turn:turn.example:3478?transport=udp", "turns:turn.example:5349?transport=tcp"],
                     "username": f"user-{n}", "credential": f"pass-{n}", "extra": "dropped"}]}
                raw = json.dumps(payload).encode()
                self.send_response(stand_in.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_POST(self) -> None:  # noqa: N802
                self._answer("POST")

            def do_GET(self) -> None:  # noqa: N802
                self._answer("GET")

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def stand_in():
    s = StandIn()
    yield s
    s.server.shutdown()


def settings(stand_in: StandIn, **over) -> SimpleNamespace:
    values = dict(turn="cloudflare", turn_ttl=600, turn_api_url=stand_in.url + "/v1/turn/keys",
                  turn_hf_url=stand_in.url + "/credentials")
    values.update(over)
    return SimpleNamespace(**values)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_cloudflare_key_mints_once_then_serves_the_cache_until_shortly_before_expiry(stand_in, caplog):
    minter = minter_from(settings(stand_in), {"TURN_KEY_ID": KEY_ID, "TURN_KEY_API_TOKEN": KEY_TOKEN,
                                              "HF_TOKEN": HF_TOKEN})
    clock = Clock()
    minter._clock = clock
    with caplog.at_level(logging.DEBUG):
        first = await minter.ice_servers()
        assert stand_in.calls == [{"method": "POST", "path": f"/v1/turn/keys/{KEY_ID}/credentials/generate-ice-servers",
                                   "auth": f"Bearer {KEY_TOKEN}", "ttl": 600}]  # the key wins over HF_TOKEN
        assert first[1] == {"urls": ["turn:turn.example:3478?transport=udp", "turns:turn.example:5349?transport=tcp"],
                            "username": "user-1", "credential": "pass-1"}  # other fields dropped
        clock.now += 600 - 121  # still more than the margin (a fifth of 600 s) left
        assert await minter.ice_servers() == first and len(stand_in.calls) == 1
        clock.now += 2  # within 120 s of expiry: minted again
        again = await minter.ice_servers()
        assert again[1]["username"] == "user-2" and len(stand_in.calls) == 2 and minter.minted == 2
    for secret in (KEY_TOKEN, HF_TOKEN, "pass-1", "pass-2"):
        assert secret not in caplog.text
    assert "minted by Cloudflare's TURN API, valid for 600 s" in caplog.text


async def test_an_hf_token_mints_from_the_hf_route(stand_in):
    minter = minter_from(settings(stand_in, turn_ttl=3600), {"HF_TOKEN": HF_TOKEN})
    servers = await minter.ice_servers()
    assert stand_in.calls == [{"method": "GET", "path": "/credentials", "auth": f"Bearer {HF_TOKEN}", "ttl": 3600}]
    assert servers[1]["credential"] == "pass-1"


async def test_refusals_and_bad_answers_are_clear_and_carry_no_secret(stand_in):
    minter = minter_from(settings(stand_in), {"TURN_KEY_ID": KEY_ID, "TURN_KEY_API_TOKEN": KEY_TOKEN})
    stand_in.status = 401
    with pytest.raises(TurnError, match=r"Cloudflare's TURN API refused to mint TURN credentials \(HTTP 401\)") as err:
        await minter.ice_servers()
    assert KEY_TOKEN not in str(err.value)
    stand_in.status = 200
    stand_in.payload_override = {"iceServers": [{"urls": "stun:only.example"}]}
    with pytest.raises(TurnError, match="without a TURN server"):
        await minter.ice_servers()
    stand_in.payload_override = {"nothing": 1}
    with pytest.raises(TurnError, match="without iceServers"):
        await minter.ice_servers()
    stand_in.payload_override = None
    assert (await minter.ice_servers())[1]["username"].startswith("user-")  # recovers once the service does
    gone = TurnMinter("http://127.0.0.1:9/none", KEY_TOKEN, method="POST", service="the stand-in")
    with pytest.raises(TurnError, match="could not be reached"):
        await gone.ice_servers()


def test_turn_needs_a_secret_and_a_space_needs_a_relay(stand_in):
    assert minter_from(settings(stand_in, turn="off"), {"HF_TOKEN": HF_TOKEN}) is None
    with pytest.raises(ValueError, match="TURN_KEY_ID and TURN_KEY_API_TOKEN .* or HF_TOKEN"):
        minter_from(settings(stand_in), {"TURN_KEY_ID": KEY_ID})
    with pytest.raises(ValueError, match="lifetime|--turn-ttl"):
        minter_from(settings(stand_in, turn_ttl=10), {"HF_TOKEN": HF_TOKEN})
    space = {"SPACE_ID": "someone/vidchat"}
    with pytest.raises(ValueError, match="Hugging Face Space, which takes no inbound UDP"):
        check_space_relay([{"urls": "stun:stun.example"}], None, space)
    check_space_relay([{"urls": ["turn:coturn.example:3478"], "username": "u", "credential": "p"}], None, space)
    check_space_relay([], minter_from(settings(stand_in), {"HF_TOKEN": HF_TOKEN}), space)
    check_space_relay([], None, {})  # not a Space: localhost needs no relay


def test_the_page_config_and_offers_use_minted_credentials(stand_in):
    from vidchat.app.server import create_app
    from vidchat.app.settings import Settings
    from vidchat.app.state import AppState

    turn = minter_from(settings(stand_in), {"TURN_KEY_ID": KEY_ID, "TURN_KEY_API_TOKEN": KEY_TOKEN})
    state = AppState(settings=Settings(), model_path="none", ice_servers=[{"urls": "stun:static.example"}], turn=turn)
    client = TestClient(create_app(state), base_url="http://127.0.0.1")  # no lifespan: no engine loads
    for _ in range(3):  # Start pressed three times: one mint
        config = client.get("/api/config").json()
        assert [s["urls"] for s in config["iceServers"]][0] == "stun:static.example"
        assert config["iceServers"][2]["username"] == "user-1"
    assert len(stand_in.calls) == 1
    stand_in.status = 500
    turn._fresh_until = 0  # expired: the next Start must mint, and the service is down
    r = client.get("/api/config")
    assert r.status_code == 503 and "Cannot connect from behind NAT now" in r.json()["detail"]
    offer = client.post("/webrtc/offer", json={"type": "offer", "sdp": "v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96"})
    assert offer.status_code == 503 and "HTTP 500" in offer.json()["detail"]
    assert len(state.registry) == 0  # no session was left behind
