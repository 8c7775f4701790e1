"""The one warm-up the engine runs at a time, and the prewarmer's counters.

vidchat.conversation.prewarm decides when a session is warmed;
vidchat.conversation.warm_plan, with what. This module sends the planned
warm-up and waits for it, aborts it when its session ends or gives it way
for an answer (the rules of what gives way to what are here), and records
what it warmed. Every outcome is counted in :class:`PrewarmStats`, which
/api/health shows.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from vidchat.conversation.enter_pins import Pin
from vidchat.conversation.warm_plan import WarmPlan, WarmState, lead_digest

log = logging.getLogger(__name__)

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

    async def answer_arriving(self, answer: Any, idle: bool) -> None:
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

    async def warm(self, engine: Any, entry: Any, plan: WarmPlan, *, busy: bool, warm: WarmState, key: tuple,
                   pin: Pin | None) -> tuple[Any, float] | None:
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
            if plan.at_enter:
                pin.warmed = False  # its question may still come: the sample taken at Enter is warmed then
            return None
        stats, took = done
        entry.session.mark_encoded(plan.sample.seqs)
        warm.record(key, plan, stats)
        self.stats.warmups += 1
        _log_warmed(sid, plan.sample, stats, took, pin if plan.at_enter else None, plan.new_frames)
        return done

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


def _log_warmed(sid: str, sample: Any, stats: Any, took: float, pin: Pin | None, new_frames: int) -> None:
    log.log(logging.INFO if pin is not None else logging.DEBUG,
            "session %s…: warmed %s%d frames (%d new), %d prompt tokens (%d already cached) in %.0f ms, "
            "%.0f ms after Enter", sid[:6], "the sample taken at Enter: " if pin is not None else "",
            len(sample.frames), new_frames, stats.prompt_tokens, stats.cached_tokens, took * 1000,
            (time.monotonic() - pin.at) * 1000 if pin is not None else float("nan"))
