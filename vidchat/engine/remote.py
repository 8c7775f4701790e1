"""The engine interface over a remote vLLM server (``--engine-url URL``).

For more than one process can hold: ``vllm serve MODEL`` (which scales out
with vLLM's own data parallelism, or Ray) serves the model, and vidchat keeps
the page, the sessions, the filter and the QA records. Questions go to its
OpenAI-compatible ``/v1/chat/completions`` as chat messages whose content is
the same layout as the in-process prompt (frames as PNG images, named by the
session's salt and kept-frame numbers; then audio; then the question), with
vLLM's extra fields for what vidchat relies on: ``cache_salt``,
``ignore_eos``, ``priority`` for warm-ups. Replies stream back as server-sent
events; closing the stream (a cancel, a new question, a page that went away)
makes vLLM abort the request.

Past one machine (docs/hosting.md, "Beyond one machine"): every request carries the
session's routing key in a header (``X-Session-ID`` by default) for a router
such as vllm-router's ``consistent_hash``; with several URLs and no router,
vidchat hashes sessions over them itself (vidchat.engine.remote).

The model's processor is loaded here too (from ``--model`` or the served
model's name), to know what it accepts. Frames as one video are not sent
this way: a video would have to be encoded first, so questions ask for images.

The request and stream formats are in :mod:`vidchat.engine.remote`;
which replica answers a session, and what a failed one means for it, in
:mod:`vidchat.engine.remote`.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import collections
import hashlib
import io
import json
import logging
import time
import urllib.parse
import uuid
import wave
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import httpx
import numpy as np
from PIL import Image

from vidchat.engine import ModelEngine
from vidchat.engine.interface import (
    ENGINE_DEAD_MESSAGE,
    WARMUP_PRIORITY,
    EngineDead,
    EngineError,
    EngineOptions,
    Prepared,
    ReplyStats,
    Turn,
)
from vidchat.engine.prompts import family_of, inputs_digest, model_type_of, tokens_per_frame
from vidchat.engine.weights import model_revision
from vidchat.media import AUDIO_RATE

log = logging.getLogger(__name__)


# vLLM's OpenAI-compatible ``/v1/chat/completions`` as the remote engine
# speaks it: the request a question becomes (frames as lossless PNG images,
# audio as WAV, vLLM's extra fields), how the QA record shows its chat, what
# one server-sent event of the answer says, and a refused request in the
# user's words.

def png_data_url(frame: np.ndarray | Image.Image) -> str:
    """A frame as a ``data:image/png`` URL."""
    image = frame if isinstance(frame, Image.Image) else Image.fromarray(np.asarray(frame))
    buf = io.BytesIO()
    # Lossless, so the server decodes exactly the pixels inputs_sha256 names;
    # the lowest compression keeps 16 frames to a few ms.
    image.convert("RGB").save(buf, "PNG", compress_level=1)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def wav_base64(audio: np.ndarray) -> str:
    """Mono float audio at AUDIO_RATE as a base64 16-bit WAV file."""
    pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(AUDIO_RATE)
        w.writeframes(pcm.tobytes())
    return base64.b64encode(buf.getvalue()).decode()


def chat_messages(question: str, frames: Sequence[np.ndarray | Image.Image], audio: np.ndarray | None,
                  history: Sequence[Turn], system_prompt: str | None, cache_salt: str | None,
                  frame_ids: Sequence[str] | None) -> list[dict[str, Any]]:
    """The chat a question becomes: the system prompt, the history's turns,
    then the question's frames, audio and text in the in-process prompt's
    order. Frames are named by salt and ``frame_ids`` (vLLM caches their
    encodings under those names) when every frame has one."""
    ids = frame_ids if cache_salt and frame_ids is not None and len(frame_ids) == len(frames) else None
    content: list[dict[str, Any]] = []
    for i, frame in enumerate(frames):
        part: dict[str, Any] = {"type": "image_url", "image_url": {"url": png_data_url(frame)}}
        if ids is not None:
            part["uuid"] = f"{cache_salt}/{ids[i]}"
        content.append(part)
    if audio is not None:
        content.append({"type": "input_audio", "input_audio": {"data": wav_base64(audio), "format": "wav"}})
    if question:
        content.append({"type": "text", "text": question})
    messages: list[dict[str, Any]] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages += [{"role": t.role, "content": t.text} for t in history]
    messages.append({"role": "user", "content": content})
    return messages


def request_body(served_model: str, messages: list[dict[str, Any]], *, max_tokens: int, temperature: float,
                 seed: int | None, ignore_eos: bool, cache_salt: str | None) -> dict[str, Any]:
    """The streamed request's JSON body, with vLLM's extra fields where set."""
    body: dict[str, Any] = {"model": served_model, "messages": messages, "max_tokens": max_tokens,
                            "temperature": temperature, "stream": True,
                            "stream_options": {"include_usage": True}}
    if seed is not None:
        body["seed"] = seed
    if ignore_eos:
        body["ignore_eos"] = True
    if cache_salt:
        body["cache_salt"] = cache_salt
    return body


def messages_text(messages: list[dict[str, Any]]) -> str:
    """The chat as the QA record shows it: the server renders the template,
    so this lists each turn with its media as placeholders."""
    lines = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = " ".join({"image_url": "<image>", "input_audio": "<audio>"}.get(part["type"])
                               or part.get("text", "") for part in content)
        lines.append(f"[{message['role']}] {content}")
    return "\n".join(lines)


def chunk_delta(chunk: dict[str, Any], stats: ReplyStats) -> str | None:
    """Read one streamed chunk into ``stats`` (token counts, finish reason);
    the text it adds, if any."""
    usage = chunk.get("usage")
    if usage:
        stats.prompt_tokens = usage.get("prompt_tokens", 0)
        stats.completion_tokens = usage.get("completion_tokens", 0)
        details = usage.get("prompt_tokens_details") or {}
        stats.cached_tokens = details.get("cached_tokens") or 0
    for choice in chunk.get("choices") or []:
        if choice.get("finish_reason"):
            stats.finish_reason = choice["finish_reason"]
        delta: str | None = (choice.get("delta") or {}).get("content")
        if delta:
            return delta
    return None


def error_text(response: httpx.Response, body: bytes) -> str:
    """The server's own words for a refused request, from its JSON error or its body."""
    try:
        payload = json.loads(body)
        detail = payload.get("error", payload)
        return str(detail.get("message") if isinstance(detail, dict) else detail)
    except (ValueError, AttributeError):
        return body.decode(errors="replace")[:300] or f"HTTP {response.status_code}"


