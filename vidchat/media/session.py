"""One viewer's state: the frame filter, a ring of kept frames, an audio window.

Producers (the WebRTC peer, the WebSocket door) put timestamped frames and
audio on the session's one timeline (:mod:`vidchat.media.session`); a
question takes a :class:`Sample` of frames (and the audio that goes with
them) out of the ring.

Storage. Kept frames are read-only RGB arrays at no more than
``store_max_pixels`` (vidchat.media.frame_buffer, which says what that costs
and saves); which ones a question takes is vidchat.media.sampling.

Timeline. Timestamps are seconds on ``time.monotonic()`` as placed by the
producer's clock (:mod:`vidchat.media.clock`); ``timeline_start`` is the first media
time the session saw, and answer records report times relative to it, so the
same clip replayed at any speed yields the same times.

Source position. A file played in the page (or by ``vidchat.qa.replay``) also has
its own clock, which pause, seek and loop move; :meth:`Session.set_source`
records it (:class:`vidchat.media.clock.SourceTimeline`) and every frame is given
its position in the file as it is ingested, so a question's record can say
where in the file each frame and its audio came from.

Threads. Frames may arrive from an asyncio task and a worker thread while a
question is being answered. The frame buffer serialises ingestion with a
lock of its own; the session's short-held lock guards the ring, counters,
audio and settings together, so a sample sees frames and audio at one moment
and neither ``sample()`` nor a settings change ever waits for a decode. A Sample holds references to
read-only arrays and its own audio copy: frames that arrive later go to the
next question and never change this one's input.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import av
import numpy as np
from PIL import Image

from vidchat.media import (
    AUDIO_RATE,
    DEFAULT_MAX_FRAME_BYTES,
    DEFAULT_MAX_FRAME_PIXELS,
    DEFAULT_STORE_MAX_PIXELS,
    MIN_AUDIO_SAMPLES,
    evs,
    is_int,
    is_number,
)
from vidchat.media.audio import AudioWindow, segment_samples, to_int16
from vidchat.media.clock import SourceTimeline
from vidchat.media.evs import FrameError
from vidchat.media.frame_buffer import DEFAULT_SCENE_CHANGE_SHARE, FrameBuffer, StoredFrame
from vidchat.media.sampling import Sample, pick, within_encode_budget
from vidchat.media.scene_log import SceneLog

logger = logging.getLogger(__name__)


# One setting's rule: its type, range, the page's label and the socket's
# names, and how a value is read from the page or checked from data. The
# table of every setting is vidchat.conversation.asking; the session's
# half of it (how frames are kept and sampled) is vidchat.media.session.

class SettingValueError(ValueError):
    """A field's value out of its range or choices; ``field`` is its name in
    the table, so a door can point at the field as its own client set it."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Setting:
    """One field. ``kind``: int, number, bool, choice or text; ``low``/``high``
    bound it (``low_open``: strictly above ``low``); ``target``: the
    SessionSettings ("session") or AnswerOptions ("answer") attribute."""

    name: str
    target: str
    kind: str
    label: str  # the page's label for it
    rule: str  # what a good value is, as the refusal says it
    origin: str = "vidchat"  # seed, vllm-omni or vidchat (docs/protocol.md's table)
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    nullable: bool = False
    choices: tuple[str, ...] = ()
    # (value, what the page shows, what it does) for each of ``choices`` the page offers by name.
    choice_labels: tuple[tuple[str, str, str], ...] = ()
    aliases: tuple[str, ...] = ()  # upstream's later names for it (session.config)

    def json_kinds(self) -> tuple[type, ...]:
        """The JSON types session.config takes for it (ranges come later)."""
        return {"int": (int,), "number": (int, float), "bool": (bool,), "choice": (str,), "text": (str,)}[self.kind]

    def page_choices(self) -> list[tuple[str, str]]:
        """The page's (label, value) pairs: a picker shows the label and sends the value."""
        labels = {value: label for value, label, _ in self.choice_labels}
        return [(labels.get(value, value), value) for value in self.choices]

    def choice_help(self, value: Any) -> str:
        """What the chosen value does, as the page's help under the picker says it."""
        return next((help_text for v, _, help_text in self.choice_labels if v == value), "")

    def problem(self, value: Any, high: float | None = None) -> str | None:
        """Why ``value`` is refused (None: it is good). ``high``: a bound known
        only at run time (max_tokens: the model's context)."""
        if value is None:
            return None if self.nullable else "missing"
        high = self.high if high is None else high
        if self.kind == "bool":
            return None if isinstance(value, bool) else "bad"
        if self.kind == "choice":
            return None if value in self.choices else "bad"
        if self.kind == "text":
            return None if isinstance(value, str) else "bad"
        if not (is_int(value) if self.kind == "int" else is_number(value)):
            return "bad"
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return "bad"
        if high is not None and value > high:
            return "bad"
        return None

    def check(self, value: Any, *, name: str | None = None, high: float | None = None) -> None:
        """Raise ValueError naming the field (``name``: another name for it, e.g. the page's label)."""
        if self.problem(value, high) is not None:
            rule = self.rule.format(high=f"{high:g}" if isinstance(high, float) else high) if high is not None \
                else self.rule
            shown = type(value).__name__ if self.kind == "text" else repr(value)
            raise SettingValueError(f"{name or self.name} must be {rule}, got {shown}", self.name)

    def from_page(self, raw: Any, high: float | None = None) -> Any:
        """A page widget's (or the /ask API's) value, read as this field's
        type and checked; refusals name the page's label."""
        value = raw
        if self.kind == "int":
            value = _whole(self.label, raw)
        elif self.kind == "number":
            value = page_number(self.label, raw)
        elif self.kind == "bool":
            value = bool(raw)
        self.check(value, name=self.label, high=high)
        return value


