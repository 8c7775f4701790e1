"""Warm-ups: keep each session's would-be question prefilled in the engine.

A question's frames are on the server seconds before the question is. While
a session streams, this module sends vLLM a warm-up for the prompt the next
question would get, minus the question text (system prompt, earlier turns,
the sampled frames and audio): vLLM encodes the frames and fills its prefix
cache, generating a single token. When the question comes, the same prefix is
a cache hit and only the question's few tokens are prefilled (its record
states ``cached_tokens``).

The rules that keep it cheap and harmless:

* Off the answer path: one background task; a warm-up never delays a
  question (vLLM's priority scheduling puts answers first, see
  ``engine.WARMUP_PRIORITY``) and, in ``idle`` mode, none starts while any
  answer is generating.
* Coalesced: one warm-up in flight at a time; a session's would-be sample is
  read when its turn comes, so a newer frame replaces an older pending one.
* Only when something changed (a kept frame, a settings change, a finished
  answer: the session's *sample key*), and never the same inputs twice.
* Rate-limited per session (``interval_s``), tighter for a session whose user
  is typing (``question_coming``), and capped as a share of the engine's time
  (``max_share`` of a sliding window).
* With the session's own cache salt, so no session warms another's cache;
  a warm-up of a session that ends is aborted.
* Where a frame is slow to encode (the CPU default: 0.5-2 s), the newest
  kept frame is encoded as it arrives, one frame a warm-up, one warm-up at a
  time (back to back as the camera starts, until a question's worth is
  encoded), and a question brings at most one frame new to the engine: its
  newest, or the one a warm-up is encoding as it comes (``ENCODE_BUDGET_S``,
  vidchat.media.sampling.within_encode_budget). ``--prewarm auto`` turns
  warm-ups on only there (vidchat.conversation.warmup).

Which session is warmed next and with what is decided in
vidchat.conversation.warmup; the warm-up in flight, and what gives way to
what, is vidchat.conversation.warmup; this module schedules the warm-ups
and takes the sessions' signals.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from vidchat.conversation.host import answering
from vidchat.engine.interface import ChatEngine, Prepared, ReplyStats
from vidchat.media.session import Sample, Session, SessionSettings

if TYPE_CHECKING:
    from vidchat.conversation.answers import Answer, AnswerOptions, SessionRecord
    from vidchat.conversation.host import Host

log = logging.getLogger(__name__)

# What a warm-up was taken for (sample_key) and what besides its frames a
# question must share with it (WarmPlan.prompt_key): compared, never read.
SampleKey = tuple[object, ...]
PromptKey = tuple[object, ...]


# ``--prewarm auto``: warm-ups where a frame is slow to encode, none where it is cheap.
#
# Whether warm-ups pay depends on the model and the machine, not on a rule of
# thumb. On the tiny test model a frame costs the vision encoder a few
# milliseconds: a question pays almost nothing for its frames, and warm-ups
# only take cores the browser needs (docs/performance.md, 'Warm-ups'). On the CPU default
# (SmolVLM2-256M at true size) a frame costs about half a second: a question
# after a moving scene pays a second or more after Enter unless its frames
# were encoded as they arrived. So at start-up the server times one encode of
# a frame at the size sessions store them and chooses:
#
# * ``idle`` (encode ahead) where that frame took more than
#   :data:`AUTO_THRESHOLD_MS`: each session's newest kept frame is encoded as
#   it arrives, one frame at a time. A question brings at most one frame new
#   to the engine: the newest, or the one a warm-up is encoding as it comes
#   (vidchat.media.sampling.within_encode_budget), so it never waits for more
#   than one frame's encode, however fast frames are kept. (An earlier rule
#   turned warm-ups off above 500 ms a frame: a warm-up's batch of frames,
#   which vLLM cannot preempt, then held up the question behind it.)
# * ``off`` where it took less: the frames cost the question little.
#
# The measurement is the difference between two one-token requests that differ
# only by the frame (after one untimed request, so neither pays the engine's
# first-call costs): what the vision encoder and the frame's prompt tokens
# cost, not the request's fixed cost. It costs three tiny requests on the
# tiny model (well under a second) and about a second on the CPU default.

# A frame whose encoding costs more than this is encoded ahead. Why 150 ms:
# it is about what the page's own round trip (Enter -> the server's chat
# event -> first token visible) costs on 2 cores, so above it the frames a
# question brings new would at least double the wait the user sees; below it
# (the tiny model: a few ms; a GPU: tens of ms even for large towers) the
# frames are not what the user waits for and warm-ups would only compete
# with the browser for the cores. The two sides measured here are 50-100x
# apart, so the threshold is far from both.
AUTO_THRESHOLD_MS = 150.0

# What the encoder gets: a frame at the size sessions store them
# (vidchat.media DEFAULT store size, 320x240), noise so it compresses to nothing.
PROBE_FRAME_HW = (240, 320)

# The mode auto turns on: warm-ups only while no answer is generating, so
# an answer never shares the cores with one.
AUTO_ON_MODE = "idle"

# Where new frames are slow to encode, a question may carry only as many as
# the engine encodes in this time (none on the CPU default, ~0.5 s a frame);
# the rest are swapped for the nearest frames a warm-up already encoded. The
# page's target is 400 ms from Enter to the first token on 2 cores; its own
# round trip takes about half of that, which leaves this for new frames.
ENCODE_BUDGET_S = 0.25

# Where a frame costs more than this to encode (--prewarm auto's threshold),
# each kept frame is encoded as it arrives: a warm-up is worth one new frame.
SLOW_FRAME_S = AUTO_THRESHOLD_MS / 1000


@dataclass
class FrameCost:
    """What a frame new to the engine costs it (seeded by --prewarm auto's
    measurement, then warm-up time per frame it had not seen, a moving
    average), and the encoder budget that follows."""

    per_frame_s: float | None = None

    @property
    def slow(self) -> bool:
        """Encoding a frame costs enough that each kept frame is encoded as it arrives."""
        return self.per_frame_s is not None and self.per_frame_s > SLOW_FRAME_S

    def learn(self, took_s: float, new_frames: int) -> None:
        if new_frames < 2:
            return  # too few to tell encoding from the fixed cost of a request
        per_frame = took_s / new_frames
        self.per_frame_s = per_frame if self.per_frame_s is None else 0.7 * self.per_frame_s + 0.3 * per_frame

    def budget(self, frames: int) -> int | None:
        """New frames a question of ``frames`` may carry (None: no limit).
        Where a new frame is slow (a CPU: the vision encoder takes about half
        a second a frame) as many as encode within ENCODE_BUDGET_S, and at
        least one: the newest frame, so the answer sees the moment it was
        asked, while warm-ups have encoded the others as they arrived."""
        per_frame_s = self.per_frame_s
        if per_frame_s is None or not self.slow:
            # A GPU or the tiny model (tens of ms a frame): a question's new
            # frames cost less than the page's own round trip; every one goes.
            return None
        budget = max(1, int(ENCODE_BUDGET_S / per_frame_s))
        return budget if budget < frames else None

    def apply(self, session: Session) -> None:
        session.encode_budget = self.budget(session.settings.num_sample_frames)


@dataclass
class PrewarmChoice:
    """What --prewarm resolved to, and why (shown by /api/health and the start-up log)."""

    setting: str  # what --prewarm said: auto, off, idle or always
    chosen: str  # the mode it resolved to: off, idle or always
    reason: str
    frame_encode_ms: float | None = None  # auto's measurement (None: not measured)
    threshold_ms: float = AUTO_THRESHOLD_MS

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def explicit(setting: str) -> PrewarmChoice:
    """A mode the user chose: it wins, nothing is measured."""
    return PrewarmChoice(setting, setting, f"set by --prewarm {setting}")


def pending() -> PrewarmChoice:
    return PrewarmChoice("auto", "off", "auto: the model is loading; warm-ups stay off until a frame is timed")


def choose(frame_ms: float, threshold_ms: float = AUTO_THRESHOLD_MS) -> PrewarmChoice:
    """The mode for a measured per-frame encoding cost."""
    size = f"{PROBE_FRAME_HW[1]}x{PROBE_FRAME_HW[0]}"
    if frame_ms > threshold_ms:
        return PrewarmChoice(
            "auto", AUTO_ON_MODE, f"auto: a {size} frame took {frame_ms:.0f} ms to encode, more than "
            f"{threshold_ms:.0f} ms: each session's newest kept frame is encoded as it arrives, one frame at a "
            "time, so a question brings at most one new frame (a frame in flight counts as that one)",
            round(frame_ms, 1), threshold_ms)
    return PrewarmChoice(
        "auto", "off", f"auto: a {size} frame took {frame_ms:.0f} ms to encode, less than {threshold_ms:.0f} ms: "
        "a question's frames cost little, warm-ups would cost the page more", round(frame_ms, 1), threshold_ms)


async def _one_token_s(engine: ChatEngine, frames: list[np.ndarray], salt: str) -> float:
    """Seconds a one-token request takes with these frames (never a cache hit: a salt of its own)."""
    prepared = await asyncio.to_thread(engine.prepare, "Describe.", frames, None, max_tokens=1, temperature=0.0,
                                       cache_salt=salt, frame_ids=[str(i) for i in range(len(frames))] or None)
    started = time.perf_counter()
    await engine.warm(prepared)
    return time.perf_counter() - started


async def measure_frame_ms(engine: ChatEngine, seed: int = 0) -> float:
    """One frame's encoding cost in ms: a one-token request with one
    stored-size frame minus the same request without it."""
    frame = np.random.default_rng(seed).integers(0, 255, (*PROBE_FRAME_HW, 3), dtype=np.uint8)
    run = f"vidchat-probe-{uuid.uuid4().hex[:8]}"
    await _one_token_s(engine, [], f"{run}-prime")  # first-call costs land here, untimed
    text_s = await _one_token_s(engine, [], f"{run}-text")
    frame_s = await _one_token_s(engine, [frame], f"{run}-frame")
    return max(0.0, (frame_s - text_s) * 1000)


async def decide(engine: ChatEngine | None, setting: str) -> PrewarmChoice:
    """The mode for ``--prewarm SETTING`` on this engine: measured for auto."""
    if setting != "auto":
        return explicit(setting)
    if engine is None:
        return PrewarmChoice("auto", "off", "auto: no engine to measure")
    try:
        return choose(await measure_frame_ms(engine))
    except Exception as exc:  # noqa: BLE001 - a probe that fails must not stop the server
        log.warning("could not time a frame's encoding (%s): warm-ups stay off", exc)
        return PrewarmChoice("auto", "off", f"auto: a frame could not be timed ({exc}); off")


async def settle(host: Host, engine: ChatEngine | None = None, measure: bool = True) -> PrewarmChoice | None:
    """Resolve the server's --prewarm once its engine is up, apply it to the
    prewarmer and say so in the log (None: no prewarmer to set).
    ``measure`` false (an engine handed to the server by a test or a
    benchmark, which counts its requests): auto stays off, unmeasured.
    ``engine``: the one just started, before the server says it is ready
    (default: the server's)."""
    prewarmer = host.prewarmer
    if not isinstance(prewarmer, Prewarmer):  # none, or warm-ups of another kind: nothing to set
        return None
    if prewarmer.setting == "auto" and not measure:
        choice = PrewarmChoice("auto", "off", "auto: the engine was handed to the server; not measured, off")
    else:
        choice = await decide(engine or host.engine_now("main"), prewarmer.setting)
    await prewarmer.apply_choice(choice)
    log.info("warm-ups: %s (%s)", choice.chosen, choice.reason)
    return choice


# The samples taken as Enter was pressed (vidchat.conversation.warmup
# ``question_now``): one per session, each for the question on its way.

# A sample taken as Enter is pressed (question_now) serves the question that
# reaches the server within this long; later, the question samples anew.
PIN_S = 2.0


@dataclass
class Pin:
    """The sample taken as Enter was pressed, for the question on its way."""

    at: float  # time.monotonic()
    sample: Sample
    settings: SessionSettings  # the session's settings it was taken with
    turn: int  # the conversation's turn then (SessionRecord.turn): a later question makes the pin stale
    warmed: bool = False


class EnterPins:
    """The samples taken as Enter was pressed, one per session, each for the question on its way."""

    def __init__(self) -> None:
        self._pins: dict[str, Pin] = {}
        self._taking: set[str] = set()  # sessions whose Enter sample is being taken

    def begin(self, entry: SessionRecord, now: float) -> bool:
        """Whether an Enter report of this session may take a pin (then call
        :meth:`end` once its sample is taken): not while a report's sample is
        being taken, nor while the session's pin waits for its question."""
        sid = entry.session.id
        if sid in self._taking or self.waiting(entry, now):
            return False
        self._taking.add(sid)  # at once: reports posted together, each awaiting its sample, pass one by one
        return True

    def end(self, session_id: str) -> None:
        self._taking.discard(session_id)

    def put(self, session_id: str, pin: Pin) -> None:
        self._pins[session_id] = pin

    def get(self, session_id: str) -> Pin | None:
        return self._pins.get(session_id)

    def take(self, entry: SessionRecord) -> Pin | None:
        """The pin for this question (None when there is none, it is older
        than PIN_S, or the question came with other sampling settings): used once."""
        pin = self._pins.pop(entry.session.id, None)
        if (pin is None or time.monotonic() - pin.at > PIN_S or pin.settings != entry.session.settings
                or pin.turn != entry.turn):
            return None
        return pin

    def waiting(self, entry: SessionRecord, now: float) -> bool:
        """A fresh pin of this session waits for its question (warmed or not):
        another Enter before that question arrives takes no new one."""
        pin = self._pins.get(entry.session.id)
        return pin is not None and now - pin.at < PIN_S and pin.turn == entry.turn

    def unwarmed(self, entry: SessionRecord, now: float) -> bool:
        """A fresh pin of this session's coming question, not warmed yet: warmed before anything else."""
        pin = self._pins.get(entry.session.id)
        return pin is not None and not pin.warmed and self.waiting(entry, now)

    def prune(self, live: dict[str, SessionRecord], now: float) -> None:
        """Forget the pins of ended sessions, stale ones, and those a question overtook."""
        for sid in [s for s in self._pins if s not in live or now - self._pins[s].at > PIN_S
                    or self._pins[s].turn != live[s].turn]:
            del self._pins[sid]


# Deciding warm-ups: which session to warm next, and with what.
#
# vidchat.conversation.warmup runs one warm-up at a time; this module is the
# part that needs no engine time: the sessions worth a warm-up now, the sample
# and prompt a warm-up of one would send, and whether that is worth sending
# (never the same inputs twice).

__all__ = ["WarmPlan", "WarmState", "beyond_share", "frames_ahead", "lead_digest", "plan_warmup", "sample_key",
           "starting", "warm_candidates", "warm_sample"]


URGENT_INTERVAL_S = 0.2

# After an answer ends, its session is not warmed for this long: the answer's
# last tokens reach the page first (on a machine whose cores the browser
# shares, a warm-up then would hold them back), and the next question is
# seconds away.
SETTLE_S = 0.5


@dataclass
class WarmState:
    """What was last warmed for one session."""

    key: SampleKey | None = None  # the sample key it was warmed for
    inputs_sha256: str = ""  # lead_digest of the frames it warmed
    prompt_key: PromptKey | None = None
    at: float = 0.0  # time.monotonic() of the last warm-up start
    urgent_until: float = 0.0
    warmed: int = 0
    last_cached_tokens: int = 0
    last_prompt_tokens: int = 0

    def record(self, key: SampleKey, plan: WarmPlan, stats: ReplyStats) -> None:
        """A warm-up of ``plan``, taken for sample key ``key``, finished with the engine's ``stats``."""
        self.key, self.inputs_sha256, self.prompt_key = key, plan.lead, plan.prompt_key
        self.warmed += 1
        self.last_cached_tokens, self.last_prompt_tokens = stats.cached_tokens, stats.prompt_tokens


@dataclass
class WarmPlan:
    """One warm-up of one session, prepared and not yet sent."""

    sample: Sample
    at_enter: bool  # the sample is the one taken as Enter was pressed
    prepared: Prepared  # the engine's prompt for it
    prompt_key: PromptKey  # what besides the frames a question must share with it
    lead: str  # lead_digest of its frames
    new_frames: int  # its frames not yet in the engine's caches

    def repeats(self, warm: WarmState, slow_frames: bool) -> bool:
        """Whether it would warm nothing that ``warm`` has not. One new frame
        is not worth a warm-up where encoding is cheap (the question encodes
        it in no time); where it is slow, it is the point."""
        return (self.lead == warm.inputs_sha256 and self.prompt_key == warm.prompt_key
                and not (slow_frames and self.new_frames))


def warm_candidates(host: Host, warm_states: dict[str, WarmState], pins: EnterPins, now: float, interval_s: float,
                    slow_frames: bool = False) -> list[tuple[bool, float, SessionRecord, SampleKey]]:
    """The sessions worth a warm-up now, most urgent first, as (not urgent,
    last warmed, entry, sample key): a pinned Enter before anything (the
    longest unwarmed of those first, so no session's Enters crowd out
    another's), then sessions whose user is typing, then the longest
    unwarmed. Where frames are slow to encode (``slow_frames``), a session
    whose buffer holds fewer encoded frames than a question takes (a camera
    just started) is warmed again as soon as the last one-frame warm-up
    ends, so its first question finds its frames encoded. Forgets the warm
    states and pins of sessions that ended."""
    live: dict[str, SessionRecord] = {}
    out: list[tuple[bool, float, SessionRecord, SampleKey]] = []
    pinned: list[tuple[float, SessionRecord, SampleKey]] = []
    engine = host.engine_now("main")
    segments = engine is not None and engine.splits_audio
    for entry in host.registry.entries():
        sid = entry.session.id
        live[sid] = entry
        if entry.away:
            continue  # its tab went away: no question comes until it is back
        if pins.unwarmed(entry, now):
            warm = warm_states.get(sid)
            pinned.append((warm.at if warm else 0.0, entry, sample_key(entry, segments)))  # Enter: first of all
            continue
        if entry.chat.answer is not None or entry.session.frame_count == 0:
            continue  # its own answer is filling the cache; nothing to warm yet
        if now - entry.chat.answer_ended < SETTLE_S:
            continue
        key = sample_key(entry, segments)
        warm = warm_states.get(sid)
        catching_up = slow_frames and starting(entry.session)
        if warm is not None and warm.key == key and not catching_up:
            continue
        urgent = warm is not None and warm.urgent_until > now
        interval = URGENT_INTERVAL_S if urgent else interval_s
        if catching_up and not urgent:
            interval = 0.0  # the first frames, one after another
        if warm is not None and now - warm.at < interval:
            continue
        out.append((not urgent, warm.at if warm else 0.0, entry, key))
    for sid in [s for s in warm_states if s not in live]:
        del warm_states[sid]  # the session ended
    pins.prune(live, now)
    out.sort(key=lambda c: (c[0], c[1]))
    pinned.sort(key=lambda c: c[0])
    return [(False, -1.0, entry, key) for _, entry, key in pinned] + out


def starting(session: Session) -> bool:
    """The session's buffer holds fewer encoded frames than a question takes (its camera just started)."""
    encoded: int = session.encoded_in_buffer()
    kept: int = session.frame_count
    return encoded < min(session.settings.num_sample_frames, kept)


def beyond_share(frame_cost: FrameCost, session: Session, warm: WarmState | None) -> bool:
    """Where frames are slow, a session whose camera just started is warmed
    beyond the engine share, for at most a question's worth of one-frame
    warm-ups: its first question finds its frames encoded."""
    return (frame_cost.slow and (warm is None or warm.warmed < session.settings.num_sample_frames)
            and starting(session))


def frames_ahead(frame_cost: FrameCost) -> int | None:
    """New frames a background warm-up of this session may encode (-1: as
    many as its question may carry). Where frames are slow to encode, one:
    the newest kept frame, encoded as it arrives, one at a time, also while
    the user types. A question that comes while one is in flight takes that
    frame as its one new frame (vidchat.media.sampling.within_encode_budget):
    it waits for what is left of that encode, never for a second one, and
    never for a batch."""
    return 1 if frame_cost.slow else -1


def warm_sample(engine: ChatEngine, entry: SessionRecord, pin: Pin | None,
                new_frames: int | None = -1) -> tuple[Sample, bool]:
    """What a warm-up of this session sends, and whether it is the sample
    taken at Enter. ``new_frames``: at most this many frames new to the
    engine (-1: the session's encode budget, as its question)."""
    if pin is not None and not pin.warmed:
        pin.warmed = True
        return pin.sample, True  # all of it: the question will carry exactly this
    sample = entry.session.sample(new_frames=new_frames)
    if engine.splits_audio:
        # The audio's finished segments, not the newest one if it is still
        # growing: the question's will be longer (vidchat.media.audio).
        return sample.without_audio_tail(), False
    # As one clip the audio grows with every chunk, so it is never a
    # question's prefix: warming it would double the work for nothing.
    return sample.without_audio(), False


async def plan_warmup(engine: ChatEngine, entry: SessionRecord, options: AnswerOptions, pin: Pin | None,
                      new_frames: int | None) -> WarmPlan | None:
    """The warm-up of this session the engine would get now, prepared as
    ``options`` would prepare its next question (``new_frames`` as
    :func:`warm_sample`); None when there is nothing to warm: no frames yet,
    or settings this engine refuses (the question will say so)."""
    from vidchat.conversation import asking

    sample, at_enter = warm_sample(engine, entry, pin, new_frames)
    if not sample.frames:
        return None
    try:
        prepared = await asyncio.to_thread(asking.prepare, engine, entry.chat, sample, options, entry.warm_history,
                                           "", True)
    except Exception as exc:
        log.debug("session %s…: no warm-up: %s", entry.session.id[:6], exc)
        return None
    # The audio's parts count only where the prompt carries audio, as the
    # engine's prepare decided (a model that hears nothing, a sliver too short
    # for the encoder): otherwise the sample taken at Enter (with audio) and a
    # background warm-up (without) send the same prompt, and the Enter one
    # would make its question wait for a warm-up of nothing new.
    prompt_key: PromptKey = (prepared.prompt_text, options.frames_as,
                  sample.audio_parts if prepared.stats.audio_seconds else ())
    lead = await asyncio.to_thread(lead_digest, sample.frames, options.frames_as)
    new = len(sample.seqs) - entry.session.encoded_count(sample.seqs)
    return WarmPlan(sample, at_enter, prepared, prompt_key, lead, new)


def lead_digest(frames: Sequence[np.ndarray], frames_as: str) -> str:
    """What a warm-up must share with a question to be worth it: all frames
    but the newest, as separate images. Only the newest frame (and the audio
    after the frames) is then left for the question to prefill, a frame's
    worth of work; warming again for each new newest frame would cost more
    than it saves. A video is one item: any new frame makes all of it new."""
    from vidchat.engine.prompts import inputs_digest

    return inputs_digest(frames if frames_as == "video" or len(frames) < 2 else frames[:-1], None)


def sample_key(entry: SessionRecord, audio_segments: bool = False) -> SampleKey:
    """Changes whenever the next question's warmed inputs may have: a kept
    frame, new settings, a finished answer (new history or options), and,
    where the engine takes the audio in segments, a finished segment."""
    session = entry.session
    segments = session.audio_segments if audio_segments else None
    return (session.kept_count, segments, session.settings, entry.chat.warm_options, entry.warm_history)


# The one warm-up the engine runs at a time, and the prewarmer's counters.
#
# vidchat.conversation.warmup decides when a session is warmed;
# vidchat.conversation.warmup, with what. This module sends the planned
# warm-up and waits for it, aborts it when its session ends or gives it way
# for an answer (the rules of what gives way to what are here), and records
# what it warmed. Every outcome is counted in :class:`PrewarmStats`, which
# /api/health shows.

SHARE_WINDOW_S = 30.0


@dataclass
class PrewarmStats:
    warmups: int = 0
    skipped_same_inputs: int = 0
    skipped_busy: int = 0
    skipped_budget: int = 0
    aborted: int = 0  # the session ended
    yielded: int = 0  # aborted to make way for an answer (another session's, or other frames of its own)
    awaited: int = 0  # in flight when its own session's question came, with that question's frames
    pinned: int = 0  # samples taken as Enter was pressed (question_now)
    pins_used: int = 0  # ...that their question took (take_pin)
    late_enter_reports: int = 0  # Enter reports that came after their question: ignored
    repeated_enter_reports: int = 0  # Enter reports while that session's pin still waits for its question: ignored
    failed: int = 0
    busy_s: float = 0.0
    # (end, seconds) of the latest warm-ups
    recent: collections.deque[tuple[float, float]] = field(default_factory=lambda: collections.deque(maxlen=512))

    def share(self, now: float) -> float:
        """Share of the last SHARE_WINDOW_S spent running warm-ups."""
        busy = sum(d for end, d in self.recent if end > now - SHARE_WINDOW_S)
        return busy / SHARE_WINDOW_S

    def counts(self) -> dict[str, Any]:
        """The counters as /api/health shows them."""
        return {"warmups": self.warmups, "skipped_same_inputs": self.skipped_same_inputs,
                "skipped_busy": self.skipped_busy, "skipped_budget": self.skipped_budget, "aborted": self.aborted,
                "yielded": self.yielded, "awaited": self.awaited, "pinned": self.pinned, "pins_used": self.pins_used,
                "late_enter_reports": self.late_enter_reports,
                "repeated_enter_reports": self.repeated_enter_reports,
                "failed": self.failed, "busy_s": round(self.busy_s, 3)}


class WarmupInFlight:
    """The one warm-up the engine runs at a time: it is aborted as its
    session ends or to make way for an answer, and its engine time counts
    against the prewarmer's share."""

    def __init__(self, stats: PrewarmStats) -> None:
        self.stats = stats
        self.current: tuple[str, asyncio.Future[ReplyStats], str] | None = None  # (session id, warm-up, its inputs)
        self.yielding: asyncio.Future[ReplyStats] | None = None  # a warm-up cancelled to make way for an answer
        # Answers announced so far (Prewarmer.answer_arriving): a warm-up planned
        # while one arrived is not started in idle mode (it saw no warm-up to stop).
        self.arrivals = 0

    async def give_way(self, task: asyncio.Future[ReplyStats]) -> None:
        """Abort this warm-up for an answer, returning once the abort is done
        (so it reaches vLLM before the answer does)."""
        self.yielding = task
        log.debug("warm-up of session %s… gives way", self.current[0][:6] if self.current else "?")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def give_way_at_enter(self, session_id: str, wanted: bool = False) -> None:
        """Enter was pressed in this session: its own warm-up in flight gives
        way to the sample taken then, unless it is encoding a frame of that
        sample (``wanted``: the question took it as its one new frame).
        Another session's finishes first: it gives way to this question
        itself, when it comes, by :meth:`answer_arriving`'s rule."""
        current = self.current
        if current is not None and current[0] == session_id and self.yielding is not current[1] and not wanted:
            await self.give_way(current[1])

    async def answer_arriving(self, answer: Answer, idle: bool) -> None:
        """A question is about to generate. The warm-up in flight gives way
        (is aborted, and the abort reaches vLLM before the question does)
        unless its prefix is the question's: a warm-up of that session with
        the question's frames (all but the newest, see :func:`lead_digest`)
        is left to finish. A warm-up of other frames of the same session is
        work for nothing; one of another session gives way in ``idle`` mode
        (in always mode it stays, behind the question's priority)."""
        self.arrivals += 1  # before any await: a warm-up being planned sees it (Prewarmer._warm_entry)
        current = self.current
        log.debug("session %s…: a question with frames %s arrives; warm-up in flight: %s", answer.session_id[:6],
                  list(answer.sample.seqs), current[0][:6] if current else None)
        if current is None:
            return
        sid, task, warming = current
        if sid == answer.session_id:
            if warming == await asyncio.to_thread(lead_digest, answer.sample.frames, answer.options.frames_as):
                self.stats.awaited += 1  # the question's own prefix: left to finish
                return
        elif not idle:
            return
        await self.give_way(task)

    async def warm(self, engine: ChatEngine, entry: SessionRecord, plan: WarmPlan, *, busy: bool, warm: WarmState,
                   key: SampleKey, pin: Pin | None) -> tuple[ReplyStats, float] | None:
        """Run the planned warm-up of this session, unless ``busy``, and
        record what it warmed in ``warm`` (taken for sample key ``key``;
        ``pin``: the session's Enter sample, if any). The engine's stats and
        the seconds it took; None when it was put off, aborted, gave way to
        an answer or failed (counted, and warmed again when the engine is idle)."""
        sid = entry.session.id
        self.stats.skipped_busy += int(busy)
        try:
            done = None if busy else await self.run(engine, entry, plan)
        except Exception as exc:
            self.stats.failed += 1
            log.warning("session %s…: warm-up failed: %s", sid[:6], exc)
            warm.key = key
            return None
        if done is None:
            if plan.at_enter and pin is not None:
                pin.warmed = False  # its question may still come: the sample taken at Enter is warmed then
            return None
        stats, took = done
        entry.session.mark_encoded(plan.sample.seqs)
        warm.record(key, plan, stats)
        self.stats.warmups += 1
        _log_warmed(sid, plan.sample, stats, took, pin if plan.at_enter else None, plan.new_frames)
        return done

    async def run(self, engine: ChatEngine, entry: SessionRecord, plan: WarmPlan) -> tuple[ReplyStats, float] | None:
        """Send the planned warm-up of this session and wait for it: the
        engine's stats and the seconds it took, or None when it was aborted
        (its session ended) or gave way to an answer. An engine error is
        raised; cancelling this cancels the warm-up."""
        task = asyncio.ensure_future(engine.warm(plan.prepared))
        ended = False

        async def session_ended() -> None:
            # Called by the registry as the session closes: the warm-up is work for nobody.
            nonlocal ended
            ended = True
            task.cancel()

        entry.closers.append(session_ended)
        self.current = (entry.session.id, task, plan.lead)
        entry.session.encoding(plan.sample.seqs)  # a question now counts them as its one new frame
        started = time.monotonic()
        log.debug("session %s…: warming frames %s (%d new)", entry.session.id[:6], list(plan.sample.seqs),
                  plan.new_frames)
        try:
            stats = await asyncio.shield(task)
        except asyncio.CancelledError:
            if ended:
                self.stats.aborted += 1
                return None
            if self.yielding is task:
                self.stats.yielded += 1
                return None
            task.cancel()  # the prewarmer itself is stopping
            await asyncio.gather(task, return_exceptions=True)
            raise
        finally:
            entry.session.encoding(())
            if session_ended in entry.closers:
                entry.closers.remove(session_ended)
            self.current = None
            took = time.monotonic() - started
            self.stats.busy_s += took
            self.stats.recent.append((time.monotonic(), took))
        return stats, took


def _log_warmed(sid: str, sample: Sample, stats: ReplyStats, took: float, pin: Pin | None, new_frames: int) -> None:
    log.log(logging.INFO if pin is not None else logging.DEBUG,
            "session %s…: warmed %s%d frames (%d new), %d prompt tokens (%d already cached) in %.0f ms, "
            "%.0f ms after Enter", sid[:6], "the sample taken at Enter: " if pin is not None else "",
            len(sample.frames), new_frames, stats.prompt_tokens, stats.cached_tokens, took * 1000,
            (time.monotonic() - pin.at) * 1000 if pin is not None else float("nan"))


__all__ = ["ENCODE_BUDGET_S", "PIN_S", "EnterPins", "FrameCost", "Pin", "Prewarmer", "PrewarmStats"]


MODES = ("off", "idle", "always")

DEFAULT_INTERVAL_S = 1.0

# A keystroke makes the session urgent for this long: long enough to be
# warmed first and at once, short enough that a user typing on a moving scene
# does not keep the engine warming until Enter (a warm-up in flight then
# delays the question by what is left of it).
URGENT_FOR_S = 0.5


class Prewarmer:
    def __init__(self, host: Host, mode: str = "idle", interval_s: float = DEFAULT_INTERVAL_S,
                 max_share: float = 0.5) -> None:
        if mode not in MODES and mode != "auto":
            raise ValueError(f"prewarm mode must be one of auto, {', '.join(MODES)}, got {mode!r}")
        self.host = host
        # --prewarm auto stays off until the engine is up and a frame is timed (apply_choice).
        self.setting = mode
        self.choice: PrewarmChoice = pending() if mode == "auto" else explicit(mode)
        self.mode = self.choice.chosen
        self.interval_s = interval_s
        self.max_share = max_share
        self.stats = PrewarmStats()
        self._warm: dict[str, WarmState] = {}
        self._pins = EnterPins()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._flight = WarmupInFlight(self.stats)
        self.frame_cost = FrameCost()

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> None:
        if self.mode != "off" and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="vidchat-prewarm")
            gate = self.host.answer_gate
            if gate is not None:
                gate.arrival_hooks.append(self.answer_arriving)

    async def set_mode(self, mode: str) -> None:
        """Change the mode while running ('off' stops the loop; a warm-up in
        flight finishes; 'auto': what --prewarm auto chose at start-up)."""
        if mode == "auto" and self.setting == "auto":
            mode = self.choice.chosen
        if mode not in MODES:
            raise ValueError(f"prewarm mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode == "off":
            await self.stop()
            self.mode = mode
            # Nothing encodes ahead now: a question takes the frames its
            # sampling picks, all of them, as before warm-ups ran.
            for entry in self.host.registry.entries():
                entry.session.encode_budget = None
            return
        self.mode = mode
        self.start()

    async def apply_choice(self, choice: PrewarmChoice) -> None:
        """What --prewarm resolved to (vidchat.conversation.warmup): its
        measured frame cost seeds the encoder budget, its mode runs."""
        self.choice = choice
        if choice.frame_encode_ms is not None and choice.chosen != "off":
            self.frame_cost.per_frame_s = choice.frame_encode_ms / 1000
        await self.set_mode(choice.chosen)

    async def stop(self) -> None:
        gate = self.host.answer_gate
        if gate is not None and self.answer_arriving in gate.arrival_hooks:
            gate.arrival_hooks.remove(self.answer_arriving)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # -- signals ---------------------------------------------------------------
    def question_coming(self, session_id: str) -> None:
        """The user is typing (or starting to speak): warm this session first and sooner."""
        state = self._warm.setdefault(session_id, WarmState())
        state.urgent_until = time.monotonic() + URGENT_FOR_S
        self._wake.set()

    async def question_now(self, session_id: str) -> None:
        """Enter was pressed in the page: take the question's sample now
        (what was on screen and heard at Enter) and warm exactly it, before
        any background warm-up; this session's warm-up in flight gives way
        (never another's). The question reaches the server a browser-and-Gradio
        round trip later, takes this sample (:meth:`take_pin`) and finds its
        whole prompt but the question prefilled. One pin per question on its
        way (EnterPins.begin): a page posting Enter in a loop gets one warm-up
        per PIN_S. Not in ``off`` mode: there, a question samples on arrival."""
        entry = self.host.registry.get(session_id)
        if self.mode == "off" or entry is None or entry.session.frame_count == 0:
            return
        if await _pin_enter_sample(entry, self._pins, self.stats):
            pin = self._pins.get(session_id)
            # Where frames are slow, a frame the warm-up is encoding is the
            # question's one new frame: stopping it would only start it again.
            wanted = self.frame_cost.slow and pin is not None and entry.session.being_encoded(pin.sample.seqs)
            log.debug("session %s…: Enter; its sample %s (%d new), the warm-up in flight %s", session_id[:6],
                      list(pin.sample.seqs) if pin else None, pin.sample.new_frames if pin else -1,
                      "stays" if wanted else "gives way if it is this session's")
            await self._flight.give_way_at_enter(session_id, wanted)
            self._wake.set()

    def take_pin(self, entry: SessionRecord) -> Pin | None:
        """The sample taken at Enter for this question (None when there is
        none, it is older than PIN_S, or the question came with other
        sampling settings): used once."""
        pin = self._pins.take(entry)
        if pin is not None:
            self.stats.pins_used += 1
        return pin

    async def answer_arriving(self, answer: Answer) -> None:
        """A question is about to generate: the warm-up in flight gives way
        unless it warms the question's own prefix (WarmupInFlight.answer_arriving)."""
        await self._flight.answer_arriving(answer, idle=self.mode == "idle")

    def poke(self) -> None:
        self._wake.set()

    def state_of(self, session_id: str) -> WarmState | None:
        return self._warm.get(session_id)

    def snapshot(self) -> dict[str, Any]:
        """What /api/health shows of warm-ups."""
        cost = self.frame_cost.per_frame_s
        return {"mode": self.mode, "setting": self.setting, "chosen": self.choice.chosen,
                "reason": self.choice.reason, "frame_encode_ms": self.choice.frame_encode_ms,
                "threshold_ms": self.choice.threshold_ms, **self.stats.counts(),
                "frame_cost_ms": None if cost is None else round(cost * 1000, 1),
                "share": round(self.stats.share(time.monotonic()), 3),
                "running": self._flight.current is not None}

    # -- the loop --------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), 0.25)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("warm-up step failed")
                await asyncio.sleep(1.0)

    def _engine_busy(self, engine: ChatEngine) -> bool:
        """In idle mode: a person's answer has the engine (vidchat.conversation.host.answering)."""
        return self.mode == "idle" and answering(self.host, engine)

    async def _step(self) -> None:
        engine = self.host.engine_now("main")  # each step: a restarted engine is another one
        if engine is None:
            return
        now = time.monotonic()
        if self.frame_cost.slow:
            # Every session keeps to one new frame a question, also one no
            # warm-up has reached yet (the engine's share spent on others).
            for live in self.host.registry.entries():
                self.frame_cost.apply(live.session)
        candidates = warm_candidates(self.host, self._warm, self._pins, now, self.interval_s, self.frame_cost.slow)
        if not candidates:
            return
        if self._engine_busy(engine):
            self.stats.skipped_busy += 1
            return
        _, _, entry, key = candidates[0]
        if self.stats.share(now) >= self.max_share and not beyond_share(self.frame_cost, entry.session,
                                                                        self._warm.get(entry.session.id)):
            self.stats.skipped_budget += 1
            return
        await self._warm_entry(engine, entry, key, self._flight.arrivals)
        if len(candidates) > 1:
            self._wake.set()

    def _budget(self, session: Session, took_s: float, new_frames: int) -> None:
        self.frame_cost.learn(took_s, new_frames)
        self.frame_cost.apply(session)

    async def _warm_entry(self, engine: ChatEngine, entry: SessionRecord, key: SampleKey, arrivals: int) -> None:
        """Plan and run one warm-up of this session; ``arrivals``: the count
        of answers announced when the engine was found idle."""
        sid = entry.session.id
        warm = self._warm.setdefault(sid, WarmState())
        warm.at = time.monotonic()
        pin = self._pins.get(sid)
        self.frame_cost.apply(entry.session)
        plan = await plan_warmup(engine, entry, entry.chat.warm_options or self.host.answer_defaults(), pin,
                                 frames_ahead(self.frame_cost))
        if plan is None:
            warm.key = key
            return
        if plan.repeats(warm, self.frame_cost.slow):
            warm.key = key
            self.stats.skipped_same_inputs += 1
            return
        if self.host.registry.get(sid) is not entry:
            return  # the session ended while its prompt was prepared
        # A question that came while the prompt was prepared found no warm-up
        # to stop: none starts beside it. No await from here to _flight.run,
        # which makes the warm-up current: a later question makes it give way.
        busy = self.mode == "idle" and (self._flight.arrivals != arrivals or self._engine_busy(engine))
        done = await self._flight.warm(engine, entry, plan, busy=busy, warm=warm, key=key, pin=pin)
        if done is not None:
            self._budget(entry.session, done[1], plan.new_frames)


async def _pin_enter_sample(entry: SessionRecord, pins: EnterPins, stats: PrewarmStats) -> bool:
    """Take the session's sample as Enter was pressed and pin it for its
    question; False when the report is late, repeated, or overtaken."""
    now = time.monotonic()
    if now - entry.typed_question_at < PIN_S:
        # A report normally comes a round trip before its question. One
        # after it is that question's, late: pinned now, it would hand
        # the next question a sample from before it was asked.
        stats.late_enter_reports += 1
        return False
    if not pins.begin(entry, now):
        stats.repeated_enter_reports += 1
        return False
    session_id = entry.session.id
    try:
        session, asked = entry.session, entry.turn
        sample = await asyncio.to_thread(session.sample)
    finally:
        pins.end(session_id)
    if entry.turn != asked:
        return False  # its question overtook it: nothing left to warm for
    pins.put(session_id, Pin(time.monotonic(), sample, session.settings, asked))
    stats.pinned += 1
    return True
