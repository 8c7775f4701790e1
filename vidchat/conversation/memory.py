"""What a live session remembers beyond its ring of frames, for every door.

Three parts, one idea:

* **Captions** (:class:`Captioner`). The engine describes each keyframe of
  a session's scene log (vidchat.media.scene_log) with a fixed instruction
  (``--memory-prompt``, at most ``--memory-caption-tokens``), greedy and
  seeded, so a caption is the same each time it is written. Captions are
  the lowest-priority work there is: one at a time, started only while no
  answer of any session is generating, waiting for its place or being
  prepared; a question arriving for the engine aborts the caption in flight
  (the abort reaches vLLM before the question does) and the keyframe is
  captioned later. Where vLLM schedules by priority, a caption also runs
  behind answers and warm-ups (``CAPTION_PRIORITY``).
* **The memory block** (:func:`recall`). Each question of a session with
  memory on carries the log as text before the question: captions, newest
  first, with their time before now, within ``--memory-tokens``.
* **Memory frames**. A question that points at a time ("two minutes ago",
  "at 10:05", "at the start", "earlier", "before") gets the keyframes of
  that time (:func:`pointed`, :func:`picks`), at most ``--memory-frames``,
  before the live frames; the block says which images they are.

* **Folding** (:meth:`Captioner._fold`). When a session's chat passes a
  quarter of the model's context (``FOLD_SHARE``), its oldest half is folded
  into a summary the model writes, by the captions' rules (idle only,
  aborted by a question): one system turn in the chat's place
  (vidchat.conversation.conversation.Summary), so a long session keeps what
  was said instead of losing it to the history cut; an answer's record says
  how many exchanges its history had folded (``history_folded``).

What a question got (:class:`MemoryUse`) is kept with its answer: its
record says ``memory_tokens`` and ``memory_frames`` with their times, a
re-ask gets exactly the same memory, and a bundle carries it for replay.
Times are on the session's media clock: "now" is the newest frame's
capture time, so a clip replayed at any speed remembers the same way.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from vidchat.conversation.events import MemoryCaption
from vidchat.conversation.host import answering
from vidchat.engine.interface import CAPTION_PRIORITY, ChatEngine, EngineError, Prepared
from vidchat.media.scene_log import Keyframe, MemoryFrame, MemoryUse, Pointer

if TYPE_CHECKING:
    from vidchat.conversation.answers import Answer, SessionRecord
    from vidchat.conversation.host import Host, MemorySettings

log = logging.getLogger(__name__)

DEFAULT_MEMORY_PROMPT = "Describe this scene in one short sentence."


@dataclass(frozen=True)
class MemoryOptions:
    """The server's memory options (--memory-prompt, --memory-caption-tokens,
    --memory-tokens, --memory-frames)."""

    prompt: str = DEFAULT_MEMORY_PROMPT
    caption_tokens: int = 48
    tokens: int = 512
    frames: int = 2

    def __post_init__(self) -> None:
        for name in ("caption_tokens", "tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"memory {name.replace('_', ' ')} must be at least 1, got {getattr(self, name)}")
        if self.frames < 0:
            raise ValueError(f"memory frames must be 0 or more, got {self.frames}")
        if not self.prompt.strip():
            raise ValueError("the memory prompt must not be empty")


# ---- questions that point at a time ------------------------------------

_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
            "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "fifteen": 15, "twenty": 20,
            "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "a few": 3, "a couple of": 2, "half a": 0.5,
            "half an": 0.5}
_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0, "h": 3600.0,
          "hr": 3600.0, "hour": 3600.0}
_AGO = re.compile(r"\b(\d+(?:\.\d+)?|a couple of|a few|half an?|an?|one|two|three|four|five|six|seven|eight|nine|"
                  r"ten|eleven|twelve|fifteen|twenty|thirty|forty|fifty|sixty)\s*"
                  r"(seconds?|secs?|minutes?|mins?|hours?|hrs?|[smh])\s+ago\b", re.IGNORECASE)
_CLOCK = re.compile(r"\bat\s+(\d{1,2})[:.](\d{2})(?::(\d{2}))?\s*([ap]\.?m\.?)?", re.IGNORECASE)
_START = re.compile(r"\b(?:the\s+(?:very\s+)?(?:start|beginning)|at\s+first)\b", re.IGNORECASE)
_EARLIER = re.compile(r"\b(?:earlier|before|previously|a while ago)\b", re.IGNORECASE)


def pointed(question: str, now: float, start: float, now_wall: float | None = None) -> Pointer | None:
    """The moment ``question`` points at (None: it points at none).
    ``now``/``start``: the session's newest media time and first; ``now_wall``:
    the Unix time of ``now`` (for a clock time like "at 10:05", local time)."""
    match = _AGO.search(question)
    if match:
        amount = match.group(1).lower()
        count = float(amount) if amount[0].isdigit() else _NUMBERS[amount]
        unit = match.group(2).lower().rstrip("s") or "s"
        seconds = count * _UNITS.get(unit, _UNITS.get(unit[:1], 1.0))
        return Pointer(match.group(0), max(start, now - seconds))
    match = _CLOCK.search(question)
    if match and now_wall is not None:
        return _clock_pointer(match, now, start, now_wall)
    match = _START.search(question)
    if match:
        return Pointer(match.group(0), start)
    match = _EARLIER.search(question)
    if match:
        return Pointer(match.group(0), None)
    return None


def _clock_pointer(match: re.Match[str], now: float, start: float, now_wall: float) -> Pointer | None:
    hour, minute, second = int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)
    suffix = (match.group(4) or "").lower().replace(".", "")
    if suffix == "pm" and hour < 12:
        hour += 12
    elif suffix == "am" and hour == 12:
        hour = 0
    if hour > 23 or minute > 59 or second > 59:
        return None
    local = time.localtime(now_wall)
    wall = time.mktime((local.tm_year, local.tm_mon, local.tm_mday, hour, minute, second, 0, 0, -1))
    # A time later than now is the last time the clock showed it: 12 hours
    # earlier without am/pm (10:05 in the evening is 22:05), else a day.
    while wall > now_wall + 60:
        wall -= 12 * 3600 if not suffix and hour < 12 else 24 * 3600
    return Pointer(match.group(0), max(start, now - (now_wall - wall)))


def picks(keyframes: Sequence[Keyframe], pointer: Pointer | None, n: int) -> list[Keyframe]:
    """At most ``n`` keyframes for a question pointing at ``pointer``, oldest
    first: the scene on screen at that moment (the newest keyframe at or
    before it), then those nearest to it; for "earlier", the scenes before
    the current one, newest first."""
    if pointer is None or n <= 0 or not keyframes:
        return []
    frames = sorted(keyframes, key=lambda k: k.t)
    if pointer.t is None:
        chosen = frames[:-1][::-1][:n]
    else:
        target = pointer.t
        on_screen = [k for k in frames if k.t <= target]
        first = on_screen[-1] if on_screen else frames[0]
        rest = sorted((k for k in frames if k is not first), key=lambda k: abs(k.t - target))
        chosen = [first, *rest[: n - 1]]
    return sorted(chosen, key=lambda k: k.t)


# ---- what a question gets ----------------------------------------------

def ago(seconds: float) -> str:
    """0:05, 2:30, 1:02:03 ago."""
    whole = int(round(max(0.0, seconds)))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def recall(keyframes: Sequence[Keyframe], question: str, now: float, start: float, options: MemorySettings,
           count_tokens: Callable[[str], int], now_wall: float | None = None,
           pinned: Sequence[Keyframe] = (), with_frames: bool = True) -> MemoryUse:
    """What a question asked at ``now`` gets of a log: the keyframes it points
    at (or ``pinned``: picked on the page's timeline) and the captions, newest
    first, as long as the block stays within ``options.tokens``.
    ``with_frames`` false: the captions alone (a question sending its frames as a video)."""
    pointer = pointed(question, now, start, now_wall)
    most = options.frames if with_frames else 0
    chosen = list(pinned)[:most] if pinned else picks(keyframes, pointer, most)
    frames = tuple(MemoryFrame(k.seq, k.t, now - k.t, k.source_t, k.caption, k.pixels()) for k in chosen)
    lines: list[str] = []
    captions: list[tuple[int, float, str]] = []
    head = "Memory of this session (what you saw earlier, newest first):"
    tail = _frames_line(frames)
    text = ""
    for k in sorted(keyframes, key=lambda k: -k.t):
        if k.caption is None:
            continue
        line = f"- {ago(now - k.t)} ago: {k.caption}"
        candidate = _block(head, [*lines, line], tail)
        if count_tokens(candidate) > options.tokens:
            break
        lines.append(line)
        captions.append((k.seq, now - k.t, k.caption))
        text = candidate
    if not text and tail:
        text = _block("", [], tail)
    return MemoryUse(text, count_tokens(text) if text else 0, frames, tuple(captions), pointer, len(keyframes))


def _frames_line(frames: Sequence[MemoryFrame]) -> str:
    if not frames:
        return ""
    times = ", ".join(f"{ago(f.ago_s)} ago" for f in frames)
    first = "The first image is" if len(frames) == 1 else f"The first {len(frames)} images are"
    return f"{first} from earlier in this session ({times}); the other images are the video now."


def _block(head: str, lines: Sequence[str], tail: str) -> str:
    parts = [p for p in (head if lines else "", "\n".join(lines), tail) if p]
    return "\n".join(parts) + "\n\n"


def with_memory(question: str, use: MemoryUse | None) -> str:
    """The question as the model gets it: the memory block first."""
    return question if use is None or not use.text else use.text + question


def token_counter(engine: ChatEngine) -> Callable[[str], int]:
    """The engine's tokenizer as a counter (about four characters a token where it has none)."""
    counter = getattr(engine, "count_tokens", None)
    if callable(counter):
        return counter  # type: ignore[no-any-return]
    return lambda text: (len(text) + 3) // 4


def session_recall(entry: SessionRecord, engine: ChatEngine, question: str, options: MemorySettings,
                   pinned_seq: int | None = None, with_frames: bool = True) -> MemoryUse | None:
    """What ``entry``'s question gets of its memory (None: its memory is off, or empty)."""
    session = entry.session
    if not session.settings.memory:
        return None
    keyframes = session.scene_log.keyframes()
    now = session.newest_frame_time
    if not keyframes or now is None:
        return None
    start = session.timeline_start if session.timeline_start is not None else keyframes[0].t
    pinned = [k for k in keyframes if k.seq == pinned_seq] if pinned_seq is not None else []
    newest = keyframes[-1]
    now_wall = newest.wall + (now - newest.t)
    return recall(keyframes, question, now, start, options, token_counter(engine), now_wall, pinned, with_frames)


# ---- captions ----------------------------------------------------------

@dataclass
class CaptionStats:
    written: int = 0
    aborted: int = 0  # cut short by an arriving question (captioned again later)
    skipped: int = 0  # put off: the engine was busy when one was due
    failed: int = 0
    folds: int = 0  # chats folded into a summary
    busy_s: float = 0.0
    # How long each abort took to reach vLLM (what a question waited for a caption), ms.
    abort_ms: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=1024))

    def counts(self) -> dict[str, Any]:
        return {"written": self.written, "aborted": self.aborted, "skipped": self.skipped, "failed": self.failed,
                "folds": self.folds, "busy_s": round(self.busy_s, 3)}


