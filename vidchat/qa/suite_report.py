"""A suite run's reports: results.json (the data), junit.xml (what CI reads)
and report.html (what a person reads: one self-contained file, nothing
loaded from anywhere, the frames the model got inline, each model's answer
side by side, each check ✓/✗, the change from the baseline word by word,
and a switch to show only what failed)."""

from __future__ import annotations

import difflib
import html
import json
import logging
import re
import shutil
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

THUMB = (160, 120)
RUN_NAME = re.compile(r"^\d{8}T\d{6}Z(-[a-z]+)?(-\d+)?$")  # what new_run_folder names; nothing else is pruned


def new_run_folder(runs: Path, suffix: str = "") -> Path:
    """A new folder under ``runs`` for one run's reports, made now and only
    for it: ``<UTC time><suffix>``, then ``-2``, ``-3``… when a run started
    in the same second already has that name (two runs never share one)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + suffix
    runs.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        folder = runs / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise OSError(f"{runs}: no free folder name for a run started at {stamp}")


def _started(folder: Path) -> tuple[str, int]:
    """A run folder's place in time: its second, then its number within the
    second (a folder not named as new_run_folder names them counts as the first)."""
    named = RUN_NAME.match(folder.name)
    number = named.group(2) if named is not None else None
    return folder.name[:16], int(number[1:]) if number else 1


def prune_runs(runs: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` run folders under ``runs``
    (--suite-keep-runs; 0 keeps them all): each run writes a bundle per ask,
    so without this the suite's folder grows with every run. Only folders
    named as new_run_folder names them are touched. Returns those deleted."""
    if keep <= 0 or not runs.is_dir():
        return []
    found = sorted((p for p in runs.iterdir() if p.is_dir() and RUN_NAME.match(p.name)), key=_started)
    old = found[:-keep]
    for folder in old:
        shutil.rmtree(folder, ignore_errors=True)
    if old:
        log.info("%s: deleted %d old run folder(s), keeping the newest %d (--suite-keep-runs)", runs, len(old), keep)
    return old


