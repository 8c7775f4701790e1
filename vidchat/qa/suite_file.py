"""A QA suite is a folder: ``suite.toml`` at its root (read with tomllib),
its clips and bundles beside it, ``baseline.json`` once a run wrote one.
This module reads and checks the file, before any engine starts: an unknown
key, check, setting or a wrong type is refused naming the file, the case and
the field. The format is the one docs/qa.md shows::

    name = "door-checks"
    [settings]                    # any setting by its socket name; a case may override
    temperature = 0
    [[case]]
    name = "red-door"
    video = "clips/red-door.mp4"  # or: bundle = "bundles/0007.zip"
    settings = { num_sample_frames = 4 }
      [[case.ask]]
      at = 2.0                    # seconds into the file; a bundle case has none
      question = "What colour is the door?"
      expect = { contains = ["red"], same_as_baseline = true }
"""

from __future__ import annotations

import json
import math
import re
import shutil
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from vidchat.conversation import bundles, suite_cases
from vidchat.conversation.bundles import BundleError, read_manifest
from vidchat.conversation.suite_cases import BASELINE_FILE, SUITE_FILE
from vidchat.qa.commands import UsageError, changes_of

CHECKS = ("contains", "not_contains", "matches", "max_first_token_ms", "same_as_baseline", "memory_frames_within")


class SuiteError(ValueError):
    """The suite can't be read: the message names the file, the case and the field."""


@dataclass(frozen=True)
class Ask:
    question: str | None  # None: a bundle case's recorded question
    at: float | None  # seconds into the video; None for a bundle
    expect: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    name: str
    video: Path | None
    bundle: Path | None
    settings: dict[str, Any]  # the suite's, overridden by the case's, by socket name
    asks: tuple[Ask, ...]
    note: str = ""
    mark: dict[str, str] | None = None  # the answer's QA verdict when it was added ({"mark", "note"}: answer_marks)


@dataclass(frozen=True)
class Suite:
    name: str
    root: Path
    cases: tuple[Case, ...]

    def baseline(self) -> dict[str, Any]:
        """{model: {case: {ask index: answer}}}; empty without a baseline file."""
        path = self.root / BASELINE_FILE
        if not path.is_file():
            return {}
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise SuiteError(f"{path}: not readable as JSON: {exc}") from None
        if not isinstance(data, dict):
            raise SuiteError(f"{path}: expected an object of models, got {type(data).__name__}")
        return data


def _where(root: Path, case: str | None = None, ask: int | None = None) -> str:
    out = str(root / SUITE_FILE)
    if case is not None:
        out += f", case {case!r}"
    if ask is not None:
        out += f", ask {ask}"
    return out


def _only(table: dict[str, Any], known: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise SuiteError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}")


def _typed(value: Any, kind: type | tuple[type, ...], where: str, name: str) -> Any:
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        wanted = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise SuiteError(f"{where}: {name} must be {wanted}, got {value!r}")
    return value


def _settings(values: Any, where: str) -> dict[str, Any]:
    _typed(values, dict, where, "settings")
    try:
        changes_of(dict(values), f"{where}: settings")
    except UsageError as exc:
        raise SuiteError(str(exc)) from None
    return dict(values)


def _in_range(settings: dict[str, Any], own: dict[str, Any], where: str) -> None:
    """Each of a case's settings within the settings table's range (the one
    every door checks against), so a value out of range is refused before
    any engine starts rather than failing every ask. A bound that depends on
    the model (max_tokens against its context) is the engine's to check."""
    from vidchat.conversation.asking import ALIASES, SETTINGS, UNBOUNDED_MAX_TOKENS

    for key, value in settings.items():
        name = ALIASES.get(key, key)
        try:
            SETTINGS[name].check(value, name=key, high=UNBOUNDED_MAX_TOKENS if name == "max_tokens" else None)
        except ValueError as exc:
            origin = "settings" if key in own else "settings (from the suite's [settings])"
            raise SuiteError(f"{where}: {origin}: {exc}") from None


def _expect(values: Any, where: str) -> dict[str, Any]:
    _typed(values, dict, where, "expect")
    unknown = sorted(set(values) - set(CHECKS))
    if unknown:
        raise SuiteError(f"{where}: unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECKS)}")
    for name in ("contains", "not_contains"):
        if name in values:
            words = values[name]
            if isinstance(words, str):
                words = [words]
            if not isinstance(words, list) or not all(isinstance(w, str) and w.strip() for w in words):
                raise SuiteError(f"{where}: expect.{name} must be a list of words or phrases, got {values[name]!r}")
    if "matches" in values:
        _typed(values["matches"], str, where, "expect.matches")
        try:
            re.compile(values["matches"])
        except re.error as exc:
            raise SuiteError(f"{where}: expect.matches is not a Python regex: {exc}") from None
    if "max_first_token_ms" in values:
        limit = _typed(values["max_first_token_ms"], (int, float), where, "expect.max_first_token_ms")
        if not (math.isfinite(limit) and limit > 0):
            raise SuiteError(f"{where}: expect.max_first_token_ms must be above 0, got {limit!r}")
    if "same_as_baseline" in values:
        _typed(values["same_as_baseline"], bool, where, "expect.same_as_baseline")
    if "memory_frames_within" in values:
        span = values["memory_frames_within"]
        if not (isinstance(span, list) and len(span) == 2 and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in span)
                and span[0] <= span[1]):
            raise SuiteError(f"{where}: expect.memory_frames_within must be [start, end] in seconds of the clip, "
                             f"start <= end, got {span!r}")
    return dict(values)


