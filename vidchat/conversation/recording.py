"""Recorded bundles read back, and the one module callers name for bundles.

:func:`read_bundle` reads a bundle folder, or a zip holding one, into the
engine's exact inputs and the manifest, without extracting a zip; a manifest
from elsewhere is checked value by value before a frame is decoded
(:func:`vidchat.conversation.bundle_check.check_manifest`);
:func:`recorded_answer` makes a bundle a finished answer the page can list
and re-ask. The format (layout, manifest fields, audio encoding) is
:mod:`vidchat.conversation.bundle_format`; writing and zipping bundles is
:mod:`vidchat.conversation.bundle_write`. Those and the manifest check are
named here too (``__all__``), so a caller imports one module for bundles.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
import weakref
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from vidchat.conversation.bundle_check import check_manifest
from vidchat.conversation.bundle_format import (
    AUDIO_FILE, BUNDLE_VERSION, KIND, MANIFEST, MAX_BUNDLE_DECODED_BYTES, MAX_BUNDLE_FRAMES, MAX_FRAME_PIXELS,
    MAX_MEMBER_BYTES, BundleError, WavTooLong, audio_used, png_bytes, read_png, read_wav, wav_bytes,
)
from vidchat.conversation.bundle_write import history_dicts, iter_zip_bundles, write_bundle, zip_bundles
from vidchat.media.session import MAX_AUDIO_SECONDS
from vidchat.conversation.recorded_reply import RecordedReply  # noqa: F401 (a bundle's answer)
from vidchat.engine import Turn, inputs_digest
from vidchat.media import AUDIO_RATE

__all__ = [
    "AUDIO_FILE", "BUNDLE_VERSION", "KIND", "MANIFEST", "MAX_AUDIO_SECONDS", "MAX_BUNDLE_DECODED_BYTES",
    "MAX_BUNDLE_FRAMES", "MAX_FRAME_PIXELS", "MAX_MEMBER_BYTES", "Bundle", "BundleError", "LazyFrames",
    "RecordedReply", "audio_used", "check_manifest", "history_dicts", "is_bundle", "iter_zip_bundles", "png_bytes",
    "read_bundle", "read_png", "read_wav", "recorded_answer", "wav_bytes", "with_frames_decoded", "write_bundle",
    "zip_bundles",
]

# A bundle's file names: no path, nothing hidden.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class _Decoded(list):
    """A LazyFrames' frames decoded (a list that can be referred to weakly)."""


class LazyFrames(Sequence[np.ndarray]):
    """A bundle's frames kept as their PNG bytes and decoded when read, for a
    bundle the page holds between re-asks: a small zip of uniform frames may
    decode to 512 MB, and a tab would hold that for as long as it is open.

    An index decodes that one frame; :meth:`decoded` decodes them all once
    and shares the list while anyone holds it (concurrent re-asks of one
    bundle decode it once), so that iterating, while it is held, decodes
    nothing again."""

    def __init__(self, pngs: list[bytes], sizes: list[tuple[int, int]]) -> None:
        self._pngs, self._sizes = pngs, sizes
        self._held: weakref.ref | None = None
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        """What the frames take while nobody decodes them: their PNG bytes."""
        return sum(len(png) for png in self._pngs)

    def __len__(self) -> int:
        return len(self._pngs)

    def _shared(self) -> "_Decoded | None":
        return self._held() if self._held is not None else None

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        shared = self._shared()
        if shared is not None:
            return shared[index]
        index = range(len(self))[index]  # negative indices, and IndexError past the end
        return read_png(self._pngs[index], self._sizes[index])

    def __iter__(self):
        # One pass decodes each frame once; a held decoded list is reused.
        shared = self._shared()
        if shared is not None:
            return iter(list(shared))
        return (read_png(png, size) for png, size in zip(self._pngs, self._sizes))

    def decoded(self) -> list[np.ndarray]:
        """All the frames as arrays; hold the list while using them."""
        with self._lock:
            shared = self._shared()
            if shared is None:
                shared = _Decoded(read_png(png, size) for png, size in zip(self._pngs, self._sizes))
                self._held = weakref.ref(shared)
            return shared


