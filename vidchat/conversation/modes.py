"""Watch and Talk as tasks of a session's conversation, for a door that only
listens (the page): the standing question asked at each scene change, and
each utterance asked as it ends. They run until switched off, Stop (Watch)
or the session's end, whoever reads the chat; a typed question never ends
them (its answer cuts a running one short by the conversation's one rule,
and watching goes on from the new chat). What each asks with is read at
the moment it asks (``options``), so settings changed meanwhile count.

The socket doors say these modes in their own protocol (vidchat.doors.socket.session,
vidchat.doors.socket.session) over the same two primitives, here:
:func:`scene_changes` (when Watch asks) and :func:`heard` (what Talk asks).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Protocol

import numpy as np

from vidchat.conversation.answers import AnswerOptions, AnswerSlot, Closer, SessionRecord, TalkListener
from vidchat.conversation.events import (
    SCENE,
    SPOKEN,
    TYPED,
    EventHub,
    SceneChanged,
    SettingsChanged,
    SoundLevel,
    SpeechStopped,
)
from vidchat.media.sampling import Sample
from vidchat.media.session import Session
from vidchat.media.vad import SpeechStarted, TurnDetector, TurnSettings, Utterance
from vidchat.media.workers import run_vad

if TYPE_CHECKING:
    from vidchat.conversation.host import Host
    from vidchat.conversation.runs import AnswerRun

log = logging.getLogger(__name__)


# Watch mode: a standing question asked by itself whenever the scene changes.
#
# The filter already measures how much of the picture changed for every frame
# it keeps; a kept frame that differs from the scene's first frame by the
# session's scene_change_share is a scene change (vidchat.media.frame_buffer:
# a cut, and motion adding up). This module turns the session's count
# of those into "ask now" moments, at most one every ``every_s`` seconds; a
# change during the pause fires when the pause ends (several coalesce into one).
# It knows nothing about doors: the page's watch event and ``vidchat.qa.replay
# --watch`` both drive their questions from it.

DEFAULT_EVERY_S = 10.0

WATCH_POLL_S = 0.25


class SceneWatch:
    """Tells when a session's scene changed, rate-limited."""

    def __init__(self, session: Session, every_s: float = DEFAULT_EVERY_S) -> None:
        if not every_s > 0:
            raise ValueError(f"watch interval must be a positive number of seconds, got {every_s!r}")
        self.session = session
        self.every_s = every_s
        self._seen = session.scene_changes  # changes before watching began do not count
        self._began_with = session.scene_changes
        self.began = time.monotonic()
        self.fired = 0
        self._last_fire: float | None = None

    def due(self, now: float) -> bool:
        """Whether to ask now (`now` on the clock the caller paces with)."""
        if self.session.scene_changes == self._seen:
            return False
        if self._last_fire is not None and now - self._last_fire < self.every_s:
            return False
        self._seen = self.session.scene_changes
        self._last_fire = now
        self.fired += 1
        return True

    def status(self, now: float) -> dict[str, Any]:
        """What watching is doing, for a person looking at it (live; ``now``
        on time.monotonic()): for how long, the scene changes it saw, the
        questions it asked and when the last was, and what it waits for."""
        changes = self.session.scene_changes - self._began_with
        pending = self.session.scene_changes != self._seen
        out: dict[str, Any] = {
            "for_s": round(now - self.began, 1), "scene_changes": changes, "asked": self.fired,
            "last_asked_s_ago": None if self._last_fire is None else round(now - self._last_fire, 1),
            "every_s": self.every_s, "scene_change_share": self.session.settings.scene_change_share}
        if pending and self._last_fire is not None and now - self._last_fire < self.every_s:
            out["waiting"] = "pause"  # a change came within --every of the last question: asked when it ends
            out["asks_in_s"] = round(self.every_s - (now - self._last_fire), 1)
        elif not changes:
            out["waiting"] = "scene_change"  # nothing has changed enough yet
        return out

    async def changes(self, stopped: Callable[[], bool] | None = None) -> AsyncIterator[float | None]:
        """Live: yield the timeline time of each (rate-limited) scene change,
        until ``stopped()`` says watching was switched off (checked at each
        poll, so a still scene does not keep a switched-off watch alive)."""
        while stopped is None or not stopped():
            if self.due(time.monotonic()):
                yield self.session.last_scene_change_t
            await asyncio.sleep(WATCH_POLL_S)


