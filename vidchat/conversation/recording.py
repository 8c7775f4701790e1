"""Recording bundles: one answer with exactly what the model was given, on disk.

A bundle is written only when someone asks for it (``--record-dir`` on the
server, ``--out`` on ``python -m vidchat.replay``); nothing in this module
writes otherwise, so with recording off nothing touches the disk. Its media
encoders (:func:`audio_used`, :func:`wav_bytes`, :func:`png_bytes`) also
serve the page's ``/inputs/<id>/`` files, in memory
(:mod:`vidchat.doors.inputs`), so a bundle and the page hold the same bytes.

Layout (``BUNDLE_VERSION`` 1)::

    0001-t3.0/                 one folder per answer: sequence number, and the
    │                           media time asked (seconds) when known
    ├── manifest.json          everything but the pixels and samples (below)
    ├── frame-0001.png         the frames handed to the engine, oldest first,
    ├── frame-0002.png         lossless RGB PNG at the stored size (exactly the
    ├── …                      uint8 arrays the engine got)
    └── audio.wav              the audio handed to the engine (absent if none)

``manifest.json``::

    version         1 (a reader refuses versions it does not know)
    kind            "vidchat.bundle"
    created         UTC time the bundle was written (ISO 8601; informational)
    question        the question text
    history         the chat before it: [{"role": "user"|"assistant", "content": text}, …]
    answer          the answer text
    t               media time at which the question was asked (seconds), or null
    source          where the media came from (a file name, "camera", a bundle…), or null
    model           the model path or hub id the engine ran
    model_option    the --model value it was resolved from ("tiny", a preset…), or null
    engine          the engine options (dtype, max_model_len, max_images, pixel cap, …), or null
    seed            the sampling seed (null: vLLM's own)
    settings        the effective answer and sampling settings, flat, with the
                    names ``vidchat.qa.replay --set`` and the WebSocket
                    session.config take (frames_as, temperature, max_tokens,
                    seed, system_prompt, include_audio, num_sample_frames,
                    sampling, evs_threshold, …) plus store_max_pixels
    prompt          the prompt as the model's chat template rendered it
    timings         prep_ms, ttft_ms, total_s, tokens_per_s
    tokens          prompt_tokens, cached_tokens, completion_tokens, finish_reason
    inputs_sha256   vidchat.engine.inputs_digest of the frames and audio below
    frames_as       "images" or "video"; video_fps for video
    frames          [{"file", "t", "index", "width", "height", "source_t"}, …]: t in
                    seconds on the session's timeline (a replayed file: seconds
                    of the file), index into the session's frame buffer when
                    sampled, source_t the frame's position in the played file
                    (seconds; null for a live source). Bundles written before
                    source_t existed lack it: readers treat it as null.
    audio           {"file", "format", "sample_rate", "samples", "seconds", "span"} or null
    record          the answer record as vidchat.conversation.chat.Answer.summary() gave it

Audio format. The engine gets float32 samples at 16 kHz mono. A session stores
audio as 16-bit PCM and hands out ``int16 / 32768``, so those samples are
exactly representable as 16-bit PCM: the bundle then holds a plain 16-bit PCM
WAV (``"format": "pcm16"``), which every player opens, and reading it back as
``int16 / 32768`` gives the engine's float32 samples bit for bit. Audio that
is not 16-bit exact (another producer) is written as a 32-bit IEEE-float WAV
(``"format": "float32"``, WAVE_FORMAT_IEEE_FLOAT; the stdlib ``wave`` module
writes PCM only, so both are written here with ``struct``). Either way
:func:`read_bundle` returns the very samples that were hashed, and
``inputs_digest(bundle.frames, bundle.audio) == manifest["inputs_sha256"]``.

A bundle folder is written under a temporary name and renamed when complete,
so a reader never sees half a bundle. :func:`zip_bundles` packs bundles into
one zip (one folder each), :func:`iter_zip_bundles` streams it; :func:`read_bundle` reads a folder or a
zip holding one bundle, without extracting it.
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
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
from PIL import Image

from vidchat.engine import ReplyStats, Turn, inputs_digest
from vidchat.media import AUDIO_RATE

log = logging.getLogger(__name__)

BUNDLE_VERSION = 1
MANIFEST = "manifest.json"
AUDIO_FILE = "audio.wav"
KIND = "vidchat.bundle"

_WAVE_FORMAT_PCM = 1
_WAVE_FORMAT_IEEE_FLOAT = 3
_PCM_SCALE = 32768.0  # vidchat.media.audio.AudioWindow hands out int16 / 32768
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# Most pixels one stored frame of a bundle may have when read (an untrusted
# zip must not decode to gigabytes); far above any stored size vidchat uses.
MAX_FRAME_PIXELS = 4096 * 4096
# Most bytes one file of a bundle may unpack to, and most frames it may hold.
MAX_MEMBER_BYTES = 128 << 20
MAX_BUNDLE_FRAMES = 1024
# Most bytes all of a bundle's frames may decode to (width x height x 3 summed
# over the manifest's frames), checked before any frame is decoded: a zip of
# uniform 4096x4096 PNGs is small and would decode to gigabytes. A recording
# at the stored size (320x240) of 64 frames needs 15 MB.
MAX_BUNDLE_DECODED_BYTES = 512 << 20


class BundleError(ValueError):
    """A bundle that cannot be read (missing file, unknown version, bad data)."""


# ---------------------------------------------------------------------------
# Media: what the engine got, as WAV (16-bit PCM or 32-bit float, mono) and PNG
# ---------------------------------------------------------------------------

def audio_used(answer: Any) -> np.ndarray | None:
    """The audio samples the engine got for an answer (a :class:`vidchat.conversation.chat.Answer`),
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


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    """(float32 mono samples, rate) from a 16-bit PCM or 32-bit float mono WAV."""
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


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------

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
    """Write one finished answer (a :class:`vidchat.conversation.chat.Answer`) as a bundle
    folder under ``root`` (created if missing) and return its path.

    ``settings``: the effective answer and sampling settings, flat (default:
    the answer's options); ``history``: the chat before the question (engine
    Turns or {"role", "content"} dicts; default: the answer's own ``history``
    where it keeps one); ``t``/``source``: when and where the
    question was asked; ``model_option``/``engine_options``: how the model was
    chosen and started, so a re-ask can start the same. ``name`` overrides the
    folder name (default: the next free sequence number, plus ``-tT``)."""
    record = answer.summary()
    sample = answer.sample
    frames = [np.ascontiguousarray(f) for f in sample.frames]
    audio = audio_used(answer)
    digest = inputs_digest(frames, audio)
    if record.get("inputs_sha256") and digest != record["inputs_sha256"]:
        log.warning("bundle: the stored frames/audio hash to %s…, the engine reported %s…",
                    digest[:12], record["inputs_sha256"][:12])
    if settings is None:
        settings = dataclasses.asdict(answer.options)
    if history is None:
        history = getattr(answer, "history", None) or ()

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
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
    manifest = {
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
        "record": record,
    }
    files[MANIFEST] = (json.dumps(_json_safe(manifest), indent=2, ensure_ascii=False) + "\n").encode()

    # Under a temporary name, renamed when whole: a reader never sees half a bundle.
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
        log.info("bundle written: %s (%d frames%s)", final, len(frames), ", audio" if audio is not None else "")
        return final


