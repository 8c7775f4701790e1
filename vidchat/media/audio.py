"""A session's audio window: int16 mono 16 kHz samples placed on the media timeline.

Chunks are placed by their timestamp, not appended end to end: audio that
arrives faster than real time (a replay, ``vidchat.qa.client --fast``) lands
where its timestamps say, so a question gets the same audio span as in a
real-time run. Gaps are filled with silence so audio stays aligned with frame
times; small jitter keeps the stream contiguous; an overlap drops the part
already held; a jump far back means a new stream and restarts the window.
Only the newest ``cap_s`` seconds are kept, stored as the chunks that came
(no copy of the whole window per chunk).

A question's audio goes to the engine in segments (:meth:`AudioWindow.parts`):
cut on a fixed grid of the stream's samples, each named by the stream and
its exact sample range. A finished segment never changes, so the engine
encodes and prefills it once (a warm-up can do it before the question);
only the newest, still growing segment is new at each question.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from vidchat.media import AUDIO_RATE, MIN_AUDIO_SAMPLES

# Differences between a chunk's timestamp and the end of the window smaller
# than this are jitter: the chunk continues the stream.
JITTER_S = 0.05
# A chunk starting this much before the window's end belongs to a new stream.
RESET_S = 1.0
# The segment grid. Qwen2.5-Omni's audio encoder attends within windows of
# 2 s (n_window 100 mel frames x 2) anyway, so cutting on this grid changes
# little of what it computes.
SEGMENT_S = 2.0


def segment_samples(segment_s: float = SEGMENT_S) -> int:
    """Samples per segment of the grid."""
    return max(1, int(round(segment_s * AUDIO_RATE)))


def to_int16(samples: np.ndarray) -> np.ndarray:
    """Mono float (-1..1) or int16 samples as a new int16 array."""
    samples = np.asarray(samples)
    if samples.ndim == 2 and 1 in samples.shape:
        samples = samples.reshape(-1)
    if samples.ndim != 1:
        raise ValueError(f"audio must be mono (1-D), got shape {samples.shape}")
    if samples.dtype == np.int16:
        return samples.copy()
    if not np.issubdtype(samples.dtype, np.floating):
        raise ValueError(f"audio must be float (-1..1) or int16 samples, got {samples.dtype}")
    clean = np.nan_to_num(samples.astype(np.float32), nan=0.0, posinf=1.0, neginf=-1.0)
    return (np.clip(clean, -1.0, 1.0) * 32767.0).astype(np.int16)


class AudioWindow:
    """The newest ``cap_s`` seconds of a session's audio; ``end`` anchors the timeline."""

    def __init__(self, cap_s: float) -> None:
        self.cap_samples = int(round(cap_s * AUDIO_RATE))
        self.chunks: deque[np.ndarray] = deque()
        self.length = 0
        self.end: float | None = None
        # Which stream (never reused in the window's life: a reset or clear
        # starts a new one) and how many samples it has had: a sample's
        # absolute number names the segment it is in.
        self.stream = 0
        self.total = 0

    @property
    def start(self) -> float | None:
        return None if self.end is None else self._start_before(self.end)

    def _start_before(self, end: float) -> float:
        """The time of the oldest sample held, for a window that ends at ``end``."""
        return end - self.length / AUDIO_RATE

    @property
    def seconds(self) -> float:
        return self.length / AUDIO_RATE

    @property
    def nbytes(self) -> int:
        return self.length * 2

    def clear(self) -> None:
        self.chunks.clear()
        self.length = 0
        self.end = None
        self.stream += 1
        self.total = 0

    def set_cap(self, cap_s: float) -> None:
        self.cap_samples = int(round(cap_s * AUDIO_RATE))
        self._trim()

    def add(self, pcm: np.ndarray, t: float | None, now: float) -> None:
        """Place int16 samples whose first one was captured at ``t``.

        Untimed chunks continue the previous one (also when chunks come in a
        burst after a network stall); after a pause they end ``now``."""
        if pcm.size == 0:
            return
        duration = pcm.size / AUDIO_RATE
        if t is None:
            if self.end is not None and self.end >= now - duration - RESET_S:
                t = self.end
            else:
                t = now - duration
        if self.end is not None:
            gap = t - self.end
            if gap < -RESET_S or gap * AUDIO_RATE >= self.cap_samples:
                self.clear()
            elif gap > JITTER_S:
                self._append(np.zeros(int(round(gap * AUDIO_RATE)), dtype=np.int16), self.end)
            elif gap < -JITTER_S:
                # Overlaps what is held (a resent or early chunk): keep only what is new.
                pcm = pcm[int(round(-gap * AUDIO_RATE)):]
                if pcm.size == 0:
                    return
        self._append(pcm, t if self.end is None else self.end)

    def _append(self, pcm: np.ndarray, end: float) -> None:
        """Add ``pcm`` after the window's ``end`` (its first sample's time, where the window is empty)."""
        self.chunks.append(pcm)
        self.length += pcm.size
        self.total += pcm.size
        self.end = end + pcm.size / AUDIO_RATE
        self._trim()

    def _trim(self) -> None:
        excess = self.length - self.cap_samples
        while excess > 0 and self.chunks:
            first = self.chunks[0]
            if first.size <= excess:
                self.chunks.popleft()
                self.length -= first.size
                excess -= first.size
            else:
                self.chunks[0] = first[excess:].copy()  # copy so the dropped part is freed
                self.length -= excess
                excess = 0
        if self.length == 0:
            self.chunks.clear()

    def since(self, t: float | None) -> tuple[np.ndarray, float, float] | None:
        """The audio after timeline time ``t`` (float32, start, end) for a
        listener that follows the stream; None when there is none yet. ``t``
        None, or later than the window's end (the stream restarted earlier):
        nothing before now counts."""
        end = self.end
        if end is None:
            return None
        if t is None or t > end + 0.05:
            return np.zeros(0, np.float32), end, end
        return self.window(max(t, self._start_before(end)))

    def window(self, start: float, end: float | None = None) -> tuple[np.ndarray, float, float] | None:
        """Float32 samples from ``start`` to ``end`` (default: the newest),
        clamped to what is kept; None when that span holds no audio."""
        span = self._span(start, end)
        if span is None:
            return None
        first, last, window_start = span
        return self._samples(first, last), window_start + first / AUDIO_RATE, window_start + last / AUDIO_RATE

    def parts(self, start: float, end: float | None = None, segment_s: float = SEGMENT_S,
              min_samples: int = 1) -> tuple[tuple[int, str], ...]:
        """How :meth:`window` of the same span splits into segments: (samples,
        name) per segment, oldest first. Cuts fall on the stream's grid of
        ``segment_s``; the span's first and last segments may be partial. A
        name (stream, first sample, count) is only ever given to the same
        samples. Parts shorter than ``min_samples`` join their neighbour."""
        span = self._span(start, end)
        if span is None:
            return ()
        base = self.total - self.length  # the stream's number of the first sample held
        first, last = base + span[0], base + span[1]
        step = segment_samples(segment_s)
        cuts = [first, *range((first // step + 1) * step, last, step), last]
        bounds = [[a, b] for a, b in zip(cuts, cuts[1:])]
        if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < min_samples:
            tail = bounds.pop()
            bounds[-1][1] = tail[1]
        if len(bounds) > 1 and bounds[0][1] - bounds[0][0] < min_samples:
            head = bounds.pop(0)
            bounds[0][0] = head[0]
        return tuple((b - a, f"{self.stream}:{a}+{b - a}") for a, b in bounds)

    @property
    def ends_segment(self) -> bool:
        """The newest sample ends a segment of the grid: that segment is finished."""
        return self.total > 0 and self.total % segment_samples() == 0

    def steady_start(self, start: float, segment_s: float = SEGMENT_S) -> float:
        """``start``, unless it is before the oldest sample held: then the
        first grid point after that sample. The oldest audio is trimmed with
        every chunk, so a span from there would start at another sample each
        time and make every segment after it new; from the grid, the
        segments stay the same (up to ``segment_s`` less audio)."""
        if self.end is None or self.length == 0:
            return start
        held_start = self._start_before(self.end)
        if start > held_start:
            return start
        step = segment_samples(segment_s)
        base = self.total - self.length
        first_grid = -(-base // step) * step  # the first grid point at or after the oldest sample held
        return held_start + (first_grid - base) / AUDIO_RATE

    def _span(self, start: float, end: float | None) -> tuple[int, int, float] | None:
        """Sample indices (into what is held) of a span, and the time of the
        oldest sample held; None when empty."""
        if self.end is None or self.length == 0:
            return None
        held_start = self._start_before(self.end)
        first = max(0, int(round((start - held_start) * AUDIO_RATE)))
        last = self.length if end is None else min(self.length, int(round((end - held_start) * AUDIO_RATE)))
        return None if last - first <= 0 else (first, last, held_start)

    def _samples(self, first: int, last: int) -> np.ndarray:
        # Only the chunks the span needs, walking back from the newest.
        parts, offset = [], self.length
        for chunk in reversed(self.chunks):
            chunk_start = offset - chunk.size
            if chunk_start < last:
                parts.append(chunk)
            offset = chunk_start
            if offset <= first:
                break
        pcm = np.concatenate(parts[::-1])
        pcm = pcm[first - offset: last - offset]
        samples: np.ndarray = pcm.astype(np.float32) * (1.0 / 32768.0)
        return samples


class Pcm16Resampler:
    """One stream of PCM16 little-endian mono chunks at ``rate`` as float32
    samples at AUDIO_RATE, in order: a client that sends audio at another
    rate (the OpenAI Realtime door's 24 kHz). One resampler per stream, so
    the filter's state carries from chunk to chunk (no click at each seam)."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._resampler: Any = None
        self._pts = 0

    def feed(self, data: bytes) -> np.ndarray:
        """Raises ValueError for an odd number of bytes."""
        if len(data) % 2:
            raise ValueError(f"PCM16 data must have an even number of bytes, got {len(data)}")
        pcm = np.frombuffer(data, dtype="<i2")
        if self.rate == AUDIO_RATE or pcm.size == 0:
            return pcm.astype(np.float32) / 32768.0
        import av

        if self._resampler is None:
            self._resampler = av.AudioResampler(format="flt", layout="mono", rate=AUDIO_RATE)
        frame = av.AudioFrame.from_ndarray(pcm.astype(np.int16).reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts = self.rate, self._pts
        self._pts += pcm.size
        out = [f.to_ndarray().reshape(-1).astype(np.float32, copy=False) for f in self._resampler.resample(frame)]
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)


class ClipTooShort(ValueError):
    """A clip committed from an :class:`AudioInput` is too short to be heard as a question."""


class AudioInput:
    """A client's audio appended in chunks until it is taken as one clip
    (the Realtime API's input audio buffer): 16 kHz float samples, resampled
    from the client's rate by one stream, and at most ``max_s`` long (whole
    chunks: the oldest goes while the rest still hold more).

    An append costs the same however much is held: the length is a running
    total, empty chunks (the resampler holding samples back) are not kept,
    and chunks under MERGE_SAMPLES are gathered and kept as one, so a client
    streaming tiny appends holds a few hundred arrays, not one per append."""

    MERGE_SAMPLES = AUDIO_RATE // 10  # 100 ms: what a held chunk is at least (but the newest)

    def __init__(self, max_s: float, rate: int) -> None:
        self.max_samples = int(max_s * AUDIO_RATE)
        self.stream = Pcm16Resampler(rate)
        self.chunks: deque[np.ndarray] = deque()  # oldest first; the small ones gathering are not among them
        self.samples = 0  # held in all, the small ones gathering included
        self._small: list[np.ndarray] = []
        self._small_samples = 0

    @property
    def rate(self) -> int:
        return self.stream.rate

    def set_rate(self, rate: int) -> None:
        if rate != self.rate:
            self.stream = Pcm16Resampler(rate)

    def append(self, samples: np.ndarray) -> None:
        if samples.size == 0:
            return
        self.samples += samples.size
        if samples.size < self.MERGE_SAMPLES:
            self._small.append(samples)
            self._small_samples += samples.size
            if self._small_samples >= self.MERGE_SAMPLES:
                self._keep_small()
        else:
            self._keep_small()  # in order: what gathered before this chunk goes first
            self.chunks.append(samples)
        while self.chunks and self.samples - self.chunks[0].size > self.max_samples:
            self.samples -= self.chunks.popleft().size

    def _keep_small(self) -> None:
        """The small chunks gathered so far, kept as one (each sample copied once)."""
        if self._small:
            self.chunks.append(np.concatenate(self._small) if len(self._small) > 1 else self._small[0])
            self._small.clear()
            self._small_samples = 0

    def clear(self) -> None:
        self.chunks.clear()
        self._small.clear()
        self.samples = self._small_samples = 0

    def take(self) -> np.ndarray:
        """The clip (the input is emptied); raises ClipTooShort under MIN_AUDIO_SAMPLES."""
        self._keep_small()
        clip = np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)
        self.clear()
        if clip.size < MIN_AUDIO_SAMPLES:
            raise ClipTooShort(f"buffer too small: {clip.size / AUDIO_RATE * 1000:.0f} ms of audio, at least "
                               f"{MIN_AUDIO_SAMPLES * 1000 // AUDIO_RATE} ms")
        return clip
