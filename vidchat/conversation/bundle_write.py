"""Writing bundles: one finished answer with exactly what the model was
given, as a folder on disk (:func:`write_bundle`), and bundle folders packed
into one zip for the page's download (:func:`zip_bundles`,
:func:`iter_zip_bundles`). The format is :mod:`vidchat.conversation.bundle_format`.

A bundle is written only when someone asks for it (``--record-dir`` on the
server, ``--out`` on ``python -m vidchat.replay``); nothing in this module
writes otherwise, so with recording off nothing touches the disk.

A bundle folder is written under a temporary name and renamed when complete,
so a reader never sees half a bundle. :func:`zip_bundles` packs bundles into
one zip (one folder each), :func:`iter_zip_bundles` streams it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import io
import json
import logging
import os
import re
import zipfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from vidchat.conversation.bundle_format import (
    AUDIO_FILE, BUNDLE_VERSION, KIND, MANIFEST, BundleError, audio_used, png_bytes, wav_bytes,
)
from vidchat.engine import Turn, inputs_digest
from vidchat.media import AUDIO_RATE

log = logging.getLogger(__name__)


def _json_safe(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _json_safe(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def history_dicts(history: Iterable[Turn | dict]) -> list[dict[str, str]]:
    """Chat history as [{"role", "content"}] (from engine Turns or such dicts)."""
    out = []
    for turn in history:
        if isinstance(turn, Turn):
            out.append({"role": turn.role, "content": turn.text})
        else:
            out.append({"role": str(turn["role"]), "content": str(turn["content"])})
    return out


def _bundle_name(seq: int, t: float | None) -> str:
    if t is None:
        return f"{seq:04d}"
    return f"{seq:04d}-t{t:.1f}" if round(t, 1) == round(t, 3) else f"{seq:04d}-t{t:.3f}"


def _next_seq(root: Path) -> int:
    seqs = [int(m.group(1)) for p in root.iterdir() if (m := re.match(r"^(\d{4,})(?:-|$)", p.name))]
    return max(seqs, default=0) + 1


def write_bundle(
    root: str | os.PathLike,
    answer: Any,
    *,
    history: Sequence[Turn | dict] | None = None,
    settings: dict[str, Any] | None = None,
    t: float | None = None,
    source: str | None = None,
    model_option: str | None = None,
    engine_options: Any = None,
    name: str | None = None,
) -> Path:
    """Write one finished answer (a :class:`vidchat.conversation.answer_path.Answer`) as a bundle
    folder under ``root`` (created if missing) and return its path.

    ``settings``: the effective answer and sampling settings, flat (default:
    the answer's options); ``history``: the chat before the question (engine
    Turns or {"role", "content"} dicts; default: the answer's own ``history``
    where it keeps one); ``t``/``source``: when and where the
    question was asked; ``model_option``/``engine_options``: how the model was
    chosen and started, so a re-ask can start the same. ``name`` overrides the
    folder name (default: the next free sequence number, plus ``-tT``)."""
    record = answer.summary()
    frames = [np.ascontiguousarray(f) for f in answer.sample.frames]
    audio = audio_used(answer)
    digest = inputs_digest(frames, audio)
    if record.get("inputs_sha256") and digest != record["inputs_sha256"]:
        log.warning("bundle: the stored frames/audio hash to %s…, the engine reported %s…",
                    digest[:12], record["inputs_sha256"][:12])
    if settings is None:
        settings = dataclasses.asdict(answer.options)
    else:  # the seed it actually used (drawn when none was set): re-asked, it answers the same
        settings = {**settings, "seed": answer.options.seed}
    if history is None:
        history = getattr(answer, "history", None) or ()

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    files, frame_entries, audio_entry = _media_files(frames, audio, record)
    manifest = _manifest(answer, record, history, settings, digest, frame_entries, audio_entry,
                         t=t, source=source, model_option=model_option, engine_options=engine_options)
    files[MANIFEST] = (json.dumps(_json_safe(manifest), indent=2, ensure_ascii=False) + "\n").encode()
    final = _write_whole(root, files, name, t)
    log.info("bundle written: %s (%d frames%s)", final, len(frames), ", audio" if audio is not None else "")
    return final


def _manifest(answer: Any, record: dict[str, Any], history: Any, settings: dict[str, Any], digest: str,
              frame_entries: list, audio_entry: Any, **asked: Any) -> dict[str, Any]:
    """The bundle's manifest.json (layout: vidchat.conversation.bundle_format);
    ``asked``: t, source, model_option, engine_options."""
    t, source, model_option, engine_options = (asked[k] for k in ("t", "source", "model_option", "engine_options"))
    return {
        "version": BUNDLE_VERSION,
        "kind": KIND,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "question": answer.question,
        "history": history_dicts(history),
        "answer": answer.reply.text,
        "t": t,
        "source": source,
        "model": record.get("model"),
        "model_option": model_option,
        "engine": engine_options,
        "seed": record.get("seed"),
        "settings": settings,
        "prompt": record.get("prompt"),
        "timings": {k: record.get(k) for k in ("prep_ms", "ttft_ms", "total_s", "tokens_per_s")},
        "tokens": {k: record.get(k) for k in ("prompt_tokens", "cached_tokens", "completion_tokens",
                                              "finish_reason")},
        "inputs_sha256": digest,
        # Talk mode: the audio was the question ({seconds, start, end}); null for a typed one.
        "spoken_question": record.get("spoken_question"),
        "frames_as": record.get("frames_as"),
        "video_fps": record.get("video_fps"),
        "frames": frame_entries,
        "audio": audio_entry,
        "mark": record.get("mark"),  # a QA verdict (vidchat.conversation.answer_marks), null without one
        "record": record,
    }


def _media_files(frames: list[np.ndarray], audio: np.ndarray | None,
                 record: dict[str, Any]) -> tuple[dict[str, bytes], list[dict[str, Any]], dict[str, Any] | None]:
    """The bundle's frames (PNG) and audio (WAV) by file name, with their manifest entries."""
    frame_entries = []
    files: dict[str, bytes] = {}
    times = record.get("frame_times") or [None] * len(frames)
    indices = record.get("frame_indices") or [None] * len(frames)
    source_times = record.get("frame_source_times") or [None] * len(frames)
    for i, frame in enumerate(frames):
        fname = f"frame-{i + 1:04d}.png"
        files[fname] = png_bytes(frame)
        frame_entries.append({"file": fname, "t": times[i], "index": indices[i],
                              "width": int(frame.shape[1]), "height": int(frame.shape[0]),
                              "source_t": source_times[i]})
    audio_entry = None
    if audio is not None:
        files[AUDIO_FILE], fmt = wav_bytes(audio)
        audio_entry = {"file": AUDIO_FILE, "format": fmt, "sample_rate": AUDIO_RATE, "samples": int(audio.size),
                       "seconds": round(audio.size / AUDIO_RATE, 6), "span": record.get("audio_span")}
    return files, frame_entries, audio_entry


