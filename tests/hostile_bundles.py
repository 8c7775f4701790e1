"""Recording bundles as someone else might craft them (issue 21): markup in
every field, wrong types, and frames that decode to far more than the zip
weighs. Shared by the unit, engine, browser and fuzz tests."""

from __future__ import annotations

import copy
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vidchat.engine import inputs_digest

# Each payload would run script or create an element if it reached the page as markup.
MARKUP = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script><svg onload=alert(1)>'

# Fields the manifest holds as numbers (or choices, or a digest): markup there is refused, by name.
NUMBER_FIELDS = [
    ("settings", "temperature"), ("settings", "seed"), ("settings", "max_tokens"), ("settings", "frames_as"),
    ("settings", "num_sample_frames"), ("settings", "include_audio"),
    ("", "seed"), ("", "frames_as"), ("", "inputs_sha256"), ("", "video_fps"), ("", "t"),
    ("tokens", "prompt_tokens"), ("tokens", "completion_tokens"), ("timings", "ttft_ms"),
    ("timings", "tokens_per_s"), ("frames", "index"), ("frames", "t"), ("frames", "width"),
]


def frames(n: int = 2, size: tuple[int, int] = (32, 24)) -> list[np.ndarray]:
    w, h = size
    return [np.full((h, w, 3), (40 * i) % 256, dtype=np.uint8) for i in range(n)]


def _png(frame: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(frame, "RGB").save(buf, "PNG")
    return buf.getvalue()


def manifest(pixels: list[np.ndarray], text: str = "What is there?") -> dict[str, Any]:
    """A version-1 manifest for these frames; ``text`` goes into every string field."""
    return {
        "version": 1, "kind": "vidchat.bundle", "created": text, "question": text,
        "history": [{"role": "user", "content": text}, {"role": "assistant", "content": text}],
        "answer": text, "t": 1.5, "source": text, "model": text, "model_option": text,
        "engine": {"model": text}, "seed": 7,
        "settings": {"frames_as": "images", "max_tokens": 4, "temperature": 0.0, "include_audio": False,
                     "system_prompt": text, "seed": 7, "num_sample_frames": len(pixels)},
        "prompt": text,
        "timings": {"prep_ms": 1.0, "ttft_ms": 2.0, "total_s": 0.1, "tokens_per_s": 10.0},
        "tokens": {"prompt_tokens": 10, "cached_tokens": 0, "completion_tokens": 4, "finish_reason": text},
        "inputs_sha256": inputs_digest(pixels, None), "spoken_question": None, "frames_as": "images",
        "video_fps": None,
        "frames": [{"file": f"frame-{i + 1:04d}.png", "t": float(i), "index": i, "width": f.shape[1],
                    "height": f.shape[0], "source_t": None} for i, f in enumerate(pixels)],
        "audio": None, "record": {"model_revision": text},
    }


def with_value(base: dict[str, Any], group: str, name: str, value: Any) -> dict[str, Any]:
    """A copy of ``base`` with one field (``group`` "" for the top level, "frames" for the first frame) set."""
    out = copy.deepcopy(base)
    target = out if not group else (out[group][0] if group == "frames" else out[group])
    target[name] = value
    return out


def write_zip(path: Path, pixels: list[np.ndarray], meta: dict[str, Any], folder: str = "0001-t1.5",
              wav: bytes | None = None) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{folder}/manifest.json", json.dumps(meta))
        for i, frame in enumerate(pixels):  # the files, whatever the manifest says of them
            zf.writestr(f"{folder}/frame-{i + 1:04d}.png", _png(frame))
        if wav is not None:
            zf.writestr(f"{folder}/audio.wav", wav)
    return path


def with_audio(meta: dict[str, Any], pixels: list[np.ndarray], seconds: float,
               says: float | None = None) -> tuple[dict[str, Any], bytes]:
    """``meta`` with ``seconds`` of silence as its audio, whose manifest says
    it lasts ``says`` seconds (default: the truth); (the manifest, the WAV)."""
    from vidchat.conversation.bundles import wav_bytes
    from vidchat.media import AUDIO_RATE

    audio = np.zeros(round(seconds * AUDIO_RATE), np.float32)
    wav, fmt = wav_bytes(audio)
    out = copy.deepcopy(meta)
    told = seconds if says is None else says
    out["audio"] = {"file": "audio.wav", "format": fmt, "sample_rate": AUDIO_RATE,
                    "samples": round(told * AUDIO_RATE), "seconds": told, "span": [0.0, told]}
    out["inputs_sha256"] = inputs_digest(pixels, audio)
    return out, wav


def hostile_zip(path: Path) -> Path:
    """Markup in every string field; the numbers are right, so the bundle loads."""
    pixels = frames()
    return write_zip(path, pixels, manifest(pixels, MARKUP), folder="0001")


def bomb_zip(path: Path, n: int, side: int = 4096) -> Path:
    """``n`` uniform side x side PNGs (one PNG's bytes, stored n times): a
    small zip whose frames decode to n x side² x 3 bytes."""
    black = np.zeros((side, side, 3), dtype=np.uint8)
    one = _png(black)
    meta = manifest([np.zeros((1, 1, 3), dtype=np.uint8)] * n)
    for entry in meta["frames"]:
        entry["width"] = entry["height"] = side
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("0001/manifest.json", json.dumps(meta))
        for entry in meta["frames"]:
            zf.writestr(f"0001/{entry['file']}", one)
    return path
