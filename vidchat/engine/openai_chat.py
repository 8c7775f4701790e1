"""vLLM's OpenAI-compatible ``/v1/chat/completions`` as the remote engine
speaks it: the request a question becomes (frames as lossless PNG images,
audio as WAV, vLLM's extra fields), how the QA record shows its chat, what
one server-sent event of the answer says, and a refused request in the
user's words."""

from __future__ import annotations

import base64
import io
import json
import wave
from typing import Any, Sequence

import httpx
import numpy as np
from PIL import Image

from vidchat.engine.errors import EngineError
from vidchat.engine.records import ReplyStats, Turn
from vidchat.media import AUDIO_RATE


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
        delta = (choice.get("delta") or {}).get("content")
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