def _ask(raw: Any, root: Path, case: str, index: int, is_bundle: bool) -> Ask:
    where = _where(root, case, index)
    _typed(raw, dict, where, "ask")
    _only(raw, ("at", "question", "expect"), where)
    question = raw.get("question")
    if question is not None:
        _typed(question, str, where, "question")
        if not question.strip():
            raise SuiteError(f"{where}: question is empty")
    at = raw.get("at")
    if is_bundle:
        if at is not None:
            raise SuiteError(f"{where}: a bundle case has no at (its recorded moment)")
    else:
        if at is None:
            raise SuiteError(f"{where}: at (seconds into the video) is missing")
        _typed(at, (int, float), where, "at")
        if not (math.isfinite(at) and at >= 0):
            raise SuiteError(f"{where}: at must be a number of seconds from 0, got {at!r}")
        if question is None:
            raise SuiteError(f"{where}: question is missing (only a bundle case may leave it out)")
    return Ask(question, None if at is None else float(at), _expect(raw.get("expect", {}), where))


def _case(raw: Any, root: Path, index: int, defaults: dict[str, Any], names: set[str]) -> Case:
    where = _where(root, f"#{index + 1}")
    _typed(raw, dict, where, "case")
    name = _typed(raw.get("name", suite_cases.default_name(index)), str, where, "name")
    where = _where(root, name)
    _only(raw, ("name", "video", "bundle", "settings", "ask", "note", "mark"), where)
    if name in names:
        raise SuiteError(f"{where}: two cases have this name")
    names.add(name)
    video, bundle = raw.get("video"), raw.get("bundle")
    if (video is None) == (bundle is None):
        raise SuiteError(f"{where}: give exactly one of video or bundle")
    source = _typed(video if video is not None else bundle, str, where, "video" if video is not None else "bundle")
    own = _settings(raw.get("settings", {}), where)
    settings = {**defaults, **own}
    _in_range(settings, own, where)
    asks_raw = raw.get("ask", [{}] if bundle is not None else None)
    if not isinstance(asks_raw, list) or not asks_raw:
        raise SuiteError(f"{where}: ask must be one or more [[case.ask]] tables")
    asks = tuple(_ask(a, root, name, i, bundle is not None) for i, a in enumerate(asks_raw))
    if bundle is not None and len(asks) != 1:
        raise SuiteError(f"{where}: a bundle case has one ask (its recorded question)")
    path = root / source
    return Case(name, path if video is not None else None, path if bundle is not None else None, settings, asks,
                _typed(raw.get("note", ""), str, where, "note"), _mark(raw.get("mark"), where))


def _mark(raw: Any, where: str) -> dict[str, str] | None:
    """A case's ``mark = { mark = "good" | "bad", note = "…" }`` (the verdict of the answer it was made from)."""
    if raw is None:
        return None
    _typed(raw, dict, where, "mark")
    _only(raw, ("mark", "note"), f"{where}: mark")
    try:
        return bundles.checked(raw.get("mark"), raw.get("note", ""))
    except ValueError as exc:
        raise SuiteError(f"{where}: {exc}") from None


def read_suite(folder: str | Path) -> Suite:
    """The suite in ``folder`` (or the suite file itself), checked whole; raises SuiteError."""
    path = Path(folder)
    root = path.parent if path.name == SUITE_FILE else path
    file = root / SUITE_FILE
    try:
        data = tomllib.loads(file.read_text())
    except FileNotFoundError:
        raise SuiteError(f"{file}: no such file (a suite is a folder with {SUITE_FILE} at its root)") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SuiteError(f"{file}: {exc}") from None
    _only(data, ("name", "settings", "case"), str(file))
    name = _typed(data.get("name", root.name), str, str(file), "name")
    defaults = _settings(data.get("settings", {}), str(file))
    cases_raw = data.get("case", [])
    if not isinstance(cases_raw, list) or not cases_raw:
        raise SuiteError(f"{file}: no [[case]] in it")
    names: set[str] = set()
    return Suite(name, root, tuple(_case(c, root, i, defaults, names) for i, c in enumerate(cases_raw)))


def _bundle_mark(bundle: Path) -> dict[str, str] | None:
    """The mark a recorded bundle carries (its manifest's), or None."""
    try:
        manifest = read_manifest(bundle)
    except (BundleError, OSError, zipfile.BadZipFile):
        return None  # the run says what is wrong with the bundle, as its case's error
    return bundles.of_manifest(manifest)


def add_bundle(folder: str | Path, bundle: str | Path, *, name: str | None = None, contains: Sequence[str] = (),
               same_as_baseline: bool = False, note: str = "") -> Case:
    """Copy a recorded bundle into the suite (``bundles/``) and add a case
    that re-asks it (vidchat.conversation.suite_cases); the suite file is
    made when there is none. Returns the case as read back, so the file stays valid."""
    root = Path(folder)
    source = Path(bundle)
    if not source.exists():
        raise SuiteError(f"{source}: no such bundle")
    if (root / SUITE_FILE).is_file():
        read_suite(root)  # a suite that can't be read is not added to
    case_name = suite_cases.free_name(root, name or source.name.removesuffix(".zip"))
    (root / "bundles").mkdir(parents=True, exist_ok=True)
    target = root / "bundles" / (case_name + (".zip" if source.suffix == ".zip" else ""))
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copyfile(source, target)
    try:
        suite_cases.append_case(root, case_name, target, contains=contains, same_as_baseline=same_as_baseline,
                                note=note, mark=_bundle_mark(target))
    except BaseException:
        # Refused (a note TOML can't hold, a name taken meanwhile): the copy goes too, so no orphan
        # bundle is left to block the next add of that name.
        shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        raise
    return next(c for c in read_suite(root).cases if c.name == case_name)
