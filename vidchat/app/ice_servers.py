"""Short-lived TURN credentials for hosted use (``--turn cloudflare``).

A browser behind NAT reaches the server's peer only through a TURN relay, and
a relay's credentials should not live in the page for days. With
``--turn cloudflare`` each **Start camera** (``/api/config``) and each
WebRTC offer gets ICE servers minted by Cloudflare's TURN service, cached
until shortly before they expire:

* with a Cloudflare TURN key (``TURN_KEY_ID`` and ``TURN_KEY_API_TOKEN`` in
  the environment): Cloudflare's own credential API;
* else with ``HF_TOKEN``: the credential service FastRTC's users reach with a
  Hugging Face token (Hugging Face accounts get some relay traffic free).

Secrets come from the environment, never from flags (a command line is
visible to every local user), and neither they nor the minted credentials
are logged: errors name the service and the HTTP status only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Mapping

from vidchat.doors import IceUnavailable

log = logging.getLogger(__name__)


CLOUDFLARE_KEYS_URL = "https://rtc.live.cloudflare.com/v1/turn/keys"

FASTRTC_CREDENTIALS_URL = "https://turn.fastrtc.org/credentials"

# Refresh this long before expiry (at most a fifth of the lifetime): a page
# may take a while between fetching its configuration and connecting.
REFRESH_MARGIN_S = 300.0

REQUEST_TIMEOUT_S = 10.0

ICE_FIELDS = ("urls", "username", "credential")


class TurnError(IceUnavailable):
    """No credentials could be minted; the message is safe to show and log."""


class TurnMinter:
    """Mints and caches ICE servers from one credential service."""

    def __init__(self, url: str, bearer: str, *, method: str, service: str, ttl_s: int = 3600,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_s < 60:
            raise ValueError(f"--turn-ttl must be at least 60 s, got {ttl_s}")
        self.url, self._bearer, self.method, self.service = url, bearer, method, service
        self.ttl_s = ttl_s
        self._clock = clock
        self._cached: list[dict[str, Any]] | None = None
        self._fresh_until = 0.0
        self._lock = asyncio.Lock()
        self.minted = 0  # how many times the service was asked (tests, /api/health)

    async def ice_servers(self) -> list[dict[str, Any]]:
        """Valid ICE servers, minted anew only when the cached ones are near expiry."""
        async with self._lock:  # one mint at a time: a burst of Start presses asks once
            if self._cached is None or self._clock() >= self._fresh_until:
                servers = await asyncio.to_thread(self._mint)
                margin = min(REFRESH_MARGIN_S, self.ttl_s / 5)
                self._cached, self._fresh_until = servers, self._clock() + self.ttl_s - margin
                self.minted += 1
                log.info("TURN credentials minted by %s, valid for %d s", self.service, self.ttl_s)
            return [dict(s) for s in self._cached]

    def _mint(self) -> list[dict[str, Any]]:
        body = json.dumps({"ttl": self.ttl_s}).encode() if self.method == "POST" else None
        url = self.url if self.method == "POST" else f"{self.url}?ttl={self.ttl_s}"
        request = urllib.request.Request(url, data=body, method=self.method, headers={
            "Authorization": f"Bearer {self._bearer}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                payload = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise TurnError(f"{self.service} refused to mint TURN credentials (HTTP {exc.code})") from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TurnError(f"{self.service} could not be reached for TURN credentials ({reason})") from None
        except ValueError:
            raise TurnError(f"{self.service} answered with something that is not JSON") from None
        return parse_ice_servers(payload, self.service)


def parse_ice_servers(payload: Any, service: str) -> list[dict[str, Any]]:
    """``{"iceServers": [...]}`` (or one server object, as Cloudflare's older
    endpoint answers) as a list of RTCIceServer dicts, other fields dropped."""
    servers = payload.get("iceServers") if isinstance(payload, dict) else None
    if isinstance(servers, dict):
        servers = [servers]
    if not isinstance(servers, list) or not servers:
        raise TurnError(f"{service} answered without iceServers")
    out = []
    for server in servers:
        if not isinstance(server, dict) or not server.get("urls"):
            raise TurnError(f"{service} answered with an ICE server without urls")
        out.append({k: server[k] for k in ICE_FIELDS if k in server})
    if not any(has_relay(s) for s in out):
        raise TurnError(f"{service} answered without a TURN server")
    return out


def has_relay(server: Mapping[str, Any]) -> bool:
    urls = server.get("urls")
    urls = [urls] if isinstance(urls, str) else urls or []
    return any(isinstance(u, str) and u.split(":", 1)[0] in ("turn", "turns") for u in urls)


def minter_from(settings: Any, env: Mapping[str, str] | None = None) -> TurnMinter | None:
    """The minter ``--turn`` asks for (None for ``off``); raises ValueError
    naming what is missing."""
    if settings.turn == "off":
        return None
    env = os.environ if env is None else env
    key_id, key_token = env.get("TURN_KEY_ID", ""), env.get("TURN_KEY_API_TOKEN", "")
    if key_id and key_token:
        return TurnMinter(f"{settings.turn_api_url.rstrip('/')}/{key_id}/credentials/generate-ice-servers",
                          key_token, method="POST", service="Cloudflare's TURN API", ttl_s=settings.turn_ttl)
    if env.get("HF_TOKEN"):
        return TurnMinter(settings.turn_hf_url, env["HF_TOKEN"], method="GET",
                          service="the Hugging Face TURN credential service", ttl_s=settings.turn_ttl)
    raise ValueError("--turn cloudflare needs TURN_KEY_ID and TURN_KEY_API_TOKEN (a Cloudflare TURN key), "
                     "or HF_TOKEN, in the environment")
