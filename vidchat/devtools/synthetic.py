"""Labelled synthetic webcam clips for tests and benchmarks.

The EVS filter is judged on what a webcam really sends: a mostly static room
(smooth lighting gradients, furniture-like shapes, fine texture), sensor noise
on every frame, lighting that drifts and flickers, a hand moving in front of
the camera, and the occasional scene change. Pure random noise would make any
filter look good or bad at will, so the scenes here are built from those
ingredients, deterministically from a seed. Nothing is written to disk.

Each clip carries its labels: which frames start a new scene (must be kept)
and whether the clip contains real motion.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import wave
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
from PIL import Image

from vidchat.media import AUDIO_RATE

FPS = 30.0


@dataclass
class Clip:
    """A labelled run of frames as a camera would deliver them."""

    name: str
    frames: list[np.ndarray]  # H×W×3 uint8 RGB
    times: list[float]  # capture time in seconds
    cuts: list[int] = field(default_factory=list)  # frame indices starting a new scene
    moving: bool = False  # True when (almost) every frame shows real motion

    def __len__(self) -> int:
        return len(self.frames)

    def jpegs(self, quality: int = 85) -> list[bytes]:
        return [encode_jpeg(f, quality) for f in self.frames]


def encode_jpeg(frame: np.ndarray, quality: int = 85) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def make_scene(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A static room-like picture as float32 H×W×3 in grey levels (0..255)."""
    rng = np.random.default_rng(seed)
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None, None]
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :, None]

    # Lighting: a smooth colour gradient across the room.
    base = rng.uniform(50, 170, 3).astype(np.float32)
    gx = rng.uniform(-60, 60, 3).astype(np.float32)
    gy = rng.uniform(-60, 60, 3).astype(np.float32)
    img = base + gx * x + gy * y

    # Soft light pools / shadows (Gaussians are separable: outer product of 1-D profiles).
    for _ in range(3):
        cy, cx = rng.uniform(0, 1, 2)
        r = rng.uniform(0.15, 0.4)
        amp = rng.uniform(-40, 40, 3).astype(np.float32)
        img += amp * (np.exp(-((y - cy) ** 2) / (2 * r * r)) * np.exp(-((x - cx) ** 2) / (2 * r * r)))

    # Furniture and objects: flat-coloured, lightly shaded rectangles and ellipses.
    for _ in range(int(rng.integers(6, 11))):
        cy, cx = rng.uniform(0.05, 0.95, 2)
        hh, hw = rng.uniform(0.04, 0.22, 2)
        colour = rng.uniform(20, 235, 3).astype(np.float32)
        shade = rng.uniform(-25, 25)
        ellipse = rng.random() < 0.5
        r0, r1 = max(int((cy - hh) * height), 0), min(int((cy + hh) * height) + 1, height)
        c0, c1 = max(int((cx - hw) * width), 0), min(int((cx + hw) * width) + 1, width)
        ys, xs = y[r0:r1], x[:, c0:c1]
        if ellipse:
            mask = ((ys - cy) / hh) ** 2 + ((xs - cx) / hw) ** 2 < 1.0
        else:
            mask = (np.abs(ys - cy) < hh) & (np.abs(xs - cx) < hw)
        region = img[r0:r1, c0:c1]
        np.copyto(region, colour + shade * (ys - cy) / hh, where=mask)

    # Fine surface texture (wall paint, fabric): fixed per scene, not per frame.
    texture = rng.standard_normal((height, width, 1), dtype=np.float32)
    texture = (texture + np.roll(texture, 1, 0) + np.roll(texture, 1, 1)) * 3.0
    img += texture
    return np.clip(img, 0, 255, out=img)


class _Noise:
    """Per-frame sensor noise: windows at random offsets into one larger i.i.d. field.

    Each pixel gets a different draw in every frame (the window moves), at a
    fraction of the cost of drawing a fresh field per frame.
    """

    PAD = 64

    def __init__(self, height: int, width: int, sigma: float, rng: np.random.Generator) -> None:
        self.rng = rng
        self.height, self.width = height, width
        self.field = rng.standard_normal((height + self.PAD, width + self.PAD, 3), dtype=np.float32) * sigma

    def next(self) -> np.ndarray:
        dy, dx = self.rng.integers(0, self.PAD, 2)
        return self.field[dy:dy + self.height, dx:dx + self.width]


def _render(scene: np.ndarray, noise: _Noise | None, gain: float = 1.0, offset: float = 0.0) -> np.ndarray:
    out = scene * np.float32(gain)
    if offset:
        out += np.float32(offset)
    if noise is not None:
        out += noise.next()
    np.clip(out, 0, 255, out=out)
    return out.astype(np.uint8)


def _noise(height: int, width: int, sigma: float, rng: np.random.Generator) -> _Noise | None:
    return _Noise(height, width, sigma, rng) if sigma > 0 else None


