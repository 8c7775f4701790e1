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

The model's processor is loaded here too (from ``--model`` or the served
model's name), to know what it accepts. Frames as one video are not sent
this way: a video would have to be encoded first, so questions ask for images.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import time
import uuid
import wave
from typing import Any, Sequence

import httpx
import numpy as np
from PIL import Image

from vidchat.engine import (ENGINE_DEAD_MESSAGE, EngineDead, EngineError, EngineOptions, ModelEngine, Prepared,
                            ReplyStats, Turn, WARMUP_PRIORITY, inputs_digest, tokens_per_frame)
from vidchat.engine.families import family_of, model_type_of
from vidchat.engine.revision import model_revision
from vidchat.media import AUDIO_RATE

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0


def png_data_url(frame: np.ndarray | Image.Image) -> str:
    image = frame if isinstance(frame, Image.Image) else Image.fromarray(np.asarray(frame))
    buf = io.BytesIO()
    # Lossless, so the server decodes exactly the pixels inputs_sha256 names;
    # the lowest compression keeps 16 frames to a few ms.
    image.convert("RGB").save(buf, "PNG", compress_level=1)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def wav_base64(audio: np.ndarray) -> str:
    pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(AUDIO_RATE)
        w.writeframes(pcm.tobytes())
    return base64.b64encode(buf.getvalue()).decode()


def _error_text(response: httpx.Response, body: bytes) -> str:
    try:
        payload = json.loads(body)
        detail = payload.get("error", payload)
        return str(detail.get("message") if isinstance(detail, dict) else detail)
    except (ValueError, AttributeError):
        return body.decode(errors="replace")[:300] or f"HTTP {response.status_code}"


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


class RemoteReply:
    """One streamed answer from the remote server; the same interface as
    :class:`vidchat.engine.Reply` (iterate for deltas, ``stats``, ``cancel``)."""

    def __init__(self, engine: "RemoteEngine", request_id: str, body: dict[str, Any], stats: ReplyStats):
        self.engine = engine
        self.request_id = request_id
        self.stats = stats
        self.text = ""
        self._body = body
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
                self._response = await self.engine._open(self.request_id, self._body)
                self._lines = self._response.aiter_lines()
            async for line in self._lines:
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                usage = chunk.get("usage")
                if usage:
                    self.stats.prompt_tokens = usage.get("prompt_tokens", 0)
                    self.stats.completion_tokens = usage.get("completion_tokens", 0)
                    details = usage.get("prompt_tokens_details") or {}
                    self.stats.cached_tokens = details.get("cached_tokens") or 0
                for choice in chunk.get("choices") or []:
                    if choice.get("finish_reason"):
                        self.stats.finish_reason = choice["finish_reason"]
                    delta = (choice.get("delta") or {}).get("content")
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
            raise EngineError(f"The model server at {self.engine.url} failed mid-answer: {exc}") from exc

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

    cancel = aclose