# How often the captioner looks for work while it has none.
LOOK_EVERY_S = 0.25


class Captioner:
    """Writes the scene logs' captions while the engine is idle (the module's rules)."""

    def __init__(self, host: Host, options: MemorySettings) -> None:
        self.host = host
        self.options = options
        self.stats = CaptionStats()
        self._task: asyncio.Task[None] | None = None
        self._flight: asyncio.Future[str] | None = None
        self._aborting: asyncio.Future[str] | None = None
        self._next_session = 0  # round robin over sessions with keyframes to caption
        # Each session's chat as last counted: (its shape, its tokens).
        self._history_tokens: dict[str, tuple[tuple[int, int, int], int]] = {}

    def start(self) -> None:
        gate = self.host.answer_gate
        if gate is not None and self._answer_arriving not in gate.arrival_hooks:
            gate.arrival_hooks.insert(0, self._answer_arriving)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        gate = self.host.answer_gate
        if gate is not None and self._answer_arriving in gate.arrival_hooks:
            gate.arrival_hooks.remove(self._answer_arriving)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    @property
    def running(self) -> bool:
        return self._flight is not None

    def snapshot(self) -> dict[str, Any]:
        """What /api/health shows of the memory's captions."""
        options = self.options
        return {"prompt": options.prompt, "caption_tokens": options.caption_tokens, "tokens": options.tokens,
                "frames": options.frames, **self.stats.counts(), "running": self.running}

    async def _answer_arriving(self, answer: Answer) -> None:
        """A question is about to generate: a caption in flight on its engine is aborted first."""
        flight = self._flight
        if flight is None or answer.engine_role != "main":
            return
        started = time.perf_counter()
        self._aborting = flight
        flight.cancel()
        await asyncio.gather(flight, return_exceptions=True)
        self.stats.abort_ms.append((time.perf_counter() - started) * 1000)

    def _busy(self, engine: ChatEngine) -> bool:
        return answering(self.host, engine)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(LOOK_EVERY_S)  # polled: whether work is due depends on every session and the engine
            try:
                while await self._step():
                    pass
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("caption step failed")
                await asyncio.sleep(1.0)

    def _due(self) -> tuple[SessionRecord, Keyframe] | None:
        """The next keyframe to caption: sessions in turn, each one's newest first."""
        entries = [e for e in self.host.registry.entries()
                   if not e.closed and e.session.settings.memory and len(e.session.scene_log)]
        if not entries:
            return None
        for i in range(len(entries)):
            entry = entries[(self._next_session + i) % len(entries)]
            waiting = entry.session.scene_log.uncaptioned()
            if waiting:
                self._next_session = (self._next_session + i + 1) % len(entries)
                return entry, waiting[0]
        return None

    async def _step(self) -> bool:
        """Fold a chat or caption one keyframe, if one is due and the engine
        is idle; whether something was written."""
        engine = self.host.engine_now("main")
        if engine is None:
            return False
        fold = self._fold_due(engine)
        due = None if fold is not None else self._due()
        if fold is None and due is None:
            return False
        if self._busy(engine):
            self.stats.skipped += 1
            return False
        if fold is not None:
            return await self._fold(engine, *fold)
        assert due is not None
        entry, keyframe = due
        caption = await self._caption(engine, entry, keyframe)
        if caption is None:
            return False
        captioned(entry, keyframe, caption)
        return True

    async def _caption(self, engine: ChatEngine, entry: SessionRecord, keyframe: Keyframe,
                       now: bool = False) -> str | None:
        """One caption, or None when it gave way to a question, its session ended or it failed.
        ``now``: whatever else the engine runs (a replay's own captions: nobody waits)."""
        options = self.options
        try:
            prepared = await asyncio.to_thread(
                engine.prepare, options.prompt, [keyframe.pixels()], None, max_tokens=options.caption_tokens,
                temperature=0.0, seed=0, cache_salt=entry.cache_salt, frame_ids=[f"m{keyframe.seq}"])
        except EngineError as exc:
            self.stats.failed += 1
            log.warning("session %s…: keyframe %d could not be captioned: %s", entry.session.id[:6],
                        keyframe.seq, exc)
            entry.session.scene_log.set_caption(keyframe.seq, "")
            return None
        text = await self._written(engine, entry, prepared, now)
        if text is None:
            return None
        self.stats.written += 1
        caption = " ".join(text.split())
        log.debug("session %s…: keyframe %d captioned (%d characters)", entry.session.id[:6], keyframe.seq,
                  len(caption))
        return caption

    async def _written(self, engine: ChatEngine, entry: SessionRecord, prepared: Prepared,
                       now: bool = False) -> str | None:
        """What the engine writes for ``prepared`` behind everything else: None
        when a question came meanwhile (it is aborted first), its session ended or it failed."""
        if (self._busy(engine) and not now) or entry.closed:  # a question came while it was prepared
            self.stats.skipped += 1
            return None
        reply = engine.submit(dataclasses.replace(prepared, priority=CAPTION_PRIORITY))

        async def written() -> str:
            text = ""
            try:
                async for delta in reply:
                    text += delta
            finally:
                await reply.aclose()
            return text

        flight = self._flight = asyncio.ensure_future(written())
        started = time.monotonic()

        async def session_ended() -> None:
            flight.cancel()

        entry.closers.append(session_ended)
        try:
            return await asyncio.shield(flight)
        except asyncio.CancelledError:
            if self._aborting is flight:
                self.stats.aborted += 1
                return None
            if flight.cancelled() and entry.closed:
                return None
            flight.cancel()  # the captioner itself is stopping
            await asyncio.gather(flight, return_exceptions=True)
            raise
        except EngineError as exc:
            self.stats.failed += 1
            log.warning("session %s…: background work failed: %s", entry.session.id[:6], exc)
            return None
        finally:
            self._flight = None
            self._aborting = None
            self.stats.busy_s += time.monotonic() - started
            if session_ended in entry.closers:
                entry.closers.remove(session_ended)

    # -- folding a long chat -------------------------------------------------

    def _fold_due(self, engine: ChatEngine) -> tuple[SessionRecord, list[Any]] | None:
        """A session with memory on whose chat passed FOLD_SHARE of the model's
        context, and the oldest half of its exchanges to fold."""
        count = token_counter(engine)
        limit = engine.options.max_model_len * FOLD_SHARE
        entries = self.host.registry.entries()
        live = {e.session.id for e in entries}
        for gone in [sid for sid in self._history_tokens if sid not in live]:
            del self._history_tokens[gone]
        for entry in entries:
            history = getattr(entry, "history", None)
            if entry.closed or not entry.session.settings.memory or history is None or len(history) < 3:
                continue
            exchanges = list(history.exchanges)
            key = (len(exchanges), id(exchanges[-1]), id(exchanges[0]))
            known = self._history_tokens.get(entry.session.id)
            if known is None or known[0] != key:
                known = (key, sum(count(turn.text) for e in exchanges for turn in e.turns()))
                self._history_tokens[entry.session.id] = known
            if known[1] > limit:
                return entry, exchanges[: max(2, len(exchanges) // 2)]
        return None

    async def _fold(self, engine: ChatEngine, entry: SessionRecord, oldest: list[Any]) -> bool:
        """Have the model summarise ``oldest`` and put the summary in their place."""
        chat = "\n".join(f"{turn.role}: {turn.text}" for e in oldest for turn in e.turns())
        try:
            prepared = await asyncio.to_thread(
                engine.prepare, FOLD_PROMPT + "\n\n" + chat, [], None, max_tokens=SUMMARY_TOKENS,
                temperature=0.0, seed=0, cache_salt=entry.cache_salt)
        except EngineError as exc:
            self.stats.failed += 1
            log.warning("session %s…: the chat could not be folded: %s", entry.session.id[:6], exc)
            return False
        text = await self._written(engine, entry, prepared)
        if text is None:
            return False
        history = getattr(entry, "history", None)
        if history is None or not history.fold(oldest, " ".join(text.split()) or "(nothing to say)"):
            return False
        self.stats.folds += 1
        log.info("session %s…: the chat's %d oldest exchanges folded into a summary (%d folded in all)",
                 entry.session.id[:6], len(oldest), history.folded)
        return True


def captioned(entry: SessionRecord, keyframe: Keyframe, caption: str) -> None:
    """Give ``keyframe`` its caption and tell the session's listeners (memory.caption)."""
    frame = entry.session.scene_log.set_caption(keyframe.seq, caption)
    if frame is not None:
        origin = entry.session.timeline_start
        time_ms = int(round((frame.t - (origin if origin is not None else frame.t)) * 1000))
        entry.event_hub.publish(MemoryCaption(frame.seq, time_ms, caption))


async def write_captions(host: Host, engine: ChatEngine, entry: SessionRecord, options: MemorySettings) -> int:
    """Caption every keyframe of ``entry`` that has none yet, oldest first, now:
    for a replay, where the engine has nobody else to serve and the file plays
    as fast as it allows (vidchat.qa.replay asks this before each question, so a
    replayed clip remembers as the live session would have once idle). How many were written."""
    writer = Captioner(host, options)
    written = 0
    for keyframe in reversed(entry.session.scene_log.uncaptioned()):
        caption = await writer._caption(engine, entry, keyframe, now=True)
        if caption is not None:
            captioned(entry, keyframe, caption)
            written += 1
    return written


# A chat is folded when it passes this share of the model's context: well
# before vidchat.engine.ModelEngine.fit_history would cut it (the frames, the
# memory block and the answer need the rest).
FOLD_SHARE = 0.25

FOLD_PROMPT = ("Summarize the conversation below in a few sentences: what was seen, asked and answered. "
               "Keep names, times and numbers.")

SUMMARY_TOKENS = 128


MEMORY_MODES = ("auto", "on", "off")


def memory_default(mode: str, gpu: bool, remote: bool = False) -> tuple[bool, str]:
    """Whether new sessions remember (--memory), and why, in words for the start-up log.
    ``remote``: the engine is at --engine-url, taken to be on a GPU (nothing says otherwise)."""
    if mode == "on":
        return True, "on (--memory on)"
    if mode == "off":
        return False, "off (--memory off)"
    if remote:
        return True, ("on (auto: the engine is at --engine-url, taken to be on a GPU, where a keyframe's "
                      "caption takes milliseconds; --memory off if those replicas run on a CPU)")
    if gpu:
        return True, ("on (auto: the engine runs on a GPU, where a keyframe's caption takes milliseconds and "
                      "an arriving question aborts it at once)")
    return False, ("off (auto: on a CPU a caption holds the engine for its frame's encoding, which an arriving "
                   "question cannot cut short; --memory on turns it on; docs/memory.md)")
