"""Where a session's requests go when ``--engine-url`` names model servers.

A session's frames are worth something only on the replica that already
holds them in its prefix and encoder caches, so every request of a session
must reach the same ``vllm serve``. Two ways, both keyed by the session's
routing key (:func:`routing_key`, sent in a header, ``X-Session-ID`` by
default):

* one URL, a router in front of the replicas (vllm-router with
  ``--policy consistent_hash``, llm-d's session-affinity scorer): the router
  reads the header and pins the session; vidchat sees a single "replica";
* several URLs, no router: vidchat hashes the key onto them itself
  (:class:`HashRing`, consistent hashing: adding a replica moves only the
  sessions it takes over, about 1/N of them).

A replica that fails (refused, reset mid-answer, silent past the first-byte
timeout) is marked down for a while; its sessions go to the next replica on
the ring, whose caches are cold, and the answer's record says the session
moved (RemoteEngine).
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import logging
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import httpx

log = logging.getLogger(__name__)

DEFAULT_SESSION_HEADER = "X-Session-ID"
# Points per replica on the ring: enough that each replica's share of the
# sessions is within a few per cent of 1/N.
RING_POINTS = 160
# A replica that failed is skipped this long before a question tries it again.
DOWN_FOR_S = 5.0
# /readyz and /api/health probe the replicas at most this often.
PROBE_EVERY_S = 2.0
PROBE_TIMEOUT_S = 2.0


def routing_key(cache_salt: str | None) -> str | None:
    """The session's key for routers: an opaque hash of its cache salt, so
    the header names neither the session id (which owns its frames and
    answers) nor the salt (which keeps its prefix-cache hits its own)."""
    if not cache_salt:
        return None
    return hashlib.sha256(b"vidchat-route\0" + cache_salt.encode()).hexdigest()[:32]


def split_urls(raw: str | Iterable[str]) -> list[str]:
    """``--engine-url`` as a list: comma- or space-separated (the variable
    and the flag alike), trailing slashes dropped, duplicates once."""
    parts = raw.replace(",", " ").split() if isinstance(raw, str) else [p for r in raw for p in split_urls(r)]
    out: list[str] = []
    for part in parts:
        url = part.rstrip("/")
        if url and url not in out:
            out.append(url)
    return out


def shown_url(url: str) -> str:
    """A URL as health routes and logs show it: without any user:password."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _point(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


class HashRing:
    """Consistent hashing of keys onto replicas: each replica owns
    RING_POINTS points of a 64-bit circle and a key goes to the owner of the
    first point at or after its own hash. The order the replicas are named
    in does not matter, and a new replica only takes keys from the others."""

    def __init__(self, replicas: Sequence[str], points: int = RING_POINTS) -> None:
        if not replicas:
            raise ValueError("a hash ring needs at least one replica")
        ring = sorted((_point(f"{name}#{i}"), name) for name in replicas for i in range(points))
        self._hashes = [h for h, _ in ring]
        self._owners = [name for _, name in ring]
        self.replicas = list(replicas)

    def order(self, key: str) -> list[str]:
        """Every replica, in the order ``key`` tries them: its own first,
        then where it goes when that one is down (the next owners on the ring)."""
        start = bisect.bisect_left(self._hashes, _point(key)) % len(self._hashes)
        seen: list[str] = []
        for i in range(len(self._owners)):
            owner = self._owners[(start + i) % len(self._owners)]
            if owner not in seen:
                seen.append(owner)
                if len(seen) == len(self.replicas):
                    break
        return seen

    def owner(self, key: str) -> str:
        return self.order(key)[0]


@dataclass
class Replica:
    """One URL of ``--engine-url`` and what vidchat last saw of it."""

    url: str
    down_until: float = 0.0  # time.monotonic() before which questions skip it
    last_error: str | None = None
    probed_ok: bool | None = None  # the last /health probe (None: never probed)
    failures: int = 0

    def usable(self, now: float) -> bool:
        return now >= self.down_until

    def status(self, now: float) -> dict[str, Any]:
        healthy = self.usable(now) and self.probed_ok is not False
        return {"url": shown_url(self.url), "healthy": healthy, "failures": self.failures,
                "error": None if healthy else self.last_error}


class ReplicaPool:
    """The replicas of ``--engine-url``: which one a key goes to, which are
    down, and their health for /readyz and /api/health."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.replicas = {url: Replica(url) for url in urls}
        self.ring = HashRing(list(self.replicas))
        self._probed_at = float("-inf")
        self._probing: asyncio.Task | None = None

    @property
    def urls(self) -> list[str]:
        return list(self.replicas)

    def candidates(self, key: str | None, fallback: str) -> list[str]:
        """The replicas to try for ``key`` (or ``fallback``, a request id,
        for requests without a session), usable ones first in ring order,
        then the ones marked down (a last resort: one may have come back)."""
        order = self.ring.order(key or fallback)
        now = time.monotonic()
        return [u for u in order if self.replicas[u].usable(now)] + \
               [u for u in order if not self.replicas[u].usable(now)]

    def mark_down(self, url: str, reason: str) -> None:
        replica = self.replicas[url]
        replica.down_until = time.monotonic() + DOWN_FOR_S
        replica.last_error = reason
        replica.failures += 1
        if len(self.replicas) > 1:
            log.warning("engine replica %s is down (%s): its sessions move to the next replica for %.0f s",
                        shown_url(url), reason, DOWN_FOR_S)

    def mark_up(self, url: str) -> None:
        replica = self.replicas[url]
        if replica.down_until and replica.last_error:
            log.info("engine replica %s answers again", shown_url(url))
        replica.down_until = 0.0
        replica.probed_ok = True

    async def health(self, client: httpx.AsyncClient) -> list[dict[str, Any]]:
        """Each replica's health, probing ``/health`` at most every
        PROBE_EVERY_S (concurrent callers share one probe)."""
        if time.monotonic() - self._probed_at >= PROBE_EVERY_S:
            if self._probing is None or self._probing.done():
                self._probing = asyncio.ensure_future(self._probe(client))
            await asyncio.shield(self._probing)
        now = time.monotonic()
        return [r.status(now) for r in self.replicas.values()]

    async def _probe(self, client: httpx.AsyncClient) -> None:
        async def one(replica: Replica) -> None:
            try:
                response = await client.get(f"{replica.url}/health", timeout=PROBE_TIMEOUT_S)
                ok = response.status_code == 200
                error = None if ok else f"/health answered {response.status_code}"
            except httpx.HTTPError as exc:
                ok, error = False, f"/health: {type(exc).__name__} {exc}".strip()
            replica.probed_ok = ok
            if ok:
                # A probe is not a question: a replica marked down by a
                # failed question stays skipped for the rest of DOWN_FOR_S.
                replica.last_error = replica.last_error if not replica.usable(time.monotonic()) else None
            else:
                replica.last_error = error
                replica.down_until = max(replica.down_until, time.monotonic() + DOWN_FOR_S)

        await asyncio.gather(*(one(r) for r in self.replicas.values()))
        self._probed_at = time.monotonic()