def _whole(label: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{label} must be a whole number, got {value!r}")
    if isinstance(value, int):
        return value  # exact: through float, 2**63 - 1 would round up out of the seed's range
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        return int(value.strip())
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{label} must be a whole number, got {value!r}") from None
    if not math.isfinite(number) or number != int(number):
        raise ValueError(f"{label} must be a whole number, got {value!r}")
    return int(number)


def page_number(label: str, value: Any) -> float:
    """A page widget's value as a finite number (ValueError naming ``label``)."""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        raise ValueError(f"{label} must be a number, got {value!r}")
    return number


# The session's half of the settings table: how a session keeps and samples
# frames and audio (SessionSettings), each field with its rule. The answer's
# half, and the table every door reads, is vidchat.conversation.asking.

MAX_FRAMES_LIMIT = 1024  # frames a session may keep, and sample for one question

SAMPLING_STRATEGIES = ("uniform", "stable", "latest_frames", "latest_seconds")

# What the page shows for each strategy (its value stays the name above, which
# every door and the protocol use), and what it does, shown while it is chosen.
SAMPLING_CHOICES = (
    ("uniform", "Spread over all kept frames",
     "Frames spread evenly over everything kept, oldest to newest."),
    ("stable", "Spread, reusing the last picks",
     "Spread over everything kept like the first choice, but a new frame changes only the newest pick, "
     "so questions share their prompt's start and answer sooner."),
    ("latest_frames", "The newest frames", "The newest kept frames, one after another."),
    ("latest_seconds", "Spread over the last seconds",
     "Frames spread over the last seconds set below (and the frame on screen as they began)."),
)

AUDIO_MODES = ("frames", "last")

MAX_AUDIO_SECONDS = 600.0

SESSION_SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("max_frames", "session", "int", "Max frames kept", f"an integer in 1..{MAX_FRAMES_LIMIT}",
            origin="seed", low=1, high=MAX_FRAMES_LIMIT),
    Setting("num_sample_frames", "session", "int", "Frames per question", f"an integer in 1..{MAX_FRAMES_LIMIT}",
            origin="seed", low=1, high=MAX_FRAMES_LIMIT, aliases=("num_frames",)),
    Setting("evs_enabled", "session", "bool", "Drop near-duplicate frames", "true or false", origin="seed",
            aliases=("enable_frame_filter",)),
    Setting("evs_threshold", "session", "number", "Filter threshold", "a number in [0, 1]", origin="seed",
            low=0.0, high=1.0, aliases=("frame_filter_threshold",)),
    Setting("sampling", "session", "choice", "Sampling", "one of " + ", ".join(SAMPLING_STRATEGIES),
            choices=SAMPLING_STRATEGIES, choice_labels=SAMPLING_CHOICES),
    Setting("sample_seconds", "session", "number", "Window of the last seconds", "a positive number",
            low=0.0, low_open=True),
    Setting("keepalive_s", "session", "number", "Keep-alive", "null or a positive number of seconds",
            low=0.0, low_open=True, nullable=True),
    Setting("scene_change_share", "session", "number", "Scene change share", "a number in (0, 1]",
            low=0.0, low_open=True, high=1.0),
    Setting("memory", "session", "bool", "Memory", "true or false"),
    Setting("audio_mode", "session", "choice", "Audio", "one of " + ", ".join(AUDIO_MODES), choices=AUDIO_MODES),
    Setting("audio_last_seconds", "session", "number", "Audio seconds", "a positive number",
            low=0.0, low_open=True),
)}


