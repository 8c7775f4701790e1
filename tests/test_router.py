"""Past one machine, with real components: two `vllm serve` replicas of the
tiny model (the suite's shared one and one of this module's), vLLM's own
router (vllm-router, --policy consistent_hash, then round_robin on the same
port) and vidchat with --engine-url, asked through the socket door.

Where each question landed is read from the replicas' own /metrics (the
questions go one at a time), never from vidchat. The figures of the run
(cached prompt tokens per policy) go to test-artifacts/router-figures.json.

Server starts, kept few for the suite's time: one extra `vllm serve` for the
module, one vidchat server in front of the router (both policies), one over
the two URLs (vidchat's own hashing, then the killed replica).
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import re
import urllib.request
from dataclasses import dataclass, field

import pytest
from conftest import TEST_MAX_IMAGES, TEST_MAX_MODEL_LEN, eventually_async, start_server, stop_server
from test_protocol import check_answer, connect, send, until

from vidchat.devtools import synthetic, vllm_servers

pytestmark = pytest.mark.engine

SESSIONS, QUESTIONS, FRAMES = 8, 4, 4
ASK = dict(max_tokens=2, temperature=0.0, num_frames=FRAMES)
# 640x480 scene cuts (the filter keeps each): ~100 prompt tokens a frame at the tiny model's pixel cap.
JPEGS = [base64.b64encode(j).decode() for j in synthetic.cuts_clip(480, 640, cuts=FRAMES, hold=1).jpegs()]
# vLLM on CPU caches prefixes in blocks of this many tokens: a cached prefix
# that covers the frames may stop up to a block short of the question.
BLOCK = 128
SERVER_ARGS = ["--model", "tiny", "--prewarm", "off", "--ws-idle-timeout", "120", "--max-sessions", "32",
               "--max-concurrent-answers", "0"]


def metric(url: str, name: str) -> float:
    """A counter or gauge of a replica's /metrics, summed over its labels."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([\d.e+-]+)$", text, re.M))


def finished(url: str) -> float:
    return metric(url, "vllm:request_success_total")


@pytest.fixture(scope="module")
def replicas(tiny_vllm_serve, tiny_omni_path, artifacts_dir):
    """[the suite's shared replica, this module's own] (the second is killed by the last test)."""
    own = vllm_servers.start_vllm_serve(tiny_omni_path, artifacts_dir / "vllm-serve-replica2.log",
                                        vllm_servers.tiny_serve_args(TEST_MAX_MODEL_LEN, TEST_MAX_IMAGES))
    yield [tiny_vllm_serve, own.url], own
    vllm_servers.stop_vllm_serve(own)


@pytest.fixture(scope="module")
def figures(artifacts_dir):
    out: dict = {}
    yield out
    (artifacts_dir / "router-figures.json").write_text(json.dumps(out, indent=2))


@dataclass
class Session:
    ws: object
    landed: list = field(default_factory=list)  # the replica of each question (from /metrics)
    stats: list = field(default_factory=list)  # each answer's record (response.text.done stats)


async def open_sessions(srv, n: int) -> list[Session]:
    sessions = []
    for _ in range(n):
        ws = await connect(srv, **ASK)
        for jpeg in JPEGS:
            await send(ws, {"type": "video.frame", "data": jpeg})
        sessions.append(Session(ws))
    return sessions


async def ask_one(session: Session, urls: list[str], text: str) -> dict:
    """One question, alone on the replicas: the one whose finished count rose answered it."""
    before = [await asyncio.to_thread(finished, u) for u in urls]
    await send(session.ws, {"type": "video.query", "text": text})
    done = check_answer(await until(session.ws, "response.text.done", timeout=60))
    rose = await eventually_async(
        lambda: asyncio.to_thread(lambda: [u for u, n in zip(urls, before) if finished(u) > n]),
        10, "a replica counts the question as finished")
    assert len(rose) == 1, rose
    session.landed.append(rose[0])
    session.stats.append(done["stats"])
    return done["stats"]


