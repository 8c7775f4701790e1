"""Recorded bundles read back, and the one module callers name for bundles.

:func:`read_bundle` reads a bundle folder, or a zip holding one, into the
engine's exact inputs and the manifest, without extracting a zip; a manifest
from elsewhere is checked value by value before a frame is decoded
(:func:`vidchat.conversation.bundles.check_manifest`);
:func:`recorded_answer` makes a bundle a finished answer the page can list
and re-ask. The format (layout, manifest fields, audio encoding) is
:mod:`vidchat.conversation.bundles`; writing and zipping bundles is
:mod:`vidchat.conversation.bundles`. Those and the manifest check are
named here too (``__all__``), so a caller imports one module for bundles.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import io
import json
import logging
import math
import os
import re
import struct
import threading
import weakref
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, cast, overload

import numpy as np
from PIL import Image

from vidchat.conversation.safe_files import writable, write_whole
from vidchat.engine.interface import ReplyStats, Turn
from vidchat.engine.prompts import inputs_digest
from vidchat.media import AUDIO_RATE
from vidchat.media.session import MAX_AUDIO_SECONDS
from vidchat.media.vad import Utterance

if TYPE_CHECKING:
    from vidchat.conversation.answers import Answer
    from vidchat.media.sampling import Sample
    from vidchat.media.scene_log import MemoryUse

log = logging.getLogger(__name__)


# The bundle format: one answer with exactly what the model was given, on disk.
#
# Written by :mod:`vidchat.conversation.bundles`, read back by
# :mod:`vidchat.conversation.bundles`; both take their names, limits and
# media codecs from here. The media encoders (:func:`audio_used`,
# :func:`wav_bytes`, :func:`png_bytes`) also serve the page's ``/inputs/<id>/``
# files, in memory (:mod:`vidchat.doors.answer_routes`), so a bundle and the page hold
# the same bytes.
#
# Layout (``BUNDLE_VERSION`` 1)::
#
#     0001-t3.0/                 one folder per answer: sequence number, and the
#     │                           media time asked (seconds) when known
#     ├── manifest.json          everything but the pixels and samples (below)
#     ├── frame-0001.png         the frames handed to the engine, oldest first,
#     ├── frame-0002.png         lossless RGB PNG at the stored size (exactly the
#     ├── …                      uint8 arrays the engine got)
#     └── audio.wav              the audio handed to the engine (absent if none)
#
# ``manifest.json``::
#
#     version         1 (a reader refuses versions it does not know)
#     kind            "vidchat.bundle"
#     created         UTC time the bundle was written (ISO 8601; informational)
#     question        the question text
#     history         the chat before it: [{"role": "user"|"assistant", "content": text}, …]
#     answer          the answer text
#     t               media time at which the question was asked (seconds), or null
#     source          where the media came from (a file name, "camera", a bundle…), or null
#     model           the model path or hub id the engine ran
#     model_name      the model's one name (preset, hub id or folder), as reports and baselines name it, or null
#     model_option    the --model value it was resolved from ("tiny", a preset…), or null
#     engine          the engine options (dtype, max_model_len, max_images, pixel cap, …), or null
#     seed            the sampling seed (null: vLLM's own)
#     settings        the effective answer and sampling settings, flat, with the
#                     names ``vidchat.qa.replay --set`` and the WebSocket
#                     session.config take (frames_as, temperature, max_tokens,
#                     seed, system_prompt, include_audio, num_sample_frames,
#                     sampling, evs_threshold, …) plus store_max_pixels
#     prompt          the prompt as the model's chat template rendered it
#     timings         prep_ms, ttft_ms, total_s, tokens_per_s
#     tokens          prompt_tokens, cached_tokens, completion_tokens, finish_reason
#     inputs_sha256   vidchat.engine.inputs_digest of the frames and audio below
#     frames_as       "images" or "video"; video_fps for video
#     frames          [{"file", "t", "index", "width", "height", "source_t"}, …]: t in
#                     seconds on the session's timeline (a replayed file: seconds
#                     of the file), index into the session's frame buffer when
#                     sampled, source_t the frame's position in the played file
#                     (seconds; null for a live source). Bundles written before
#                     source_t existed lack it: readers treat it as null.
#     audio           {"file", "format", "sample_rate", "samples", "seconds", "span"} or null
#     record          the answer record as vidchat.conversation.asking.Answer.summary() gave it
#     memory          what the question got of its session's memory (vidchat.conversation.memory),
#                     or absent/null: {"text" (the block before the question, exactly), "tokens",
#                     "keyframes", "pointed", "captions": [{"seq", "ago_s", "caption"}],
#                     "frames": [{"file": "memory-0001.png", "seq", "t" (from the session's start), "ago_s", "source_t",
#                     "caption", "width", "height"}]}; its keyframes are PNGs beside the frames,
#                     given to the engine before them. A re-ask uses them as they are: the
#                     recorded captions, never written again.
#
# Audio format. The engine gets float32 samples at 16 kHz mono. A session stores
# audio as 16-bit PCM and hands out ``int16 / 32768``, so those samples are
# exactly representable as 16-bit PCM: the bundle then holds a plain 16-bit PCM
# WAV (``"format": "pcm16"``), which every player opens, and reading it back as
# ``int16 / 32768`` gives the engine's float32 samples bit for bit. Audio that
# is not 16-bit exact (another producer) is written as a 32-bit IEEE-float WAV
# (``"format": "float32"``, WAVE_FORMAT_IEEE_FLOAT; the stdlib ``wave`` module
# writes PCM only, so both are written here with ``struct``). Either way
# :func:`vidchat.conversation.bundles.read_bundle` returns the very samples that were hashed, and
# ``inputs_digest(bundle.frames, bundle.audio) == manifest["inputs_sha256"]``.

BUNDLE_VERSION = 1

MANIFEST = "manifest.json"

AUDIO_FILE = "audio.wav"

KIND = "vidchat.bundle"

_WAVE_FORMAT_PCM = 1

_WAVE_FORMAT_IEEE_FLOAT = 3

_PCM_SCALE = 32768.0  # vidchat.media.audio.AudioWindow hands out int16 / 32768

# Most pixels one stored frame of a bundle may have when read (an untrusted
# zip must not decode to gigabytes); far above any stored size vidchat uses.
MAX_FRAME_PIXELS = 4096 * 4096

# Most bytes one file of a bundle may unpack to, and most frames it may hold.
MAX_MEMBER_BYTES = 128 << 20

MAX_BUNDLE_FRAMES = 1024

# Most bytes a bundle may decode to: its frames (width x height x 3 summed
# over the manifest's frames) and its audio as float32 (the manifest's
# audio.seconds at 16 kHz, 4 bytes a sample), checked before anything is
# decoded: a zip of uniform 4096x4096 PNGs is small and would decode to
# gigabytes. A bundle loaded into the page holds no more than this either
# (its frames' PNG bytes and its audio). A recording at the stored size
# (320x240) of 64 frames and 30 s of audio needs 17 MB.
MAX_BUNDLE_DECODED_BYTES = 512 << 20

AUDIO_SAMPLE_BYTES = 4  # float32, as the engine gets it


class BundleError(ValueError):
    """A bundle that cannot be read (missing file, unknown version, bad data)."""


class WavTooLong(BundleError):
    """A WAV holding more samples than its reader allows (``samples`` at ``rate`` Hz)."""

    def __init__(self, samples: int, rate: int) -> None:
        super().__init__(f"the WAV holds {samples} samples at {rate} Hz, more than allowed")
        self.samples, self.rate = samples, rate


def audio_used(answer: Any) -> np.ndarray | None:
    """The audio samples the engine got for an answer (a :class:`vidchat.conversation.asking.Answer`),
    float32 mono; None when it got none: include_audio off, or audio the engine
    dropped (a vision-only model, a sliver under 0.1 s), which it reports as 0 seconds."""
    if not answer.reply.stats.audio_seconds or answer.sample.audio is None:
        return None
    return np.ascontiguousarray(answer.sample.audio, dtype=np.float32).reshape(-1)


def _is_pcm16_exact(audio: np.ndarray) -> bool:
    scaled = audio.astype(np.float64) * _PCM_SCALE
    return bool(np.all(scaled == np.round(scaled)) and scaled.min(initial=0) >= -32768 and
                scaled.max(initial=0) <= 32767)


def wav_bytes(audio: np.ndarray, rate: int = AUDIO_RATE) -> tuple[bytes, str]:
    """A mono WAV of float32 samples: (bytes, "pcm16" | "float32"); lossless either way."""
    samples = np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
    if _is_pcm16_exact(samples):
        data = np.round(samples.astype(np.float64) * _PCM_SCALE).astype("<i2").tobytes()
        fmt, tag, bits = "pcm16", _WAVE_FORMAT_PCM, 16
    else:
        data = samples.astype("<f4").tobytes()
        fmt, tag, bits = "float32", _WAVE_FORMAT_IEEE_FLOAT, 32
    block = bits // 8
    fmt_chunk = struct.pack("<HHIIHH", tag, 1, rate, rate * block, block, bits)
    if tag != _WAVE_FORMAT_PCM:
        fmt_chunk += struct.pack("<H", 0)  # cbSize: non-PCM formats carry it
    chunks = b"fmt " + struct.pack("<I", len(fmt_chunk)) + fmt_chunk
    if tag != _WAVE_FORMAT_PCM:
        chunks += b"fact" + struct.pack("<II", 4, samples.size)  # required for non-PCM
    chunks += b"data" + struct.pack("<I", len(data)) + data
    if len(data) % 2:
        chunks += b"\0"
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks, fmt


def read_wav(data: bytes, max_samples: int | None = None) -> tuple[np.ndarray, int]:
    """(float32 mono samples, rate) from a 16-bit PCM or 32-bit float mono WAV;
    ``max_samples``: a WAV holding more is refused before it is converted
    (a 128 MiB member of 16-bit PCM would be 256 MiB of float32)."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise BundleError("audio is not a WAV file")
    pos, fmt, payload = 12, None, None
    while pos + 8 <= len(data):
        cid, size = data[pos:pos + 4], struct.unpack("<I", data[pos + 4:pos + 8])[0]
        body = data[pos + 8:pos + 8 + size]
        if cid == b"fmt ":
            if len(body) < 16:
                raise BundleError("WAV fmt chunk too short")
            fmt = struct.unpack("<HHIIHH", body[:16])
        elif cid == b"data":
            payload = body
        pos += 8 + size + (size % 2)
    if fmt is None or payload is None:
        raise BundleError("WAV file without fmt or data chunk")
    tag, channels, rate, _, _, bits = fmt
    if channels != 1:
        raise BundleError(f"WAV must be mono, has {channels} channels")
    if tag in (_WAVE_FORMAT_PCM, _WAVE_FORMAT_IEEE_FLOAT) and bits in (16, 32) and max_samples is not None:
        held = len(payload) // (bits // 8)
        if held > max_samples:
            raise WavTooLong(held, rate)
    if tag == _WAVE_FORMAT_PCM and bits == 16:
        pcm = np.frombuffer(payload[: len(payload) // 2 * 2], "<i2")
        return pcm.astype(np.float32) * np.float32(1.0 / _PCM_SCALE), rate
    if tag == _WAVE_FORMAT_IEEE_FLOAT and bits == 32:
        return np.frombuffer(payload[: len(payload) // 4 * 4], "<f4").astype(np.float32), rate
    raise BundleError(f"unsupported WAV encoding (format {tag}, {bits} bits): expected 16-bit PCM or 32-bit float")


def png_bytes(frame: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(frame, dtype=np.uint8), "RGB").save(buf, format="PNG")
    return buf.getvalue()


def read_png(data: bytes, size: tuple[int, int] | None = None) -> np.ndarray:
    """A PNG's RGB pixels; ``size`` (width, height): what its header must say, checked before decoding."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.format != "PNG":
                raise BundleError(f"frame is {img.format}, not PNG")
            if img.width * img.height > MAX_FRAME_PIXELS:
                raise BundleError(f"frame of {img.width}x{img.height} is larger than a bundle frame may be")
            if size is not None and img.size != size:
                raise BundleError(f"frame is {img.width}x{img.height}, the manifest says {size[0]}x{size[1]}")
            return np.asarray(img.convert("RGB"))
    except (OSError, Image.DecompressionBombError) as exc:
        raise BundleError(f"frame is not a readable PNG: {exc}") from None


# Writing bundles: one finished answer with exactly what the model was
# given, as a folder on disk (:func:`write_bundle`), and bundle folders packed
# into one zip for the page's download (:func:`zip_bundles`,
# :func:`iter_zip_bundles`). The format is :mod:`vidchat.conversation.bundles`.
#
# A bundle is written only when someone asks for it (``--record-dir`` on the
# server, ``--out`` on ``python -m vidchat.replay``); nothing in this module
# writes otherwise, so with recording off nothing touches the disk.
#
# A bundle folder is written under a temporary name and renamed when complete,
# so a reader never sees half a bundle. :func:`zip_bundles` packs bundles into
# one zip (one folder each), :func:`iter_zip_bundles` streams it.

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


def history_dicts(history: Iterable[Turn | dict[str, Any]]) -> list[dict[str, str]]:
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
    root: str | os.PathLike[str],
    answer: Answer,
    *,
    history: Sequence[Turn | dict[str, Any]] | None = None,
    settings: dict[str, Any] | None = None,
    t: float | None = None,
    source: str | None = None,
    model_option: str | None = None,
    engine_options: Any = None,
    name: str | None = None,
) -> Path:
    """Write one finished answer (a :class:`vidchat.conversation.asking.Answer`) as a bundle
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
    memory = getattr(answer, "memory", None)
    if memory is not None:
        manifest["memory"] = _memory_entry(memory, files, answer.sample.origin)
    files[MANIFEST] = (json.dumps(_json_safe(manifest), indent=2, ensure_ascii=False) + "\n").encode()
    final = _write_whole(root, files, name, t)
    log.info("bundle written: %s (%d frames%s)", final, len(frames), ", audio" if audio is not None else "")
    return final


def _manifest(answer: Any, record: dict[str, Any], history: Any, settings: dict[str, Any], digest: str,
              frame_entries: list[dict[str, Any]], audio_entry: Any, **asked: Any) -> dict[str, Any]:
    """The bundle's manifest.json (layout: vidchat.conversation.bundles);
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
        "model_name": record.get("model_name"),  # the model's one name (vidchat.engine.weights.model_name)
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
        "mark": record.get("mark"),  # a QA verdict (vidchat.conversation.bundles), null without one
        "record": record,
    }


def _memory_entry(memory: MemoryUse, files: dict[str, bytes], origin: float) -> dict[str, Any]:
    """The manifest's ``memory`` (layout above), its keyframes added to ``files`` as PNG; times
    from the session's start (``origin``), as the bundle's frames have them."""
    frames = []
    for i, frame in enumerate(memory.frames):
        fname = f"memory-{i + 1:04d}.png"
        files[fname] = png_bytes(frame.pixels)
        frames.append({"file": fname, "seq": frame.seq, "t": round(frame.t - origin, 6), "ago_s": round(frame.ago_s, 6),
                       "source_t": frame.source_t, "caption": frame.caption,
                       "width": int(frame.pixels.shape[1]), "height": int(frame.pixels.shape[0])})
    pointer = memory.pointer
    return {"text": memory.text, "tokens": memory.tokens, "keyframes": memory.keyframes,
            "pointed": None if pointer is None else pointer.phrase,
            "pointed_t": None if pointer is None or pointer.t is None else round(pointer.t - origin, 6),
            "captions": [{"seq": s, "ago_s": round(a, 6), "caption": c} for s, a, c in memory.captions],
            "frames": frames}


# A bundle's memory may carry at most this many keyframes, and this much text.
MAX_MEMORY_FRAMES = 16

MAX_MEMORY_TEXT = 256 * 1024


def _read_memory(src: _Folder | _Zip, where: str, entry: Any) -> MemoryUse | None:
    """A bundle's memory (vidchat.conversation.memory.MemoryUse), checked field by field; None without one."""
    from vidchat.media.scene_log import MemoryFrame, MemoryUse, Pointer

    if entry is None:
        return None

    def bad(field: str, expected: str) -> BundleError:
        return BundleError(f"{where}: manifest field 'memory.{field}' must be {expected}")

    if not isinstance(entry, dict):
        raise BundleError(f"{where}: manifest field 'memory' must be an object or null")
    text, listed, captions = entry.get("text"), entry.get("frames") or [], entry.get("captions") or []
    if not isinstance(text, str) or len(text) > MAX_MEMORY_TEXT:
        raise bad("text", f"text of at most {MAX_MEMORY_TEXT} characters")
    if not isinstance(listed, list) or len(listed) > MAX_MEMORY_FRAMES:
        raise bad("frames", f"a list of at most {MAX_MEMORY_FRAMES}")
    for name in ("tokens", "keyframes"):
        if not _count(entry.get(name, 0)):
            raise bad(name, "a whole number >= 0")
    if not isinstance(captions, list) or not all(
            isinstance(c, dict) and _count(c.get("seq")) and _number(c.get("ago_s")) and isinstance(c.get("caption"), str)
            for c in captions):
        raise bad("captions", "a list of {seq, ago_s, caption}")
    frames = []
    for n, f in enumerate(listed):
        if not (isinstance(f, dict) and _count(f.get("seq")) and _number(f.get("t")) and _number(f.get("ago_s"))
                and (f.get("source_t") is None or _number(f.get("source_t")))
                and (f.get("caption") is None or isinstance(f.get("caption"), str))
                and all(_count(f.get(k)) and 0 < f[k] <= 1 << 16 for k in ("width", "height"))):
            raise bad(f"frames[{n}]", "{file, seq, t, ago_s, source_t, caption, width, height}")
        pixels = read_png(src.read(_safe_file(f.get("file"))), (f["width"], f["height"]))
        pixels.setflags(write=False)
        frames.append(MemoryFrame(f["seq"], float(f["t"]), float(f["ago_s"]), f.get("source_t"), f.get("caption"),
                                  pixels))
    pointed, pointed_t = entry.get("pointed"), entry.get("pointed_t")
    when = float(pointed_t) if isinstance(pointed_t, (int, float)) and _number(pointed_t) else None
    pointer = Pointer(pointed, when) if isinstance(pointed, str) else None
    return MemoryUse(text, int(entry.get("tokens", 0)), tuple(frames),
                     tuple((c["seq"], float(c["ago_s"]), c["caption"]) for c in captions), pointer,
                     int(entry.get("keyframes", 0)))


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


def zip_bundles(paths: Iterable[str | os.PathLike[str]]) -> bytes:
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


def iter_zip_bundles(paths: Iterable[str | os.PathLike[str]], chunk: int = 1 << 20) -> Iterator[bytes]:
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


# A bundle's manifest checked value by value, before a frame is decoded.
#
# A manifest may come from elsewhere (the page takes uploads): every value the
# page shows or uses is checked by type and range, its settings through the
# checks every door uses, and what its frames and audio would decode to is
# held to MAX_BUNDLE_DECODED_BYTES, so a small upload cannot become a large
# allocation. Reading the bundle is :mod:`vidchat.conversation.bundles`;
# the fields are :mod:`vidchat.conversation.bundles`'s.

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
    checks every door uses (vidchat.conversation.asking.checked_settings), everything else
    the page shows or uses by type and range, its audio.seconds against
    ``max_audio_seconds`` (a server's --ws-max-audio-seconds), and the
    decoded size of its frames and audio against MAX_BUNDLE_DECODED_BYTES,
    all before a frame is read. Raises BundleError naming the field."""
    from vidchat.conversation.asking import checked_settings

    settings = manifest.get("settings") or {}
    top = {k: manifest[k] for k in ("seed", "frames_as") if manifest.get(k) is not None}
    for label, values in (("settings", settings), ("", top)):
        try:
            checked_settings(values)
        except ValueError as exc:
            raise BundleError(f"{where}: manifest {label + ' ' if label else ''}rejected: {exc}") from None
    _check(where, "answer", manifest.get("answer"), _text, "text")
    for name in ("model", "model_name", "model_option", "model_revision", "prompt", "source"):
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


# A recorded answer as a reply (vidchat.engine.Reply): what the compare view
# and re-asks read of a bundle's answer, with nothing left to generate.

class RecordedReply:
    """A bundle's answer as the page's compare view reads a live reply: its
    text, its stats and the model that gave it (nothing to generate or cancel)."""

    def __init__(self, manifest: dict[str, Any]):
        self.text = manifest.get("answer") or ""
        timings = manifest.get("timings") or {}
        tokens = manifest.get("tokens") or {}
        record = manifest.get("record") or {}
        ttft_ms = timings.get("ttft_ms")
        self.stats = ReplyStats(
            prompt_tokens=tokens.get("prompt_tokens") or 0,
            cached_tokens=tokens.get("cached_tokens") or 0,
            completion_tokens=tokens.get("completion_tokens") or 0,
            frames=len(manifest.get("frames") or []),
            audio_seconds=float((manifest.get("audio") or {}).get("seconds") or 0.0),
            ttft_s=None if ttft_ms is None else ttft_ms / 1000,
            tokens_per_s=timings.get("tokens_per_s"),
            total_s=timings.get("total_s") or 0.0,
            finish_reason=tokens.get("finish_reason"),
            inputs_sha256=manifest.get("inputs_sha256", ""),
        )
        self.engine = SimpleNamespace(model_path=manifest.get("model") or "",
                                      model_revision=manifest.get("model_revision") or record.get("model_revision")
                                      or "",
                                      # The engine that answered ("main" or "compare"), as recorded.
                                      options=SimpleNamespace(role=(manifest.get("engine") or {}).get("role")
                                                              or record.get("engine") or "main",
                                                              # its one name as recorded (older bundles: none)
                                                              name=manifest.get("model_name")
                                                              or record.get("model_name") or ""))

    def __aiter__(self) -> "RecordedReply":
        return self

    async def __anext__(self) -> str:
        raise StopAsyncIteration  # recorded whole: nothing left to stream

    async def aclose(self) -> None:
        return None  # nothing runs


__all__ = [
    "AUDIO_FILE", "BUNDLE_VERSION", "KIND", "MANIFEST", "MAX_AUDIO_SECONDS", "MAX_BUNDLE_DECODED_BYTES",
    "MAX_BUNDLE_FRAMES", "MAX_FRAME_PIXELS", "MAX_MEMBER_BYTES", "Bundle", "BundleError", "LazyFrames",
    "RecordedReply", "audio_used", "check_manifest", "history_dicts", "is_bundle", "iter_zip_bundles", "png_bytes",
    "read_bundle", "read_png", "read_wav", "recorded_answer", "wav_bytes", "with_frames_decoded", "write_bundle",
    "zip_bundles",
]

# A bundle's file names: no path, nothing hidden.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class _Decoded(list[np.ndarray]):
    """A LazyFrames' frames decoded (a list that can be referred to weakly)."""


class LazyFrames(Sequence[np.ndarray]):
    """A bundle's frames kept as their PNG bytes and decoded when read, for a
    bundle the page holds between re-asks: a small zip of uniform frames may
    decode to 512 MB, and a tab would hold that for as long as it is open.

    An index decodes that one frame; :meth:`decoded` decodes them all once
    and shares the list while anyone holds it (concurrent re-asks of one
    bundle decode it once), so that iterating, while it is held, decodes
    nothing again."""

    def __init__(self, pngs: list[bytes], sizes: list[tuple[int, int]]) -> None:
        self._pngs, self._sizes = pngs, sizes
        self._held: weakref.ref[_Decoded] | None = None
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        """What the frames take while nobody decodes them: their PNG bytes."""
        return sum(len(png) for png in self._pngs)

    def __len__(self) -> int:
        return len(self._pngs)

    def _shared(self) -> "_Decoded | None":
        return self._held() if self._held is not None else None

    @overload
    def __getitem__(self, index: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, index: slice) -> list[np.ndarray]: ...

    def __getitem__(self, index: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        shared = self._shared()
        if shared is not None:
            return shared[index]
        index = range(len(self))[index]  # negative indices, and IndexError past the end
        return read_png(self._pngs[index], self._sizes[index])

    def __iter__(self) -> Iterator[np.ndarray]:
        # One pass decodes each frame once; a held decoded list is reused.
        shared = self._shared()
        if shared is not None:
            return iter(list(shared))
        return (read_png(png, size) for png, size in zip(self._pngs, self._sizes))

    def decoded(self) -> list[np.ndarray]:
        """All the frames as arrays; hold the list while using them."""
        with self._lock:
            shared = self._shared()
            if shared is None:
                shared = _Decoded(read_png(png, size) for png, size in zip(self._pngs, self._sizes))
                self._held = weakref.ref(shared)
            return shared


@dataclass
class Bundle:
    """A bundle read back: the engine's exact inputs and the manifest."""

    path: str
    manifest: dict[str, Any]
    frames: Sequence[np.ndarray]  # RGB uint8 H×W×3, oldest first (a LazyFrames when read lazily)
    audio: np.ndarray | None  # float32 mono 16 kHz, or None
    frame_times: list[float] = field(default_factory=list)
    frame_indices: list[int] = field(default_factory=list)
    _digest: str | None = field(default=None, repr=False)  # computed as the frames were read (lazily read)
    # What the question got of its session's memory (vidchat.conversation.memory), or None.
    memory: MemoryUse | None = None

    @property
    def question(self) -> str:
        return str(self.manifest["question"])

    @property
    def spoken(self) -> Utterance | None:
        """The spoken question when the audio was the question, else None."""
        spoken = self.manifest.get("spoken_question")
        if not isinstance(spoken, dict):
            return None
        start, seconds = spoken.get("start"), spoken.get("seconds")
        start = float(start) if isinstance(start, (int, float)) else 0.0
        seconds = float(seconds) if isinstance(seconds, (int, float)) else 0.0
        return Utterance(start, start + seconds, level_dbfs=-120.0)

    @property
    def inputs_sha256(self) -> str:
        """What the manifest says the engine got."""
        return str(self.manifest.get("inputs_sha256", ""))

    def digest(self) -> str:
        """The hash of the frames and audio as read back (equals inputs_sha256 for an intact bundle)."""
        if self._digest is not None:
            return self._digest
        return inputs_digest(self.frames, self.audio)

    def history(self) -> list[Turn]:
        return [Turn(h["role"], h["content"]) for h in self.manifest.get("history") or []]

    def sample(self) -> Sample:
        """The frames and audio as a :class:`vidchat.media.session.Sample`, on the
        recorded timeline (times as recorded, origin 0)."""
        from vidchat.media.session import Sample

        span = (self.manifest.get("audio") or {}).get("span") or [None, None]
        record = self.manifest.get("record") or {}
        positions = [f.get("source_t") for f in self.manifest.get("frames") or []]
        at_jump = record.get("frame_source_at_jump")
        if not (isinstance(at_jump, list) and len(at_jump) == len(self.frames)
                and all(isinstance(b, bool) for b in at_jump)):
            at_jump = []  # a bundle from before the field: nothing known
        source_span = record.get("audio_source_span")
        # The audio's segments as the engine got them, so a re-ask sends the
        # same clips; unnamed, so vLLM tells them apart by their samples.
        parts = record.get("audio_parts")
        audio_parts: tuple[tuple[int, str | None], ...] = ()
        if (self.audio is not None and isinstance(parts, list) and parts
                and all(isinstance(n, int) and n > 0 for n in parts) and sum(parts) == self.audio.size):
            audio_parts = tuple((n, None) for n in parts)
        # Lazy frames are shared, not copied: copying would decode them all.
        # (A Sample reads its frames as a sequence: by index, by length, in order.)
        frames = cast("list[np.ndarray]", self.frames) if isinstance(self.frames, LazyFrames) else list(self.frames)
        return Sample(frames=frames, timestamps=list(self.frame_times),
                      indices=list(self.frame_indices), audio=self.audio,
                      audio_start=span[0], audio_end=span[1], origin=0.0,
                      source_times=positions if len(positions) == len(self.frames) else [],
                      source_at_jump=at_jump,
                      audio_source_span=tuple(source_span) if isinstance(source_span, list) and
                      len(source_span) == 2 else None,
                      source=record.get("source") if isinstance(record.get("source"), dict) else None,
                      audio_parts=audio_parts)


def with_frames_decoded(answer: Answer) -> Answer:
    """``answer`` with its frames as arrays, for one use of them all (a
    re-ask): a loaded bundle's lazy frames are decoded once and shared with
    any other use under way; any other answer is returned as it is."""
    frames = answer.sample.frames
    if not isinstance(frames, LazyFrames):
        return answer
    return dataclasses.replace(answer, sample=dataclasses.replace(answer.sample, frames=frames.decoded()))


def recorded_answer(bundle: Bundle) -> Answer:
    """A bundle as a finished :class:`vidchat.conversation.asking.Answer`: the page lists it
    beside the session's own answers and re-asks it the same way."""
    from vidchat.conversation.answers import Answer, AnswerOptions

    settings = bundle.manifest.get("settings") or {}
    known = {f.name for f in dataclasses.fields(AnswerOptions)}
    options = AnswerOptions(**{k: v for k, v in settings.items() if k in known})
    if bundle.manifest.get("frames_as") in ("images", "video"):
        options.frames_as = bundle.manifest["frames_as"]
    return Answer(bundle.question, RecordedReply(bundle.manifest), bundle.sample(), options,
                  prompt_text=bundle.manifest.get("prompt") or "", video_fps=bundle.manifest.get("video_fps"),
                  history=tuple(bundle.history()), bundle_name=Path(bundle.path).name, spoken=bundle.spoken,
                  mark=of_manifest(bundle.manifest), memory=bundle.memory)


class _Folder:
    def __init__(self, path: Path):
        self.path = path

    def read(self, name: str) -> bytes:
        target = self.path / name
        if not target.is_file():
            raise BundleError(f"{self.path}: {name} is missing")
        return target.read_bytes()


class _Zip:
    def __init__(self, zf: zipfile.ZipFile, prefix: str):
        self.zf, self.prefix = zf, prefix

    def read(self, name: str) -> bytes:
        try:
            info = self.zf.getinfo(self.prefix + name)
        except KeyError:
            raise BundleError(f"{name} is missing from the zip") from None
        # A zip from elsewhere (the page takes uploads) may inflate a few
        # kilobytes into gigabytes: its declared size is checked first, and
        # the read stops there whatever the header claimed.
        if info.file_size > MAX_MEMBER_BYTES:
            raise BundleError(f"{name} would unpack to {info.file_size} bytes; a bundle file may be at most "
                              f"{MAX_MEMBER_BYTES} bytes")
        with self.zf.open(info) as member:
            data = member.read(MAX_MEMBER_BYTES + 1)
        if len(data) > MAX_MEMBER_BYTES:
            raise BundleError(f"{name} unpacks to more than {MAX_MEMBER_BYTES} bytes")
        return data


def _safe_file(name: Any) -> str:
    if not isinstance(name, str) or not _SAFE_NAME.match(name) or ".." in name:
        raise BundleError(f"bad file name in manifest: {name!r}")
    return name


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A bundle's manifest alone (folder or zip, with the same size checks as
    :func:`read_bundle`), for what needs its fields and not its frames;
    raises BundleError."""
    p = Path(path)
    if p.is_dir():
        data = _Folder(p).read(MANIFEST)
    elif p.is_file() and zipfile.is_zipfile(p):
        with zipfile.ZipFile(p) as zf:
            found = _manifests(zf)
            if len(found) != 1:
                raise BundleError(f"{p}: a zip with {len(found)} bundles; unpack it and name one folder")
            data = _Zip(zf, found[0][: -len(MANIFEST)]).read(MANIFEST)
    else:
        raise BundleError(f"{p}: not a bundle folder or zip")
    try:
        manifest = json.loads(data)
    except ValueError as exc:
        raise BundleError(f"{p}: its manifest is not JSON: {exc}") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{p}: its manifest is not a JSON object")
    return manifest


def is_bundle(path: str | os.PathLike[str]) -> bool:
    """A bundle folder, or a zip with exactly one bundle in it."""
    p = Path(path)
    if p.is_dir():
        return (p / MANIFEST).is_file()
    if p.is_file() and zipfile.is_zipfile(p):
        try:
            with zipfile.ZipFile(p) as zf:
                return len(_manifests(zf)) == 1
        except (zipfile.BadZipFile, OSError):
            return False
    return False


def _manifests(zf: zipfile.ZipFile) -> list[str]:
    return [n for n in zf.namelist() if PurePosixPath(n).name == MANIFEST and len(PurePosixPath(n).parts) <= 2]


def read_bundle(path: str | os.PathLike[str], *, lazy: bool = False,
                max_audio_seconds: float = MAX_AUDIO_SECONDS) -> Bundle:
    """Read a bundle folder (or a zip holding one bundle) into memory; raises
    BundleError. ``lazy``: its frames stay PNG bytes (:class:`LazyFrames`),
    each decoded once here to check it; ``max_audio_seconds``: longer audio
    is refused (a server passes its --ws-max-audio-seconds)."""
    p = Path(path)
    if p.is_dir():
        return _read(_Folder(p), str(p), lazy, max_audio_seconds)
    if p.is_file() and zipfile.is_zipfile(p):
        with zipfile.ZipFile(p) as zf:
            found = _manifests(zf)
            if len(found) != 1:
                raise BundleError(f"{p}: a zip with {len(found)} bundles; unpack it and name one folder")
            prefix = found[0][: -len(MANIFEST)]
            return _read(_Zip(zf, prefix), str(p), lazy, max_audio_seconds)
    raise BundleError(f"{p}: not a bundle folder or zip")


def _read_audio(src: _Folder | _Zip, where: str, entry: dict[str, Any]) -> np.ndarray:
    """A bundle's audio, held to what its manifest says (audio.seconds, and
    audio.samples when given): a WAV longer than the manifest says is refused
    before it is converted, so the checked seconds bound what is decoded."""
    seconds = entry["seconds"]
    expected = round(seconds * AUDIO_RATE)
    try:
        audio, rate = read_wav(src.read(_safe_file(entry.get("file"))), max_samples=expected + 1)
    except WavTooLong as exc:
        raise BundleError(f"{where}: its audio file holds {exc.samples / exc.rate:g} s of audio; the manifest "
                          f"field 'audio.seconds' says {seconds:g} s") from None
    if rate != AUDIO_RATE:
        raise BundleError(f"{where}: audio at {rate} Hz; bundles hold {AUDIO_RATE} Hz")
    # Within a sample: the writer rounds seconds to the microsecond.
    if abs(audio.size - seconds * AUDIO_RATE) > 1:
        raise BundleError(f"{where}: its audio file holds {audio.size / AUDIO_RATE:g} s of audio; the manifest "
                          f"field 'audio.seconds' says {seconds:g} s")
    samples = entry.get("samples")
    if samples is not None and samples != audio.size:
        raise BundleError(f"{where}: its audio file holds {audio.size} samples; the manifest field "
                          f"'audio.samples' says {samples}")
    return audio


def _read(src: _Folder | _Zip, where: str, lazy: bool = False,
          max_audio_seconds: float = MAX_AUDIO_SECONDS) -> Bundle:
    try:
        manifest = json.loads(src.read(MANIFEST).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{where}: manifest.json is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{where}: manifest.json is not an object")
    version = manifest.get("version")
    if version != BUNDLE_VERSION:
        raise BundleError(f"{where}: bundle version {version!r}; this vidchat reads version {BUNDLE_VERSION}")
    spoken = isinstance(manifest.get("spoken_question"), dict) and manifest.get("audio")
    if not isinstance(manifest.get("question"), str) or not (manifest["question"].strip() or spoken):
        raise BundleError(f"{where}: the manifest has no question (neither text nor a spoken question's audio)")
    check_manifest(manifest, where, max_audio_seconds)
    listed = manifest.get("frames") or []
    if not listed:
        raise BundleError(f"{where}: the bundle has no frames")
    audio_entry = manifest.get("audio")
    audio = _read_audio(src, where, audio_entry) if audio_entry else None
    times = [entry.get("t") for entry in listed]
    indices = [entry.get("index") for entry in listed]
    sizes = [(entry["width"], entry["height"]) for entry in listed]
    digest = None
    if lazy:
        pngs: list[bytes] = []
        held = 0 if audio is None else audio.nbytes

        def checked() -> Iterator[np.ndarray]:  # each frame decoded once, to check it and hash it, then dropped
            nonlocal held
            for entry, size in zip(listed, sizes):
                png = src.read(_safe_file(entry.get("file")))
                held += len(png)
                # A PNG far larger than its pixels (padding chunks) would make the kept bytes the bomb.
                if held > MAX_BUNDLE_DECODED_BYTES:
                    raise BundleError(f"{where}: its frame files and audio take more than "
                                      f"{MAX_BUNDLE_DECODED_BYTES >> 20} MB")
                pngs.append(png)
                yield read_png(png, size)

        digest = inputs_digest(checked(), audio)
        frames: Sequence[np.ndarray] = LazyFrames(pngs, sizes)
    else:
        frames = [read_png(src.read(_safe_file(entry.get("file"))), size) for entry, size in zip(listed, sizes)]
    if any(t is None for t in times):  # recorded without times: evenly spaced, for a video's rate only
        times = [float(i) for i in range(len(frames))]
    return Bundle(where, manifest, frames, audio, times, [i if i is not None else n for n, i in enumerate(indices)],
                  _digest=digest, memory=_read_memory(src, where, manifest.get("memory")))


# A QA person's verdict on an answer: good or bad, with a note. Kept on the
# answer (so its record says it), written into its bundle when it has been
# recorded (its manifest's ``mark``, and the record inside it), and carried
# into a suite case made from it (vidchat.conversation.suite_cases), whose
# report shows it. The one rule for every door that marks answers.

MARKS = ("good", "bad")

MAX_NOTE = 500  # characters


def checked(mark: Any, note: Any = "") -> dict[str, str] | None:
    """The mark as kept ({"mark", "note"}), or None to take one back
    (``mark`` empty or None); raises ValueError naming the field."""
    if mark in (None, ""):
        return None
    if mark not in MARKS:
        raise ValueError(f"mark must be \"good\" or \"bad\" (or empty to take it back), got {mark!r}")
    if not isinstance(note, str) or len(note) > MAX_NOTE:
        raise ValueError(f"note must be text of at most {MAX_NOTE} characters")
    writable("note", note)  # it goes into the bundle's manifest and a suite's case
    return {"mark": mark, "note": note.strip()}


def mark_bundle(path: str | os.PathLike[str], mark: dict[str, str] | None) -> None:
    """Write the mark into a recorded bundle's manifest (and the record it
    holds), replacing the file whole so a reader never sees half of it."""
    manifest_path = Path(path) / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["mark"] = mark
    if isinstance(manifest.get("record"), dict):
        manifest["record"]["mark"] = mark
    write_whole(manifest_path, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")


def mark_answer(entry: Any, answer_id: str, answer: Any, mark: dict[str, str] | None) -> str | None:
    """Mark a kept answer of ``entry`` (its Conversation); returns the bundle
    it was written into, if the answer was recorded. Files: call it off the event loop."""
    answer.mark = mark
    bundle = entry.bundles.get(answer_id)
    if bundle is None or not (Path(bundle) / MANIFEST).is_file():
        return None
    mark_bundle(bundle, mark)
    return str(bundle)


def of_manifest(manifest: dict[str, Any]) -> dict[str, str] | None:
    """A bundle's mark, when it has a well-formed one (a hand-edited manifest may not)."""
    mark = manifest.get("mark")
    try:
        return checked(mark.get("mark"), mark.get("note", "")) if isinstance(mark, dict) else None
    except ValueError:
        return None
