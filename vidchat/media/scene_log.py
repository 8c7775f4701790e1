"""A session's scene log: one keyframe per scene, for the whole session.

The ring of kept frames (vidchat.media.frame_buffer) holds seconds to a few
minutes of a live source; the scene log is what the session remembers of
everything before. Each time the filter's change detection begins a new
scene (the rule Watch asks on, vidchat.media.frame_buffer: the session's
first kept frame, a cut, or motion sweeping ``scene_change_share`` of the
picture) the frame is added as a :class:`Keyframe`: its time, its place in
a played file, its wall-clock time and the frame itself at the stored size,
kept as a JPEG (quality 85: about 12 KB at 320×240 instead of 230 KB as an
array, so 256 keyframes cost a session about 3 MB).

Bounded, never cut off. At most ``limit`` keyframes (``--memory-keyframes``,
default 256). Past it, each new keyframe makes the log drop one: of those
between the session's first keyframe and the newest (which always stay), the
one whose neighbours are closest together on a logarithmic scale of age (how
long before the newest keyframe they were). So the log always spans the
whole session, and its keyframes end up evenly spaced in the logarithm of
their age: the last minutes scene by scene, and the further back, the
sparser, in proportion to how long ago (16 keyframes over an hour with a
scene every 30 s: scene by scene for the last minute and a half, then one a
minute, then one every 4 minutes, and 8 to 16 minutes apart from half an
hour back to the start).

Captions (vidchat.conversation.memory writes them while the engine is idle)
are set on the keyframe they describe; a keyframe thinned away takes its
caption with it.

What one question got of it (vidchat.conversation.memory chooses): a
:class:`MemoryUse`, its captions as text and the :class:`MemoryFrame` s
that joined its sample, with the :class:`Pointer` of the moment it named;
the answer keeps it and its bundle writes it. Here, below the conversation,
so an answer and the memory that builds it both name it.

Threads. Keyframes are added by the ingest thread (under the session's
lock) and read by the event loop; the log's own short lock guards its list.
"""

from __future__ import annotations

import io
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

DEFAULT_MEMORY_KEYFRAMES = 256

# The strip under the page's preview, and GET /sessions/<id>/memory, show this wide a thumbnail.
THUMBNAIL_WIDTH = 96

JPEG_QUALITY = 85


@dataclass
class Keyframe:
    """The first kept frame of one scene."""

    seq: int  # its kept-frame number in the session (vidchat.media.frame_buffer.StoredFrame.seq)
    t: float  # its capture time on the session's timeline (monotonic seconds)
    wall: float  # the same moment as Unix time (what "at 10:05" points at)
    source_t: float | None  # its position in the played file, when the source is one
    size: tuple[int, int]  # (width, height) as stored
    jpeg: bytes = field(repr=False)
    caption: str | None = None
    caption_wall: float | None = None  # when its caption was written (Unix time)
    _thumb: bytes | None = field(default=None, repr=False)

    def pixels(self) -> np.ndarray:
        """The frame as the model gets it (read-only), decoded each time: a
        millisecond, where a kept copy would stay with the keyframe for the
        session's life (what holds a question's copy is its record)."""
        arr = np.asarray(Image.open(io.BytesIO(self.jpeg)).convert("RGB"))
        arr.setflags(write=False)
        return arr

    def thumbnail(self) -> bytes:
        """A small JPEG for the page's strip."""
        if self._thumb is None:
            img = Image.open(io.BytesIO(self.jpeg))
            height = max(1, round(img.height * THUMBNAIL_WIDTH / img.width))
            out = io.BytesIO()
            img.convert("RGB").resize((THUMBNAIL_WIDTH, height), Image.Resampling.BILINEAR).save(
                out, "JPEG", quality=80)
            self._thumb = out.getvalue()
        return self._thumb