async def run_round(srv, urls: list[str], seed: int) -> list[Session]:
    """8 sessions x 4 questions: every session's first, then the rest in a
    shuffled order (each session's own in order), one at a time."""
    sessions = await open_sessions(srv, SESSIONS)
    for s in sessions:
        await ask_one(s, urls, "Question 1?")
    # Keys are random (each session's salt): 8 sessions all land on one
    # replica once in 128 runs. More sessions then, until both have one.
    while len({s.landed[0] for s in sessions}) < len(urls) and len(sessions) < 3 * SESSIONS:
        sessions += await open_sessions(srv, 1)
        await ask_one(sessions[-1], urls, "Question 1?")
    rest = [s for s in sessions for _ in range(QUESTIONS - 1)]
    random.Random(seed).shuffle(rest)
    for s in rest:
        await ask_one(s, urls, f"Question {len(s.landed) + 1}?")
    for s in sessions:
        await s.ws.close()
    return sessions


def later_cached(sessions: list[Session]) -> tuple[int, int]:
    """(cached, prompt) tokens of the 2nd-4th questions of every session."""
    later = [st for s in sessions for st in s.stats[1:]]
    return sum(st["cached_tokens"] for st in later), sum(st["prompt_tokens"] for st in later)


def assert_pinned_and_warm(sessions: list[Session], urls: list[str]) -> None:
    homes = [set(s.landed) for s in sessions]
    assert all(len(h) == 1 for h in homes), [s.landed for s in sessions]
    assert set().union(*homes) == set(urls), "both replicas get sessions"
    for s in sessions:
        for st in s.stats[1:]:  # the frames are in that replica's prefix cache
            assert st["cached_tokens"] >= st["prompt_tokens"] - BLOCK - 32 > 0, s.stats


async def test_vllm_router_consistent_hash_pins_sessions_and_round_robin_loses_their_caches(
        replicas, figures, artifacts_dir):
    urls, _ = replicas
    router = await asyncio.to_thread(vllm_servers.start_router, urls, "consistent_hash", artifacts_dir / "router.log")
    srv = None
    try:
        srv = await asyncio.to_thread(start_server, [*SERVER_ARGS, "--engine-url", router.url],
                                      artifacts_dir / "server-router.log")
        ready = await asyncio.to_thread(srv.get_json, "/readyz")
        assert ready["ready"] and [r["url"] for r in ready["replicas"]] == [router.url]
        hashed = await run_round(srv, urls, seed=1)
        assert_pinned_and_warm(hashed, urls)
        assert all(st["replica"] == router.url for s in hashed for st in s.stats)
        # The same port, another policy: vidchat keeps its URL and its sessions' keys.
        await asyncio.to_thread(vllm_servers.stop_router, router)
        port = int(router.url.rsplit(":", 1)[1])
        router = await asyncio.to_thread(vllm_servers.start_router, urls, "round_robin",
                                         artifacts_dir / "router-rr.log", port)
        spread = await run_round(srv, urls, seed=1)
        assert any(len(set(s.landed)) > 1 for s in spread), [s.landed for s in spread]
        hash_cached, hash_prompt = later_cached(hashed)
        rr_cached, rr_prompt = later_cached(spread)
        figures["vllm_router"] = {"consistent_hash": {"cached": hash_cached, "prompt": hash_prompt},
                                  "round_robin": {"cached": rr_cached, "prompt": rr_prompt},
                                  "sessions": SESSIONS, "questions": QUESTIONS, "frames": FRAMES}
        assert rr_cached < hash_cached, figures
        failures = [ln for ln in srv.log_problems() if " ERROR " in ln or "Traceback" in ln]
        assert not failures, failures
    finally:
        if srv is not None:
            await asyncio.to_thread(stop_server, srv)
        await asyncio.to_thread(vllm_servers.stop_router, router)


@pytest.fixture(scope="module")
def hashing_server(replicas, artifacts_dir):
    """vidchat over both URLs, no router: its own consistent hashing."""
    urls, _ = replicas
    srv = start_server([*SERVER_ARGS, "--engine-url", ",".join(urls)], artifacts_dir / "server-hashing.log")
    yield srv
    stop_server(srv)