def static_clip(height: int = 480, width: int = 640, n: int = 60, *, noise_sigma: float = 3.0,
                flicker: float = 0.04, seed: int = 1) -> Clip:
    """A static scene with sensor noise and slow lighting flicker.

    Brightness follows a slow sine (``flicker`` relative gain, 2 s period), plus
    a small offset drift and per-frame auto-exposure jitter of about 1 %.
    """
    rng = np.random.default_rng(seed + 1000)
    scene = make_scene(height, width, seed)
    noise = _noise(height, width, noise_sigma, rng)
    frames, times = [], []
    for i in range(n):
        t = i / FPS
        gain = 1.0 + flicker * np.sin(2 * np.pi * t / 2.0) + rng.normal(0, 0.01)
        offset = 3.0 * np.sin(2 * np.pi * t / 3.0)
        frames.append(_render(scene, noise, gain, offset))
        times.append(t)
    return Clip("static", frames, times, cuts=[0], moving=False)


def _hand(height: int, width: int, area: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A skin-coloured, shaded, textured ellipse covering ``area`` of the frame.

    Returns (colour patch float32 h×w×3, mask bool h×w) for the bounding box.
    """
    # Ellipse with height/width ratio 1.3: area = pi * a * 1.3a.
    a = np.sqrt(area * height * width / (1.3 * np.pi))
    b = 1.3 * a
    hh, hw = int(np.ceil(b)), int(np.ceil(a))
    yy = np.arange(-hh, hh, dtype=np.float32)[:, None]
    xx = np.arange(-hw, hw, dtype=np.float32)[None, :]
    mask = (yy / b) ** 2 + (xx / a) ** 2 < 1.0
    skin = np.array([205, 150, 120], dtype=np.float32)
    shading = 1.0 - 0.25 * (xx / a) - 0.15 * (yy / b)
    patch = skin * shading[..., None]
    patch = patch + rng.standard_normal(patch.shape[:2] + (1,), dtype=np.float32) * 6.0
    return np.clip(patch, 0, 255), mask


def motion_clip(height: int = 480, width: int = 640, n: int = 40, *, area: float = 0.15,
                step: float = 0.10, noise_sigma: float = 3.0, seed: int = 2) -> Clip:
    """A hand-sized object (``area`` of the frame) moving ``step`` × width per frame.

    The object sweeps left and right across a noisy static background,
    bouncing at the edges, with a small vertical wobble.
    """
    rng = np.random.default_rng(seed + 1000)
    scene = make_scene(height, width, seed)
    patch, mask = _hand(height, width, area, rng)
    noise = _noise(height, width, noise_sigma, rng)
    ph, pw = mask.shape
    lo, hi = 0, width - pw
    x, direction = lo + (hi - lo) * 0.1, 1
    frames, times = [], []
    for i in range(n):
        y0 = int((height - ph) / 2 + 0.05 * height * np.sin(i / 3.0))
        y0 = min(max(y0, 0), height - ph)
        x0 = int(round(x))
        img = scene.copy()
        region = img[y0:y0 + ph, x0:x0 + pw]
        region[mask] = patch[mask]
        frames.append(_render(img, noise))
        times.append(i / FPS)
        x += direction * step * width
        if x > hi or x < lo:
            direction = -direction
            x = min(max(x, lo), hi)
    return Clip("motion", frames, times, cuts=[0], moving=True)


def cuts_clip(height: int = 480, width: int = 640, cuts: int = 12, hold: int = 5, *,
              noise_sigma: float = 3.0, flicker: float = 0.02, seed: int = 3) -> Clip:
    """``cuts`` different scenes, each held still for ``hold`` noisy frames."""
    rng = np.random.default_rng(seed + 1000)
    noise = _noise(height, width, noise_sigma, rng)
    frames, times, starts = [], [], []
    for c in range(cuts):
        scene = make_scene(height, width, seed * 100 + c)
        starts.append(len(frames))
        for _ in range(hold):
            i = len(frames)
            gain = 1.0 + flicker * np.sin(2 * np.pi * i / (2.0 * FPS)) + rng.normal(0, 0.005)
            frames.append(_render(scene, noise, gain))
            times.append(i / FPS)
    return Clip("cuts", frames, times, cuts=starts, moving=False)


# Labelled synthetic microphone audio for Talk mode's tests and benchmark.
#
# Speech is generated offline by Debian's ``espeak-ng`` (installed by
# scripts/setup.sh for the tests): real phonemes with real pauses, so the
# voice activity detector is judged on speech, not on a tone that happens to
# pass. The other sounds a microphone hears (room noise, music-like tones,
# clicks, the page's own voice coming back quietly) are built here,
# deterministically from a seed. Every track knows where its speech is.
# Nothing is written to disk.

ESPEAK = "espeak-ng"

# espeak-ng's own edges are not silent: a sample below this is not speech.
SPEECH_EDGE = 0.01


class NoSpeechSynthesizer(RuntimeError):
    pass


def speech(text: str, *, words_per_minute: int = 165, voice: str = "en", pitch: int = 50) -> np.ndarray:
    """``text`` spoken by espeak-ng, as float32 mono 16 kHz, trimmed to its speech."""
    exe = shutil.which(ESPEAK)
    if exe is None:
        raise NoSpeechSynthesizer("espeak-ng is not installed (scripts/setup.sh --test installs it)")
    wav = subprocess.run([exe, "--stdout", "-s", str(words_per_minute), "-v", voice, "-p", str(pitch), text],
                         check=True, capture_output=True, timeout=60).stdout
    with wave.open(io.BytesIO(wav)) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0
    t = np.arange(0, pcm.size / rate, 1 / AUDIO_RATE)
    audio = np.interp(t, np.arange(pcm.size) / rate, pcm).astype(np.float32)
    loud = np.nonzero(np.abs(audio) > SPEECH_EDGE)[0]
    return audio[loud[0]: loud[-1] + 1] if loud.size else audio


def room_noise(seconds: float, level_dbfs: float = -50.0, seed: int = 0) -> np.ndarray:
    """Pinkish background noise (a fan, a room) at an RMS level."""
    rng = np.random.default_rng(seed)
    white = rng.standard_normal(int(seconds * AUDIO_RATE))
    # A short moving average leans it towards the low frequencies rooms have.
    pink = np.convolve(white, np.ones(6) / 6, mode="same")
    return _at_level(pink, level_dbfs)


def tones(seconds: float, level_dbfs: float = -20.0, seed: int = 0) -> np.ndarray:
    """Music-like sound: a melody of harmonic notes with soft attacks."""
    rng = np.random.default_rng(seed)
    n = int(seconds * AUDIO_RATE)
    out = np.zeros(n, np.float64)
    note_s = 0.3
    for k in range(int(np.ceil(seconds / note_s))):
        f0 = 220.0 * 2 ** (rng.integers(0, 24) / 12)
        start = int(k * note_s * AUDIO_RATE)
        length = min(int(note_s * AUDIO_RATE), n - start)
        if length <= 0:
            break
        t = np.arange(length) / AUDIO_RATE
        env = np.minimum(1.0, t / 0.02) * np.exp(-t * 3)
        note = sum(np.sin(2 * np.pi * f0 * h * t) / h for h in (1, 2, 3, 4))
        out[start:start + length] += env * note
    return _at_level(out, level_dbfs)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(round(seconds * AUDIO_RATE)), np.float32)


def _at_level(x: np.ndarray, level_dbfs: float) -> np.ndarray:
    rms = float(np.sqrt(np.mean(np.square(x)))) or 1.0
    return (x * (10 ** (level_dbfs / 20) / rms)).astype(np.float32)


def scaled(x: np.ndarray, gain_db: float) -> np.ndarray:
    return (x * 10 ** (gain_db / 20)).astype(np.float32)


@dataclass
class Track:
    """Audio with the true spans of the user's speech (seconds from its start)."""

    audio: np.ndarray
    speech: list[tuple[float, float]] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.audio.size / AUDIO_RATE


def compose(parts: list[tuple[np.ndarray, bool]], background: np.ndarray | None = None) -> Track:
    """Concatenate parts (audio, is_user_speech); mix ``background`` under all of it."""
    pieces, spans, t = [], [], 0.0
    for audio, is_speech in parts:
        if is_speech:
            spans.append((t, t + audio.size / AUDIO_RATE))
        pieces.append(audio.astype(np.float32))
        t += audio.size / AUDIO_RATE
    audio = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    if background is not None:
        bg = np.resize(background, audio.size)
        audio = audio + bg
    return Track(np.clip(audio, -1.0, 1.0).astype(np.float32), spans)


def pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes()


def wav_file_bytes(audio: np.ndarray, rate: int = AUDIO_RATE) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm16(audio))
    return buf.getvalue()


def long_stream(minutes: float, scene_every_s: float = 30.0, fps: float = 1.0, height: int = 120,
                width: int = 160, noise_sigma: float = 2.0, seed: int = 11) -> Iterator[tuple[float, np.ndarray, int]]:
    """A live stream of ``minutes``: a new scene every ``scene_every_s``
    seconds, each held still with sensor noise, at ``fps``. Yields (t in
    seconds from its start, frame, scene number) as fast as it is read: the
    memory's tests and bench/longsession.py play an hour in a minute."""
    rng = np.random.default_rng(seed + 2000)
    noise = _noise(height, width, noise_sigma, rng)
    scene_number, scene = -1, None
    for i in range(int(minutes * 60 * fps)):
        t = i / fps
        number = int(t // scene_every_s)
        if number != scene_number:
            scene_number, scene = number, make_scene(height, width, seed * 1000 + number)
        assert scene is not None
        yield t, _render(scene, noise), number