def encode_jpeg(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(out, "JPEG", quality=JPEG_QUALITY)
    return out.getvalue()


class SceneLog:
    """A session's keyframes, oldest first, at most ``limit`` (thinned, see the module)."""

    def __init__(self, limit: int = DEFAULT_MEMORY_KEYFRAMES) -> None:
        if limit < 2:
            raise ValueError(f"memory keyframes must be at least 2, got {limit}")
        self.limit = limit
        self._lock = threading.Lock()
        self._frames: list[Keyframe] = []
        self.added = 0  # keyframes added in the session's life
        self.thinned = 0  # keyframes dropped by thinning
        self.version = 0  # moves on every change (a keyframe added or thinned, a caption written)

    def __len__(self) -> int:
        return len(self._frames)

    def add(self, seq: int, t: float, pixels: np.ndarray, source_t: float | None = None,
            wall: float | None = None) -> Keyframe:
        """Log a scene's first frame (``pixels`` at the stored size)."""
        if wall is None:
            wall = time.time() - (time.monotonic() - t)
        frame = Keyframe(seq, t, wall, source_t, (int(pixels.shape[1]), int(pixels.shape[0])), encode_jpeg(pixels))
        with self._lock:
            self._frames.append(frame)
            self.added += 1
            while len(self._frames) > self.limit:
                self._thin()
            self.version += 1
        return frame

    def _thin(self) -> None:
        # The module's rule: drop the keyframe whose neighbours are closest in log(age).
        frames = self._frames
        newest = frames[-1].t
        # An age of 0 has no logarithm: ages count from one scene before the newest.
        offset = max(1e-3, newest - frames[-2].t)

        def gap_without(i: int) -> float:
            return math.log((newest - frames[i - 1].t + offset) / (newest - frames[i + 1].t + offset))

        del frames[min(range(1, len(frames) - 1), key=lambda i: (gap_without(i), -i))]
        self.thinned += 1

    def keyframes(self) -> list[Keyframe]:
        """The log now, oldest first (a copy: the log may change meanwhile)."""
        with self._lock:
            return list(self._frames)

    def get(self, seq: int) -> Keyframe | None:
        with self._lock:
            return next((k for k in self._frames if k.seq == seq), None)

    def uncaptioned(self) -> list[Keyframe]:
        """Keyframes without a caption yet, newest first (what a user asks about first)."""
        with self._lock:
            return [k for k in reversed(self._frames) if k.caption is None]

    def set_caption(self, seq: int, caption: str) -> Keyframe | None:
        """Give keyframe ``seq`` its caption; None when it was thinned away meanwhile."""
        with self._lock:
            frame = next((k for k in self._frames if k.seq == seq), None)
            if frame is not None:
                frame.caption = caption
                frame.caption_wall = time.time()
                self.version += 1
            return frame

    def clear(self) -> None:
        with self._lock:
            self._frames.clear()
            self.version += 1

    def memory_bytes(self) -> int:
        with self._lock:
            return sum(len(k.jpeg) + len(k._thumb or b"") for k in self._frames)

    def as_json(self, origin: float | None, now: float | None) -> dict[str, Any]:
        """The log as GET /sessions/<id>/memory returns it: times in seconds
        from the session's start (``origin``) and before its newest media (``now``)."""
        frames = self.keyframes()
        base = origin if origin is not None else (frames[0].t if frames else 0.0)
        newest = now if now is not None else (frames[-1].t if frames else base)
        return {
            "limit": self.limit, "added": self.added, "thinned": self.thinned, "version": self.version,
            "keyframes": [keyframe_json(k, base, newest) for k in frames],
        }


def keyframe_json(k: Keyframe, origin: float, now: float) -> dict[str, Any]:
    return {"seq": k.seq, "time_s": round(k.t - origin, 3), "ago_s": round(max(0.0, now - k.t), 3),
            "time_ms": int(round((k.t - origin) * 1000)), "wall": round(k.wall, 3),
            "source_s": None if k.source_t is None else round(k.source_t, 3),
            "size": f"{k.size[0]}x{k.size[1]}", "caption": k.caption}


# What one question got of a scene log (vidchat.conversation.memory builds it,
# vidchat.conversation.answers keeps it on the answer, bundles write it).

@dataclass(frozen=True)
class Pointer:
    """The moment a question points at: ``t`` on the session's clock, or
    None for "earlier"/"before" (the scenes before the current one)."""

    phrase: str
    t: float | None


@dataclass(frozen=True)
class MemoryFrame:
    """A keyframe as one question got it (its pixels are the model's input)."""

    seq: int
    t: float  # capture time on the session's clock
    ago_s: float  # before the question's newest media
    source_t: float | None
    caption: str | None
    pixels: np.ndarray = field(repr=False, compare=False)


@dataclass(frozen=True)
class MemoryUse:
    """What of the memory one question got: the block before its question,
    its tokens, the captions it listed and the frames that joined its sample."""

    text: str
    tokens: int
    frames: tuple[MemoryFrame, ...] = ()
    captions: tuple[tuple[int, float, str], ...] = ()  # (seq, ago_s, caption), newest first
    pointer: Pointer | None = None
    keyframes: int = 0  # the log's size when asked

    def record(self, origin: float) -> dict[str, Any]:
        """The answer record's memory: times from the session's start (``origin``)."""
        return {
            "memory_tokens": self.tokens,
            "memory_frames": [{"seq": f.seq, "time_s": round(f.t - origin, 3), "ago_s": round(f.ago_s, 3),
                               "source_s": None if f.source_t is None else round(f.source_t, 3),
                               "caption": f.caption} for f in self.frames],
            "memory": {"text": self.text, "keyframes": self.keyframes,
                       "pointed": None if self.pointer is None else self.pointer.phrase,
                       "pointed_time_s": None if self.pointer is None or self.pointer.t is None
                       else round(self.pointer.t - origin, 3),
                       "captions": [{"seq": s, "ago_s": round(a, 3), "caption": c} for s, a, c in self.captions]},
        }

    def frame_ids(self) -> list[str]:
        # Not the kept frames' numbers: a keyframe is a JPEG of that frame, other pixels.
        return [f"m{f.seq}" for f in self.frames]
