"""Re-ask and compare on the page: an earlier answer's exact inputs (the
session's kept answers, or a bundle loaded into the tab) asked again with
other settings, or on the second model, beside the chat."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import weakref
from pathlib import Path
from typing import Any, AsyncIterator

from vidchat.conversation import CANCELLED, Conversation, Delta, Done, answer_path, kept, recording
from vidchat.media.session import Session
from vidchat.doors.markup import as_text
from vidchat.doors.page.answers import page_request
from vidchat.doors.page.view import _short, compare_html, model_label, second_model_label
from vidchat.engine import EngineError


# A tab holds one loaded bundle; loading another replaces it. (It held 8,
# each up to 512 MB decoded plus its audio, and an API client can open tabs
# at will.) Its frames stay PNG bytes until re-asked (recording.LazyFrames).
MAX_LOADED_BUNDLES = 1
MAX_BUNDLE_BYTES = 256 << 20  # a bundle of 64 frames at 1280×720 is ~100 MB of PNG


class TabBundles(dict):
    """A tab's loaded bundle by answer id, and ``slot``: where all the tab's
    re-asks run while it has no session, kept across loads, so a re-ask
    replaces the tab's running one and a tab holds one answer place at most
    (a fresh slot per call let one tab take every --max-concurrent-answers place)."""

    def __init__(self, *args: Any, slot: Conversation | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slot = slot


# Each tab's loaded bundles by its Gradio session, held weakly (the tab's own
# state holds them): the chat feed lists them in the re-ask list beside the
# chat's answers without the tab sending them again.
_TABS: "weakref.WeakValueDictionary[str, TabBundles]" = weakref.WeakValueDictionary()


def remember_tab(tab: str | None, loaded: Any) -> None:
    if tab and isinstance(loaded, TabBundles):
        _TABS[tab] = loaded


def tab_bundles(tab: str | None) -> dict | None:
    return _TABS.get(tab) if tab else None


def _tab_slot(state: Any, loaded: dict | None) -> Conversation:
    """The entry a tab's re-asks run on when it has no session (see TabBundles)."""
    slot = getattr(loaded, "slot", None)
    if slot is None:
        # Outside the registry (it holds no media), with its own cache salt.
        slot = Conversation(Session("bundle-" + secrets.token_urlsafe(9)), kind="bundle", state=state)
        if isinstance(loaded, TabBundles):
            loaded.slot = slot
    return slot


def _audio_cap(state: Any) -> float:
    """Most seconds of audio a loaded bundle may hold: the socket doors' --ws-max-audio-seconds."""
    return getattr(getattr(state, "settings", None), "ws_max_audio_seconds", recording.MAX_AUDIO_SECONDS)


def reask_choices(state, sid: str, loaded: dict | None = None) -> list[tuple[str, str]]:
    """The answers of the session's chat (not of a cleared one), newest
    first, then bundles loaded into this tab, as (label, answer id). A label
    starts with when the question was asked, on the session's timeline
    (seconds since its first media, as the frames' captions), so the same
    question asked twice reads as two even where a phone cuts the label short."""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    out = []
    if entry is not None:
        start = entry.session.timeline_start
        for n, (answer_id, answer) in enumerate(kept.chat_answers(entry)):
            when = [] if start is None else [f"at {answer.asked_at - start:.1f} s"]
            head = ", ".join((["latest"] if n == 0 else []) + when)
            out.append((f"{head + ': ' if head else ''}{_short(answer.question)} ({len(answer.sample.frames)} "
                        f"frames, T={answer.options.temperature:g})", answer_id))
    return out + bundle_choices(loaded)


def bundle_choices(loaded: dict | None) -> list[tuple[str, str]]:
    """The bundles loaded into this tab, newest first, as (label, answer id)."""
    return [(f"bundle: {_short(answer.question)} ({len(answer.sample.frames)} frames, {answer.bundle_name})",
             answer_id) for answer_id, answer in reversed((loaded or {}).items())]


def reask_engines(state) -> list[tuple[str, str]]:
    """The models a re-ask can go to, as (label, value) for the page's radio."""
    out = [(f"{model_label(state)} (this server's model)", "main")]
    if state.compare_model_path:
        out.append((f"{second_model_label(state)} (--compare-model)", "compare"))
    return out


async def _reask_engine(state, which: str):
    if which == "compare":
        ready, reason = state.compare_readiness()
        if not ready:
            raise EngineError(reason)
        return state.compare_engine
    return await state.wait_engine(timeout=0)