@dataclass
class SessionSettings:
    """Per-session options; may be changed between questions."""

    max_frames: int = 64
    num_sample_frames: int = 16
    sampling: str = "uniform"  # "uniform" | "stable" | "latest_frames" | "latest_seconds"
    sample_seconds: float = 10.0  # window for "latest_seconds"
    evs_enabled: bool = True
    evs_threshold: float = evs.DEFAULT_THRESHOLD  # keep a frame when > (1 - x) of the picture changed
    keepalive_s: float | None = None  # keep >= 1 frame every N seconds even if nothing changes
    # A kept frame is a scene change (Watch) when this share of the picture
    # differs from the scene's first frame (vidchat.media.frame_buffer).
    scene_change_share: float = DEFAULT_SCENE_CHANGE_SHARE
    # Keep a scene log and put it in each question's prompt (vidchat.conversation.memory);
    # the server's --memory gives a new session its default.
    memory: bool = False
    audio_seconds: float = 30.0  # audio window cap
    audio_mode: str = "frames"  # "frames": from the first sampled frame on; "last": last audio_last_seconds
    audio_last_seconds: float = 10.0

    def validate(self) -> None:
        """Raise ValueError naming the first bad field (the rows above)."""
        for setting in SESSION_SETTINGS.values():
            setting.check(getattr(self, setting.name))
        if not is_number(self.audio_seconds) or not 0 < self.audio_seconds <= MAX_AUDIO_SECONDS:
            raise ValueError(f"audio_seconds must be a number in (0, {MAX_AUDIO_SECONDS:g}], "
                             f"got {self.audio_seconds!r}")


# What producers put on one viewer's timeline: kept frames (filtered and
# bounded by :mod:`vidchat.media.frame_buffer`), audio
# (:class:`vidchat.media.audio.AudioWindow`) and the played file's clock
# (:class:`vidchat.media.clock.SourceTimeline`). :class:`vidchat.media.session.Session`
# builds on it with the settings' rules and the questions' samples; the
# threading rules are the session's (its module says them).