Options = Callable[[], AnswerOptions]  # what a mode's question is asked with, read as it is asked


class Talker(Protocol):
    """What Watch and Talk use of the conversation they run in
    (vidchat.conversation.conversation.Conversation): its session and
    record, its host, its chat's running answer, and the two ways a door
    asks and stops (``submit``, ``cancel``)."""

    talk: TalkListener | None
    _chat_run: AnswerRun | None

    @property
    def session(self) -> Session: ...

    @property
    def host(self) -> Host | None: ...

    @property
    def event_hub(self) -> EventHub: ...

    @property
    def chat(self) -> AnswerSlot: ...

    @property
    def closed(self) -> bool: ...

    @property
    def closers(self) -> list[Closer]: ...

    def submit(self, question: str, options: AnswerOptions | Callable[[], AnswerOptions], *, cause: str = TYPED,
               at: float | None = None, spoken: Utterance | None = None, sample: Sample | None = None,
               pinned_at: float | None = None, record: bool = False) -> int: ...

    async def cancel(self, why: str | None = None) -> None: ...


class Modes:
    """One conversation's Watch and Talk tasks (``conversation.modes``)."""

    def __init__(self, conversation: Talker) -> None:
        self.conversation = conversation
        self._watch: asyncio.Task[None] | None = None
        self._talk: asyncio.Task[None] | None = None
        self.watch_question: str | None = None
        self.watcher: SceneWatch | None = None

    @property
    def watching(self) -> bool:
        return self._watch is not None and not self._watch.done()

    def watch_status(self) -> dict[str, Any] | None:
        """What watching is doing (SceneWatch.status), or None when not watching."""
        watcher = self.watcher
        return watcher.status(time.monotonic()) if self.watching and watcher is not None else None

    @property
    def talking(self) -> bool:
        return self._talk is not None and not self._talk.done()

    def watch(self, question: str, every_s: float, options: Options) -> None:
        """Ask ``question`` at each scene change, at most every ``every_s``
        seconds (replacing a watch already running)."""
        self.stop_watching()
        entry = self.conversation
        watcher = SceneWatch(entry.session, every_s)
        self.watcher = watcher
        self.watch_question = question
        self._watch = asyncio.get_running_loop().create_task(self._watching(watcher, question, options),
                                                             name=f"watch-{entry.session.id[:6]}")

    def stop_watching(self) -> None:
        task, self._watch = self._watch, None
        self.watch_question = None
        self.watcher = None
        if task is not None:
            task.cancel()

    async def _watching(self, watcher: SceneWatch, question: str, options: Options) -> None:
        conversation = self.conversation
        me = asyncio.current_task()

        def stopped() -> bool:  # switched off, Stop, replaced, or the session ended
            return self._watch is not me or conversation.closed

        try:
            async for t in scene_changes(conversation, watcher, stopped):
                conversation.submit(question, options, cause=SCENE, at=t)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - watching ends, the session goes on
            log.exception("session %s…: watching failed", conversation.session.id[:6])

    def talk(self, settings: TurnSettings, barge_in: bool, options: Options,
             on_speech: Callable[[], None] | None = None) -> None:
        """Ask each utterance the session's microphone hears, as it ends
        (the listener, with barge-in, is the session's: vidchat.conversation.modes)."""
        entry = self.conversation
        heard = listener(entry, settings, barge_in, on_speech=on_speech)
        if self.talking:
            return  # the running task reads the same listener, with its new settings
        self._talk = asyncio.get_running_loop().create_task(self._talking(heard, options),
                                                            name=f"talk-{entry.session.id[:6]}")

    async def stop_talking(self) -> None:
        task, self._talk = self._talk, None
        if task is not None:
            task.cancel()
        await stop(self.conversation)

    async def _talking(self, listener: Listener, options: Options) -> None:
        conversation = self.conversation
        me = asyncio.current_task()

        def stale() -> bool:
            return self._talk is not me or not listener.running or conversation.closed

        try:
            async for spoken in heard(listener, stale):
                if isinstance(spoken, Utterance):  # always, without ``starts``
                    conversation.submit("", options, cause=SPOKEN, spoken=spoken)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - Talk ends, the session goes on
            log.exception("session %s…: talk failed", conversation.session.id[:6])


