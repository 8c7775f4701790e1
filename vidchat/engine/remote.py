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
vidchat hashes sessions over them itself (vidchat.engine.replicas).

The model's processor is loaded here too (from ``--model`` or the served
model's name), to know what it accepts. Frames as one video are not sent
this way: a video would have to be encoded first, so questions ask for images.

The request and stream formats are in :mod:`vidchat.engine.openai_chat`;
which replica answers a session, and what a failed one means for it, in
:mod:`vidchat.engine.replica_sessions`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any, Sequence

import httpx
import numpy as np
from PIL import Image

from vidchat.engine import ModelEngine
from vidchat.engine.chat_template import tokens_per_frame
from vidchat.engine.errors import ENGINE_DEAD_MESSAGE, EngineDead, EngineError
from vidchat.engine.families import family_of, model_type_of
from vidchat.engine.interface import WARMUP_PRIORITY
from vidchat.engine.openai_chat import chat_messages, chunk_delta, error_text, messages_text, refusal, request_body
from vidchat.engine.payload import inputs_digest
from vidchat.engine.records import EngineOptions, Prepared, ReplyStats, Turn
from vidchat.engine.replica_sessions import SessionReplicas
from vidchat.engine.replicas import DEFAULT_SESSION_HEADER, routing_key, shown_url, split_urls
from vidchat.engine.revision import model_revision
from vidchat.media import AUDIO_RATE

log = logging.getLogger(__name__)

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
        self._closing: asyncio.Task | None = None
        self._running: set[str] = set()
        self._closed = False

    @classmethod
    def start(cls, options: EngineOptions, url: str | list[str], *,  # type: ignore[override]
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

    def submit(self, prepared: Prepared, request_id: str | None = None) -> RemoteReply:  # type: ignore[override]
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
