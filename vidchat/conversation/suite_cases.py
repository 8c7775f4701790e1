"""Adding a recorded answer to a QA suite's folder (docs/suites.md): the
case that re-asks it, added to suite.toml, and its answer kept as a model's
baseline. The one rule for ``vidchat suite add`` (vidchat.qa.suite), the
page's Add to suite (vidchat.doors.answer_routes) and ``--update-baseline``;
reading and checking a suite is vidchat.qa.suite_file.

suite.toml is edited with tomlkit, which keeps a hand-edited file's comments
and layout and writes every string escaped as TOML needs (a DEL is
``\\u007f``). Text no file can hold (a lone surrogate) is refused, naming its
field, before anything is made. The new file is read back with tomllib, as
every run reads it, before it replaces the old one (vidchat.conversation.safe_files),
and every writer of the suite's files holds its lock file, the server's
and the command line's alike."""

from __future__ import annotations

import json
import logging
import shutil
import tomllib
from pathlib import Path
from typing import Any, Callable, Sequence

import tomlkit
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import AoT

from vidchat.conversation.safe_files import locked, writable, write_whole

log = logging.getLogger(__name__)

SUITE_FILE = "suite.toml"
BASELINE_FILE = "baseline.json"
# Which login added which case from the page ({case: login}; "" without a login): --suite-max-cases.
ADDED_BY_FILE = ".added-by.json"

Baseline = dict[str, dict[str, dict[str, str]]]  # {model: {case: {ask index: answer}}}


class SuiteConflict(ValueError):
    """The suite as it is on disk can't take the case (a file of it can't be
    read, or it has a case of that name); nothing is added to it."""


class TooManyCases(ValueError):
    """The login has added as many cases as --suite-max-cases allows."""


def default_name(index: int) -> str:
    """The name of the ``index``-th case (from 0) when suite.toml gives it none."""
    return f"case-{index + 1}"


def _suite_text(root: Path) -> str | None:
    file = root / SUITE_FILE
    try:
        return file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise SuiteConflict(f"{file} can't be read ({exc}); fix it before adding to it") from None


