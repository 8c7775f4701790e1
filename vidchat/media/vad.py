"""Voice activity: where speech starts and ends in a session's audio (Talk mode).

Silero VAD (the ``silero-vad`` package, which ships its 2 MB model) gives a
speech probability for each 32 ms window of 16 kHz audio; :class:`TurnDetector`
turns those into turns: *speech started* once speech has lasted
``min_speech_s`` (what barge-in reacts to), and an *utterance* once
``min_silence_s`` of silence followed it (what becomes a question).

The model is small but not free (about 1 ms a window on one core, ~30 ms per
second of audio): callers run :meth:`TurnDetector.feed` in a worker thread
(:func:`vidchat.media.workers.run_vad`), never on the event loop.
"""

from __future__ import annotations

import logging
import math
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vidchat.media import AUDIO_RATE, is_number

log = logging.getLogger(__name__)

# Samples per model window: Silero's fixed size at 16 kHz (32 ms).
WINDOW = 512
WINDOW_S = WINDOW / AUDIO_RATE
# Below this level (dBFS) a window is silence whatever the model says: keeps
# dither and codec noise from ever reaching it.
SILENCE_DBFS = -60.0

_import_lock = threading.Lock()


def _new_model() -> Any:
    """A fresh Silero TorchScript model (about 40 ms to load): each detector
    has its own, since the model object carries the stream's state."""
    import torch

    with _import_lock, warnings.catch_warnings():
        # Its loader uses APIs that torch and importlib now call deprecated.
        warnings.simplefilter("ignore", DeprecationWarning)
        threads = torch.get_num_threads()
        from silero_vad import load_silero_vad  # sets torch's threads to 1 when first imported

        # vLLM's input processing runs in this process too: keep its threads.
        torch.set_num_threads(threads)
        return load_silero_vad()


class SpeechModel:
    """Speech probability per 512-sample window of one stream."""

    def __init__(self) -> None:
        self._model = _new_model()
        self._model.reset_states()

    def reset(self) -> None:
        self._model.reset_states()

    def probabilities(self, windows: np.ndarray) -> list[float]:
        """Speech probability of each row of ``windows`` (float32, shape n×512), in order."""
        import torch

        with torch.inference_mode():
            return [float(self._model(torch.from_numpy(np.ascontiguousarray(row)), AUDIO_RATE).item())
                    for row in windows]


@dataclass(frozen=True)
class TurnSettings:
    """When speech counts as a turn. Defaults follow common practice for
    conversational turn taking (OpenAI's and vllm-omni's server_vad use 0.5
    and 500 ms of silence)."""

    threshold: float = 0.5  # speech probability that starts speech
    min_speech_s: float = 0.25  # shorter bursts (a cough, a click) are no turn
    min_silence_s: float = 0.5  # trailing silence that ends an utterance
    pad_s: float = 0.05  # audio kept on each side of the detected speech
    max_utterance_s: float = 30.0  # a longer one is cut and asked
    # While the page reads an answer aloud, speech must be this close (dB)
    # to the user's own level to count: the echo that survives the browser's
    # echo cancellation is much quieter than a voice at the microphone.
    echo_margin_db: float = 10.0

    def validate(self) -> None:
        ranges = [
            ("threshold", 0.05, 0.95, "between 0.05 and 0.95"),
            ("min_speech_s", 0.03, 5.0, "between 0.03 and 5 seconds"),
            ("min_silence_s", 0.1, 5.0, "between 0.1 and 5 seconds"),
            ("pad_s", 0.0, 1.0, "between 0 and 1 second"),
            ("max_utterance_s", 1.0, 120.0, "between 1 and 120 seconds"),
            ("echo_margin_db", 0.0, 60.0, "between 0 and 60 dB"),
        ]
        for name, low, high, what in ranges:
            value = getattr(self, name)
            if not is_number(value) or not low <= value <= high:
                raise ValueError(f"{name} must be {what}, got {value!r}")


@dataclass(frozen=True)
class Utterance:
    """One spoken turn, in session timeline seconds (padding included)."""

    start: float
    end: float
    level_dbfs: float  # its speech's loudness (90th percentile of its 32 ms windows' RMS)
    cut: bool = False  # ended by max_utterance_s, not by silence
    # The speech itself, as detected (start and end without the padding).
    speech_start: float | None = None
    speech_end: float | None = None

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class SpeechStarted:
    """Speech has lasted min_speech_s: a turn is under way (barge-in point)."""

    start: float  # where the speech began (timeline seconds)
    at: float  # where the detector confirmed it


