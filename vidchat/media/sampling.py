"""What one question sends to the model (:class:`Sample`), and which kept
frames it takes: the sampling strategies, the window a spoken question
covers, and the encoder budget.

Pure functions over a buffer's frames (anything with a capture time ``t``
and a kept number ``seq``, oldest first); the session takes them under its
lock (vidchat.media.session).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import AbstractSet, Any, Protocol, Sequence, TypeVar

import numpy as np
from PIL import Image

from vidchat.media import AUDIO_RATE

V = TypeVar("V")


class Kept(Protocol):
    """A kept frame as sampling sees it (read-only: the buffer's frames are named tuples)."""

    @property
    def t(self) -> float:
        """Capture time on the session's timeline."""
        ...

    @property
    def seq(self) -> int:
        """The session's kept-frame number."""
        ...


@dataclass
class Sample:
    """What one question sends to the model. Times are on the session's
    timeline (monotonic seconds); ``origin`` is the timeline's start, so
    ``relative()`` gives times a replay reproduces."""

    frames: list[np.ndarray] = field(default_factory=list)  # RGB uint8 H×W×3 (read-only), oldest first
    timestamps: list[float] = field(default_factory=list)  # capture time per frame
    indices: list[int] = field(default_factory=list)  # indices into the ring at sampling time
    audio: np.ndarray | None = None  # float32 mono 16 kHz
    audio_start: float | None = None
    audio_end: float | None = None
    origin: float = 0.0
    # Where in the played file each frame was (seconds; None for a live
    # source), parallel to timestamps; empty when nobody knew (an old bundle).
    source_times: list[float | None] = field(default_factory=list)
    # Parallel to source_times: the frame was captured so close to a seek
    # (vidchat.media.clock.JUMP_WINDOW_S) that it may show either side of it.
    source_at_jump: list[bool] = field(default_factory=list)
    audio_source_span: tuple[float | None, float | None] | None = None
    source: dict[str, Any] | None = None  # {"kind", "name"} of the newest frame's source
    seqs: list[int] = field(default_factory=list)  # the frames' kept numbers
    substituted: int = 0  # frames swapped for already-encoded ones (the encoder budget)
    left_out: int = 0  # picks left out: new to the engine, over the budget, and nothing encoded to swap in
    new_frames: int = 0  # frames not yet encoded when sampled (the question encodes them, or waits for them)
    # How the audio splits into the engine's items: (samples, name) per
    # segment (vidchat.media.audio.AudioWindow.parts); the names are unique within
    # the session and never reused for other samples. Empty: one clip.
    audio_parts: tuple[tuple[int, str | None], ...] = ()
    audio_tail_open: bool = True  # the newest segment is still growing (not cut on the grid)

    def without_audio(self) -> "Sample":
        """The sample's frames alone."""
        return dataclasses.replace(self, audio=None, audio_start=None, audio_end=None, audio_parts=())

    def without_audio_tail(self) -> "Sample":
        """The sample minus its newest audio segment if that one is still
        growing: what a warm-up prefills, since the question's will be longer."""
        if self.audio is not None and self.audio_parts and not self.audio_tail_open:
            return self
        if self.audio is None or len(self.audio_parts) < 2:
            return self.without_audio()
        keep = self.audio_parts[:-1]
        n = sum(size for size, _ in keep)
        assert self.audio_start is not None  # a sample's audio always has its start
        return dataclasses.replace(self, audio=self.audio[:n], audio_end=self.audio_start + n / AUDIO_RATE,
                                   audio_parts=keep)

    def relative(self, t: float | None) -> float | None:
        """A time on this sample's timeline as seconds since the session's first media, in ms precision."""
        return None if t is None else round(t - self.origin, 3)

    def images(self) -> list[Image.Image]:
        """The frames as PIL images (copies)."""
        return [Image.fromarray(f) for f in self.frames]

    def frame_source_times(self) -> list[float | None]:
        """``source_times`` parallel to ``timestamps`` (all None when unknown)."""
        return self._per_frame(self.source_times, None)

    def _per_frame(self, values: Sequence[V], unknown: V) -> list[V]:
        """``values`` where there is one per frame, else ``unknown`` for each (nobody knew)."""
        return list(values) if len(values) == len(self.timestamps) else [unknown] * len(self.timestamps)

    def frames_at(self, picks: Sequence[int]) -> "Sample":
        """The same sample with only the frames at ``picks`` (with their
        times, indices, positions and marks); the audio stays whole."""
        source_times, at_jump = self.frame_source_times(), self.frame_source_at_jump()
        return dataclasses.replace(
            self,
            frames=[self.frames[i] for i in picks],
            timestamps=[self.timestamps[i] for i in picks],
            indices=[self.indices[i] for i in picks],
            source_times=[source_times[i] for i in picks],
            source_at_jump=[at_jump[i] for i in picks],
            seqs=[self.seqs[i] for i in picks] if len(self.seqs) == len(self.frames) else [],
        )

    def frame_source_at_jump(self) -> list[bool]:
        """``source_at_jump`` parallel to ``timestamps`` (all False when unknown)."""
        return self._per_frame(self.source_at_jump, False)


def _trivial_pick(n: int, k: int) -> list[int] | None:
    """The picks every strategy agrees on: none, the newest alone, or all."""
    if n <= 0 or k <= 0:
        return []
    if k == 1:
        return [n - 1]
    if k >= n:
        return list(range(n))
    return None


def stable_indices(seqs: Sequence[int], k: int) -> list[int]:
    """k frames spread evenly over a window of consecutive kept numbers, on a
    grid anchored to the numbers themselves (every stride-th kept frame),
    plus the newest. As the window slides, a new frame replaces only the
    newest pick, and the grid moves one place every `stride` frames: the
    frames before stay the same, in the same order, so a later question
    shares their prompt prefix and their encodings (vidchat.conversation.warmup)."""
    n = len(seqs)
    trivial = _trivial_pick(n, k)
    if trivial is not None:
        return trivial
    # At most (n-1)/(k-1): any n consecutive numbers then hold k-1 multiples.
    stride = max(1, (n - 1) // (k - 1))
    grid = [i for i, q in enumerate(seqs[:-1]) if q % stride == 0]
    return grid[-(k - 1):] + [n - 1]


def uniform_indices(n: int, k: int) -> list[int]:
    """The seed's uniform pick of k out of n (k=1: the newest; k >= n: all)."""
    trivial = _trivial_pick(n, k)
    if trivial is not None:
        return trivial
    return [int(i * (n - 1) / (k - 1)) for i in range(k)]


def window_candidates(frames: Sequence[Kept], newest_received_t: float | None,
                      seconds: float) -> tuple[list[int], float | None]:
    """latest_seconds: the indices of the frames within ``seconds`` before the
    newest received frame, led by the one on screen when that window began,
    and the window's start."""
    n = len(frames)
    if n == 0:
        return [], None
    newest = newest_received_t if newest_received_t is not None else frames[-1].t
    since = newest - seconds
    first = n  # first frame captured inside the window
    while first > 0 and frames[first - 1].t >= since:
        first -= 1
    if first == n or frames[first].t > since:
        # The frame kept before the window was still on screen when it began.
        first = max(first - 1, 0)
    return list(range(first, n)), since


def span_candidates(frames: Sequence[Kept], span: tuple[float, float]) -> list[int]:
    """Indices of the frames captured within ``span``, led by the one on
    screen when it began (a still scene keeps no frame in it)."""
    start, end = span
    inside = [i for i, f in enumerate(frames) if start <= f.t <= end]
    before = [i for i, f in enumerate(frames) if f.t < start]
    if before:
        inside.insert(0, before[-1])
    elif not inside and frames:
        inside = [0]  # every kept frame came after the span: the nearest one
    return inside


def pick(frames: Sequence[Kept], k: int, strategy: str, *, span: tuple[float, float] | None = None,
         newest_received_t: float | None = None,
         sample_seconds: float = 0.0) -> tuple[list[int], list[int], float | None]:
    """(candidates, picked, window start): the indices a question may take
    from ``frames``, the k it takes, and where its audio may start at the
    earliest (None: no such limit).

    * ``uniform``: k frames spread over the whole ring (the seed's indices).
    * ``stable``: k frames spread over the whole ring on a grid of kept
      numbers, plus the newest: a new frame changes only the newest pick
      (and every stride-th, the oldest), so questions and warm-ups share
      a prompt prefix (:func:`stable_indices`).
    * ``latest_frames``: the k newest frames.
    * ``latest_seconds``: k frames spread over the last ``sample_seconds``
      before the newest *received* frame, plus the kept frame that was on
      screen when that window began (the filter drops its repeats), so a
      static scene still yields its picture.

    ``span`` (timeline start, end; a spoken question): k frames spread over
    the span, plus the kept frame on screen when it began; the strategy is
    not used."""
    window_start: float | None
    if span is not None:
        candidates, window_start = span_candidates(frames, span), span[0]
    elif strategy == "latest_seconds":
        candidates, window_start = window_candidates(frames, newest_received_t, sample_seconds)
    else:
        candidates, window_start = list(range(len(frames))), None
    if span is None and strategy == "latest_frames":
        picked = candidates[-k:]
    elif span is None and strategy == "stable":
        picked = [candidates[i] for i in stable_indices([frames[c].seq for c in candidates], k)]
    else:
        picked = [candidates[i] for i in uniform_indices(len(candidates), k)]
    return candidates, picked, window_start


def within_encode_budget(frames: Sequence[Kept], candidates: list[int], picked: list[int],
                         encoded: AbstractSet[int], budget: int | None,
                         in_flight: AbstractSet[int] = frozenset()) -> tuple[list[int], int, int]:
    """With an encoder budget (a CPU where encoding a frame costs most of a
    second), at most ``budget`` picked frames may be new to the engine: not
    in ``encoded``, nor in ``in_flight`` (being encoded by a warm-up now,
    which the question would wait for; those count against the budget).
    The budget goes to the newest pick, what the user has just seen; any
    other new pick is swapped for the nearest frame already encoded (or in
    flight: a question then takes the frame being encoded as its newest
    rather than a newer one), and spends the budget only where none is left
    to swap in (the first seconds of a session), or else is left out. So a
    question never waits for a batch of encodings, nor for an older frame
    when its newest is ready (a mostly still scene, whose few kept frames
    move stable's grid). Returns the picks, how many were swapped and how
    many left out."""
    if budget is None:
        return picked, 0, 0
    ready = encoded | in_flight
    new = [p for p in picked if frames[p].seq not in ready]
    allowed = max(0, budget - sum(frames[c].seq in in_flight for c in candidates))
    if not new:
        return picked, 0, 0
    newest_new = picked[-1] in new and allowed > 0
    allowed -= int(newest_new)
    chosen = set(picked)
    already = [c for c in candidates if frames[c].seq in ready]
    out, substituted, left_out = [], 0, 0
    for p in reversed(picked):  # the newer picks first: they get the nearer frames and the budget
        if p not in new or (p == picked[-1] and newest_new):
            out.append(p)
            continue
        chosen.discard(p)
        near = [c for c in already if c not in chosen]
        if near:
            best = min(near, key=lambda c: (abs(c - p), c))
            chosen.add(best)
            out.append(best)
            substituted += 1
        elif allowed > 0:
            chosen.add(p)
            out.append(p)
            allowed -= 1
        else:
            left_out += 1
    if not out:  # nothing encoded and no budget: the newest frame, rather than none
        return [picked[-1]], 0, len(picked) - 1
    return sorted(out), substituted, left_out