def _parsed(root: Path, text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SuiteConflict(f"{root / SUITE_FILE} can't be read ({exc}); fix it before adding to it") from None


def _names(data: dict[str, Any]) -> list[str]:
    """The case names in order, as a run names them (vidchat.qa.suite_file)."""
    cases = data.get("case", [])
    if not isinstance(cases, list):
        return []
    return [str(c.get("name", default_name(i))) if isinstance(c, dict) else default_name(i)
            for i, c in enumerate(cases)]


def _bundle_names(root: Path) -> set[str]:
    """What bundles/ holds, by case name: a folder left there by a failed add is not reused."""
    folder = root / "bundles"
    if not folder.is_dir():
        return set()
    return {p.name.removesuffix(".zip") for p in folder.iterdir()}


def taken_names(root: Path) -> set[str]:
    """The names a new case may not have: suite.toml's (the default ``case-N`` of
    a case without one included) and those of bundles/'s entries."""
    return set(_names(_parsed(root, _suite_text(root)))) | _bundle_names(root)


def _free(wanted: str, taken: set[str]) -> str:
    name, n = wanted, 2
    while name in taken:
        name, n = f"{wanted}-{n}", n + 1
    return name


def free_name(root: Path, wanted: str) -> str:
    """``wanted``, or with -2, -3 … after it when it is taken (:func:`taken_names`)."""
    return _free(wanted, taken_names(root))


def _case(name: str, bundle: str, contains: Sequence[str], same_as_baseline: bool, note: str,
          mark: dict[str, str] | None) -> dict[str, Any]:
    """The case as tomllib reads it back."""
    case: dict[str, Any] = {"name": name, "bundle": bundle}
    if note:
        case["note"] = note
    if mark:  # the answer's QA verdict (vidchat.conversation.bundles)
        case["mark"] = {"mark": mark["mark"], "note": mark.get("note", "")}
    expect: dict[str, Any] = {}
    if contains:
        expect["contains"] = list(contains)
    if same_as_baseline:
        expect["same_as_baseline"] = True
    case["ask"] = [{"expect": expect}]
    return case


def _case_table(case: dict[str, Any]) -> Any:
    """``case`` as a tomlkit table laid out as docs/suites.md shows one."""
    table = tomlkit.table()
    table.trivia.indent = "\n"  # a blank line before its [[case]]
    for key in ("name", "bundle", "note"):
        if key in case:
            table.add(key, case[key])
    if "mark" in case:
        mark = tomlkit.inline_table()
        mark.update(case["mark"])
        table.add("mark", mark)
    asks = tomlkit.aot()
    for raw in case["ask"]:
        expect = tomlkit.inline_table()
        expect.update(raw["expect"])
        ask = tomlkit.table()
        ask.add("expect", expect)
        asks.append(ask.indent(2))
    table.add("ask", asks)
    return table


def _with_case(root: Path, text: str | None, case: dict[str, Any]) -> str:
    """suite.toml's text with ``case`` added after its last case, the rest as it was;
    SuiteConflict when the result would not read back as exactly that."""
    try:
        doc = tomlkit.parse(text) if text else tomlkit.document()
        if not text:
            doc.add("name", tomlkit.item(root.resolve().name))
        if "case" not in doc:
            doc.append("case", tomlkit.aot())
        cases = doc["case"]
        if not isinstance(cases, AoT):
            raise TypeError("its 'case' is not an array of tables ([[case]])")
        cases.append(_case_table(case))
        new = tomlkit.dumps(doc)
    except (TOMLKitError, TypeError, ValueError) as exc:
        raise SuiteConflict(f"{root / SUITE_FILE}: a case can't be added to it ({exc})") from None
    _check_added(root, text, new, case)
    return new


def _check_added(root: Path, old: str | None, new: str, case: dict[str, Any]) -> None:
    """Raise SuiteConflict unless ``new`` reads, with tomllib, as ``old`` plus ``case``."""
    try:
        data = tomllib.loads(new)
    except tomllib.TOMLDecodeError as exc:
        raise SuiteConflict(f"{root / SUITE_FILE}: with the case added it would not read ({exc})") from None
    before = _parsed(root, old) if old else {"name": root.resolve().name}
    cases = data.pop("case", None)
    if not (isinstance(cases, list) and cases and cases[-1] == case
            and cases[:-1] == before.pop("case", []) and data == before):
        raise SuiteConflict(f"{root / SUITE_FILE}: with the case added it would not read as the same suite "
                              "plus that case; nothing was changed")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise SuiteConflict(f"{path} can't be read ({exc}); fix it before adding to it") from None
    if not isinstance(data, dict):
        raise SuiteConflict(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _json_text(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _check_json(text: str) -> None:
    json.loads(text)


def append_case(root: Path, name: str, bundle: Path, *, contains: Sequence[str] = (),
                same_as_baseline: bool = False, note: str = "", mark: dict[str, str] | None = None) -> None:
    """Add a bundle case named ``name`` to suite.toml (made, with the folder's
    name, when there is none); ValueError (Unwritable, SuiteConflict) when it
    can't be, the file then as it was."""
    case = _case(name, bundle.relative_to(root).as_posix(), contains, same_as_baseline, note, mark)
    _writable_case(case)
    with locked(root):
        text = _suite_text(root)
        if name in _names(_parsed(root, text)):
            raise SuiteConflict(f"{root / SUITE_FILE} already has a case named {name!r}")
        new = _with_case(root, text, case)
        write_whole(root / SUITE_FILE, new, lambda back: _check_added(root, text, back, case))


def _writable_case(case: dict[str, Any]) -> None:
    writable("note", case.get("note", ""))
    writable("expect", ", ".join(case["ask"][0]["expect"].get("contains", [])))
    writable("mark.note", (case.get("mark") or {}).get("note", ""))
    writable("name", case["name"])


def edit_baseline(root: Path, change: Callable[[Baseline], None]) -> None:
    """Read baseline.json, let ``change`` edit it in place, write it whole, all
    under the suite's lock: a writer beside this one (the server's Add to
    suite, a command line's --update-baseline) loses none of its entries."""
    with locked(root):
        path = root / BASELINE_FILE
        baseline = _read_json(path)
        change(baseline)
        write_whole(path, _json_text(baseline), _check_json)


def keep_baseline(root: Path, model: str, case: str, answers: dict[str, str]) -> None:
    """Set ``case``'s answers (by ask index) as ``model``'s baseline."""
    def keep(baseline: Baseline) -> None:
        baseline.setdefault(model, {})[case] = answers

    edit_baseline(root, keep)


def keeps_baseline(mark: dict[str, str] | None) -> bool:
    """Whether an added answer becomes its model's baseline: not one marked bad."""
    return not (mark and mark.get("mark") == "bad")


def add_case(root: Path, wanted: str, save_bundle: Callable[[Path, str], Path], *, model: str, answer: str,
             login: str | None, max_cases: int, contains: Sequence[str] = (), note: str = "",
             mark: dict[str, str] | None = None) -> tuple[str, Path]:
    """The page's Add to suite, whole or not at all: a case named ``wanted``
    (or ``wanted-2`` … when taken) re-asking the bundle ``save_bundle(bundles
    folder, name)`` writes, its ``answer`` as ``model``'s baseline, and the
    case counted against ``login``'s ``max_cases``. Everything is checked
    (the text, the suite's files, the count) before anything is made; a
    failure after that takes back what was made. Returns (name, bundle).

    An answer marked bad is not a baseline (it would hold later answers to
    what someone judged wrong): its case is added without same_as_baseline,
    baseline.json is left as it was, and :func:`keeps_baseline` says so to
    whoever reports the add."""
    kept = keeps_baseline(mark)
    case = _case("", "", contains, kept, note, mark)
    _writable_case({**case, "name": wanted})
    who = login or ""
    with locked(root):
        text = _suite_text(root)
        names = _names(_parsed(root, text))
        baseline = _read_json(root / BASELINE_FILE)
        added_by = {c: w for c, w in _read_json(root / ADDED_BY_FILE).items() if c in names}
        if sum(w == who for w in added_by.values()) >= max_cases:
            raise TooManyCases(f"not added: the suite already has {max_cases} cases added by "
                               f"{'this login' if login else 'callers without a login'}, the most the server's "
                               f"--suite-max-cases allows; remove some of them from {SUITE_FILE} to add more")
        name = _free(wanted, set(names) | _bundle_names(root))
        case.update(name=name, bundle=f"bundles/{name}")
        new = _with_case(root, text, case)
        bundles = root / "bundles"
        bundles.mkdir(exist_ok=True)
        bundle = save_bundle(bundles, name)
        written: list[tuple[Path, str | None]] = []
        try:
            files = [(root / SUITE_FILE, new, lambda back: _check_added(root, text, back, case))]
            if kept:
                files.append((root / BASELINE_FILE, _json_text({**baseline, model: {**baseline.get(model, {}),
                                                                                   name: {"0": answer}}}),
                              _check_json))
            files.append((root / ADDED_BY_FILE, _json_text({**added_by, name: who}), _check_json))
            for path, content, check in files:
                old = path.read_text(encoding="utf-8") if path.exists() else None
                write_whole(path, content, check)
                written.append((path, old))
        except BaseException:
            _take_back(bundle, written)
            raise
    return name, bundle


def _take_back(bundle: Path, written: list[tuple[Path, str | None]]) -> None:
    """Undo an add that failed partway: the files as they were, the bundle removed."""
    for path, old in reversed(written):
        try:
            if old is None:
                path.unlink(missing_ok=True)
            else:
                write_whole(path, old)
        except OSError:
            log.exception("suite: could not restore %s after a failed add", path)
    if bundle.is_dir():
        shutil.rmtree(bundle, ignore_errors=True)
    else:
        bundle.unlink(missing_ok=True)
