"""Deciding warm-ups: which session to warm next, and with what.

vidchat.conversation.prewarm runs one warm-up at a time; this module is the
part that needs no engine time: the sessions worth a warm-up now, the sample
and prompt a warm-up of one would send, and whether that is worth sending
(never the same inputs twice).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from vidchat.conversation.enter_pins import EnterPins, Pin
from vidchat.conversation.prewarm_auto import FrameCost

__all__ = ["WarmPlan", "WarmState", "beyond_share", "frames_ahead", "lead_digest", "plan_warmup", "sample_key",
           "starting", "warm_candidates", "warm_sample"]
log = logging.getLogger(__name__)

URGENT_INTERVAL_S = 0.2
# After an answer ends, its session is not warmed for this long: the answer's
# last tokens reach the page first (on a machine whose cores the browser
# shares, a warm-up then would hold them back), and the next question is
# seconds away.
SETTLE_S = 0.5


@dataclass
class WarmState:
    """What was last warmed for one session."""

    key: tuple | None = None  # the sample key it was warmed for
    inputs_sha256: str = ""  # lead_digest of the frames it warmed
    prompt_key: tuple | None = None
    at: float = 0.0  # time.monotonic() of the last warm-up start
    urgent_until: float = 0.0
    warmed: int = 0
    last_cached_tokens: int = 0
    last_prompt_tokens: int = 0

    def record(self, key: tuple, plan: WarmPlan, stats: Any) -> None:
        """A warm-up of ``plan``, taken for sample key ``key``, finished with the engine's ``stats``."""
        self.key, self.inputs_sha256, self.prompt_key = key, plan.lead, plan.prompt_key
        self.warmed += 1
        self.last_cached_tokens, self.last_prompt_tokens = stats.cached_tokens, stats.prompt_tokens


@dataclass
class WarmPlan:
    """One warm-up of one session, prepared and not yet sent."""

    sample: Any
    at_enter: bool  # the sample is the one taken as Enter was pressed
    prepared: Any  # the engine's prompt for it
    prompt_key: tuple  # what besides the frames a question must share with it
    lead: str  # lead_digest of its frames
    new_frames: int  # its frames not yet in the engine's caches

    def repeats(self, warm: WarmState, slow_frames: bool) -> bool:
        """Whether it would warm nothing that ``warm`` has not. One new frame
        is not worth a warm-up where encoding is cheap (the question encodes
        it in no time); where it is slow, it is the point."""
        return (self.lead == warm.inputs_sha256 and self.prompt_key == warm.prompt_key
                and not (slow_frames and self.new_frames))


def warm_candidates(state: Any, warm_states: dict[str, WarmState], pins: EnterPins,
                    now: float, interval_s: float, slow_frames: bool = False) -> list[tuple[bool, float, Any, tuple]]:
    """The sessions worth a warm-up now, most urgent first, as (not urgent,
    last warmed, entry, sample key): a pinned Enter before anything (the
    longest unwarmed of those first, so no session's Enters crowd out
    another's), then sessions whose user is typing, then the longest
    unwarmed. Where frames are slow to encode (``slow_frames``), a session
    whose buffer holds fewer encoded frames than a question takes (a camera
    just started) is warmed again as soon as the last one-frame warm-up
    ends, so its first question finds its frames encoded. Forgets the warm
    states and pins of sessions that ended."""
    live = {}
    out = []
    pinned = []
    segments = getattr(state.engine, "splits_audio", False)
    for entry in state.registry.entries():
        sid = entry.session.id
        live[sid] = entry
        if entry.away:
            continue  # its tab went away: no question comes until it is back
        if pins.unwarmed(entry, now):
            warm = warm_states.get(sid)
            pinned.append((warm.at if warm else 0.0, entry, sample_key(entry, segments)))  # Enter: first of all
            continue
        if entry.answer is not None or entry.session.frame_count == 0:
            continue  # its own answer is filling the cache; nothing to warm yet
        if now - entry.answer_ended < SETTLE_S:
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


def starting(session: Any) -> bool:
    """The session's buffer holds fewer encoded frames than a question takes (its camera just started)."""
    return session.encoded_in_buffer() < min(session.settings.num_sample_frames, session.frame_count)


def beyond_share(frame_cost: FrameCost, session: Any, warm: WarmState | None) -> bool:
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


def warm_sample(engine: Any, entry: Any, pin: Pin | None, new_frames: int | None = -1) -> tuple[Any, bool]:
    """What a warm-up of this session sends, and whether it is the sample
    taken at Enter. ``new_frames``: at most this many frames new to the
    engine (-1: the session's encode budget, as its question)."""
    if pin is not None and not pin.warmed:
        pin.warmed = True
        return pin.sample, True  # all of it: the question will carry exactly this
    sample = entry.session.sample(new_frames=new_frames)
    if getattr(engine, "splits_audio", False):
        # The audio's finished segments, not the newest one if it is still
        # growing: the question's will be longer (vidchat.media.audio).
        return sample.without_audio_tail(), False
    # As one clip the audio grows with every chunk, so it is never a
    # question's prefix: warming it would double the work for nothing.
    return sample.without_audio(), False


async def plan_warmup(engine: Any, entry: Any, options: Any, pin: Pin | None,
                      new_frames: int | None) -> WarmPlan | None:
    """The warm-up of this session the engine would get now, prepared as
    ``options`` would prepare its next question (``new_frames`` as
    :func:`warm_sample`); None when there is nothing to warm: no frames yet,
    or settings this engine refuses (the question will say so)."""
    from vidchat.conversation import answer_path

    sample, at_enter = warm_sample(engine, entry, pin, new_frames)
    if not sample.frames:
        return None
    try:
        prepared = await asyncio.to_thread(answer_path.prepare, engine, entry, sample, options, entry.warm_history, "", True)
    except Exception as exc:
        log.debug("session %s…: no warm-up: %s", entry.session.id[:6], exc)
        return None
    # The audio's parts count only where the prompt carries audio, as the
    # engine's prepare decided (a model that hears nothing, a sliver too short
    # for the encoder): otherwise the sample taken at Enter (with audio) and a
    # background warm-up (without) send the same prompt, and the Enter one
    # would make its question wait for a warm-up of nothing new.
    prompt_key = (prepared.prompt_text, options.frames_as,
                  sample.audio_parts if prepared.stats.audio_seconds else ())
    lead = await asyncio.to_thread(lead_digest, sample.frames, options.frames_as)
    new = len(sample.seqs) - entry.session.encoded_count(sample.seqs)
    return WarmPlan(sample, at_enter, prepared, prompt_key, lead, new)


def lead_digest(frames: Any, frames_as: str) -> str:
    """What a warm-up must share with a question to be worth it: all frames
    but the newest, as separate images. Only the newest frame (and the audio
    after the frames) is then left for the question to prefill, a frame's
    worth of work; warming again for each new newest frame would cost more
    than it saves. A video is one item: any new frame makes all of it new."""
    from vidchat.engine import inputs_digest

    return inputs_digest(frames if frames_as == "video" or len(frames) < 2 else frames[:-1], None)


def sample_key(entry: Any, audio_segments: bool = False) -> tuple:
    """Changes whenever the next question's warmed inputs may have: a kept
    frame, new settings, a finished answer (new history or options), and,
    where the engine takes the audio in segments, a finished segment."""
    session = entry.session
    segments = session.audio_segments if audio_segments else None
    return (session.kept_count, segments, session.settings, entry.warm_options, entry.warm_history)
