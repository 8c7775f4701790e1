"""The bundle format: one answer with exactly what the model was given, on disk.

Written by :mod:`vidchat.conversation.bundle_write`, read back by
:mod:`vidchat.conversation.recording`; both take their names, limits and
media codecs from here. The media encoders (:func:`audio_used`,
:func:`wav_bytes`, :func:`png_bytes`) also serve the page's ``/inputs/<id>/``
files, in memory (:mod:`vidchat.doors.inputs`), so a bundle and the page hold
the same bytes.

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
    record          the answer record as vidchat.conversation.answer_path.Answer.summary() gave it

Audio format. The engine gets float32 samples at 16 kHz mono. A session stores
audio as 16-bit PCM and hands out ``int16 / 32768``, so those samples are
exactly representable as 16-bit PCM: the bundle then holds a plain 16-bit PCM
WAV (``"format": "pcm16"``), which every player opens, and reading it back as
``int16 / 32768`` gives the engine's float32 samples bit for bit. Audio that
is not 16-bit exact (another producer) is written as a 32-bit IEEE-float WAV
(``"format": "float32"``, WAVE_FORMAT_IEEE_FLOAT; the stdlib ``wave`` module
writes PCM only, so both are written here with ``struct``). Either way
:func:`vidchat.conversation.recording.read_bundle` returns the very samples that were hashed, and
``inputs_digest(bundle.frames, bundle.audio) == manifest["inputs_sha256"]``.
"""

from __future__ import annotations

import io
import struct
from typing import Any

import numpy as np
from PIL import Image

from vidchat.media import AUDIO_RATE

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


# ---------------------------------------------------------------------------
# Media: what the engine got, as WAV (16-bit PCM or 32-bit float, mono) and PNG
# ---------------------------------------------------------------------------

def audio_used(answer: Any) -> np.ndarray | None:
    """The audio samples the engine got for an answer (a :class:`vidchat.conversation.answer_path.Answer`),
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