@dataclass
class Bundle:
    """A bundle read back: the engine's exact inputs and the manifest."""

    path: str
    manifest: dict[str, Any]
    frames: Sequence[np.ndarray]  # RGB uint8 H×W×3, oldest first (a LazyFrames when read lazily)
    audio: np.ndarray | None  # float32 mono 16 kHz, or None
    frame_times: list[float] = field(default_factory=list)
    frame_indices: list[int] = field(default_factory=list)
    _digest: str | None = field(default=None, repr=False)  # computed as the frames were read (lazily read)

    @property
    def question(self) -> str:
        return self.manifest["question"]

    @property
    def spoken(self) -> Any:
        """The spoken question (a vidchat.media.vad.Utterance) when the audio was the question, else None."""
        from vidchat.media.vad import Utterance

        spoken = self.manifest.get("spoken_question")
        if not isinstance(spoken, dict):
            return None
        start = spoken.get("start") if isinstance(spoken.get("start"), (int, float)) else 0.0
        seconds = spoken.get("seconds") if isinstance(spoken.get("seconds"), (int, float)) else 0.0
        return Utterance(float(start), float(start) + float(seconds), level_dbfs=-120.0)

    @property
    def inputs_sha256(self) -> str:
        """What the manifest says the engine got."""
        return self.manifest.get("inputs_sha256", "")

    def digest(self) -> str:
        """The hash of the frames and audio as read back (equals inputs_sha256 for an intact bundle)."""
        if self._digest is not None:
            return self._digest
        return inputs_digest(self.frames, self.audio)

    def history(self) -> list[Turn]:
        return [Turn(h["role"], h["content"]) for h in self.manifest.get("history") or []]

    def sample(self):
        """The frames and audio as a :class:`vidchat.media.session.Sample`, on the
        recorded timeline (times as recorded, origin 0)."""
        from vidchat.media.session import Sample

        span = (self.manifest.get("audio") or {}).get("span") or [None, None]
        record = self.manifest.get("record") or {}
        positions = [f.get("source_t") for f in self.manifest.get("frames") or []]
        at_jump = record.get("frame_source_at_jump")
        if not (isinstance(at_jump, list) and len(at_jump) == len(self.frames)
                and all(isinstance(b, bool) for b in at_jump)):
            at_jump = []  # a bundle from before the field: nothing known
        source_span = record.get("audio_source_span")
        # The audio's segments as the engine got them, so a re-ask sends the
        # same clips; unnamed, so vLLM tells them apart by their samples.
        parts = record.get("audio_parts")
        audio_parts: tuple = ()
        if (self.audio is not None and isinstance(parts, list) and parts
                and all(isinstance(n, int) and n > 0 for n in parts) and sum(parts) == self.audio.size):
            audio_parts = tuple((n, None) for n in parts)
        # Lazy frames are shared, not copied: copying would decode them all.
        frames = self.frames if isinstance(self.frames, LazyFrames) else list(self.frames)
        return Sample(frames=frames, timestamps=list(self.frame_times),
                      indices=list(self.frame_indices), audio=self.audio,
                      audio_start=span[0], audio_end=span[1], origin=0.0,
                      source_times=positions if len(positions) == len(self.frames) else [],
                      source_at_jump=at_jump,
                      audio_source_span=tuple(source_span) if isinstance(source_span, list) and
                      len(source_span) == 2 else None,
                      source=record.get("source") if isinstance(record.get("source"), dict) else None,
                      audio_parts=audio_parts)


def with_frames_decoded(answer: Any) -> Any:
    """``answer`` with its frames as arrays, for one use of them all (a
    re-ask): a loaded bundle's lazy frames are decoded once and shared with
    any other use under way; any other answer is returned as it is."""
    frames = answer.sample.frames
    if not isinstance(frames, LazyFrames):
        return answer
    return dataclasses.replace(answer, sample=dataclasses.replace(answer.sample, frames=frames.decoded()))