def write_reports(out: Path, report: dict[str, Any], baseline: dict[str, Any]) -> None:
    """The three files, into ``out``; ``baseline``: the suite's as the run read it."""
    (out / "results.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    junit(report).write(out / "junit.xml", encoding="utf-8", xml_declaration=True)
    (out / "report.html").write_text(report_html(report, baseline), encoding="utf-8")


def junit(report: dict[str, Any]) -> ET.ElementTree:
    """One <testsuite>, one <testcase> per ask and model."""
    asks = report["asks"]
    suite = ET.Element("testsuite", name=report["suite"], tests=str(len(asks)),
                       failures=str(sum(a["status"] == "failed" for a in asks)),
                       errors=str(sum(a["status"] == "error" for a in asks)))
    for a in asks:
        case = ET.SubElement(suite, "testcase", classname=f"{report['suite']}.{a['model']}",
                             name=f"{a['case']}#{a['ask']}",
                             time=f"{(a.get('first_token_ms') or 0) / 1000:.3f}")
        if a["status"] == "failed":
            failing = [c for c in a["checks"] if not c["ok"]]
            ET.SubElement(case, "failure", message="; ".join(f"{c['check']}: {c['detail']}" for c in failing)).text = \
                a["answer"]
        elif a["status"] == "error":
            ET.SubElement(case, "error", message=a.get("error") or "error").text = a.get("error")
    return ET.ElementTree(suite)


def _thumbs(bundle: str | None, times: list[float]) -> str:
    """The frames the model got, inline (read back from the answer's recording)."""
    if not bundle:
        return ""
    from vidchat.conversation.bundles import BundleError, read_bundle
    from vidchat.doors.answer_routes import thumb_data_url

    try:
        frames = read_bundle(bundle).frames  # the frames as recorded, which the model got
    except (BundleError, OSError) as exc:
        log.warning("the report can't show the frames of %s: %s", bundle, exc)
        return ""
    figures = []
    for i, frame in enumerate(frames):
        when = f"{times[i]:.2f} s" if i < len(times) and times[i] is not None else f"#{i}"
        figures.append(f"<figure><img src='{thumb_data_url(frame, THUMB)}' alt='frame {i}'>"
                       f"<figcaption>{when}</figcaption></figure>")
    return "<div class='frames'>" + "".join(figures) + "</div>"


def word_diff(before: str, after: str) -> str:
    """``after`` against ``before``, word by word: removed words struck, new ones marked."""
    a, b = before.split(), after.split()
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op in ("delete", "replace"):
            out.append(f"<del>{html.escape(' '.join(a[i1:i2]))}</del>")
        if op in ("insert", "replace"):
            out.append(f"<ins>{html.escape(' '.join(b[j1:j2]))}</ins>")
        if op == "equal":
            out.append(html.escape(" ".join(a[i1:i2])))
    return " ".join(out)


def _answer_cell(a: dict[str, Any], baseline: str | None) -> str:
    if a["status"] == "error" and not a.get("answer"):
        return f"<td class='error'><b>error</b>: {html.escape(a.get('error') or '')}</td>"
    checks = "".join(f"<li class='{'ok' if c['ok'] else 'bad'}'>{'✓' if c['ok'] else '✗'} {html.escape(c['check'])}: "
                     f"{html.escape(c['detail'])}</li>" for c in a["checks"])
    text = html.escape(a["answer"])
    if a.get("changed_from_baseline") and baseline is not None:
        text += f"<div class='diff'><b>changed from the baseline:</b> {word_diff(baseline, a['answer'])}</div>"
    took = "" if a.get("first_token_ms") is None else f"first token {a['first_token_ms']:.0f} ms · "
    if a["status"] == "error":  # answered, but it could not be judged (no baseline)
        text = f"<b>error</b>: {html.escape(a.get('error') or '')}<br>{text}"
    return (f"<td class='{a['status']}'><p class='answer'>{text}</p><ul>{checks}</ul>"
            f"<p class='meta'>{took}{a.get('tokens')} tokens · {a.get('frames')} frames · "
            f"inputs {html.escape((a.get('inputs_sha256') or '')[:16])}</p></td>")


def _case_notes(a: dict[str, Any]) -> str:
    """The case's note, and the verdict a QA person gave the answer it was made from."""
    out = f"<p class='note'>{html.escape(a['note'])}</p>" if a.get("note") else ""
    mark = a.get("mark")
    if mark:
        good = mark["mark"] == "good"
        out += (f"<p class='mark {'good' if good else 'bad'}'>Marked {'good ✓' if good else 'bad ✗'} when recorded"
                + (f": {html.escape(mark['note'])}" if mark.get("note") else "") + "</p>")
    return out


def report_html(report: dict[str, Any], baseline: dict[str, Any]) -> str:
    models = report["models"]
    by_ask: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for a in report["asks"]:
        by_ask.setdefault((a["case"], a["ask"]), {})[a["model"]] = a
    rows = []
    for (case, index), per_model in by_ask.items():
        first = next(iter(per_model.values()))
        failed = any(a["status"] != "passed" for a in per_model.values())
        cells = "".join(_answer_cell(per_model[m], baseline.get(m, {}).get(case, {}).get(str(index)))
                        if m in per_model else "<td></td>" for m in models)
        rows.append(f"<tr class='{'failed' if failed else 'passed'}'><th><b>{html.escape(case)}</b> #{index}"
                    f"<p>{html.escape(first['question'])}</p>{_case_notes(first)}"
                    f"{_thumbs(first.get('bundle'), first['frame_times'])}"
                    f"</th>{cells}</tr>")
    s = report["summary"]
    head = "".join(f"<th>{html.escape(m)}</th>" for m in models)
    written = ("<p class='baseline'>This run's answers were written as the baseline (baseline.json); its "
               "same_as_baseline checks hold them to what it accepted.</p>" if report.get("baseline_written") else "")
    return f"""<!doctype html><html lang="en"><meta charset="utf-8">
<title>{html.escape(report['suite'])}: suite report</title>
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #222; }}
table {{ border-collapse: collapse; width: 100%; }} th, td {{ border: 1px solid #ddd; padding: 8px;
vertical-align: top; text-align: left; }}
.frames {{ display: flex; flex-wrap: wrap; gap: 4px; }} figure {{ margin: 0; font-size: 11px; color: #666; }}
img {{ width: 96px; display: block; }} .ok {{ color: #1e7b34; }} .bad, .error {{ color: #a93226; }}
td.failed, td.error {{ background: #fff7f6; }}
ul {{ padding-left: 16px; margin: 4px 0; list-style: none; }} .meta {{ color: #777; font-size: 12px; }}
del {{ background: #fbe3e1; }} ins {{ background: #e1f5e4; text-decoration: none; }}
body.only-failed tr.passed {{ display: none; }}
.note {{ color: #555; font-style: italic; }} .mark.good {{ color: #1e7b34; }} .mark.bad {{ color: #a93226; }}
</style>
<h1>{html.escape(report['suite'])}</h1>
<p>{s['passed']} passed, {s['failed']} failed, {s['errors']} errors · {len(report['asks'])} asks on
{len(models)} model(s)</p>
{written}
<label><input type="checkbox" onchange="document.body.classList.toggle('only-failed', this.checked)">
show only what failed</label>
<table><tr><th>case and what the model got</th>{head}</tr>
{''.join(rows)}
</table></html>
"""
