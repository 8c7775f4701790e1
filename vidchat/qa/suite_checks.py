"""A suite ask's checks against the answer it got: each one ✓ or ✗ with a
detail a person reads (what was expected, what came), or not judged at all
(same_as_baseline with no baseline: the ask is an error, not a failure)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CheckResult:
    check: str
    ok: bool
    detail: str
    judged: bool = True  # False: there was nothing to judge the answer against

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.check, "ok": self.ok, "detail": self.detail}


def _words(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def run_checks(expect: dict[str, Any], answer: str, first_token_ms: float | None,
               baseline: str | None, accepting: bool = False) -> list[CheckResult]:
    """Every check of ``expect`` on ``answer``. ``baseline``: this model's
    answer in baseline.json (None: there is none, and same_as_baseline is
    not judged, saying so, rather than passing). ``accepting``: the run
    writes ``baseline`` as this model's baseline (--update-baseline)."""
    results: list[CheckResult] = []
    lowered = answer.casefold()
    for word in _words(expect.get("contains", [])):
        found = word.casefold() in lowered
        results.append(CheckResult("contains", found, f"{'has' if found else 'lacks'} {word!r}"))
    for word in _words(expect.get("not_contains", [])):
        found = word.casefold() in lowered
        results.append(CheckResult("not_contains", not found, f"{'has' if found else 'lacks'} {word!r}"))
    if "matches" in expect:
        hit = re.search(expect["matches"], answer)
        results.append(CheckResult("matches", hit is not None,
                                   f"/{expect['matches']}/ {'matched ' + repr(hit.group(0)) if hit else 'no match'}"))
    if "max_first_token_ms" in expect:
        limit = float(expect["max_first_token_ms"])
        ok = first_token_ms is not None and first_token_ms <= limit
        took = "no first token" if first_token_ms is None else f"first token after {first_token_ms:.0f} ms"
        results.append(CheckResult("max_first_token_ms", ok, f"{took} (at most {limit:g} ms)"))
    if expect.get("same_as_baseline"):
        if baseline is None:
            results.append(CheckResult("same_as_baseline", False,
                                       "no baseline for this model: run with --update-baseline first", judged=False))
        else:
            same = answer == baseline
            said = "differs from the baseline" if not same else (
                "accepted as the baseline (--update-baseline writes it)" if accepting else "the same as the baseline")
            results.append(CheckResult("same_as_baseline", same, said))
    return results
