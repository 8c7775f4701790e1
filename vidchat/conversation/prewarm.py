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

__all__ = ["ENCODE_BUDGET_S", "PIN_S", "EnterPins", "FrameCost", "Pin", "Prewarmer", "PrewarmStats"]
log = logging.getLogger(__name__)

MODES = ("off", "idle", "always")
DEFAULT_INTERVAL_S = 1.0
URGENT_INTERVAL_S = 0.2
# A keystroke makes the session urgent for this long: long enough to be
# warmed first and at once, short enough that a user typing on a moving scene
# does not keep the engine warming until Enter (a warm-up in flight then
# delays the question by what is left of it).
URGENT_FOR_S = 0.5
SHARE_WINDOW_S = 30.0
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
                "failed": self.failed, "busy_s": round(self.busy_s, 3)}


def warm_candidates(state: Any, warm_states: dict[str, WarmState], pins: "EnterPins",
                    now: float, interval_s: float) -> list[tuple[bool, float, Any, tuple]]:
    """The sessions worth a warm-up now, most urgent first, as (not urgent,
    last warmed, entry, sample key): a pinned Enter before anything, then
    sessions whose user is typing, then the longest unwarmed. Forgets the
    warm states and pins of sessions that ended."""
    live = {}
    out = []
    segments = getattr(state.engine, "splits_audio", False)
    for entry in state.registry.entries():
        sid = entry.session.id
        live[sid] = entry
        if pins.unwarmed(entry, now):
            out.append((False, -1.0, entry, sample_key(entry, segments)))  # Enter was pressed: first of all
            continue
        if entry.answer is not None or entry.session.frame_count == 0:
            continue  # its own answer is filling the cache; nothing to warm yet
        if now - entry.answer_ended < SETTLE_S:
            continue
        key = sample_key(entry, segments)
        warm = warm_states.get(sid)
        if warm is not None and warm.key == key:
            continue
        urgent = warm is not None and warm.urgent_until > now
        interval = URGENT_INTERVAL_S if urgent else interval_s
        if warm is not None and now - warm.at < interval:
            continue
        out.append((not urgent, warm.at if warm else 0.0, entry, key))
    for sid in [s for s in warm_states if s not in live]:
        del warm_states[sid]  # the session ended
    pins.prune(live, now)
    out.sort(key=lambda c: (c[0], c[1]))
    return out


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
        self.current: tuple[str, asyncio.Task, str] | None = None  # (session id, warm-up, its inputs) in flight
        self._yielding: asyncio.Task | None = None  # a warm-up cancelled to make way for an answer
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
        (what was on screen and heard at Enter) and warm exactly it, ahead of
        any other warm-up, which gives way. The question reaches the server
        a browser-and-Gradio round trip later, takes this sample
        (:meth:`take_pin`) and finds its whole prompt but the question
        prefilled. Not in ``off`` mode: there, a question samples on arrival."""
        entry = self.state.registry.get(session_id)
        if self.mode == "off" or entry is None or entry.session.frame_count == 0:
            return
        if time.monotonic() - entry.typed_question_at < PIN_S:
            # A report normally comes a round trip before its question. One
            # after it is that question's, late: pinned now, it would hand
            # the next question a sample from before it was asked.
            self.stats.late_enter_reports += 1
            return
        session, asked = entry.session, entry.question_seq
        sample = await asyncio.to_thread(session.sample)
        if entry.question_seq != asked:
            return  # its question overtook it: nothing left to warm for
        self._pins.put(session_id, Pin(time.monotonic(), sample, session.settings, asked))
        self.stats.pinned += 1
        current = self.current
        if current is not None and self._yielding is not current[1]:
            self._yielding = current[1]
            current[1].cancel()
            await asyncio.gather(current[1], return_exceptions=True)
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
        current = self.current
        if current is None:
            return
        sid, task, warming = current
        if sid == answer.session_id:
            if warming == await asyncio.to_thread(lead_digest, answer.sample.frames, answer.options.frames_as):
                self.stats.awaited += 1  # the question's own prefix: left to finish
                return
        elif self.mode != "idle":
            return
        self._yielding = task
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

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
                "running": self.current is not None}

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
        await self._warm_entry(engine, entry, key)
        if len(candidates) > 1:
            self._wake.set()

    def _budget(self, session: Any, took_s: float, new_frames: int) -> None:
        self.frame_cost.learn(took_s, new_frames)
        self.frame_cost.apply(session)

    def _ahead(self, warm: WarmState) -> int | None:
        """New frames a background warm-up of this session may encode (-1: as
        many as its question may carry). Where frames are slow to encode, at
        least the newest: each kept frame is encoded as it arrives, so the
        question finds its frames encoded. But not while the user types: a
        question is coming, and a frame's encoding in flight would hold it
        up; the warm-up then prefills the frames already encoded."""
        if not self.frame_cost.slow or warm.urgent_until > time.monotonic():
            return -1
        budget = self.frame_cost.budget(0x7FFFFFFF)
        return max(1, budget or 0)

    async def _warm_entry(self, engine: Any, entry: Any, key: tuple) -> None:
        from vidchat.conversation import chat

        sid = entry.session.id
        warm = self._warm.setdefault(sid, WarmState())
        warm.at = time.monotonic()
        options = entry.warm_options or self.state.answer_defaults()
        pin = self._pins.get(sid)
        self.frame_cost.apply(entry.session)
        sample, at_enter = warm_sample(engine, entry, pin, self._ahead(warm))
        if not sample.frames:
            warm.key = key
            return
        try:
            prepared = await asyncio.to_thread(chat.prepare, engine, entry, sample, options, entry.warm_history,
                                               "", True)
        except Exception as exc:  # settings this engine refuses: the question will say so
            log.debug("session %s…: no warm-up: %s", sid[:6], exc)
            warm.key = key
            return
        prompt_key = (prepared.prompt_text, options.frames_as, sample.audio_parts if options.include_audio else ())
        lead = await asyncio.to_thread(lead_digest, sample.frames, options.frames_as)
        new_frames = len(sample.seqs) - entry.session.encoded_count(sample.seqs)
        # One new frame is not worth a warm-up where encoding is cheap (the
        # question encodes it in no time); where it is slow, it is the point.
        if lead == warm.inputs_sha256 and prompt_key == warm.prompt_key and not (self.frame_cost.slow and new_frames):
            warm.key = key
            self.stats.skipped_same_inputs += 1
            return
        if self.state.registry.get(sid) is not entry:
            return  # the session ended while its prompt was prepared
        task = asyncio.ensure_future(engine.warm(prepared))
        ended = False

        async def session_ended() -> None:
            # Called by the registry as the session closes: the warm-up is work for nobody.
            nonlocal ended
            ended = True
            task.cancel()

        entry.closers.append(session_ended)
        self.current = (sid, task, lead)
        started = time.monotonic()
        try:
            stats = await asyncio.shield(task)
        except asyncio.CancelledError:
            if ended:
                self.stats.aborted += 1
                return
            if self._yielding is task:  # gave way to an answer: warmed again when the engine is idle
                self.stats.yielded += 1
                return
            task.cancel()  # the prewarmer itself is stopping
            await asyncio.gather(task, return_exceptions=True)
            raise
        except Exception as exc:
            self.stats.failed += 1
            log.warning("session %s…: warm-up failed: %s", sid[:6], exc)
            warm.key = key
            return
        finally:
            if session_ended in entry.closers:
                entry.closers.remove(session_ended)
            self.current = None
            took = time.monotonic() - started
            self.stats.busy_s += took
            self.stats.recent.append((time.monotonic(), took))
        entry.session.mark_encoded(sample.seqs)
        self._budget(entry.session, took, new_frames)
        warm.key, warm.inputs_sha256, warm.prompt_key = key, lead, prompt_key
        warm.warmed += 1
        warm.last_cached_tokens, warm.last_prompt_tokens = stats.cached_tokens, stats.prompt_tokens
        self.stats.warmups += 1
        _log_warmed(sid, sample, stats, took, pin if at_enter else None, new_frames)


def _log_warmed(sid: str, sample: Any, stats: Any, took: float, pin: Pin | None, new_frames: int) -> None:
    log.log(logging.INFO if pin is not None else logging.DEBUG,
            "session %s…: warmed %s%d frames (%d new), %d prompt tokens (%d already cached) in %.0f ms, "
            "%.0f ms after Enter", sid[:6], "the sample taken at Enter: " if pin is not None else "",
            len(sample.frames), new_frames, stats.prompt_tokens, stats.cached_tokens, took * 1000,
            (time.monotonic() - pin.at) * 1000 if pin is not None else float("nan"))