class SessionMedia:
    """What producers put on one viewer's timeline: kept frames (filtered
    and bounded), audio, and the played file's clock. :class:`Session`
    adds the settings' rules and the questions' samples.

    ``settings`` is read-only from outside: change it with :meth:`Session.update_settings`.
    """

    def __init__(self, session_id: str, settings: SessionSettings, *, store_max_pixels: int | None,
                 max_frame_bytes: int, max_frame_pixels: int, max_bytes: int | None) -> None:
        self.id = session_id
        self.settings = settings
        self.store_max_pixels = store_max_pixels
        self.max_frame_bytes = max_frame_bytes
        self.max_frame_pixels = max_frame_pixels
        self.max_bytes = max_bytes  # the frame buffer's budget (None: none)
        self.last_activity = time.monotonic()
        self._lock = threading.Lock()
        self.source_timeline = SourceTimeline()
        self._buffer = FrameBuffer(self._lock, settings.max_frames, evs_enabled=settings.evs_enabled,
                                   evs_threshold=settings.evs_threshold, keepalive_s=settings.keepalive_s,
                                   store_max_pixels=store_max_pixels, max_frame_bytes=max_frame_bytes,
                                   max_frame_pixels=max_frame_pixels, on_media=self._on_media,
                                   position_at=self.source_timeline.position_at)
        self._buffer.scene_change_share = settings.scene_change_share
        # What the session remembers beyond its ring (vidchat.media.scene_log),
        # logged while its memory is on.
        self.scene_log = SceneLog()
        self._buffer.on_scene = self._scene_began
        self._audio = AudioWindow(settings.audio_seconds)
        self._audio_arrived: float | None = None  # time.monotonic() of the newest audio
        self.timeline_start: float | None = None

    def _scene_began(self, frame: StoredFrame) -> None:
        # Under the session's lock, on the ingest thread.
        if self.settings.memory:
            self.scene_log.add(frame.seq, frame.t, frame.pixels, frame.source_t)

    @property
    def on_frame(self) -> Callable[[bool], None] | None:
        """Told of each frame the filter judged (True: kept): the app's metrics."""
        return self._buffer.on_judged

    @on_frame.setter
    def on_frame(self, hook: Callable[[bool], None] | None) -> None:
        self._buffer.on_judged = hook

    def _on_media(self, t: float | None, now: float) -> None:
        # Media captured at t (None: not placed) arrived now; the caller holds _lock.
        if t is not None and (self.timeline_start is None or t < self.timeline_start):
            self.timeline_start = t
        self.last_activity = now

    # -- frames ------------------------------------------------------------

    def add_frame(self, frame: np.ndarray | Image.Image, t: float | None = None) -> bool:
        """Offer a frame captured at ``t`` (default: now); True if it was kept.

        Raises FrameError for an unusable frame; the session is unchanged.
        """
        if isinstance(frame, (bytes, bytearray, memoryview)):
            return self.add_jpeg(frame, t)
        return self._buffer.add_array(frame, t) is not None

    def add_luma_frame(self, luma: np.ndarray, render_rgb: Callable[[int, int], np.ndarray],
                       t: float | None = None, chroma: tuple[np.ndarray, np.ndarray] | None = None) -> bool:
        """Offer a decoded video frame by its luma plane (H×W uint8, may be
        strided) and, so that the filter sees colour, its U and V planes
        (``chroma``, any subsampling); ``render_rgb(width, height)`` is called
        only if the frame is kept, at the stored size. For decoders that hold
        YUV: the filter reads the planes in place, so most frames (the dropped
        ones) never pay for RGB."""
        return self._buffer.add_luma(luma, render_rgb, t, chroma) is not None

    def add_jpeg(self, data: bytes | bytearray | memoryview, t: float | None = None) -> bool:
        """Offer an encoded frame (JPEG, PNG or WebP); decoded in full only if kept.

        Refused with FrameError, before any pixel is decoded, when it is over
        ``max_frame_bytes``, in another format, or over ``max_frame_pixels``."""
        return self.offer_jpeg(data, t) is not None

    def offer_jpeg(self, data: bytes | bytearray | memoryview, t: float | None = None) -> int | None:
        """:meth:`add_jpeg`, answering with the kept frame's number (its
        ``seq``: what :attr:`Sample.seqs` lists once it is sampled), or None
        when the filter dropped it. For a producer that names its frames
        (the WebSocket door's ``frame_id``) and must learn which kept frame
        is which even while other threads feed the session."""
        return self._buffer.add_encoded(data, t)

    # -- audio -------------------------------------------------------------

    def add_audio(self, samples: np.ndarray, t: float | None = None) -> None:
        """Place mono 16 kHz samples (float -1..1 or int16); ``t`` = capture time of the first."""
        pcm = to_int16(samples)
        now = time.monotonic()
        with self._lock:
            self._audio_arrived = now
            self._audio.add(pcm, t, now)
            end = self._audio.end
            self._on_media(None if end is None else (t if t is not None else end - pcm.size / AUDIO_RATE), now)

    def add_pcm16(self, data: bytes | bytearray | memoryview, t: float | None = None) -> None:
        """Place PCM16 little-endian mono 16 kHz bytes."""
        if len(data) % 2:
            raise ValueError(f"PCM16 data must have an even number of bytes, got {len(data)}")
        self.add_audio(np.frombuffer(data, dtype="<i2").astype(np.int16), t)

    def audio_age_s(self) -> float | None:
        """Seconds since audio last arrived (None: none ever has)."""
        arrived = self._audio_arrived
        return None if arrived is None else round(time.monotonic() - arrived, 2)

    def audio_since(self, t: float | None) -> tuple[np.ndarray, float, float] | None:
        """The audio received after timeline time ``t`` (float32, start, end),
        for a listener that follows the stream (Talk mode); None when there
        is none yet. ``t`` None: nothing before now counts."""
        with self._lock:
            return self._audio.since(t)

    # -- source ------------------------------------------------------------

    def note_sender_clock(self, offset_s: float) -> None:
        """Timeline time minus the sender's clock, for the newest video frame
        (the WebRTC door measures it from the browser's sender reports)."""
        self.source_timeline.sender_offset = offset_s

    def set_source(self, kind: str, name: str | None = None, position_s: float | None = None,
                   playing: bool = True, rate: float = 1.0, t: float | None = None, *,
                   duration_s: float | None = None, loop: bool = False,
                   at_sender_s: float | None = None) -> tuple[float, bool]:
        """Say what the video source is from timeline time ``t`` on, placed
        as :meth:`SourceTimeline.place_report` says (the time used and
        whether the sender's clock placed it are returned). Frames stamped
        from then on carry their position in the file, including frames
        that arrived before the report but were captured after it. Not
        media activity: it keeps no session alive."""
        t, by_sender = self.source_timeline.place_report(kind, name, position_s, playing, rate, t,
                                                         duration=duration_s, loop=loop, at_sender_s=at_sender_s,
                                                         now=time.monotonic(), who=self.id)
        with self._lock:
            self._buffer.redate(t)
        return t, by_sender