def _remove_tree(path: Path) -> None:
    if not path.exists():
        return
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------

@dataclass
class Bundle:
    """A bundle read back: the engine's exact inputs and the manifest."""

    path: str
    manifest: dict[str, Any]
    frames: list[np.ndarray]  # RGB uint8 H×W×3, oldest first
    audio: np.ndarray | None  # float32 mono 16 kHz, or None
    frame_times: list[float] = field(default_factory=list)
    frame_indices: list[int] = field(default_factory=list)

    @property
    def question(self) -> str:
        return self.manifest["question"]

    @property
    def spoken(self) -> Any:
        """The spoken question (a vidchat.media.vad.Utterance) when the audio was the question, else None."""
        from vidchat.media.vad import Utterance

        spoken = self.manifest.get("spoken_question")
        if not isinstance(spoken, dict):
            return None
        start = spoken.get("start") if isinstance(spoken.get("start"), (int, float)) else 0.0
        seconds = spoken.get("seconds") if isinstance(spoken.get("seconds"), (int, float)) else 0.0
        return Utterance(float(start), float(start) + float(seconds), level_dbfs=-120.0)

    @property
    def inputs_sha256(self) -> str:
        """What the manifest says the engine got."""
        return self.manifest.get("inputs_sha256", "")

    def digest(self) -> str:
        """The hash of the frames and audio as read back (equals inputs_sha256 for an intact bundle)."""
        return inputs_digest(self.frames, self.audio)

    def history(self) -> list[Turn]:
        return [Turn(h["role"], h["content"]) for h in self.manifest.get("history") or []]

    def sample(self):
        """The frames and audio as a :class:`vidchat.conversation.session.Sample`, on the
        recorded timeline (times as recorded, origin 0)."""
        from vidchat.conversation.session import Sample

        span = (self.manifest.get("audio") or {}).get("span") or [None, None]
        record = self.manifest.get("record") or {}
        positions = [f.get("source_t") for f in self.manifest.get("frames") or []]
        source_span = record.get("audio_source_span")
        # The audio's segments as the engine got them, so a re-ask sends the
        # same clips; unnamed, so vLLM tells them apart by their samples.
        parts = record.get("audio_parts")
        audio_parts: tuple = ()
        if (self.audio is not None and isinstance(parts, list) and parts
                and all(isinstance(n, int) and n > 0 for n in parts) and sum(parts) == self.audio.size):
            audio_parts = tuple((n, None) for n in parts)
        return Sample(frames=list(self.frames), timestamps=list(self.frame_times),
                      indices=list(self.frame_indices), audio=self.audio,
                      audio_start=span[0], audio_end=span[1], origin=0.0,
                      source_times=positions if len(positions) == len(self.frames) else [],
                      audio_source_span=tuple(source_span) if isinstance(source_span, list) and
                      len(source_span) == 2 else None,
                      source=record.get("source") if isinstance(record.get("source"), dict) else None,
                      audio_parts=audio_parts)


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
                                      or "")

    async def cancel(self) -> None:
        return None

    aclose = cancel


