"""Past one machine, the parts without a model server: the consistent hash
that pins sessions to replicas, the routing key and its header, the options
(vidchat.engine.remote, vidchat.engine.remote). The real replicas and
vllm-router are test_router's."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import numpy as np
import pytest

from vidchat.app.settings import parse_settings
from vidchat.engine import EngineError, EngineOptions
from vidchat.engine.remote import HashRing, RemoteEngine, ReplicaPool, routing_key, shown_url, split_urls

pytestmark = pytest.mark.unit

KEYS = [routing_key(f"salt-{i}") for i in range(4000)]
TWO = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
THREE = [*TWO, "http://10.0.0.3:8000"]


def test_a_key_always_goes_to_the_same_replica_whatever_order_the_urls_come_in():
    ring, reordered = HashRing(THREE), HashRing(list(reversed(THREE)))
    owners = [ring.owner(k) for k in KEYS]
    assert owners == [ring.owner(k) for k in KEYS] == [reordered.owner(k) for k in KEYS]
    shares = {url: owners.count(url) / len(KEYS) for url in THREE}
    assert all(0.23 < share < 0.43 for share in shares.values()), shares


def test_adding_a_replica_moves_only_its_share_and_only_to_it():
    before, after = HashRing(TWO), HashRing(THREE)
    moved = [k for k in KEYS if before.owner(k) != after.owner(k)]
    assert {after.owner(k) for k in moved} == {THREE[2]}  # nothing moves between the old ones
    assert 0.25 < len(moved) / len(KEYS) < 0.42, len(moved)  # about 1/3
    # Removing it again puts every key back where it was.
    assert all(before.owner(k) == HashRing(TWO).owner(k) for k in moved)


def test_a_down_replica_is_skipped_and_its_keys_go_to_the_next_one_on_the_ring():
    pool = ReplicaPool(THREE)
    homes = {k: pool.candidates(k, "rid")[0] for k in KEYS[:600]}
    pool.mark_down(THREE[0], "refused")
    for key, home in homes.items():
        order = pool.candidates(key, "rid")
        assert order[-1] == THREE[0]  # tried last, in case it came back
        if home != THREE[0]:
            assert order[0] == home  # the others' sessions never notice
        else:
            assert order[0] == pool.ring.order(key)[1]
    pool.mark_up(THREE[0])
    assert all(pool.candidates(k, "rid")[0] == home for k, home in homes.items())


def test_the_routing_key_is_an_opaque_stable_hash_of_the_salt():
    salt = "3f2a" * 8
    key = routing_key(salt)
    assert key == routing_key(salt) and key != routing_key(salt + "x") and len(key) == 32
    assert salt not in key and key not in salt
    assert routing_key(None) is None and routing_key("") is None


def test_engine_urls_split_on_commas_and_spaces_and_hide_credentials():
    assert split_urls("http://a:8000/, http://b:8000 http://a:8000") == ["http://a:8000", "http://b:8000"]
    assert split_urls(["http://a:1", "http://b:2,http://c:3"]) == ["http://a:1", "http://b:2", "http://c:3"]
    assert shown_url("http://user:secret@gpu:8000/v1") == "http://gpu:8000/v1"
    settings = parse_settings(["--engine-url", "http://a:1,http://b:2", "--engine-session-header", "X-Affinity",
                               "--engine-connect-timeout", "2", "--engine-first-byte-timeout", "30"])
    assert settings.engine_session_header == "X-Affinity" and settings.engine_first_byte_timeout == 30
    with pytest.raises(SystemExit):
        parse_settings(["--engine-first-byte-timeout", "0"])


def _answer(seen: list[httpx.Request], request: httpx.Request) -> httpx.Response:
    """A stand-in model server: records the request, streams one token."""
    seen.append(request)
    chunk = {"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]}
    return httpx.Response(200, text=f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n")


def _engine(urls: list[str], seen: list[httpx.Request], header: str = "X-Session-ID") -> RemoteEngine:
    """A RemoteEngine over stand-in servers (httpx's MockTransport: no network)."""
    engine = RemoteEngine(EngineOptions(model="/nonexistent/model"), urls, "served", SimpleNamespace(), 0.0, "",
                          session_header=header)
    engine._client = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: _answer(seen, r)))
    return engine


async def _ask(engine: RemoteEngine, salt: str | None, warmup: bool = False) -> None:
    frame = np.zeros((8, 8, 3), np.uint8)
    prepared = engine.prepare("" if warmup else "What?", [frame], cache_salt=salt, frame_ids=["1"], warmup=warmup)
    if warmup:
        await engine.warm(prepared)
        return
    async for _ in engine.submit(prepared):
        pass


async def test_every_request_and_warm_up_of_a_session_carries_its_key_never_its_salt():
    seen: list[httpx.Request] = []
    engine = _engine(["http://router:30000"], seen)
    await _ask(engine, "salt-a")
    await _ask(engine, "salt-a", warmup=True)
    await _ask(engine, "salt-b")
    keys = [r.headers.get("X-Session-ID") for r in seen]
    assert keys == [routing_key("salt-a"), routing_key("salt-a"), routing_key("salt-b")]
    assert all("salt" not in r.headers.get("X-Session-ID") for r in seen)
    renamed: list[httpx.Request] = []
    await _ask(_engine(["http://router:30000"], renamed, header="X-Affinity"), "salt-a")
    assert renamed[0].headers["X-Affinity"] == routing_key("salt-a") and "X-Session-ID" not in renamed[0].headers
    await _ask(engine, None)  # no session (a benchmark's bare question): no key
    assert "X-Session-ID" not in seen[-1].headers


async def test_several_urls_pin_each_session_and_a_refused_replica_moves_it_once():
    seen: list[httpx.Request] = []
    engine = _engine(TWO, seen)
    salts = [f"session-{i}" for i in range(12)]
    for salt in salts * 2:
        await _ask(engine, salt)
    hosts = {salt: {str(r.url.host) for r in seen if r.headers["X-Session-ID"] == routing_key(salt)}
             for salt in salts}
    assert all(len(h) == 1 for h in hosts.values()) and len(set().union(*hosts.values())) == 2
    # The replica of session-0 refuses connections from now on.
    dead = TWO[0] if hosts["session-0"] == {"10.0.0.1"} else TWO[1]

    def refuse_dead(request: httpx.Request) -> httpx.Response:
        if str(request.url).startswith(dead):
            raise httpx.ConnectError("connection refused", request=request)
        return _answer(seen, request)

    engine._client = httpx.AsyncClient(transport=httpx.MockTransport(refuse_dead))
    first = engine.submit(engine.prepare("Again?", [np.zeros((8, 8, 3), np.uint8)], cache_salt="session-0"))
    async for _ in first:
        pass
    assert first.stats.replica != dead and first.stats.session_moved == {"from": dead, "to": first.stats.replica,
                                                                        "caches": "cold"}
    second = engine.submit(engine.prepare("And again?", [np.zeros((8, 8, 3), np.uint8)], cache_salt="session-0"))
    async for _ in second:
        pass
    assert second.stats.session_moved is None and second.stats.replica == first.stats.replica
    health = {r["url"]: r["healthy"] for r in await engine.replica_health()}
    assert health == {dead: False, first.stats.replica: True}
    engine._client = httpx.AsyncClient(transport=httpx.MockTransport(
        lambda r: (_ for _ in ()).throw(httpx.ConnectError("refused", request=r))))
    with pytest.raises(EngineError, match="could not be reached"):
        await _ask(engine, "session-1")
