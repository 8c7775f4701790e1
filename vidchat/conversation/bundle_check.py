"""A bundle's manifest checked value by value, before a frame is decoded.

A manifest may come from elsewhere (the page takes uploads): every value the
page shows or uses is checked by type and range, its settings through the
checks every door uses, and what its frames and audio would decode to is
held to MAX_BUNDLE_DECODED_BYTES, so a small upload cannot become a large
allocation. Reading the bundle is :mod:`vidchat.conversation.recording`;
the fields are :mod:`vidchat.conversation.bundle_format`'s.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

from vidchat.conversation.bundle_format import (
    AUDIO_SAMPLE_BYTES, MAX_BUNDLE_DECODED_BYTES, MAX_BUNDLE_FRAMES, BundleError,
)
from vidchat.media import AUDIO_RATE
from vidchat.media.session import MAX_AUDIO_SECONDS


def _number(value: Any, least: float | None = None) -> bool:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return ok and (least is None or value >= least)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63


def _check(where: str, field: str, value: Any, ok: Callable[[Any], bool], expected: str,
           nullable: bool = True) -> None:
    if (value is None and nullable) or (value is not None and ok(value)):
        return
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    raise BundleError(f"{where}: manifest field '{field}' must be {expected}, got {shown}")


def _text(value: Any) -> bool:
    return isinstance(value, str)


def check_manifest(manifest: dict[str, Any], where: str = "bundle",
                   max_audio_seconds: float = MAX_AUDIO_SECONDS) -> None:
    """A manifest from elsewhere, value by value: its settings through the
    checks every door uses (vidchat.conversation.answer_path.checked_settings), everything else
    the page shows or uses by type and range, its audio.seconds against
    ``max_audio_seconds`` (a server's --ws-max-audio-seconds), and the
    decoded size of its frames and audio against MAX_BUNDLE_DECODED_BYTES,
    all before a frame is read. Raises BundleError naming the field."""
    from vidchat.conversation.answer_path import checked_settings

    settings = manifest.get("settings") or {}
    top = {k: manifest[k] for k in ("seed", "frames_as") if manifest.get(k) is not None}
    for label, values in (("settings", settings), ("", top)):
        try:
            checked_settings(values)
        except ValueError as exc:
            raise BundleError(f"{where}: manifest {label + ' ' if label else ''}rejected: {exc}") from None
    _check(where, "answer", manifest.get("answer"), _text, "text")
    for name in ("model", "model_option", "model_revision", "prompt", "source"):
        _check(where, name, manifest.get(name), _text, "text or null")
    _check(where, "t", manifest.get("t"), _number, "a number or null")
    _check(where, "video_fps", manifest.get("video_fps"), lambda v: _number(v) and v > 0, "a positive number")
    _check(where, "inputs_sha256", manifest.get("inputs_sha256"),
           lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{0,64}", v) is not None, "a hex digest")
    history = manifest.get("history") or []
    _check(where, "history", history, lambda v: isinstance(v, list) and all(
        isinstance(h, dict) and h.get("role") in ("user", "assistant") and isinstance(h.get("content"), str)
        for h in v), "a list of {role: user|assistant, content: text}", nullable=False)
    for group, names, ok, expected in (
            ("tokens", ("prompt_tokens", "cached_tokens", "completion_tokens"), _count, "a whole number >= 0"),
            ("tokens", ("finish_reason",), _text, "text or null"),
            ("timings", ("prep_ms", "ttft_ms", "total_s", "tokens_per_s"), lambda v: _number(v, 0), "a number >= 0")):
        values = manifest.get(group) or {}
        _check(where, group, values, lambda v: isinstance(v, dict), "an object", nullable=False)
        for name in names:
            _check(where, f"{group}.{name}", values.get(name), ok, expected)
    for name in ("record", "spoken_question", "audio", "engine"):
        _check(where, name, manifest.get(name), lambda v: isinstance(v, dict), "an object or null")
    record = manifest.get("record") or {}
    _check(where, "record.model_revision", record.get("model_revision"), _text, "text or null")
    spoken = manifest.get("spoken_question") or {}
    for name in ("start", "seconds"):
        _check(where, f"spoken_question.{name}", spoken.get(name), _number, "a number or null")
    seconds = _checked_audio(manifest, where, max_audio_seconds)
    _check_media_size(manifest, where, seconds)


def _checked_audio(manifest: dict[str, Any], where: str, max_audio_seconds: float) -> float:
    """The manifest's audio entry checked; returns its seconds."""
    audio = manifest.get("audio") or {}
    # Its WAV is then held to it (recording._read_audio): a bundle says how long its audio is.
    _check(where, "audio.seconds", audio.get("seconds"), lambda v: _number(v, 0), "a number >= 0",
           nullable=not audio)
    _check(where, "audio.samples", audio.get("samples"), _count, "a whole number >= 0")
    seconds = audio.get("seconds") or 0.0
    if seconds > max_audio_seconds:
        raise BundleError(f"{where}: manifest field 'audio.seconds' is {seconds:g} s; a bundle's audio may be at "
                          f"most {max_audio_seconds:g} s here (the server's --ws-max-audio-seconds)")
    _check(where, "audio.span", audio.get("span"), lambda v: isinstance(v, list) and len(v) == 2 and all(
        x is None or _number(x) for x in v), "[start, end] in seconds")
    return seconds


def _check_media_size(manifest: dict[str, Any], where: str, seconds: float) -> None:
    """Each frame entry checked, and what the frames and audio decode to held to MAX_BUNDLE_DECODED_BYTES."""
    listed = manifest.get("frames") or []
    if not isinstance(listed, list) or len(listed) > MAX_BUNDLE_FRAMES:
        raise BundleError(f"{where}: the manifest's frames must be a list of at most {MAX_BUNDLE_FRAMES}")
    decoded = 0
    for n, entry in enumerate(listed):
        if not isinstance(entry, dict):
            raise BundleError(f"{where}: a frame entry of the manifest is not an object")
        for name in ("width", "height"):
            _check(where, f"frames[{n}].{name}", entry.get(name), lambda v: _count(v) and 0 < v <= 1 << 16,
                   "a whole number of pixels", nullable=False)
        for name in ("t", "source_t"):
            _check(where, f"frames[{n}].{name}", entry.get(name), _number, "a number or null")
        _check(where, f"frames[{n}].index", entry.get("index"), _count, "a whole number >= 0 or null")
        decoded += entry["width"] * entry["height"] * 3
    audio_bytes = round(seconds * AUDIO_RATE) * AUDIO_SAMPLE_BYTES
    if decoded + audio_bytes > MAX_BUNDLE_DECODED_BYTES:
        with_audio = f" and {seconds:g} s of audio" if audio_bytes else ""
        raise BundleError(f"{where}: its {len(listed)} frames{with_audio} would decode to "
                          f"{(decoded + audio_bytes) / 2**20:.0f} MB; a bundle's frames and audio may decode to at "
                          f"most {MAX_BUNDLE_DECODED_BYTES >> 20} MB")