class RemoteEngine(ModelEngine):
    """:class:`vidchat.engine.ChatEngine`, answered by a remote vLLM server."""

    def __init__(self, options: EngineOptions, url: str, served_model: str, processor: Any, start_s: float,
                 revision: str) -> None:
        family = family_of(model_type_of(options.model))
        # What the model takes, as its processor says (the server's own
        # limits can't be read); frames go as images (see the module's docstring).
        hears = getattr(processor, "feature_extractor", None) is not None
        super().__init__(options, processor, options.model, start_s, family, revision, hears, False)
        self.url = url.rstrip("/")
        self.served_model = served_model
        self._client = httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(CONNECT_TIMEOUT_S, read=None))
        self._running: set[str] = set()
        self._closed = False

    @classmethod
    def start(cls, options: EngineOptions, url: str) -> "RemoteEngine":  # type: ignore[override]
        """Find the served model and load its processor (blocking)."""
        from transformers import AutoProcessor

        t0 = time.perf_counter()
        url = url.rstrip("/")
        try:
            models = httpx.get(f"{url}/v1/models", timeout=CONNECT_TIMEOUT_S).raise_for_status().json()
            served = models["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            raise EngineError(f"no vLLM server answers at --engine-url {url}: {exc}") from exc
        name = options.model or served
        try:
            processor = AutoProcessor.from_pretrained(name)
        except Exception as exc:
            raise EngineError(f"the processor of {name!r} could not be loaded here (vidchat reads it to know "
                              f"what the model takes): pass --model with its hub id or a local copy "
                              f"({exc})") from exc
        options = EngineOptions(**{**options.__dict__, "model": name})
        engine = cls(options, url, served, processor, time.perf_counter() - t0, model_revision(name))
        try:  # what a frame costs, for the history budget (the processor's own count)
            engine.tokens_per_frame = tokens_per_frame(processor, options.max_image_pixels, engine.processor_kwargs)
        except Exception:
            log.debug("could not measure the tokens a frame costs", exc_info=True)
        log.info("engine ready: %s served by %s (%s)", served, url, engine.model_revision)
        return engine

    def shutdown(self) -> None:
        self._closed = True
        client = self._client
        try:
            asyncio.get_running_loop().create_task(client.aclose())
        except RuntimeError:
            asyncio.run(client.aclose())
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
        named = cache_salt and frame_ids is not None and len(frame_ids) == len(frames)
        content: list[dict[str, Any]] = []
        for i, frame in enumerate(frames):
            part: dict[str, Any] = {"type": "image_url", "image_url": {"url": png_data_url(frame)}}
            if named:
                part["uuid"] = f"{cache_salt}/{frame_ids[i]}"
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
        body: dict[str, Any] = {"model": self.served_model, "messages": messages, "max_tokens": max_tokens,
                                "temperature": temperature, "stream": True,
                                "stream_options": {"include_usage": True}}
        if seed is not None:
            body["seed"] = seed
        if ignore_eos:
            body["ignore_eos"] = True
        if cache_salt:
            body["cache_salt"] = cache_salt
        audio_s = 0.0 if audio is None else audio.size / AUDIO_RATE
        stats = ReplyStats(frames=len(frames), audio_seconds=audio_s, inputs_sha256=inputs_digest(frames, audio),
                           history_turns=len(history), history_turns_total=total_turns)
        return Prepared(body, messages_text(messages), None, stats)

    def check_request(self, n_frames: int, frames_as: str) -> None:
        if frames_as == "video" and n_frames:
            raise EngineError("Frames go to a remote model server (--engine-url) as images; send frames as images.")
        super().check_request(n_frames, frames_as)

    def submit(self, prepared: Prepared, request_id: str | None = None) -> RemoteReply:  # type: ignore[override]
        if self.is_dead:
            raise EngineDead(ENGINE_DEAD_MESSAGE)
        rid = request_id or f"vidchat-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        return RemoteReply(self, rid, prepared.prompt, prepared.stats)

    async def _open(self, request_id: str, body: dict[str, Any]) -> httpx.Response:
        self._running.add(request_id)
        try:
            request = self._client.build_request("POST", "/v1/chat/completions", json=body,
                                                 headers={"X-Request-Id": request_id})
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            self._running.discard(request_id)
            raise EngineError(f"The model server at {self.url} could not be reached: {exc}") from exc
        if response.status_code != 200:
            text = _error_text(response, await response.aread())
            await response.aclose()
            self._running.discard(request_id)
            if "maximum context length" in text or "longer than the maximum model length" in text:
                raise EngineError(f"The question with its frames and chat history is too long for the model "
                                  f"(limit {self.options.max_model_len} tokens): send fewer frames or clear "
                                  f"the chat. ({text.splitlines()[0]})")
            raise EngineError(f"The model server refused the question: {text.splitlines()[0] if text else ''}")
        return response

    async def warm(self, prepared: Prepared) -> ReplyStats:
        """A warm-up on the remote server: one token, at low priority where the
        server schedules by priority (vidchat cannot tell; 0 otherwise)."""
        body = dict(prepared.prompt)
        if self.options.priority_scheduling:
            body["priority"] = WARMUP_PRIORITY
        reply = RemoteReply(self, f"vidchat-warm-{next(self._ids)}-{uuid.uuid4().hex[:8]}", body, prepared.stats)
        try:
            async for _ in reply:
                pass
        finally:
            await reply.aclose()
        return reply.stats