async def test_vidchat_hashes_sessions_over_two_urls_itself(replicas, hashing_server, figures):
    urls, _ = replicas
    health = await asyncio.to_thread(hashing_server.get_json, "/api/health")
    assert [(r["url"], r["healthy"]) for r in health["replicas"]] == [(u, True) for u in urls]
    sessions = await run_round(hashing_server, urls, seed=2)
    assert_pinned_and_warm(sessions, urls)
    # The record names the replica /metrics saw answer; nobody moved.
    assert all(st["replica"] == landed and st["session_moved"] is None
               for s in sessions for st, landed in zip(s.stats, s.landed))
    cached, prompt = later_cached(sessions)
    figures["vidchat_hashing"] = {"cached": cached, "prompt": prompt}


async def test_a_replica_killed_mid_answer_costs_its_sessions_one_error_and_nobody_else_anything(
        replicas, hashing_server):
    urls, own = replicas
    killed, kept = own.url, urls[0]
    sessions: list[Session] = []
    # Where each lives: its record says (the test above checked records
    # against /metrics); as in run_round, until both replicas have sessions.
    while len(sessions) < SESSIONS or (len({s.stats[0]["replica"] for s in sessions}) < 2
                                       and len(sessions) < 3 * SESSIONS):
        s = (await open_sessions(hashing_server, 1))[0]
        await send(s.ws, {"type": "video.query", "text": "Where?"})
        s.stats.append(check_answer(await until(s.ws, "response.text.done", timeout=60))["stats"])
        sessions.append(s)
    on_killed = [s for s in sessions if s.stats[0]["replica"] == killed]
    others = [s for s in sessions if s.stats[0]["replica"] == kept]
    assert on_killed and others and len(on_killed) + len(others) == len(sessions)
    # Every session starts a long answer; all are streaming when the replica dies.
    for s in sessions:
        await send(s.ws, {"type": "session.update", "max_tokens": 3500})
        await send(s.ws, {"type": "video.query", "text": "Talk for a long time."})
    for s in sessions:
        await until(s.ws, "response.text.delta", timeout=60)
    await asyncio.to_thread(vllm_servers.kill_vllm_serve, own)
    for s in on_killed:  # one clear error, then its answer's end
        msgs = await until(s.ws, "response.text.done", timeout=30)
        errors = [m["message"] for m in msgs if m["type"] == "error"]
        assert len(errors) == 1 and "stopped answering" in errors[0] and "another replica" in errors[0], errors
    for s in others:  # a new question replaces the long answer; no error anywhere
        await send(s.ws, {"type": "session.update", "max_tokens": 2})
        await send(s.ws, {"type": "video.query", "text": "Short now."})
        msgs = await until(s.ws, "response.start", timeout=30)
        msgs += await until(s.ws, "response.text.done", timeout=60)
        assert not [m for m in msgs if m["type"] == "error"], msgs
        done = msgs[-1]["stats"]
        assert done["replica"] == kept and done["session_moved"] is None and done["cached_tokens"] > 0
    for s in on_killed:  # the next question answers from the other replica, and says it moved
        await send(s.ws, {"type": "session.update", "max_tokens": 2})
        await send(s.ws, {"type": "video.query", "text": "Still there?"})
        msgs = await until(s.ws, "response.text.done", timeout=60)
        done = check_answer([m for m in msgs if m["type"] != "session.updated"])["stats"]
        assert done["replica"] == kept and done["session_moved"] == {"from": killed, "to": kept, "caches": "cold"}
    # Nothing left running, in vidchat or on the surviving replica; health says which one is gone.
    await eventually_async(lambda: asyncio.to_thread(
        lambda: hashing_server.running_requests() == 0 and metric(kept, "vllm:num_requests_running") == 0),
        10, "no request left running")
    ready = await asyncio.to_thread(hashing_server.get_json, "/readyz")
    assert ready["ready"] and {r["url"]: r["healthy"] for r in ready["replicas"]} == {kept: True, killed: False}
    for s in sessions:
        await s.ws.close()