def recorded_answer(bundle: Bundle):
    """A bundle as a finished :class:`vidchat.conversation.chat.Answer`: the page lists it
    beside the session's own answers and re-asks it the same way."""
    from vidchat.conversation.chat import Answer, AnswerOptions

    settings = bundle.manifest.get("settings") or {}
    known = {f.name for f in dataclasses.fields(AnswerOptions)}
    options = AnswerOptions(**{k: v for k, v in settings.items() if k in known})
    if bundle.manifest.get("frames_as") in ("images", "video"):
        options.frames_as = bundle.manifest["frames_as"]
    return Answer(bundle.question, RecordedReply(bundle.manifest), bundle.sample(), options,
                  prompt_text=bundle.manifest.get("prompt") or "", video_fps=bundle.manifest.get("video_fps"),
                  history=tuple(bundle.history()), bundle_name=Path(bundle.path).name, spoken=bundle.spoken)


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


def check_manifest(manifest: dict[str, Any], where: str = "bundle") -> None:
    """A manifest from elsewhere, value by value: its settings through the
    checks every door uses (vidchat.conversation.chat.checked_settings), everything else
    the page shows or uses by type and range, and the decoded size of its
    frames against MAX_BUNDLE_DECODED_BYTES, all before a frame is read.
    Raises BundleError naming the field."""
    from vidchat.conversation.chat import checked_settings

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
    audio = manifest.get("audio") or {}
    _check(where, "audio.seconds", audio.get("seconds"), lambda v: _number(v, 0), "a number >= 0")
    _check(where, "audio.span", audio.get("span"), lambda v: isinstance(v, list) and len(v) == 2 and all(
        x is None or _number(x) for x in v), "[start, end] in seconds")
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
    if decoded > MAX_BUNDLE_DECODED_BYTES:
        raise BundleError(f"{where}: its {len(listed)} frames would decode to {decoded / 2**20:.0f} MB; a bundle's "
                          f"frames may decode to at most {MAX_BUNDLE_DECODED_BYTES >> 20} MB")


def _safe_file(name: Any) -> str:
    if not isinstance(name, str) or not _SAFE_NAME.match(name) or ".." in name:
        raise BundleError(f"bad file name in manifest: {name!r}")
    return name


def is_bundle(path: str | os.PathLike) -> bool:
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


def read_bundle(path: str | os.PathLike) -> Bundle:
    """Read a bundle folder (or a zip holding one bundle) into memory; raises BundleError."""
    p = Path(path)
    if p.is_dir():
        return _read(_Folder(p), str(p))
    if p.is_file() and zipfile.is_zipfile(p):
        with zipfile.ZipFile(p) as zf:
            found = _manifests(zf)
            if len(found) != 1:
                raise BundleError(f"{p}: a zip with {len(found)} bundles; unpack it and name one folder")
            prefix = found[0][: -len(MANIFEST)]
            return _read(_Zip(zf, prefix), str(p))
    raise BundleError(f"{p}: not a bundle folder or zip")


def _read(src: _Folder | _Zip, where: str) -> Bundle:
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
    check_manifest(manifest, where)
    frames, times, indices = [], [], []
    for entry in manifest.get("frames") or []:
        frame = read_png(src.read(_safe_file(entry.get("file"))), (entry["width"], entry["height"]))
        frames.append(frame)
        times.append(entry.get("t"))
        indices.append(entry.get("index"))
    if not frames:
        raise BundleError(f"{where}: the bundle has no frames")
    audio = None
    audio_entry = manifest.get("audio")
    if audio_entry:
        audio, rate = read_wav(src.read(_safe_file(audio_entry.get("file"))))
        if rate != AUDIO_RATE:
            raise BundleError(f"{where}: audio at {rate} Hz; bundles hold {AUDIO_RATE} Hz")
    if any(t is None for t in times):  # recorded without times: evenly spaced, for a video's rate only
        times = [float(i) for i in range(len(frames))]
    return Bundle(where, manifest, frames, audio, times, [i if i is not None else n for n, i in enumerate(indices)])


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