def refusal(text: str, max_model_len: int) -> EngineError:
    """A refused request (``text``: the server's words) as the user is told it."""
    if "maximum context length" in text or "longer than the maximum model length" in text:
        return EngineError(f"The question with its frames and chat history is too long for the model "
                           f"(limit {max_model_len} tokens): send fewer frames or clear "
                           f"the chat. ({text.splitlines()[0]})")
    return EngineError(f"The model server refused the question: {text.splitlines()[0] if text else ''}")


# Where a session's requests go when ``--engine-url`` names model servers.
#
# A session's frames are worth something only on the replica that already
# holds them in its prefix and encoder caches, so every request of a session
# must reach the same ``vllm serve``. Two ways, both keyed by the session's
# routing key (:func:`routing_key`, sent in a header, ``X-Session-ID`` by
# default):
#
# * one URL, a router in front of the replicas (vllm-router with
#   ``--policy consistent_hash``, llm-d's session-affinity scorer): the router
#   reads the header and pins the session; vidchat sees a single "replica";
# * several URLs, no router: vidchat hashes the key onto them itself
#   (:class:`HashRing`, consistent hashing: adding a replica moves only the
#   sessions it takes over, about 1/N of them).
#
# A replica that fails (refused, reset mid-answer, silent past the first-byte
# timeout) is marked down for a while; its sessions go to the next replica on
# the ring, whose caches are cold, and the answer's record says the session
# moved (RemoteEngine).

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
        self._probing: asyncio.Task[None] | None = None

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


# The remote engine's replicas as its sessions meet them: the pool a
# request's replica is chosen from (vidchat.engine.remote), the replica that
# last answered each session (to say when one moved, its caches cold there),
# and a failing replica, marked down and told in the user's words.

# Sessions whose last replica is remembered (to say when one moved).
MAX_HOMES = 10_000


