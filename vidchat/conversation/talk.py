"""Talk mode: hands-free questions from a session's own audio.

A :class:`Listener` follows one session's 16 kHz audio with a turn detector
(:mod:`vidchat.media.vad`, in its worker thread). When speech starts while an
answer streams, it stops that answer (barge-in: the vLLM request is
aborted); when an utterance ends, it hands the utterance to whichever door
turned Talk on (the page's Talk switch, a socket's ``turn_detection``),
which asks it through the one answer path (:func:`vidchat.conversation.answer_path.ask` with
``spoken=``). Both doors share this code and its rules.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from vidchat.conversation.session_events import SettingsChanged, SoundLevel, SpeechStopped
from vidchat.media.vad import SpeechStarted, TurnDetector, TurnSettings, Utterance
from vidchat.media.workers import run_vad

log = logging.getLogger(__name__)

# How often the listener looks for new audio. WebRTC delivers 20 ms packets;
# the detector's window is 32 ms: 40 ms keeps the decision within a window
# or two of the audio while costing a wake-up per session 25 times a second.
POLL_S = 0.04
# The microphone's level is said this often while Talk listens (the page's
# meter), and a silent microphone reads as this.
LEVEL_EVERY_S = 0.25
SILENT_DBFS = -90.0
# Utterances waiting for a door to ask them; older ones are dropped.
MAX_QUEUED = 4
# Why an answer cut short by the client's speech (barge-in) was cancelled:
# answer_path.Answer.cancelled_by, in OpenAI Realtime's word, which its door reports.
BARGED_IN = "turn_detected"

Event = SpeechStarted | Utterance


@dataclass
class TalkStats:
    utterances: int = 0
    barge_ins: int = 0


@dataclass
class Listener:
    """Turn detection over one session's audio, while Talk is on."""

    entry: Any  # the session's vidchat.conversation.Conversation (not imported: it imports this module)
    settings: TurnSettings = field(default_factory=TurnSettings)
    barge_in: bool = True
    # Called as speech starts: a spoken question is coming (the server's
    # warm-ups take this session first, vidchat.conversation.prewarm question_coming).
    on_speech: Callable[[], None] | None = None
    stats: TalkStats = field(default_factory=TalkStats)
    events: asyncio.Queue = field(default_factory=lambda: asyncio.Queue(maxsize=64))
    # The state a page shows: "listening", "hearing you".
    hearing: bool = False
    speech_starts: int = 0
    level_dbfs: float | None = None  # the microphone's last level (None: no audio heard yet)
    level_t: float | None = None  # its time on the session's timeline
    _level_at: float = float("-inf")
    _detector: TurnDetector | None = None
    _task: asyncio.Task | None = None
    _pos: float | None = None
    _playback_until: float = 0.0
    _returned: collections.deque = field(default_factory=collections.deque)

    def start(self) -> None:
        """Listen from now on: audio already received is not a turn, all that comes after is."""
        if self._task is None or self._task.done():
            now = self.entry.session.audio_since(None)
            self._pos = now[2] if now is not None else float("-inf")
            self._task = asyncio.create_task(self._run(), name=f"talk-{self.entry.session.id[:6]}")
            self.entry.event_hub.publish(SettingsChanged({"talk": True}))

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
            self.entry.event_hub.publish(SettingsChanged({"talk": False}))

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def set_playback(self, on: bool, hold_s: float = 0.3) -> None:
        """The page is (or stopped) reading an answer aloud. The echo gate
        stays up ``hold_s`` past the end: the room still rings."""
        self._playback_until = float("inf") if on else time.monotonic() + hold_s

    @property
    def playback(self) -> bool:
        return time.monotonic() < self._playback_until

    async def next_utterance(self) -> Utterance:
        """The next finished utterance (speech-start events are skipped)."""
        if self._returned:
            return self._returned.popleft()
        while True:
            event = await self.events.get()
            if isinstance(event, Utterance):
                return event

    async def next_event(self) -> Any:
        """The next speech start or finished utterance (one put back comes first)."""
        if self._returned:
            return self._returned.popleft()
        return await self.events.get()

    def put_back(self, utterance: Utterance) -> None:
        """An utterance taken by a loop that may no longer ask it (a newer
        loop owns the chat): the next caller of next_utterance gets it first."""
        self._returned.appendleft(utterance)

    async def _run(self) -> None:
        session = self.entry.session
        try:
            # The model loads in the worker (40 ms): never on the loop.
            self._detector = await run_vad(TurnDetector, self.settings)
            while True:
                await asyncio.sleep(POLL_S)
                got = session.audio_since(self._pos)
                if got is None:
                    continue
                samples, start, end = got
                self._pos = end
                if samples.size == 0:
                    continue
                self._say_level(samples, end)
                self._detector.playback = self.playback
                events = await run_vad(self._detector.feed, samples, start)
                for event in events:
                    await self._handle(event)
        except asyncio.CancelledError:
            raise
        except Exception:  # the listener ends; the session goes on
            log.exception("session %s… talk listener failed", session.id[:6])

    def _say_level(self, samples: np.ndarray, end: float) -> None:
        """The microphone's level, at most every LEVEL_EVERY_S (the page's meter)."""
        now = time.monotonic()
        if now - self._level_at < LEVEL_EVERY_S:
            return
        self._level_at = now
        rms = float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))
        self.level_dbfs = max(SILENT_DBFS, 20 * math.log10(rms)) if rms > 0 else SILENT_DBFS
        self.level_t = end
        self.entry.event_hub.publish(SoundLevel(round(self.level_dbfs, 1), end))

    async def _handle(self, event: Event) -> None:
        sid = self.entry.session.id[:6]
        if isinstance(event, SpeechStarted):
            self.hearing = True
            self.speech_starts += 1
            self.entry.event_hub.publish(event)
            if self.on_speech is not None:
                self.on_speech()
            if self.barge_in and self.entry.answer is not None:
                self.stats.barge_ins += 1
                log.info("session %s… barge-in: speech at %.2f s stops the answer", sid, event.start)
                await self.entry.cancel(BARGED_IN)  # the conversation's one way to cancel the chat's answer
        else:
            self.hearing = False
            self.stats.utterances += 1
            self.entry.event_hub.publish(SpeechStopped(event.end))
            self.entry.event_hub.publish(event)
            log.info("session %s… utterance of %.2f s (%.1f dBFS)%s", sid, event.seconds, event.level_dbfs,
                     " cut at the length limit" if event.cut else "")
        if self.events.full():
            self.events.get_nowait()  # nobody is asking: the oldest goes
        self.events.put_nowait(event)


def listener(entry: Any, settings: TurnSettings | None = None, barge_in: bool = True,
             on_speech: Callable[[], None] | None = None) -> Listener:
    """The session's listener, started (one per session; new settings replace the old ones)."""
    current: Listener | None = getattr(entry, "talk", None)
    if current is not None and current.running:
        if settings is not None and settings != current.settings:
            current.settings = settings
            if current._detector is not None:
                current._detector.settings = settings
        current.barge_in = barge_in
        current.on_speech = on_speech or current.on_speech
        return current
    made = Listener(entry, settings or TurnSettings(), barge_in, on_speech)
    if current is not None and current.stop in entry.closers:
        entry.closers.remove(current.stop)
    entry.talk = made
    entry.closers.append(made.stop)
    made.start()
    return made


def speech_warms(state: Any, entry: Any) -> Callable[[], None] | None:
    """A listener's ``on_speech`` that warms the session first (a spoken
    question is coming), when the server has warm-ups."""
    prewarmer = getattr(state, "prewarmer", None)
    if prewarmer is None:
        return None
    return lambda: prewarmer.question_coming(entry.session.id)


async def stop(entry: Any) -> None:
    current: Listener | None = getattr(entry, "talk", None)
    if current is not None:
        await current.stop()