# A stored frame is RGB, one byte a channel; the server's default per-session
# budget (--max-session-mb 0) is what this many frames at the stored size need.
BYTES_PER_PIXEL = 3

BUDGET_FRAMES = 64


def session_budget_bytes(budget_mb: float, store_max_pixels: int) -> int:
    """--max-session-mb in bytes (0: BUDGET_FRAMES frames at the stored size, rounded up to a whole MB)."""
    if budget_mb > 0:
        return int(budget_mb * 2**20)
    return math.ceil(BUDGET_FRAMES * store_max_pixels * BYTES_PER_PIXEL / 2**20) * 2**20


def check_frame_budget(max_frames: Any, store_max_pixels: int | None, budget_bytes: int | None) -> None:
    """Raise ValueError naming max_frames and the budget when a full buffer
    of ``max_frames`` stored frames would not fit the session's budget."""
    if budget_bytes is None or store_max_pixels is None or not is_int(max_frames):
        return
    need = max_frames * store_max_pixels * BYTES_PER_PIXEL
    if need > budget_bytes:
        most = budget_bytes // (store_max_pixels * BYTES_PER_PIXEL)
        raise ValueError(f"max_frames {max_frames} needs {need / 2**20:.1f} MB at the stored frame size "
                         f"({store_max_pixels:,} pixels); this server's budget is {budget_bytes / 2**20:.1f} MB "
                         f"per session (--max-session-mb), at most {most} frames")


__all__ = ["FrameError", "Session", "SessionSettings", "Sample"]


def _question_audio(window: AudioWindow, frames: list[StoredFrame], picked: list[int],
                    window_start: float | None, span: tuple[float, float] | None,
                    s: SessionSettings, audio_after: float | None = None,
                    ) -> tuple[tuple[np.ndarray, float, float] | None, tuple[tuple[int, str], ...]]:
    """The audio that goes with a question's frames, and its segments (see Session.sample)."""
    if span is not None:
        return window.window(span[0], span[1]), ()  # a spoken question: one clip
    if audio_after is not None:
        held_start = window.start
        if held_start is None:  # no audio yet
            return None, ()
        start = max(audio_after, held_start)  # all of it since then, as much as is kept
        return window.window(start), window.parts(start, min_samples=MIN_AUDIO_SAMPLES)
    if s.audio_mode == "frames" and picked:
        start = frames[picked[0]].t
        if window_start is not None:
            start = max(start, window_start)
    elif window.end is not None:
        start = window.end - s.audio_last_seconds
    else:
        return None, ()
    start = window.steady_start(start)
    return window.window(start), window.parts(start, min_samples=MIN_AUDIO_SAMPLES)


