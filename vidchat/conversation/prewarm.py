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
  warm-ups on only there (vidchat.conversation.prewarm_auto).

Which session is warmed next and with what is decided in
vidchat.conversation.warm_plan; the warm-up in flight, and what gives way to
what, is vidchat.conversation.warm_flight; this module schedules the warm-ups
and takes the sessions' signals.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from vidchat.conversation.enter_pins import PIN_S, EnterPins, Pin
from vidchat.conversation.prewarm_auto import ENCODE_BUDGET_S, FrameCost, PrewarmChoice, explicit, pending
from vidchat.conversation.warm_flight import PrewarmStats, WarmupInFlight
from vidchat.conversation.warm_plan import WarmState, beyond_share, frames_ahead, plan_warmup, warm_candidates

__all__ = ["ENCODE_BUDGET_S", "PIN_S", "EnterPins", "FrameCost", "Pin", "Prewarmer", "PrewarmStats"]
log = logging.getLogger(__name__)

MODES = ("off", "idle", "always")
DEFAULT_INTERVAL_S = 1.0
# A keystroke makes the session urgent for this long: long enough to be
# warmed first and at once, short enough that a user typing on a moving scene
# does not keep the engine warming until Enter (a warm-up in flight then
# delays the question by what is left of it).
URGENT_FOR_S = 0.5


class Prewarmer:
    def __init__(self, state: Any, mode: str = "idle", interval_s: float = DEFAULT_INTERVAL_S,
                 max_share: float = 0.5) -> None:
        if mode not in MODES and mode != "auto":
            raise ValueError(f"prewarm mode must be one of auto, {', '.join(MODES)}, got {mode!r}")
        self.state = state
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
        self._task: asyncio.Task | None = None
        self._flight = WarmupInFlight(self.stats)
        self.frame_cost = FrameCost()

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> None:
        if self.mode != "off" and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="vidchat-prewarm")
            self.state.answer_gate.arrival_hooks.append(self.answer_arriving)

    async def set_mode(self, mode: Any) -> None:
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
            for entry in self.state.registry.entries():
                entry.session.encode_budget = None
            return
        self.mode = mode
        self.start()

    async def apply_choice(self, choice: PrewarmChoice) -> None:
        """What --prewarm resolved to (vidchat.conversation.prewarm_auto): its
        measured frame cost seeds the encoder budget, its mode runs."""
        self.choice = choice
        if choice.frame_encode_ms is not None and choice.chosen != "off":
            self.frame_cost.per_frame_s = choice.frame_encode_ms / 1000
        await self.set_mode(choice.chosen)

    async def stop(self) -> None:
        if self.answer_arriving in self.state.answer_gate.arrival_hooks:
            self.state.answer_gate.arrival_hooks.remove(self.answer_arriving)
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
        entry = self.state.registry.get(session_id)
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

    def take_pin(self, entry: Any) -> Pin | None:
        """The sample taken at Enter for this question (None when there is
        none, it is older than PIN_S, or the question came with other
        sampling settings): used once."""
        pin = self._pins.take(entry)
        if pin is not None:
            self.stats.pins_used += 1
        return pin

    async def answer_arriving(self, answer: Any) -> None:
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

    def _engine_busy(self, engine: Any) -> bool:
        """In idle mode: an answer is generating, waiting for its turn, or being prepared."""
        if self.mode != "idle":
            return False
        return (engine.running_requests > 0 or self.state.answer_gate.snapshot().get("waiting", 0) > 0
                or any(e.answer is not None for e in self.state.registry.entries()))

    async def _step(self) -> None:
        engine = self.state.engine
        if engine is None or engine.is_dead:
            return
        now = time.monotonic()
        if self.frame_cost.slow:
            # Every session keeps to one new frame a question, also one no
            # warm-up has reached yet (the engine's share spent on others).
            for entry in self.state.registry.entries():
                self.frame_cost.apply(entry.session)
        candidates = warm_candidates(self.state, self._warm, self._pins, now, self.interval_s, self.frame_cost.slow)
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

    def _budget(self, session: Any, took_s: float, new_frames: int) -> None:
        self.frame_cost.learn(took_s, new_frames)
        self.frame_cost.apply(session)

    async def _warm_entry(self, engine: Any, entry: Any, key: tuple, arrivals: int) -> None:
        """Plan and run one warm-up of this session; ``arrivals``: the count
        of answers announced when the engine was found idle."""
        sid = entry.session.id
        warm = self._warm.setdefault(sid, WarmState())
        warm.at = time.monotonic()
        pin = self._pins.get(sid)
        self.frame_cost.apply(entry.session)
        plan = await plan_warmup(engine, entry, entry.warm_options or self.state.answer_defaults(), pin,
                                 frames_ahead(self.frame_cost))
        if plan is None:
            warm.key = key
            return
        if plan.repeats(warm, self.frame_cost.slow):
            warm.key = key
            self.stats.skipped_same_inputs += 1
            return
        if self.state.registry.get(sid) is not entry:
            return  # the session ended while its prompt was prepared
        # A question that came while the prompt was prepared found no warm-up
        # to stop: none starts beside it. No await from here to _flight.run,
        # which makes the warm-up current: a later question makes it give way.
        busy = self.mode == "idle" and (self._flight.arrivals != arrivals or self._engine_busy(engine))
        done = await self._flight.warm(engine, entry, plan, busy=busy, warm=warm, key=key, pin=pin)
        if done is not None:
            self._budget(entry.session, done[1], plan.new_frames)


async def _pin_enter_sample(entry: Any, pins: EnterPins, stats: PrewarmStats) -> bool:
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