class SessionReplicas:
    """The replica pool, and each session's home in it (by routing key)."""

    def __init__(self, urls: list[str], first_byte_timeout: float) -> None:
        self.pool = ReplicaPool(urls)
        self.first_byte_timeout = first_byte_timeout  # for the words of a silent replica
        self._homes: collections.OrderedDict[str, str] = collections.OrderedDict()  # routing key -> replica

    def placed(self, key: str | None, url: str, warmup: bool, stats: ReplyStats) -> None:
        """Note which replica answers; say so when the session moved. Warm-ups
        don't move a session: the question after them says it moved."""
        stats.replica = shown_url(url)
        if key is None or warmup:
            return
        before = self._homes.get(key)
        if before is not None and before != url:
            stats.session_moved = {"from": shown_url(before), "to": shown_url(url), "caches": "cold"}
            log.info("a session moved from replica %s to %s: its caches there are cold",
                     shown_url(before), shown_url(url))
        self._homes[key] = url
        self._homes.move_to_end(key)
        while len(self._homes) > MAX_HOMES:
            self._homes.popitem(last=False)

    def failed(self, url: str, exc: Exception, before_answer: bool = False) -> str:
        """Mark the replica down and say what happened, in words for the user."""
        what = (f"did not answer within {self.first_byte_timeout:g} s" if isinstance(exc, httpx.TimeoutException)
                else f"stopped answering ({type(exc).__name__}: {exc})".replace(" ()", ""))
        self.pool.mark_down(url, what)
        where = "before answering" if before_answer else "mid-answer"
        text = f"The model server at {shown_url(url)} {what} {where}."
        if len(self.pool.urls) > 1:
            text += " Ask again: this session's next question goes to another replica (its caches start cold)."
        return text


# Defaults of --engine-connect-timeout and --engine-first-byte-timeout.
CONNECT_TIMEOUT_S = 5.0

# Also the longest silence between two parts of a streamed answer: a
# replica that stops sending (hung, drained without a close) ends the answer
# with an error instead of holding its session forever. A cold question on a
# CPU takes ~15 s before its first token (docs/performance.md, the true-size figures).
FIRST_BYTE_TIMEOUT_S = 60.0


class RemoteReply:
    """One streamed answer from the remote server; the same interface as
    :class:`vidchat.engine.Reply` (iterate for deltas, ``stats``, ``aclose``)."""

    def __init__(self, engine: "RemoteEngine", request_id: str, body: dict[str, Any], stats: ReplyStats,
                 key: str | None = None, warmup: bool = False):
        self.engine = engine
        self.request_id = request_id
        self.stats = stats
        self.text = ""
        self.url: str | None = None  # the replica answering, once connected
        self._body = body
        self._key = key
        self._warmup = warmup
        self._response: httpx.Response | None = None
        self._lines: Any = None
        self._done = False
        self._started = time.perf_counter()

    def __aiter__(self) -> "RemoteReply":
        return self

    async def __anext__(self) -> str:
        if self._done:
            raise StopAsyncIteration
        try:
            if self._response is None:
                self._response, self.url = await self.engine._open(self.request_id, self._body, self._key,
                                                                   self._warmup, self.stats)
                self._lines = self._response.aiter_lines()
            async for line in self._lines:
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                delta = chunk_delta(json.loads(data), self.stats)
                if delta:
                    if self.stats.ttft_s is None:
                        self.stats.ttft_s = time.perf_counter() - self._started
                    self.text += delta
                    return delta
            await self._finish()
            raise StopAsyncIteration
        except (asyncio.CancelledError, GeneratorExit):
            self.stats.cancelled = True
            await self._finish()
            raise
        except (httpx.HTTPError, ValueError) as exc:
            if self._done and self.stats.cancelled:
                raise StopAsyncIteration  # another task cancelled it: the stream was closed on purpose
            await self._finish()
            if isinstance(exc, ValueError) or self.url is None:
                raise EngineError(f"The model server at {shown_url(self.url or self.engine.url)} sent a reply "
                                  f"vidchat cannot read: {exc}") from exc
            raise EngineError(self.engine.replicas.failed(self.url, exc)) from exc

    async def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        self.engine._running.discard(self.request_id)
        if self._response is not None:
            # Closing the connection is how a client aborts: vLLM's server
            # sees the disconnect and aborts the request.
            await self._response.aclose()
        self.stats.ended(self._started)

    async def aclose(self) -> None:
        if not self._done:
            self.stats.cancelled = True
        await self._finish()