def recorded_answer(bundle: Bundle):
    """A bundle as a finished :class:`vidchat.conversation.answer_path.Answer`: the page lists it
    beside the session's own answers and re-asks it the same way."""
    from vidchat.conversation.answer_marks import of_manifest
    from vidchat.conversation.answer_path import Answer, AnswerOptions

    settings = bundle.manifest.get("settings") or {}
    known = {f.name for f in dataclasses.fields(AnswerOptions)}
    options = AnswerOptions(**{k: v for k, v in settings.items() if k in known})
    if bundle.manifest.get("frames_as") in ("images", "video"):
        options.frames_as = bundle.manifest["frames_as"]
    return Answer(bundle.question, RecordedReply(bundle.manifest), bundle.sample(), options,
                  prompt_text=bundle.manifest.get("prompt") or "", video_fps=bundle.manifest.get("video_fps"),
                  history=tuple(bundle.history()), bundle_name=Path(bundle.path).name, spoken=bundle.spoken,
                  mark=of_manifest(bundle.manifest))


class _Folder:
    def __init__(self, path: Path):
        self.path = path

    def read(self, name: str) -> bytes:
        target = self.path / name
        if not target.is_file():
            raise BundleError(f"{self.path}: {name} is missing")
        return target.read_bytes()


class _Zip:
    def __init__(self, zf: zipfile.ZipFile, prefix: str):
        self.zf, self.prefix = zf, prefix

    def read(self, name: str) -> bytes:
        try:
            info = self.zf.getinfo(self.prefix + name)
        except KeyError:
            raise BundleError(f"{name} is missing from the zip") from None
        # A zip from elsewhere (the page takes uploads) may inflate a few
        # kilobytes into gigabytes: its declared size is checked first, and
        # the read stops there whatever the header claimed.
        if info.file_size > MAX_MEMBER_BYTES:
            raise BundleError(f"{name} would unpack to {info.file_size} bytes; a bundle file may be at most "
                              f"{MAX_MEMBER_BYTES} bytes")
        with self.zf.open(info) as member:
            data = member.read(MAX_MEMBER_BYTES + 1)
        if len(data) > MAX_MEMBER_BYTES:
            raise BundleError(f"{name} unpacks to more than {MAX_MEMBER_BYTES} bytes")
        return data


def _safe_file(name: Any) -> str:
    if not isinstance(name, str) or not _SAFE_NAME.match(name) or ".." in name:
        raise BundleError(f"bad file name in manifest: {name!r}")
    return name


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """A bundle's manifest alone (folder or zip, with the same size checks as
    :func:`read_bundle`), for what needs its fields and not its frames;
    raises BundleError."""
    p = Path(path)
    if p.is_dir():
        data = _Folder(p).read(MANIFEST)
    elif p.is_file() and zipfile.is_zipfile(p):
        with zipfile.ZipFile(p) as zf:
            found = _manifests(zf)
            if len(found) != 1:
                raise BundleError(f"{p}: a zip with {len(found)} bundles; unpack it and name one folder")
            data = _Zip(zf, found[0][: -len(MANIFEST)]).read(MANIFEST)
    else:
        raise BundleError(f"{p}: not a bundle folder or zip")
    try:
        manifest = json.loads(data)
    except ValueError as exc:
        raise BundleError(f"{p}: its manifest is not JSON: {exc}") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{p}: its manifest is not a JSON object")
    return manifest


def is_bundle(path: str | os.PathLike) -> bool:
    """A bundle folder, or a zip with exactly one bundle in it."""
    p = Path(path)
    if p.is_dir():
        return (p / MANIFEST).is_file()
    if p.is_file() and zipfile.is_zipfile(p):
        try:
            with zipfile.ZipFile(p) as zf:
                return len(_manifests(zf)) == 1
        except (zipfile.BadZipFile, OSError):
            return False
    return False


def _manifests(zf: zipfile.ZipFile) -> list[str]:
    return [n for n in zf.namelist() if PurePosixPath(n).name == MANIFEST and len(PurePosixPath(n).parts) <= 2]


def read_bundle(path: str | os.PathLike, *, lazy: bool = False,
                max_audio_seconds: float = MAX_AUDIO_SECONDS) -> Bundle:
    """Read a bundle folder (or a zip holding one bundle) into memory; raises
    BundleError. ``lazy``: its frames stay PNG bytes (:class:`LazyFrames`),
    each decoded once here to check it; ``max_audio_seconds``: longer audio
    is refused (a server passes its --ws-max-audio-seconds)."""
    p = Path(path)
    if p.is_dir():
        return _read(_Folder(p), str(p), lazy, max_audio_seconds)
    if p.is_file() and zipfile.is_zipfile(p):
        with zipfile.ZipFile(p) as zf:
            found = _manifests(zf)
            if len(found) != 1:
                raise BundleError(f"{p}: a zip with {len(found)} bundles; unpack it and name one folder")
            prefix = found[0][: -len(MANIFEST)]
            return _read(_Zip(zf, prefix), str(p), lazy, max_audio_seconds)
    raise BundleError(f"{p}: not a bundle folder or zip")