def _sample_of(frames: list[StoredFrame], picked: list[int], audio: tuple[np.ndarray, float, float] | None,
               sources: SourceTimeline, **fields: Any) -> Sample:
    """The Sample of the picked frames and their audio, dated in the played file where it is one."""
    audio_span = None
    if audio:
        audio_span = (sources.position_at(audio[1]), sources.position_at(audio[2]))
        if audio_span == (None, None):
            audio_span = None
    return Sample(
        frames=[frames[i].pixels for i in picked],
        timestamps=[frames[i].t for i in picked],
        indices=picked,
        audio=audio[0] if audio else None,
        audio_start=audio[1] if audio else None,
        audio_end=audio[2] if audio else None,
        source_times=[frames[i].source_t for i in picked],
        source_at_jump=[frames[i].source_t is not None and sources.at_jump(frames[i].t) for i in picked],
        audio_source_span=audio_span,
        source=sources.source_at(frames[picked[-1]].t if picked else None),
        seqs=[frames[i].seq for i in picked],
        **fields,
    )


class Session(SessionMedia):
    """Frames and audio of one viewer, filtered, bounded and sampled for questions.

    ``settings`` is read-only from outside: change it with :meth:`update_settings`.
    """

    def __init__(self, session_id: str, settings: SessionSettings | None = None, *,
                 store_max_pixels: int | None = DEFAULT_STORE_MAX_PIXELS,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 max_frame_pixels: int = DEFAULT_MAX_FRAME_PIXELS, max_bytes: int | None = None) -> None:
        settings = dataclasses.replace(settings) if settings is not None else SessionSettings()
        settings.validate()
        check_frame_budget(settings.max_frames, store_max_pixels, max_bytes)
        super().__init__(session_id, settings, store_max_pixels=store_max_pixels, max_frame_bytes=max_frame_bytes,
                         max_frame_pixels=max_frame_pixels, max_bytes=max_bytes)
        # Kept frames a warm-up has put in the engine's caches, and how many
        # new ones a question may carry (None: no limit; vidchat.conversation.warmup sets it).
        self._encoded: set[int] = set()
        self._in_flight: set[int] = set()  # being encoded by a warm-up now
        self.encode_budget: int | None = None
        # Frames a socket door dropped over --ws-max-fps, before decoding: they
        # never reach the buffer, so frames_received does not count them.
        self.frames_rate_dropped = 0

    # -- questions ---------------------------------------------------------

    def sample(self, k: int | None = None, strategy: str | None = None,
               span: tuple[float, float] | None = None, new_frames: int | None = -1,
               audio_after: float | None = None) -> Sample:
        """Frames (and audio) for one question; defaults come from the settings.

        Which frames: ``strategy`` (or, for a spoken question, ``span``:
        timeline start and end, vidchat.conversation.modes), as
        :func:`vidchat.media.sampling.pick` explains.

        Audio: ``audio_mode="frames"`` sends the audio from the first sampled
        frame's time (for ``latest_seconds``, from the window's start) to the
        end of the audio received; ``"last"`` (and "frames" with no frames)
        the last ``audio_last_seconds``. Where that start is older than the
        audio kept, from the first 2-s segment boundary of what is kept
        (AudioWindow.steady_start), and ``audio_parts`` gives the segments.
        A spoken question gets exactly its span's audio. ``audio_after``: all
        the audio after that timeline time instead, as much as is kept (the
        seed protocol's rule for clients that send no timestamps: what
        arrived since the previous question).

        ``new_frames``: at most this many frames new to the engine (None: no
        limit); -1, the default: the session's ``encode_budget`` (a warm-up
        that encodes ahead asks for more than a question may carry).
        """
        with self._lock:
            s = self.settings
            k = s.num_sample_frames if k is None else k
            strategy = s.sampling if strategy is None else strategy
            if not is_int(k) or k < 1:
                raise ValueError(f"k must be a positive integer, got {k!r}")
            if strategy not in SAMPLING_STRATEGIES:
                raise ValueError(f"strategy must be one of {', '.join(SAMPLING_STRATEGIES)}, got {strategy!r}")
            frames = list(self._buffer.frames)
            candidates, picked, window_start = pick(frames, k, strategy, span=span, sample_seconds=s.sample_seconds,
                                                    newest_received_t=self._buffer.newest_received_t)
            budget = self.encode_budget if new_frames == -1 else new_frames
            picked, substituted, left_out = within_encode_budget(frames, candidates, picked, self._encoded, budget,
                                                                 self._in_flight)
            new_frames = sum(frames[i].seq not in self._encoded for i in picked)
            audio, audio_parts = _question_audio(self._audio, frames, picked, window_start, span, s, audio_after)
            origin = self.timeline_start if self.timeline_start is not None else 0.0
            tail_open = not self._audio.ends_segment
            self.last_activity = time.monotonic()
        return _sample_of(frames, picked, audio, self.source_timeline, origin=origin, substituted=substituted,
                          left_out=left_out, new_frames=new_frames, audio_parts=audio_parts if audio else (),
                          audio_tail_open=tail_open)

    def mark_encoded(self, seqs: Sequence[int]) -> None:
        """These kept frames are in the engine's caches (a warm-up or a question carried them)."""
        with self._lock:
            live = {f.seq for f in self._buffer.frames}
            self._encoded = {q for q in self._encoded if q in live} | {q for q in seqs if q in live}

    def encoding(self, seqs: Sequence[int]) -> None:
        """A warm-up is encoding these frames now (empty: it ended); a
        question counts them against its budget instead of encoding others."""
        with self._lock:
            self._in_flight = set(seqs) - self._encoded

    def being_encoded(self, seqs: Sequence[int]) -> bool:
        """Whether a warm-up is encoding any of these frames now."""
        with self._lock:
            return any(q in self._in_flight for q in seqs)

    def encoded_in_buffer(self) -> int:
        """How many of the kept frames the engine has encoded."""
        with self._lock:
            return sum(f.seq in self._encoded for f in self._buffer.frames)

    def encoded_count(self, seqs: Sequence[int]) -> int:
        with self._lock:
            return sum(q in self._encoded for q in seqs)

    # -- settings and lifecycle --------------------------------------------

    def update_settings(self, **changes: Any) -> None:
        """Change settings (validated as a whole); the ring keeps its newest frames."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(SessionSettings)})
        if unknown:
            raise ValueError(f"unknown setting(s): {', '.join(unknown)}")
        with self._lock:
            new = dataclasses.replace(self.settings, **changes)
            new.validate()
            check_frame_budget(new.max_frames, self.store_max_pixels, self.max_bytes)
            self._buffer.configure(new.max_frames, new.evs_enabled, new.evs_threshold, new.keepalive_s,
                                   new.scene_change_share)
            if new.audio_seconds != self.settings.audio_seconds:
                self._audio.set_cap(new.audio_seconds)
            remembers_now = new.memory and not self.settings.memory
            if self.settings.memory and not new.memory:
                self.scene_log.clear()  # off keeps nothing: a session with memory off has no log
            self.settings = new
            if remembers_now and self._buffer.frames:
                # Memory turned on mid-scene: the scene on screen is its first keyframe.
                newest = self._buffer.frames[-1]
                logged = self.scene_log.keyframes()
                if not logged or logged[-1].seq < newest.seq:
                    self.scene_log.add(newest.seq, newest.t, newest.pixels, newest.source_t)
        logger.debug("session %s: settings changed %s", self.id, changes)

    def reset(self) -> None:
        """Drop all frames, audio and counts; settings and the source stay."""
        with self._lock:
            self._buffer.clear()
            self._audio.clear()
            self.scene_log.clear()
            self._encoded = set()
            self._in_flight = set()
            self.timeline_start = None
            self.frames_rate_dropped = 0
            self.last_activity = time.monotonic()

    # -- introspection -----------------------------------------------------

    frame_count = property(lambda self: len(self._buffer.frames), doc="Frames in the buffer now.")
    kept_count = property(lambda self: self._buffer.kept,
                          doc="Frames kept so far: changes exactly when the buffer gains a frame.")
    scene_changes = property(lambda self: self._buffer.scene_changes,
                             doc="Kept frames where most of the picture changed at once (watch mode).")
    last_scene_change_t = property(lambda self: self._buffer.last_scene_change_t)
    newest_frame_time = property(lambda self: self._buffer.newest_received_t, doc=(
        "Capture time of the newest frame received (kept or dropped): shows the stream is alive."))

    @property
    def audio_segments(self) -> tuple[int, int]:
        """(stream, finished audio segments): changes when a segment is
        complete, which is when a warm-up can take it (vidchat.conversation.warmup)."""
        window = self._audio
        return window.stream, window.total // segment_samples()

    @property
    def oldest_seq(self) -> int | None:
        """The number of the oldest frame still in the buffer (None when it
        is empty): kept frames numbered below it have been pushed out."""
        with self._lock:
            frames = self._buffer.frames
            return frames[0].seq if frames else None

    @property
    def memory_bytes(self) -> int:
        """Bytes held by stored frames and audio."""
        with self._lock:
            return sum(f.pixels.nbytes for f in self._buffer.frames) + self._audio.nbytes

    def recent_kept(self, n: int) -> list[tuple[int, float, np.ndarray]]:
        """The n newest kept frames as (ring index, time, pixels), oldest first."""
        with self._lock:
            frames = list(self._buffer.frames)
        start = max(0, len(frames) - n)
        return [(i, f.t, f.pixels) for i, f in enumerate(frames[start:], start)]

    @property
    def stats(self) -> dict[str, Any]:
        with self._lock:
            arrival = self._buffer.newest_arrival
            return {
                **self._buffer.stats(max_frames=self.settings.max_frames, audio_seconds=self._audio.seconds,
                                     frames_rate_dropped=self.frames_rate_dropped),
                # By arrival on this process's clock, so it works whatever clock t uses.
                "newest_frame_age_s": time.monotonic() - arrival if arrival is not None else None,
            }


# A decoded video frame (PyAV) offered to a session, the one rule for
# every live source that decodes video on the server: the WebRTC door's
# camera and screen tracks, and the streams of --stream (vidchat.media.streams).

# Decoder outputs with 8-bit luma at full size first, then U and V (NV12: interleaved).
LUMA_FIRST_FORMATS = frozenset({"yuv420p", "yuvj420p", "nv12", "yuv422p", "yuv444p"})


def yuv_planes(frame: av.VideoFrame) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Views of a planar or NV12 frame's Y plane and its U and V planes (no copy)."""
    def plane(i: int, width_bytes: int) -> np.ndarray:
        p = frame.planes[i]
        # memoryview: a plane is a buffer (no copy), which numpy's stubs
        # only see as one through memoryview on Python 3.11.
        return np.frombuffer(memoryview(p), np.uint8).reshape(p.height, p.line_size)[:, :width_bytes]

    luma = plane(0, frame.width)
    if len(frame.planes) == 2:  # NV12: U and V interleaved in one plane
        uv = plane(1, 2 * frame.planes[1].width)
        return luma, (uv[:, 0::2], uv[:, 1::2])
    return luma, (plane(1, frame.planes[1].width), plane(2, frame.planes[2].width))


def render_rgb(frame: av.VideoFrame, width: int, height: int) -> np.ndarray:
    """The frame as RGB at ``width`` × ``height``."""
    if (width, height) == (frame.width, frame.height):
        return frame.to_ndarray(format="rgb24")
    # Area averaging: the downscale stays free of aliasing for the model.
    return frame.reformat(width=width, height=height, format="rgb24", interpolation="AREA").to_ndarray()


def offer_decoded(session: Session, frame: av.VideoFrame, t: float) -> bool:
    """Offer a decoded frame captured at ``t`` to ``session``'s filter and
    buffer; True if kept (raises FrameError for an unusable one). The filter
    reads the Y, U and V planes in place: most frames are dropped and never
    pay for conversion to RGB, which runs at the stored size for a kept one."""
    if frame.format.name in LUMA_FIRST_FORMATS:
        luma, chroma = yuv_planes(frame)
        return session.add_luma_frame(luma, lambda w, h: render_rgb(frame, w, h), t=t, chroma=chroma)
    return session.add_frame(frame.to_ndarray(format="rgb24"), t=t)
