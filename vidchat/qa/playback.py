"""A video file played into a session on the file's own clock, for
``python -m vidchat.replay``: when each question is due (:class:`Schedule`),
the file's frames and audio as one stream of events in time order
(:func:`media_events`, audio split at question times), and each event put
into the session with watch mode's decision (:class:`Playback`). No wall
clock decides anything, so every run feeds the session the same way.
"""

from __future__ import annotations

import heapq
import logging
import math
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from vidchat.conversation.watch import SceneWatch
from vidchat.media import AUDIO_RATE
from vidchat.qa.replay_options import UsageError

log = logging.getLogger("vidchat.qa.replay")

# Times closer than this are the same instant (float pts arithmetic).
EPS = 1e-6


@dataclass(frozen=True)
class Question:
    at: float  # seconds of the file
    text: str
    periodic: bool = False
    watch: bool = False  # asked by watch mode, on a scene change


class Schedule:
    """The questions in time order (ties: in the order given); --every ones
    come back at k×S, computed as k*S so the audio cuts land on the same times."""

    def __init__(self, asks: Sequence[tuple[float, str]], every: Sequence[tuple[float, str]]):
        self._heap: list[tuple[float, int, str, float, int]] = []
        for order, (at, text) in enumerate(asks):
            self._heap.append((at, order, text, 0.0, 0))
        for j, (period, text) in enumerate(every):
            self._heap.append((period, len(asks) + j, text, period, 1))
        heapq.heapify(self._heap)
        self._asks = sorted(at for at, _ in asks)
        self._periods = [period for period, _ in every]

    def peek(self) -> Question | None:
        if not self._heap:
            return None
        at, _, text, period, _ = self._heap[0]
        return Question(at, text, period > 0)

    def pop(self) -> Question:
        at, order, text, period, k = heapq.heappop(self._heap)
        if period > 0:
            heapq.heappush(self._heap, ((k + 1) * period, order, text, period, k + 1))
        return Question(at, text, period > 0)

    def stop_periodic(self) -> None:
        """Drop the --every questions (the file has ended); the others stay."""
        self._heap = [e for e in self._heap if e[3] == 0]
        heapq.heapify(self._heap)

    def cuts(self, start: float, end: float) -> list[float]:
        """Question times strictly inside (start, end): where an audio chunk is split."""
        found = [a for a in self._asks if start < a < end]
        for period in self._periods:
            k = math.floor(start / period) + 1
            while k * period < end:
                if k * period > start:
                    found.append(k * period)
                k += 1
        return sorted(set(found))


# Media: (t, rank, kind, payload) in time order, t in seconds of the file.

def _file_start(container) -> float:
    import av

    start = container.start_time
    return start / av.time_base if start is not None else 0.0


def video_events(path: str) -> Iterator[tuple]:
    """Every decoded video frame as RGB, at its presentation time."""
    import av

    with av.open(path) as container:
        if not container.streams.video:
            raise UsageError(f"{path} has no video stream")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"  # frame threads: faster, same pictures
        start = _file_start(container)
        rate = float(stream.average_rate) if stream.average_rate else 30.0
        last = None
        for frame in container.decode(stream):
            if frame.time is not None:
                t = frame.time - start
            else:  # no pts: continue at the stream's rate
                t = 0.0 if last is None else last + 1.0 / rate
            if t < -EPS:
                log.debug("skipping a video frame before the file's start (%.3f s)", t)
                continue
            last = t = max(t, 0.0)
            # rank 0: a frame before audio of the same instant (ties in a fixed order).
            yield t, 0, "frame", frame.to_ndarray(format="rgb24")


def audio_events(path: str, schedule: Schedule) -> Iterator[tuple]:
    """The audio track as float32 mono 16 kHz chunks, placed from the first
    frame's time on by sample count, split at question times."""
    import av

    with av.open(path) as container:
        if not container.streams.audio:
            return
        stream = container.streams.audio[0]
        start = _file_start(container)
        resampler = av.AudioResampler(format="flt", layout="mono", rate=AUDIO_RATE)
        origin: float | None = None
        count = 0  # samples placed so far

        def pieces(samples: np.ndarray) -> Iterator[tuple]:
            nonlocal count
            t0 = origin + count / AUDIO_RATE
            if t0 < 0:  # priming before the file's start
                skip = min(samples.size, math.ceil(-t0 * AUDIO_RATE - EPS))
                samples, count = samples[skip:], count + skip
                t0 = origin + count / AUDIO_RATE
            if samples.size == 0:
                return
            for cut in schedule.cuts(t0 + EPS, t0 + samples.size / AUDIO_RATE - EPS):
                k = round((cut - origin) * AUDIO_RATE) - count
                if 0 < k < samples.size:
                    yield origin + count / AUDIO_RATE, 1, "audio", samples[:k]
                    samples, count = samples[k:], count + k
            yield origin + count / AUDIO_RATE, 1, "audio", samples
            count += samples.size

        for frame in container.decode(stream):
            if origin is None:
                origin = frame.time - start if frame.time is not None else 0.0
            for out in resampler.resample(frame):
                yield from pieces(out.to_ndarray().reshape(-1).astype(np.float32))
        if origin is not None:
            for out in resampler.resample(None):
                yield from pieces(out.to_ndarray().reshape(-1).astype(np.float32))


def media_events(path: str, schedule: Schedule) -> Iterator[tuple]:
    """Video and audio of one file merged by time (each stream decoded on its
    own, so the file's interleaving does not matter)."""
    return heapq.merge(video_events(path), audio_events(path, schedule), key=lambda e: (e[0], e[1]))


class Playback:
    """One file's media into a session, event by event in time order, and
    watch mode's decision: after each frame, whether the scene changed (the
    session counts scene changes) and the watch question may be asked now,
    rate-limited on the file's clock, so it is the same on every run."""

    def __init__(self, session, watch_every: float | None = None, name: str | None = None):
        self.session = session
        # The file's start is the session timeline's start: answer records then
        # give frame and audio times in seconds of the file.
        session.timeline_start = 0.0
        # The timeline is the file's own clock, so its position is the identity:
        # records carry frame_source_times as the page's file source does.
        # Audio primed before the start may begin a fraction of a sample
        # before 0; until 0 the file is at its start.
        session.set_source("file", name, 0.0, playing=False, t=-math.inf)
        session.set_source("file", name, 0.0, playing=True, rate=1.0, t=0.0)
        self.watch = SceneWatch(session, watch_every) if watch_every is not None else None
        self.frames = self.bad_frames = 0
        self.end = 0.0  # seconds of media fed so far

    def feed(self, t: float, kind: str, payload) -> bool:
        """Put one event from :func:`media_events` into the session; True
        when the watch question is due at ``t`` (only ever after a frame)."""
        from vidchat.media.evs import FrameError

        if kind != "frame":
            self.end = max(self.end, t + payload.size / AUDIO_RATE)
            self.session.add_audio(payload, t)
            return False
        self.frames += 1
        self.end = max(self.end, t)
        try:
            self.session.add_frame(payload, t=t)
        except FrameError as exc:
            self.bad_frames += 1
            log.warning("frame at %.3f s dropped: %s", t, exc)
        return self.watch is not None and self.watch.due(t)