def _dbfs(window: np.ndarray) -> float:
    rms = float(np.sqrt(np.mean(np.square(window, dtype=np.float64))))
    return 20.0 * math.log10(rms) if rms > 1e-9 else -120.0


@dataclass
class TurnDetector:
    """Streaming turn detection over one session's audio.

    Feed float32 samples in timeline order with the time of the first; each
    call returns the events it completed. Not thread-safe: one feeder."""

    settings: TurnSettings = field(default_factory=TurnSettings)
    model: SpeechModel = field(default_factory=lambda: SpeechModel())
    # The user's speech level (dBFS), learnt from their utterances; the echo
    # gate compares against it while the page speaks.
    user_level_dbfs: float = -20.0
    playback: bool = False  # the page is reading an answer aloud
    _pending: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    _pending_t: float | None = None
    _speech_start: float | None = None
    _speech_end: float = 0.0  # end of the last window judged speech
    _confirmed: bool = False
    _levels: list[float] = field(default_factory=list)

    def feed(self, samples: np.ndarray, t: float) -> list[SpeechStarted | Utterance]:
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        if self._pending_t is None or abs(self._pending_t + self._pending.size / AUDIO_RATE - t) > 0.05:
            if self._pending_t is not None:
                log.debug("audio jumped by %.3f s: the detector starts again",
                          t - (self._pending_t + self._pending.size / AUDIO_RATE))
            self._flush_gap()
            self._pending, self._pending_t = samples, t
        else:
            self._pending = np.concatenate([self._pending, samples])
        n = self._pending.size // WINDOW
        if n == 0:
            return []
        windows = self._pending[: n * WINDOW].reshape(n, WINDOW)
        start_t = self._pending_t
        self._pending = self._pending[n * WINDOW:]
        self._pending_t = start_t + n * WINDOW_S
        probs = self.model.probabilities(windows)
        events: list[SpeechStarted | Utterance] = []
        for i, (window, prob) in enumerate(zip(windows, probs)):
            events.extend(self._step(start_t + i * WINDOW_S, window, prob))
        return events

    def _flush_gap(self) -> None:
        """Forget the stream's speech (a jump in the audio, a new source)."""
        self.model.reset()
        self._speech_start = None
        self._confirmed = False
        self._levels = []

    def _is_speech(self, prob: float, level: float) -> bool:
        s = self.settings
        if level < SILENCE_DBFS:
            return False
        # Hysteresis: speech goes on down to threshold - 0.15 (Silero's own rule).
        threshold = s.threshold if self._speech_start is None else max(0.05, s.threshold - 0.15)
        if prob < threshold:
            return False
        if self.playback and level < self.user_level_dbfs - s.echo_margin_db:
            return False  # the page's own voice, coming back through the microphone
        return True

    def _step(self, t: float, window: np.ndarray, prob: float) -> list[SpeechStarted | Utterance]:
        s = self.settings
        level = _dbfs(window)
        end = t + WINDOW_S
        if self._is_speech(prob, level):
            if self._speech_start is None:
                self._speech_start, self._confirmed, self._levels = t, False, []
            self._speech_end = end
            self._levels.append(level)
            if not self._confirmed and end - self._speech_start >= s.min_speech_s:
                self._confirmed = True
                return [SpeechStarted(self._speech_start, end)]
            if self._confirmed and end - self._speech_start >= s.max_utterance_s:
                return self._close(cut=True)
            return []
        if self._speech_start is None:
            return []
        if end - self._speech_end >= s.min_silence_s:
            return self._close(cut=False)
        return []

    def _close(self, cut: bool) -> list[SpeechStarted | Utterance]:
        start, end, confirmed = self._speech_start, self._speech_end, self._confirmed
        levels = self._levels
        self._speech_start, self._confirmed, self._levels = None, False, []
        if not confirmed or start is None:
            return []  # too short to be a turn
        # Its loud part (90th percentile of the windows): what the echo gate
        # compares single windows against, so an echo's own peaks stay under it.
        level = float(np.percentile(levels, 90)) if levels else -120.0
        if not self.playback:
            # Learn the user's level from turns that can't be the page's echo.
            self.user_level_dbfs = 0.7 * self.user_level_dbfs + 0.3 * level
        pad = self.settings.pad_s
        return [Utterance(start - pad, end + pad, level, cut=cut, speech_start=start, speech_end=end)]
