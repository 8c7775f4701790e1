"""Watch and Talk as tasks of a session's conversation, for a door that only
listens (the page): the standing question asked at each scene change, and
each utterance asked as it ends. They run until switched off, Stop (Watch)
or the session's end, whoever reads the chat; a typed question never ends
them (its answer cuts a running one short by the conversation's one rule,
and watching goes on from the new chat). What each asks with is read at
the moment it asks (``options``), so settings changed meanwhile count.

The socket doors say these modes in their own protocol (vidchat.doors.socket_watch,
vidchat.doors.socket_turns) over the same two primitives, here:
:func:`scene_changes` (when Watch asks) and :func:`heard` (what Talk asks)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Callable

import vidchat.conversation.talk as talk
from vidchat.conversation.session_events import SCENE, SPOKEN, SceneChanged
from vidchat.conversation.watch import SceneWatch
from vidchat.media.vad import TurnSettings, Utterance

log = logging.getLogger(__name__)

Options = Callable[[], Any]  # the AnswerOptions a mode's question is asked with, read as it is asked


class Modes:
    """One conversation's Watch and Talk tasks (``conversation.modes``)."""

    def __init__(self, conversation: Any) -> None:
        self.conversation = conversation
        self._watch: asyncio.Task | None = None
        self._talk: asyncio.Task | None = None
        self.watch_question: str | None = None

    @property
    def watching(self) -> bool:
        return self._watch is not None and not self._watch.done()

    @property
    def talking(self) -> bool:
        return self._talk is not None and not self._talk.done()

    def watch(self, question: str, every_s: float, options: Options) -> None:
        """Ask ``question`` at each scene change, at most every ``every_s``
        seconds (replacing a watch already running)."""
        self.stop_watching()
        entry = self.conversation
        watcher = SceneWatch(entry.session, every_s)
        self.watch_question = question
        self._watch = asyncio.get_running_loop().create_task(self._watching(watcher, question, options),
                                                             name=f"watch-{entry.session.id[:6]}")

    def stop_watching(self) -> None:
        task, self._watch = self._watch, None
        self.watch_question = None
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

    def talk(self, settings: TurnSettings, barge_in: bool, options: Options, on_speech: Any = None) -> None:
        """Ask each utterance the session's microphone hears, as it ends
        (the listener, with barge-in, is the session's: vidchat.conversation.talk)."""
        entry = self.conversation
        listener = talk.listener(entry, settings, barge_in, on_speech=on_speech)
        if self.talking:
            return  # the running task reads the same listener, with its new settings
        self._talk = asyncio.get_running_loop().create_task(self._talking(listener, options),
                                                            name=f"talk-{entry.session.id[:6]}")

    async def stop_talking(self) -> None:
        task, self._talk = self._talk, None
        if task is not None:
            task.cancel()
        await talk.stop(self.conversation)

    async def _talking(self, listener: Any, options: Options) -> None:
        conversation = self.conversation
        me = asyncio.current_task()

        def stale() -> bool:
            return self._talk is not me or not listener.running or conversation.closed

        try:
            async for spoken in heard(listener, stale):
                conversation.submit("", options, cause=SPOKEN, spoken=spoken)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - Talk ends, the session goes on
            log.exception("session %s…: talk failed", conversation.session.id[:6])


async def scene_changes(conversation: Any, watcher: SceneWatch,
                        stopped: Callable[[], bool]) -> AsyncIterator[float | None]:
    """Watch mode's moments to ask the standing question, for every
    door: each (rate-limited) scene change, none while the model loads,
    and never one that cuts an answer short: a change during an answer
    is asked about once that answer's Done is delivered. Ends when
    ``stopped()`` says watching was switched off."""
    async for t in watcher.changes(stopped):
        if t is not None:
            conversation.event_hub.publish(SceneChanged(t))
        if conversation.state.engine is None:
            continue
        while (run := conversation._chat_run) is not None and not run.finished.is_set() and not stopped():
            try:  # looked at again each second: watching switched off meanwhile ends here
                await asyncio.wait_for(asyncio.shield(run.finished.wait()), 1.0)
            except asyncio.TimeoutError:
                pass
        if stopped():
            return
        yield t

async def heard(listener: Any, stale: Callable[[], bool] = lambda: False,
            starts: bool = False) -> AsyncIterator[Any]:
    """Talk mode's turns for a door, from the session's listener
    (vidchat.conversation.talk): each finished utterance (and, with ``starts``, each
    speech start) until ``stale()`` says this reader is done (looked at
    every second while nothing is heard). An utterance heard just as the
    reader went stale is put back for the next reader, never dropped."""
    while True:
        waiter = asyncio.ensure_future(listener.next_event() if starts else listener.next_utterance())
        try:
            while not waiter.done():
                await asyncio.wait({waiter}, timeout=1.0)
                if stale():
                    return
        finally:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None and stale() \
                    and isinstance(waiter.result(), Utterance):
                listener.put_back(waiter.result())
            waiter.cancel()
        yield waiter.result()