async def load_bundle(state, path: Any, loaded: dict | None) -> tuple[dict, list[tuple[str, str]], str, str]:
    """Read an uploaded bundle zip into this tab, in place of the one it held:
    (loaded, its choice list, the id to select, a message). The upload is
    deleted once read."""
    loaded = TabBundles(loaded or {}, slot=getattr(loaded, "slot", None))
    if not path:
        return loaded, [], "", ""
    path = str(getattr(path, "path", path))
    try:
        size = Path(path).stat().st_size
        if size > MAX_BUNDLE_BYTES:
            raise recording.BundleError(f"the file is {size / 2**20:.0f} MiB; a bundle may be at most "
                                        f"{MAX_BUNDLE_BYTES >> 20} MiB")
        bundle = await asyncio.to_thread(recording.read_bundle, path, lazy=True,
                                         max_audio_seconds=_audio_cap(state))
        intact = await asyncio.to_thread(lambda: bundle.digest() == bundle.inputs_sha256)
    except (recording.BundleError, OSError) as exc:
        return loaded, [], "", f"<p class='vc-note'>⚠ Not a bundle vidchat can read: {as_text(str(exc))}</p>"
    finally:
        try:  # Gradio kept the upload on disk; nothing of it stays once read
            Path(path).unlink()
        except OSError:
            pass
    answer = recording.recorded_answer(bundle)
    answer_id = "bundle-" + secrets.token_urlsafe(12)
    loaded[answer_id] = answer
    while len(loaded) > MAX_LOADED_BUNDLES:  # the one loaded before goes (a re-ask of it running ends on its own)
        loaded.pop(next(iter(loaded)))
    warn = ("" if intact else " Its frames and audio do not hash to the inputs_sha256 it records: the files were "
            "changed after recording.")
    # Only what this page offers: a model to choose only when a second one is served.
    choose = ("Choose the model, change Settings above if you like" if state.compare_model_path else
              "Change Settings above if you like")
    # In a worker: its record reads every frame's size, which decodes the lazy frames.
    message = await asyncio.to_thread(
        compare_html, answer, None, "", f"Loaded the bundle ({len(answer.sample.frames)} frames"
        f"{', audio' if answer.sample.audio is not None else ''}). {choose}, then press "
        "“Re-ask with these settings”." + warn)
    return loaded, [], answer_id, message


async def reask(state, sid: str, answer_id: str, *raw_settings: Any, engine_choice: str = "main",
                loaded: dict | None = None) -> AsyncIterator[str]:
    """Ask an earlier answer's (or a loaded bundle's) question again on its
    exact frames, audio and history, with the page's current settings and
    the chosen model; yields the comparison."""
    entry = state.registry.get(sid) if isinstance(sid, str) else None
    original = None
    if isinstance(answer_id, str):
        original = (entry.answers.get(answer_id) if entry is not None else None) or (loaded or {}).get(answer_id)
    if original is None:
        yield ("<p class='vc-note'>Pick an answer of this session (answers are kept while the session runs) or "
               "load a recorded bundle to re-ask.</p>")
        return
    try:
        engine = await _reask_engine(state, engine_choice if engine_choice in ("main", "compare") else "main")
    except EngineError as exc:
        yield f"<p class='vc-note'>⚠ {as_text(str(exc))}</p>"
        return
    # A loaded bundle's frames, decoded for this re-ask (its comparison reads each frame's size at every update).
    original = await asyncio.to_thread(recording.with_frames_decoded, original)
    try:
        request = page_request(state, *raw_settings)
        answer_path.check_options(request.options, engine)
        wanted = request.sampling["num_sample_frames"]
        sample = answer_path.frozen_sample(original, wanted)
    except ValueError as exc:
        yield f"<p class='vc-note'>⚠ Settings not accepted: {as_text(str(exc))}</p>"
        return
    note = (f"The original had {len(original.sample.frames)} frames; all of them are used."
            if wanted > len(original.sample.frames) else "")
    if entry is None:
        # A bundle re-asked before any source started: the tab's own slot,
        # which each of its re-asks shares (one answer place per tab).
        entry = _tab_slot(state, loaded)
    heading = "Re-asked" if engine is state.engine else "Re-asked on the second model"
    try:
        run = await entry.reask(original, request.options, sample, engine=engine)
    except answer_path.Superseded:
        return
    except EngineError as exc:
        yield f"<p class='vc-note'>⚠ {as_text(str(exc))}</p>"
        return
    yield compare_html(original, None, "", note, heading)
    async with contextlib.aclosing(run.events()) as events:
        async for event in events:
            if isinstance(event, Delta):
                yield compare_html(original, None, run.answer.reply.text, note, heading)
            elif isinstance(event, Done):
                if not event.current:
                    return  # a newer re-ask of this tab replaced it: the comparison is that one's now
                if event.error:
                    note = f"⚠ {event.error}"
                elif event.status == CANCELLED:
                    note = "Stopped."
                yield compare_html(original, event.answer, event.text, note, heading)