def _write_whole(root: Path, files: dict[str, bytes], name: str | None, t: float | None) -> Path:
    """Write ``files`` as a new bundle folder under ``root``; its path.

    Under a temporary name, renamed when whole: a reader never sees half a bundle."""
    while True:
        final = root / (name or _bundle_name(_next_seq(root), t))
        tmp = root / f".{final.name}.{os.getpid()}.partial"
        tmp.mkdir()
        try:
            for fname, data in files.items():
                (tmp / fname).write_bytes(data)
            try:
                os.rename(tmp, final)  # fails if final exists (a folder that is not empty)
            except OSError:
                if final.exists() and name is None:  # another writer took the number: take the next
                    _remove_tree(tmp)
                    continue
                raise
        except BaseException:
            _remove_tree(tmp)
            raise
        return final


def _remove_tree(path: Path) -> None:
    if not path.exists():
        return
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


# ---------------------------------------------------------------------------
# Zip (the page's download)
# ---------------------------------------------------------------------------

def zip_bundles(paths: Iterable[str | os.PathLike]) -> bytes:
    """Bundle folders packed into one zip, in memory (one folder per bundle,
    under its own name). A zip of one bundle can be re-asked as it is."""
    return b"".join(iter_zip_bundles(paths))


class _Pipe(io.RawIOBase):
    """A write-only, unseekable stream whose bytes are taken as they come:
    zipfile then writes each member's sizes after its data, as a stream can."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._chunks.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self._chunks = b"".join(self._chunks), []
        return out


def iter_zip_bundles(paths: Iterable[str | os.PathLike], chunk: int = 1 << 20) -> Iterator[bytes]:
    """The zip of :func:`zip_bundles` as it is written, a piece at a time, so
    a download of many bundles never holds them all in memory. The folders
    are checked before the first piece (raises BundleError)."""
    members: list[tuple[Path, str]] = []
    seen: set[str] = set()
    for path in paths:
        p = Path(path)
        if not (p / MANIFEST).is_file():
            raise BundleError(f"{p}: not a bundle folder")
        if p.name in seen:
            raise BundleError(f"two bundles named {p.name}")
        seen.add(p.name)
        members += [(child, f"{p.name}/{child.name}") for child in sorted(p.iterdir()) if child.is_file()]
    return _zip_pieces(members, chunk)


def _zip_pieces(members: list[tuple[Path, str]], chunk: int) -> Iterator[bytes]:
    pipe = _Pipe()
    with zipfile.ZipFile(pipe, "w", zipfile.ZIP_DEFLATED) as zf:
        for child, arcname in members:
            info = zipfile.ZipInfo.from_file(child, arcname)
            # PNGs are already compressed: stored as they are.
            info.compress_type = zipfile.ZIP_STORED if child.suffix == ".png" else zipfile.ZIP_DEFLATED
            with open(child, "rb") as src, zf.open(info, "w") as dst:
                while data := src.read(chunk):
                    dst.write(data)
                    yield pipe.take()
            yield pipe.take()
    yield pipe.take()
