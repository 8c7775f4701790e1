"""Labelled synthetic microphone audio for Talk mode's tests and benchmark.

Speech is generated offline by Debian's ``espeak-ng`` (installed by
scripts/setup.sh for the tests): real phonemes with real pauses, so the
voice activity detector is judged on speech, not on a tone that happens to
pass. The other sounds a microphone hears (room noise, music-like tones,
clicks, the page's own voice coming back quietly) are built here,
deterministically from a seed. Every track knows where its speech is.
Nothing is written to disk.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import wave
from dataclasses import dataclass, field

import numpy as np

from vidchat.media import AUDIO_RATE

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