async def scene_changes(conversation: Talker, watcher: SceneWatch,
                        stopped: Callable[[], bool]) -> AsyncIterator[float | None]:
    """Watch mode's moments to ask the standing question, for every
    door: each (rate-limited) scene change, none while the model loads,
    and never one that cuts an answer short: a change during an answer
    is asked about once that answer's Done is delivered. Ends when
    ``stopped()`` says watching was switched off."""
    async for t in watcher.changes(stopped):
        if t is not None:
            conversation.event_hub.publish(SceneChanged(t))
        if conversation.host is None or conversation.host.engine_now("main") is None:
            continue
        while (run := conversation._chat_run) is not None and not run.over.is_set() and not stopped():
            try:  # looked at again each second: watching switched off meanwhile ends here
                await asyncio.wait_for(asyncio.shield(run.over.wait()), 1.0)
            except asyncio.TimeoutError:
                pass
        if stopped():
            return
        yield t


async def heard(listener: Listener, stale: Callable[[], bool] = lambda: False,
                starts: bool = False) -> AsyncIterator[Event]:
    """Talk mode's turns for a door, from the session's listener
    (vidchat.conversation.modes): each finished utterance (and, with ``starts``, each
    speech start) until ``stale()`` says this reader is done (looked at
    every second while nothing is heard). An utterance heard just as the
    reader went stale is put back for the next reader, never dropped."""
    while True:
        waiter: asyncio.Future[Event] = asyncio.ensure_future(
            listener.next_event() if starts else listener.next_utterance())
        try:
            while not waiter.done():
                await asyncio.wait({waiter}, timeout=1.0)
                if stale():
                    return
        finally:
            got = waiter.result() if waiter.done() and not waiter.cancelled() and waiter.exception() is None \
                else None
            if isinstance(got, Utterance) and stale():
                listener.put_back(got)
            waiter.cancel()
        yield waiter.result()


# Talk mode: hands-free questions from a session's own audio.
#
# A :class:`Listener` follows one session's 16 kHz audio with a turn detector
# (:mod:`vidchat.media.vad`, in its worker thread). When speech starts while an
# answer streams, it stops that answer (barge-in: the vLLM request is
# aborted); when an utterance ends, it hands the utterance to whichever door
# turned Talk on (the page's Talk switch, a socket's ``turn_detection``),
# which asks it through the one answer path (:func:`vidchat.conversation.asking.ask` with
# ``spoken=``). Both doors share this code and its rules.

# How often the listener looks for new audio. WebRTC delivers 20 ms packets;
# the detector's window is 32 ms: 40 ms keeps the decision within a window
# or two of the audio while costing a wake-up per session 25 times a second.
TALK_POLL_S = 0.04

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

    entry: Talker  # the session's (not imported at run time: it imports this module)
    settings: TurnSettings = field(default_factory=TurnSettings)
    barge_in: bool = True
    # Called as speech starts: a spoken question is coming (the server's
    # warm-ups take this session first, vidchat.conversation.warmup question_coming).
    on_speech: Callable[[], None] | None = None
    stats: TalkStats = field(default_factory=TalkStats)
    events: asyncio.Queue[Event] = field(default_factory=lambda: asyncio.Queue(maxsize=64))
    # The state a page shows: "listening", "hearing you".
    hearing: bool = False
    speech_starts: int = 0
    level_dbfs: float | None = None  # the microphone's last level (None: no audio heard yet)
    level_t: float | None = None  # its time on the session's timeline
    _level_at: float = float("-inf")
    _detector: TurnDetector | None = None
    _task: asyncio.Task[None] | None = None
    _pos: float | None = None
    _playback_until: float = 0.0
    _returned: collections.deque[Utterance] = field(default_factory=collections.deque)

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

    async def next_event(self) -> Event:
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
                await asyncio.sleep(TALK_POLL_S)
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
            if self.barge_in and self.entry.chat.answer is not None:
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


def listener(entry: Talker, settings: TurnSettings | None = None, barge_in: bool = True,
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


def speech_warms(host: Host, entry: SessionRecord) -> Callable[[], None] | None:
    """A listener's ``on_speech`` that warms the session first (a spoken
    question is coming), when the server has warm-ups."""
    prewarmer = host.prewarmer
    if prewarmer is None:
        return None
    return lambda: prewarmer.question_coming(entry.session.id)


async def stop(entry: Talker) -> None:
    current: Listener | None = getattr(entry, "talk", None)
    if current is not None:
        await current.stop()