class RemoteEngine(ModelEngine):
    """:class:`vidchat.engine.ChatEngine`, answered by remote vLLM servers
    (one, a router in front of several, or several hashed by session)."""

    def __init__(self, options: EngineOptions, url: str | list[str], served_model: str, processor: Any,
                 start_s: float, revision: str, *, session_header: str = DEFAULT_SESSION_HEADER,
                 connect_timeout: float = CONNECT_TIMEOUT_S,
                 first_byte_timeout: float = FIRST_BYTE_TIMEOUT_S) -> None:
        family = family_of(model_type_of(options.model))
        # What the model takes, as its processor says (the server's own
        # limits can't be read); frames go as images (see the module's docstring).
        hears = getattr(processor, "feature_extractor", None) is not None
        super().__init__(options, processor, options.model, start_s, family, revision, hears, False)
        self.replicas = SessionReplicas(split_urls(url), first_byte_timeout)
        self.pool = self.replicas.pool
        self.url = self.pool.urls[0]
        self.served_model = served_model
        self.session_header = session_header
        self.first_byte_timeout = first_byte_timeout
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(first_byte_timeout, connect=connect_timeout))
        self._client_loop: asyncio.AbstractEventLoop | None = None  # where its connections live (shutdown)
        self._closing: asyncio.Task[None] | None = None
        self._running: set[str] = set()
        self._closed = False

    @classmethod
    def start(cls, options: EngineOptions, url: str | list[str], *,
              session_header: str = DEFAULT_SESSION_HEADER, connect_timeout: float = CONNECT_TIMEOUT_S,
              first_byte_timeout: float = FIRST_BYTE_TIMEOUT_S) -> "RemoteEngine":
        """Find the served model and load its processor (blocking). ``url``:
        one URL or several (a list, or comma separated); one answering is enough."""
        from transformers import AutoProcessor

        t0 = time.perf_counter()
        urls = split_urls(url)
        if not urls:
            raise EngineError("--engine-url names no URL")
        served = _served_model(urls, connect_timeout)
        name = options.model or served
        try:
            processor = AutoProcessor.from_pretrained(name)
        except Exception as exc:
            raise EngineError(f"the processor of {name!r} could not be loaded here (vidchat reads it to know "
                              f"what the model takes): pass --model with its hub id or a local copy "
                              f"({exc})") from exc
        options = EngineOptions(**{**options.__dict__, "model": name})
        engine = cls(options, urls, served, processor, time.perf_counter() - t0, model_revision(name),
                     session_header=session_header, connect_timeout=connect_timeout,
                     first_byte_timeout=first_byte_timeout)
        try:  # what a frame costs, for the history budget (the processor's own count)
            engine.tokens_per_frame = tokens_per_frame(processor, options.max_image_pixels, engine.processor_kwargs)
        except Exception:
            log.debug("could not measure the tokens a frame costs", exc_info=True)
        log.info("engine ready: %s served by %s (%s); sessions keyed by %s", served,
                 ", ".join(shown_url(u) for u in urls), engine.model_revision, session_header)
        return engine

    def shutdown(self) -> None:
        """Close the HTTP client, once, on the loop that owns its connections
        (a shutdown may run in a worker thread: closing them on a loop of its
        own would touch another loop's sockets)."""
        if self._closed:
            return
        self._closed = True
        client, owner = self._client, self._client_loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and (owner is None or owner is running):
            self._closing = running.create_task(client.aclose())
        elif owner is not None and owner.is_running():
            try:
                asyncio.run_coroutine_threadsafe(client.aclose(), owner).result(timeout=5.0)
            except Exception:  # noqa: BLE001 - the process is ending; the sockets go with it
                log.debug("closing the remote engine's client failed", exc_info=True)
        else:
            asyncio.run(client.aclose())  # no loop runs it any more: nothing else owns its sockets
        log.info("remote engine closed")

    @property
    def running_requests(self) -> int:
        return len([r for r in self._running if not r.startswith("vidchat-warm-")])

    @property
    def running_warmups(self) -> int:
        return len([r for r in self._running if r.startswith("vidchat-warm-")])

    @property
    def is_dead(self) -> bool:
        return self._closed

    @property
    def encoder_cache_tokens(self) -> int | None:
        return None  # the remote server's own business

    async def replica_health(self) -> list[dict[str, Any]]:
        self._client_loop = asyncio.get_running_loop()
        return await self.pool.health(self._client)

    def prepare(self, question: str, frames: Sequence[np.ndarray | Image.Image] = (),
                audio: np.ndarray | None = None, *, frame_times: Sequence[float] | None = None,
                history: Sequence[Turn] = (), system_prompt: str | None = None, frames_as: str = "images",
                max_tokens: int = 256, temperature: float = 0.7, seed: int | None = None,
                ignore_eos: bool = False, cache_salt: str | None = None,
                frame_ids: Sequence[str] | None = None, warmup: bool = False, spoken: bool = False,
                audio_parts: Sequence[tuple[int, str | None]] = ()) -> Prepared:
        """The question as a chat-completions request (same checks and layout
        as the in-process prompt, except that the audio goes as one clip:
        ``audio_parts`` is not used)."""
        question, max_tokens, temperature, seed, audio = self._checked_inputs(
            question, len(frames), audio, frames_as, max_tokens, temperature, seed, warmup, spoken)
        total_turns = len(history)
        history = self.fit_history(history, question, len(frames), frames_as, 0 if audio is None else 1,
                                   0.0 if audio is None else audio.size / AUDIO_RATE, max_tokens, system_prompt)
        messages = chat_messages(question, frames, audio, history, system_prompt, cache_salt, frame_ids)
        body = request_body(self.served_model, messages, max_tokens=max_tokens, temperature=temperature,
                            seed=seed, ignore_eos=ignore_eos, cache_salt=cache_salt)
        audio_s = 0.0 if audio is None else audio.size / AUDIO_RATE
        stats = ReplyStats(frames=len(frames), audio_seconds=audio_s, inputs_sha256=inputs_digest(frames, audio),
                           history_turns=len(history), history_turns_total=total_turns)
        return Prepared(body, messages_text(messages), None, stats, routing_key=routing_key(cache_salt))

    def check_request(self, n_frames: int, frames_as: str) -> None:
        if frames_as == "video" and n_frames:
            raise EngineError("Frames go to a remote model server (--engine-url) as images; send frames as images.")
        super().check_request(n_frames, frames_as)

    def submit(self, prepared: Prepared, request_id: str | None = None) -> RemoteReply:
        if self.is_dead:
            raise EngineDead(ENGINE_DEAD_MESSAGE)
        rid = request_id or f"vidchat-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        return RemoteReply(self, rid, prepared.prompt, prepared.stats, prepared.routing_key)

    async def _open(self, request_id: str, body: dict[str, Any], key: str | None, warmup: bool,
                    stats: ReplyStats) -> tuple[httpx.Response, str]:
        """Send the request to the session's replica, or where the ring
        sends it while that one is down. Only a refused connection moves on
        to the next replica (nothing reached the failed one); any later
        failure ends this answer with an error and the session's next
        question moves."""
        self._running.add(request_id)
        headers = {"X-Request-Id": request_id}
        if key:
            headers[self.session_header] = key
        errors: list[str] = []
        for url in self.pool.candidates(key, request_id):
            try:
                request = self._client.build_request("POST", f"{url}/v1/chat/completions", json=body,
                                                     headers=headers)
                self._client_loop = asyncio.get_running_loop()
                response = await self._client.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                self.pool.mark_down(url, f"{type(exc).__name__}: {exc}")
                errors.append(f"{shown_url(url)}: {exc}")
                continue
            except httpx.HTTPError as exc:
                self._running.discard(request_id)
                raise EngineError(self.replicas.failed(url, exc, before_answer=True)) from exc
            self.pool.mark_up(url)
            self.replicas.placed(key, url, warmup, stats)
            return await self._checked(response, request_id), url
        self._running.discard(request_id)
        raise EngineError(f"The model server could not be reached ({'; '.join(errors)}).")

    async def _checked(self, response: httpx.Response, request_id: str) -> httpx.Response:
        if response.status_code != 200:
            text = error_text(response, await response.aread())
            await response.aclose()
            self._running.discard(request_id)
            raise refusal(text, self.options.max_model_len)
        return response

    async def warm(self, prepared: Prepared) -> ReplyStats:
        """A warm-up on the remote server: one token, at low priority where the
        server schedules by priority (vidchat cannot tell; 0 otherwise)."""
        body = dict(prepared.prompt)
        if self.options.priority_scheduling:
            body["priority"] = WARMUP_PRIORITY
        reply = RemoteReply(self, f"vidchat-warm-{next(self._ids)}-{uuid.uuid4().hex[:8]}", body, prepared.stats,
                            prepared.routing_key, warmup=True)
        try:
            async for _ in reply:
                pass
        finally:
            await reply.aclose()
        return reply.stats


def _served_model(urls: list[str], timeout: float) -> str:
    """The model the first answering URL serves (the others may be down now:
    questions find out); a replica serving another model is an error."""
    served: dict[str, str] = {}
    errors = []
    for url in urls:
        try:
            models = httpx.get(f"{url}/v1/models", timeout=timeout).raise_for_status().json()
            served[url] = models["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            errors.append(f"{shown_url(url)}: {exc}")
    if not served:
        raise EngineError(f"no vLLM server answers at --engine-url ({'; '.join(errors)})")
    if len(set(served.values())) > 1:
        raise EngineError("the --engine-url servers serve different models: " +
                          ", ".join(f"{shown_url(u)}: {m}" for u, m in served.items()))
    for error in errors:
        log.warning("--engine-url: %s does not answer now (questions will skip it while it is down)", error)
    return next(iter(served.values()))
