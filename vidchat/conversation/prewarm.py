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
* Where a frame is slow to encode (the CPU default: ~0.5 s), each kept frame
  is encoded as it arrives, a question carries only frames already encoded
  (``ENCODE_BUDGET_S``), and while the user types only those are prefilled.
  ``--prewarm auto`` turns warm-ups on only there (vidchat.conversation.prewarm_auto).

Which session is warmed next and with what is decided in
vidchat.conversation.warm_plan; this module schedules and runs the warm-ups.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from vidchat.conversation.enter_pins import PIN_S, EnterPins, Pin
from vidchat.conversation.prewarm_auto import ENCODE_BUDGET_S, FrameCost, PrewarmChoice, explicit, pending
from vidchat.conversation.warm_plan import (WarmPlan, WarmState, frames_ahead, lead_digest, plan_warmup,
                                            warm_candidates)

__all__ = ["ENCODE_BUDGET_S", "PIN_S", "EnterPins", "FrameCost", "Pin", "Prewarmer", "PrewarmStats"]
log = logging.getLogger(__name__)

MODES = ("off", "idle", "always")
DEFAULT_INTERVAL_S = 1.0
# A keystroke makes the session urgent for this long: long enough to be
# warmed first and at once, short enough that a user typing on a moving scene
# does not keep the engine warming until Enter (a warm-up in flight then
# delays the question by what is left of it).
URGENT_FOR_S = 0.5
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
    recent: collections.deque = field(default_factory=lambda: collections.deque(maxlen=512))  # (end, seconds)

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
        self.current: tuple[str, asyncio.Task, str] | None = None  # (session id, warm-up, its inputs)
        self.yielding: asyncio.Task | None = None  # a warm-up cancelled to make way for an answer
        # Answers announced so far (Prewarmer.answer_arriving): a warm-up planned
        # while one arrived is not started in idle mode (it saw no warm-up to stop).
        self.arrivals = 0

    async def give_way(self, task: asyncio.Task) -> None:
        """Abort this warm-up for an answer, returning once the abort is done
        (so it reaches vLLM before the answer does)."""
        self.yielding = task
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def run(self, engine: Any, entry: Any, plan: WarmPlan) -> tuple[Any, float] | None:
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
        started = time.monotonic()
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
            if session_ended in entry.closers:
                entry.closers.remove(session_ended)
            self.current = None
            took = time.monotonic() - started
            self.stats.busy_s += took
            self.stats.recent.append((time.monotonic(), took))
        return stats, took


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
        now = time.monotonic()
        if now - entry.typed_question_at < PIN_S:
            # A report normally comes a round trip before its question. One
            # after it is that question's, late: pinned now, it would hand
            # the next question a sample from before it was asked.
            self.stats.late_enter_reports += 1
            return
        if not self._pins.begin(entry, now):
            self.stats.repeated_enter_reports += 1
            return
        try:
            session, asked = entry.session, entry.turn
            sample = await asyncio.to_thread(session.sample)
        finally:
            self._pins.end(session_id)
        if entry.turn != asked:
            return  # its question overtook it: nothing left to warm for
        self._pins.put(session_id, Pin(time.monotonic(), sample, session.settings, asked))
        self.stats.pinned += 1
        current = self._flight.current
        # Another session's warm-up finishes first: it gives way to this
        # question itself, when it comes, by answer_arriving's rule.
        if current is not None and current[0] == session_id and self._flight.yielding is not current[1]:
            await self._flight.give_way(current[1])
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
        """A question is about to generate. The warm-up in flight gives way
        (is aborted, and the abort reaches vLLM before the question does)
        unless its prefix is the question's: a warm-up of that session with
        the question's frames (all but the newest, see :func:`lead_digest`)
        is left to finish. A warm-up of other frames of the same session is
        work for nothing; one of another session gives way in idle mode (in
        always mode it stays, behind the question's priority)."""
        self._flight.arrivals += 1  # before any await: a warm-up being planned sees it (_warm_entry)
        current = self._flight.current
        if current is None:
            return
        sid, task, warming = current
        if sid == answer.session_id:
            if warming == await asyncio.to_thread(lead_digest, answer.sample.frames, answer.options.frames_as):
                self.stats.awaited += 1  # the question's own prefix: left to finish
                return
        elif self.mode != "idle":
            return
        await self._flight.give_way(task)

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

    def _candidates(self, now: float) -> list[tuple[bool, float, Any, tuple]]:
        return warm_candidates(self.state, self._warm, self._pins, now, self.interval_s)

    async def _step(self) -> None:
        engine = self.state.engine
        if engine is None or engine.is_dead:
            return
        now = time.monotonic()
        candidates = self._candidates(now)
        if not candidates:
            return
        if self._engine_busy(engine):
            self.stats.skipped_busy += 1
            return
        if self.stats.share(now) >= self.max_share:
            self.stats.skipped_budget += 1
            return
        _, _, entry, key = candidates[0]
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
                                 frames_ahead(self.frame_cost, warm, time.monotonic()))
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
        self.stats.skipped_busy += int(busy)
        try:
            done = None if busy else await self._flight.run(engine, entry, plan)
        except Exception as exc:
            self.stats.failed += 1
            log.warning("session %s…: warm-up failed: %s", sid[:6], exc)
            warm.key = key
            return
        if done is None:  # put off, aborted, or gave way to an answer: warmed again when the engine is idle
            if plan.at_enter:
                pin.warmed = False  # its question may still come: the sample taken at Enter is warmed then
            return
        stats, took = done
        entry.session.mark_encoded(plan.sample.seqs)
        self._budget(entry.session, took, plan.new_frames)
        warm.record(key, plan, stats)
        self.stats.warmups += 1
        _log_warmed(sid, plan.sample, stats, took, pin if plan.at_enter else None, plan.new_frames)


def _log_warmed(sid: str, sample: Any, stats: Any, took: float, pin: Pin | None, new_frames: int) -> None:
    log.log(logging.INFO if pin is not None else logging.DEBUG,
            "session %s…: warmed %s%d frames (%d new), %d prompt tokens (%d already cached) in %.0f ms, "
            "%.0f ms after Enter", sid[:6], "the sample taken at Enter: " if pin is not None else "",
            len(sample.frames), new_frames, stats.prompt_tokens, stats.cached_tokens, took * 1000,
            (time.monotonic() - pin.at) * 1000 if pin is not None else float("nan"))