def _read_audio(src: _Folder | _Zip, where: str, entry: dict[str, Any]) -> np.ndarray:
    """A bundle's audio, held to what its manifest says (audio.seconds, and
    audio.samples when given): a WAV longer than the manifest says is refused
    before it is converted, so the checked seconds bound what is decoded."""
    seconds = entry["seconds"]
    expected = round(seconds * AUDIO_RATE)
    try:
        audio, rate = read_wav(src.read(_safe_file(entry.get("file"))), max_samples=expected + 1)
    except WavTooLong as exc:
        raise BundleError(f"{where}: its audio file holds {exc.samples / exc.rate:g} s of audio; the manifest "
                          f"field 'audio.seconds' says {seconds:g} s") from None
    if rate != AUDIO_RATE:
        raise BundleError(f"{where}: audio at {rate} Hz; bundles hold {AUDIO_RATE} Hz")
    # Within a sample: the writer rounds seconds to the microsecond.
    if abs(audio.size - seconds * AUDIO_RATE) > 1:
        raise BundleError(f"{where}: its audio file holds {audio.size / AUDIO_RATE:g} s of audio; the manifest "
                          f"field 'audio.seconds' says {seconds:g} s")
    samples = entry.get("samples")
    if samples is not None and samples != audio.size:
        raise BundleError(f"{where}: its audio file holds {audio.size} samples; the manifest field "
                          f"'audio.samples' says {samples}")
    return audio


def _read(src: _Folder | _Zip, where: str, lazy: bool = False,
          max_audio_seconds: float = MAX_AUDIO_SECONDS) -> Bundle:
    try:
        manifest = json.loads(src.read(MANIFEST).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{where}: manifest.json is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{where}: manifest.json is not an object")
    version = manifest.get("version")
    if version != BUNDLE_VERSION:
        raise BundleError(f"{where}: bundle version {version!r}; this vidchat reads version {BUNDLE_VERSION}")
    spoken = isinstance(manifest.get("spoken_question"), dict) and manifest.get("audio")
    if not isinstance(manifest.get("question"), str) or not (manifest["question"].strip() or spoken):
        raise BundleError(f"{where}: the manifest has no question (neither text nor a spoken question's audio)")
    check_manifest(manifest, where, max_audio_seconds)
    listed = manifest.get("frames") or []
    if not listed:
        raise BundleError(f"{where}: the bundle has no frames")
    audio_entry = manifest.get("audio")
    audio = _read_audio(src, where, audio_entry) if audio_entry else None
    times = [entry.get("t") for entry in listed]
    indices = [entry.get("index") for entry in listed]
    sizes = [(entry["width"], entry["height"]) for entry in listed]
    digest = None
    if lazy:
        pngs: list[bytes] = []
        held = 0 if audio is None else audio.nbytes

        def checked():  # each frame decoded once, to check it and hash it, then dropped
            nonlocal held
            for entry, size in zip(listed, sizes):
                png = src.read(_safe_file(entry.get("file")))
                held += len(png)
                # A PNG far larger than its pixels (padding chunks) would make the kept bytes the bomb.
                if held > MAX_BUNDLE_DECODED_BYTES:
                    raise BundleError(f"{where}: its frame files and audio take more than "
                                      f"{MAX_BUNDLE_DECODED_BYTES >> 20} MB")
                pngs.append(png)
                yield read_png(png, size)

        digest = inputs_digest(checked(), audio)
        frames: Sequence[np.ndarray] = LazyFrames(pngs, sizes)
    else:
        frames = [read_png(src.read(_safe_file(entry.get("file"))), size) for entry, size in zip(listed, sizes)]
    if any(t is None for t in times):  # recorded without times: evenly spaced, for a video's rate only
        times = [float(i) for i in range(len(frames))]
    return Bundle(where, manifest, frames, audio, times, [i if i is not None else n for n, i in enumerate(indices)],
                  _digest=digest)
