"""``--prewarm auto``: warm-ups where a frame is slow to encode, none where it is cheap.

Whether warm-ups pay depends on the model and the machine, not on a rule of
thumb. On the tiny test model a frame costs the vision encoder a few
milliseconds: a question pays almost nothing for its frames, and warm-ups
only take cores the browser needs (docs/performance.md, 'Warm-ups'). On the CPU default
(SmolVLM2-256M at true size) a frame costs about half a second: a question
after a moving scene pays a second or more after Enter unless its frames
were encoded as they arrived. So at start-up the server times one encode of
a frame at the size sessions store them and chooses:

* ``idle`` (encode ahead) where that frame took more than
  :data:`AUTO_THRESHOLD_MS`: each session's newest kept frame is encoded as
  it arrives, one frame at a time. A question brings at most one frame new
  to the engine: the newest, or the one a warm-up is encoding as it comes
  (vidchat.media.sampling.within_encode_budget), so it never waits for more
  than one frame's encode, however fast frames are kept. (An earlier rule
  turned warm-ups off above 500 ms a frame: a warm-up's batch of frames,
  which vLLM cannot preempt, then held up the question behind it.)
* ``off`` where it took less: the frames cost the question little.

The measurement is the difference between two one-token requests that differ
only by the frame (after one untimed request, so neither pays the engine's
first-call costs): what the vision encoder and the frame's prompt tokens
cost, not the request's fixed cost. It costs three tiny requests on the
tiny model (well under a second) and about a second on the CPU default.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

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
        if not self.slow:
            # A GPU or the tiny model (tens of ms a frame): a question's new
            # frames cost less than the page's own round trip; every one goes.
            return None
        budget = max(1, int(ENCODE_BUDGET_S / self.per_frame_s))
        return budget if budget < frames else None

    def apply(self, session: Any) -> None:
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


async def _one_token_s(engine: Any, frames: list[np.ndarray], salt: str) -> float:
    """Seconds a one-token request takes with these frames (never a cache hit: a salt of its own)."""
    prepared = await asyncio.to_thread(engine.prepare, "Describe.", frames, None, max_tokens=1, temperature=0.0,
                                       cache_salt=salt, frame_ids=[str(i) for i in range(len(frames))] or None)
    started = time.perf_counter()
    await engine.warm(prepared)
    return time.perf_counter() - started


async def measure_frame_ms(engine: Any, seed: int = 0) -> float:
    """One frame's encoding cost in ms: a one-token request with one
    stored-size frame minus the same request without it."""
    frame = np.random.default_rng(seed).integers(0, 255, (*PROBE_FRAME_HW, 3), dtype=np.uint8)
    run = f"vidchat-probe-{uuid.uuid4().hex[:8]}"
    await _one_token_s(engine, [], f"{run}-prime")  # first-call costs land here, untimed
    text_s = await _one_token_s(engine, [], f"{run}-text")
    frame_s = await _one_token_s(engine, [frame], f"{run}-frame")
    return max(0.0, (frame_s - text_s) * 1000)


async def decide(engine: Any, setting: str) -> PrewarmChoice:
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


async def settle(state: Any, engine: Any = None, measure: bool = True) -> PrewarmChoice | None:
    """Resolve the server's --prewarm once its engine is up, apply it to the
    prewarmer and say so in the log (None: no prewarmer to set).
    ``measure`` false (an engine handed to the server by a test or a
    benchmark, which counts its requests): auto stays off, unmeasured.
    ``engine``: the one just started, before the server says it is ready
    (default: the server's)."""
    prewarmer = getattr(state, "prewarmer", None)
    if prewarmer is None:
        return None
    if prewarmer.setting == "auto" and not measure:
        choice = PrewarmChoice("auto", "off", "auto: the engine was handed to the server; not measured, off")
    else:
        choice = await decide(engine or state.engine, prewarmer.setting)
    await prewarmer.apply_choice(choice)
    log.info("warm-ups: %s (%s)", choice.chosen, choice.reason)
    return choice
