"""The OpenAI Realtime door's conversation items: what a client's
``conversation.item.create`` may hold (checked whole before anything is
taken in), how the door says an item back, and the question the items
build up until the next response. Pure, no I/O, like
:mod:`vidchat.doors.realtime_events`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vidchat.conversation.settings_table import MAX_QUESTION_CHARS
from vidchat.doors.realtime_events import EventError, message_item
from vidchat.doors.socket_media import is_millis
from vidchat.media import AUDIO_RATE

IMAGE_TYPES = ("data:image/jpeg", "data:image/png", "data:image/webp")


# ---- conversation.item.create ----------------------------------------------------

@dataclass(frozen=True)
class Part:
    kind: str  # "input_text", "input_audio" or "input_image"
    value: Any  # the text, the base64 audio, or the image's data URL
    pts_ms: Any = None
    index: int = 0


# What an assistant's or a system message may hold (the GA types'), and where its text is.
HISTORY_CONTENT = {"assistant": {"output_text": "text", "output_audio": "transcript"},
                   "system": {"input_text": "text"}}


def message_role(item: Any) -> str:
    """A conversation.item.create's message role ("user", "assistant",
    "system"); raises EventError for anything else (function calls and their
    outputs: tools are not served)."""
    if not isinstance(item, dict):
        raise EventError("conversation.item.create needs an 'item' object", param="item")
    role = item.get("role")
    if item.get("type", "message") != "message" or role not in ("user", *HISTORY_CONTENT):
        raise EventError("only messages are taken (item.type \"message\", item.role \"user\", \"assistant\" "
                         "or \"system\")", code="unsupported_item", param="item.role")
    return role


def history_text(item: dict[str, Any], role: str) -> str:
    """An assistant's or a system message's text (an output_audio part by
    its transcript: there is no audio to keep), checked; raises EventError.
    Clients replay their chat this way after a reconnect and at hand-offs."""
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise EventError("item.content must be a non-empty list", param="item.content")
    kinds, texts = HISTORY_CONTENT[role], []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds:
            raise EventError(f"item.content[{i}].type of a{'n' if role == 'assistant' else ''} {role} message must "
                             f"be {' or '.join(kinds)}, got {kind!r}", code="unsupported_content",
                             param=f"item.content[{i}].type")
        key = kinds[kind]
        text = part.get(key)
        if not isinstance(text, str) and not (kind == "output_audio" and text is None):  # audio with no transcript
            raise EventError(f"item.content[{i}].{key} must be a string", param=f"item.content[{i}].{key}")
        texts.append(text or "")
    text = "\n".join(t for t in texts if t)
    if len(text) > MAX_QUESTION_CHARS:
        raise EventError(f"item.content: a history message is at most {MAX_QUESTION_CHARS} characters",
                         "question_too_long", "item.content")
    return text


def history_item(item_id: str, role: str, text: str) -> dict[str, Any]:
    """An assistant's or a system message as conversation.item.added/done say it back."""
    return message_item(item_id, role, "completed",
                        [{"type": "output_text" if role == "assistant" else "input_text", "text": text}])


def user_parts(item: Any) -> list[Part]:
    """A user message's content, checked before anything is taken in; raises EventError."""
    if message_role(item) != "user":
        raise EventError("item.role must be \"user\" here", code="unsupported_item", param="item.role")
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise EventError("item.content must be a non-empty list", param="item.content")
    parts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        key = {"input_text": "text", "input_audio": "audio", "input_image": "image_url"}.get(kind)
        param = f"item.content[{i}]"
        if key is None:
            raise EventError(f"{param}.type must be input_text, input_audio or input_image, got {kind!r}",
                             code="unsupported_content", param=f"{param}.type")
        value = part.get(key)
        if not isinstance(value, str) or (kind != "input_text" and not value):
            raise EventError(f"{param}.{key} must be a {'string' if kind == 'input_text' else 'non-empty string'}",
                             param=f"{param}.{key}")
        if kind == "input_image" and not value[:20].lower().startswith(IMAGE_TYPES):
            raise EventError(f"{param}.image_url must be a data URL of a JPEG, PNG or WebP image "
                             "(data:image/jpeg;base64,…)", code="invalid_image", param=f"{param}.image_url")
        pts = part.get("pts_ms")
        if pts is not None and (kind != "input_image" or not is_millis(pts)):
            raise EventError(f"{param}.pts_ms must be a number of milliseconds on an input_image, got {pts!r}",
                             param=f"{param}.pts_ms")
        parts.append(Part(kind, value, pts, i))
    return parts


def acked_item(item_id: str, parts: list[Part]) -> dict[str, Any]:
    """The user item as conversation.item.added/done say it: its parts without
    their media (an image is not sent back; an audio part is named, not echoed)."""
    return message_item(item_id, "user", "completed", [{"type": p.kind, "text": p.value} if p.kind == "input_text"
                                                        else {"type": p.kind} for p in parts])


class Question:
    """The text and audio items added since the last response: the next
    response's question. An item that would pass a limit is refused whole.
    Image items count too: a picture alone is something to answer (the API
    answers it, and the Agents SDK asks a response after every message)."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.audio: list[np.ndarray] = []  # 16 kHz float samples, one array an item
        self.images = 0  # image items since the last response (their frames are in the buffer)

    def __bool__(self) -> bool:
        return bool(self.texts or self.audio or self.images)

    def check(self, texts: list[str], audio: list[np.ndarray], max_audio_s: float) -> None:
        """Raises EventError when an item's text and audio would make the question too long."""
        if sum(map(len, self.texts + texts)) > MAX_QUESTION_CHARS:
            raise EventError(f"the next response's question would pass {MAX_QUESTION_CHARS} characters",
                             "question_too_long", "item.content")
        if sum(a.size for a in self.audio + audio) > max_audio_s * AUDIO_RATE:
            raise EventError(f"the next response's spoken question would pass {max_audio_s:g} s of audio",
                             "question_too_long", "item.content")

    def add(self, texts: list[str], audio: list[np.ndarray], images: int = 0) -> None:
        self.texts += texts
        self.audio += audio
        self.images += images

    def take_text(self) -> str:
        """The text for a response (its image items are answered with it)."""
        text, self.texts, self.images = "\n".join(self.texts), [], 0
        return text

    def take_answered_text(self) -> str:
        """The text an assistant history message answered: the question of
        that exchange. Image items stay pending: their frames are the
        buffer's, not the exchange's, and still ask for the next response."""
        text, self.texts = "\n".join(self.texts), []
        return text

    def take(self) -> tuple[str, np.ndarray | None]:
        """The question's text and its audio (None without any), and a fresh start."""
        audio, self.audio = self.audio, []
        return self.take_text(), np.concatenate(audio) if audio else None
