"""The page's latency: Enter -> first token visible, in headless Chromium with
a fake camera, against a real server (real vLLM).

    .venv/bin/python bench/page.py [--questions 20] [--still-questions 20]
    .venv/bin/python bench/page.py --preset smolvlm2-256m --true-size   # the CPU default, random weights
    .venv/bin/python bench/page.py --server-arg=--frames-per-question=8  # any app.py option for its server

Rows, each over --questions questions (the model's frames per question:
16 on the tiny model, 4 on the SmolVLM presets), every question on a fresh
chat (so every question costs the same):

* the first question after Start camera, in --first-questions new tabs
  (the server's defaults, warm-ups as --prewarm auto chose), typed as a
  person types once the page is live;
* moving scene with the server's default sampling (``stable`` on the SmolVLM
  presets: issue 49), warm-ups ``auto`` (what --prewarm auto chose at
  start-up: off on the tiny model, encode-ahead one frame at a time on the
  CPU default), then warm-ups off;
* moving scene with the old default: ``uniform`` sampling, warm-ups off;
* mostly still scene (moves 2 s in every 8), default sampling, auto and
  off (--still-questions each);

each split into Enter -> server event (the browser's and Gradio's share),
server event -> first token (vidchat and vLLM) and first token -> visible,
with how many of each question's frames were new to the engine (the
server's log line). One frame's encode time is what --prewarm auto
measured at start-up (/api/health). The full report is written to
bench/results/page.json.

Last lines: `latency: {…json…}` (the whole report), `ratios: …` and
`page: preset=… median_ms_off=… median_ms_auto=… p95_ms_auto=…
still_median_ms_auto=… old_median_ms=… frame_encode_ms=…
first_question_ms=… new_frames_median=…`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from vidchat.devtools import harness  # noqa: E402
from vidchat.devtools.page import (  # noqa: E402
    BOT_MESSAGES,
    WEBCAM_SIZE,
    launch,
    next_frame,
    open_and_start,
    set_setting,
    wait_for_answer,
    write_wav,
    write_y4m,
)

log = logging.getLogger("bench.page")
RESULTS = Path(__file__).resolve().parent / "results"
RED = (210, 40, 40)
TYPING_MS = 60  # between key presses: the question is typed as a person types it


async def _observe_latency(page) -> None:
    """Time Enter -> first token visible in the page itself (a MutationObserver on the chat)."""
    await page.evaluate(
        """() => { window.__lat = {results: [], waiting: false, expect: 0, t0: 0};
          new MutationObserver(() => {
            const L = window.__lat;
            if (!L.waiting) return;
            const b = """ + BOT_MESSAGES + """;
            if (b.length >= L.expect && b[L.expect - 1].innerText.trim().length > 0) {
              // An answer that was only its end token streamed nothing: no latency to measure.
              const empty = b[L.expect - 1].innerText.includes('(the model returned no text)');
              L.results.push(empty ? null : [performance.now() - L.t0, L.wall0]); L.waiting = false;
            }
          }).observe(document.querySelector('#vc-chat'), {subtree: true, childList: true, characterData: true});
        }"""
    )


async def _round(page, server: harness.Server, questions: int, typing_ms: int) -> tuple[list, list, list]:
    """Enter -> first token visible for ``questions`` questions, each on a fresh chat, each typed
    key by key (``typing_ms`` apart, as a person types)."""
    box = page.locator("#vc-question textarea")
    log_start = len(server.log())
    await page.evaluate("() => { window.__lat.results = []; }")
    for i in range(1, questions + 1):
        # A fresh chat each time: every question costs the same, and a
        # growing history of random text can't drift the model into
        # ending its answers at once.
        await page.click("#vc-clear")
        await page.wait_for_function("!document.querySelector('#vc-chat [data-testid=\"bot\"]')")
        await next_frame(page)
        # Typed key by key (TYPING_MS apart by default, a fast typist): the
        # page tells the server a question is coming at the first key.
        await box.press_sequentially(f"Question {i}: what is moving?", delay=typing_ms)
        await page.evaluate("() => { Object.assign(window.__lat, "
                            "{t0: performance.now(), wall0: Date.now(), waiting: true, expect: 1}); }")
        await box.press("Enter")
        await page.wait_for_function("!window.__lat.waiting", timeout=60_000)
        await wait_for_answer(page, 1)
        # The answer's event has ended too (its last message reached the page).
        await page.wait_for_function("window.vidchat.questions.asked === window.vidchat.questions.finished")
    results = await page.evaluate("window.__lat.results")
    log_text = server.log()[log_start:]
    prep = [float(m) for m in re.findall(r"chat event -> engine call: ([\d.]+) ms", log_text)]
    server_ttft = [(float(ms), float(at), int(new)) for ms, new, at in re.findall(
        r"chat event -> first token: ([\d.]+) ms \(.*?(\d+) of \d+ frames new; event at ([\d.]+)\)", log_text)]
    return results, prep, server_ttft


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 1)


def _p95(values: list[float]) -> float:
    return round(sorted(values)[int(0.95 * (len(values) - 1))], 1)


def summarise(timed: list, prep: list, server: list, questions: int) -> dict:
    # Every question reached the engine; an answer whose first token was only
    # whitespace has no visible first token to time.
    if len(timed) != questions or len(prep) != questions:
        raise RuntimeError(f"{questions} questions, but {len(timed)} timed and {len(prep)} reached the engine")
    timed = [r for r in timed if r is not None]
    # Each page timing with the server's line for the same question: the
    # first chat event at or after its Enter (the log may lack a line, or
    # hold one the page could not time).
    paired = []
    for i, (total, wall0) in enumerate(timed):
        next_enter = timed[i + 1][1] if i + 1 < len(timed) else float("inf")
        later = [line for line in server if wall0 - 50 <= line[1] * 1000 < next_enter]
        if later:
            paired.append(((total, wall0), min(later, key=lambda line: line[1])))
    if len(paired) < max(1, questions // 2):
        raise RuntimeError(f"{len(timed)} answers timed in the page, {len(paired)} matched on the server")
    timed, server = [p for p, _ in paired], [line for _, line in paired]
    results = [total for total, _ in timed]
    server_ttft = [ms for ms, _, _ in server]
    # Browser and server share this machine's wall clock: Enter -> the
    # server's chat event is the page's and Gradio's share before the model,
    # first token -> visible theirs after it.
    before = [event_at * 1000 - wall0 for (_, wall0), (_, event_at, _) in zip(timed, server)]
    new_frames = [new for _, _, new in server]
    after = [total - b - ms for total, b, ms in zip(results, before, server_ttft)]
    return {
        "questions_with_streamed_text": len(results),
        "breakdown_median_ms": {"enter_to_server_event": _median(before),
                                "server_event_to_first_token": _median(server_ttft),
                                "first_token_to_visible": _median(after)},
        "enter_to_first_token_ms": {"median": _median(results), "p95": _p95(results),
                                    "min": round(min(results), 1), "max": round(max(results), 1)},
        "vidchat_event_to_engine_ms": {"median": round(statistics.median(prep), 2), "max": round(max(prep), 2)},
        "server_event_to_first_token_ms": {"median": _median(server_ttft), "p95": _p95(server_ttft)},
        "new_frames": {"median": statistics.median(new_frames), "max": max(new_frames)},
    }


async def _mode(page, server: harness.Server, questions: int, mode: str, typing_ms: int) -> dict:
    switched = server.post_json("/api/prewarm", {"mode": mode})
    if switched.get("mode") != mode and not (mode == "auto" and switched.get("setting") == "auto"):
        raise RuntimeError(f"the server refused warm-up mode {mode}: {switched}")
    pins_before = server.get_json("/api/health")["prewarm"]["pins_used"]
    summary = summarise(*await _round(page, server, questions, typing_ms), questions)
    health = server.get_json("/api/health")
    # With warm-ups on, the page's Enter has the server take each question's
    # sample at once and warm it (vidchat.conversation.warmup question_now); off, never.
    taken_at_enter = health["prewarm"]["pins_used"] - pins_before
    summary.update(mode_run=switched["mode"], loop_lag_so_far=health["loop_lag"], samples_taken_at_enter=taken_at_enter)
    return summary


def _labels() -> dict[str, str]:
    """The page's label of each sampling rule, by its name."""
    from vidchat.conversation.asking import SETTINGS

    return {value: label for label, value in SETTINGS["sampling"].page_choices()}


async def _sampling(page, value: str) -> None:
    """Choose a sampling rule in the page's settings, by its name."""
    label = _labels()[value]
    if await page.input_value("#vc-sampling input") == label:
        return
    if not await page.locator("#vc-sampling input").is_visible():
        await page.click("#vc-settings > .label-wrap, #vc-settings button")
    await page.click("#vc-sampling input")
    await page.locator("[data-testid=dropdown-option]", has_text=label).click()
    await page.wait_for_function("(l) => document.querySelector('#vc-sampling input').value === l", arg=label)


# (report key, scene, warm-ups, sampling: None is the server's default), in the order they run.
PLAN = [("prewarm_auto", "moving", "auto", None), ("prewarm_off", "moving", "off", None),
        ("old_default", "moving", "off", "uniform"),
        ("still_prewarm_auto", "still", "auto", None), ("still_prewarm_off", "still", "off", None)]


async def _first_questions(browser, server: harness.Server, starts: int, typing_ms: int) -> dict:
    """The first question after Start camera, ``starts`` times, each in a
    new tab (a new session, its buffer empty), typed as a person types once
    the page is live and has a few frames, with the server's defaults: what
    encoding ahead has done by the time the question comes."""
    timed, prep, server_ttft = [], [], []
    for _ in range(starts):
        page = await open_and_start(browser, server.url + "/", min_buffer=4)
        try:
            await _observe_latency(page)
            t, p, s = await _round(page, server, 1, typing_ms)
            timed += t
            prep += p
            server_ttft += s
        finally:
            await page.close()
    return summarise(timed, prep, server_ttft, starts)


async def measure(server: harness.Server, questions: int, still_questions: int, work: Path,
                  typing_ms: int = TYPING_MS, first_questions: int = 5) -> dict:
    from playwright.async_api import async_playwright

    media = {"moving": work / "moving.y4m", "still": work / "still.y4m", "tone": work / "tone.wav"}
    write_y4m(media["moving"], RED, size=WEBCAM_SIZE)
    write_y4m(media["still"], RED, seconds=8.0, moving_s=2.0, size=WEBCAM_SIZE)
    write_wav(media["tone"])
    report: dict = {"questions": questions, "still_questions": still_questions}
    server.post_json("/api/prewarm", {"mode": "auto"})
    async with async_playwright() as pw:
        for scene in ("moving", "still"):
            # A mostly still scene changes little between a warm-up and Enter;
            # a scene in constant motion brings new frames all the time.
            browser = await launch(pw, media[scene], media["tone"])
            try:
                if scene == "moving":
                    report["first_question"] = await _first_questions(browser, server, first_questions, typing_ms)
                page = await open_and_start(browser, server.url + "/")
                await _observe_latency(page)
                await set_setting(page, "vc-max-tokens", "8")
                # The server's default sampling: what its page starts with.
                shown = await page.input_value("#vc-sampling input")
                default = next(value for value, label in _labels().items() if label == shown)
                for key, row_scene, mode, sampling in PLAN:
                    if row_scene != scene:
                        continue
                    await _sampling(page, sampling or default)
                    report[key] = await _mode(page, server, questions if scene == "moving" else still_questions,
                                              mode, typing_ms)
                    report[key]["sampling"] = sampling or default
            finally:
                await browser.close()
        report["prewarm"] = server.get_json("/api/health")["prewarm"]
        server.post_json("/api/prewarm", {"mode": "auto"})  # back to the server's own choice
    return report


ROWS = [("first question after start", "first_question"),
        ("moving, default, warm-ups auto", "prewarm_auto"), ("moving, default, warm-ups off", "prewarm_off"),
        ("moving, old default (uniform, off)", "old_default"),
        ("still, default, warm-ups auto", "still_prewarm_auto"), ("still, default, warm-ups off", "still_prewarm_off")]


def print_report(report: dict, preset: str) -> None:
    print(f"{'row':<36}{'median':>8}{'p95':>8}{'->event':>9}{'->token':>9}{'->shown':>9}{'new':>5}"
          "  (ms, Enter -> first token; new: frames new to the engine, median)")
    for label, key in ROWS:
        row = report[key]
        total, parts = row["enter_to_first_token_ms"], row["breakdown_median_ms"]
        print(f"{label:<36}{total['median']:>8.1f}{total['p95']:>8.1f}{parts['enter_to_server_event']:>9.1f}"
              f"{parts['server_event_to_first_token']:>9.1f}{parts['first_token_to_visible']:>9.1f}"
              f"{row['new_frames']['median']:>5g}")
    print("latency:", json.dumps(report))
    med = {key: report[key]["enter_to_first_token_ms"]["median"] for _, key in ROWS}
    prewarm = report.get("prewarm", {})
    encode_ms = prewarm.get("frame_encode_ms")
    encode = f"{encode_ms:.1f}" if encode_ms is not None else "unmeasured"
    per_encode = f"{med['prewarm_auto'] / encode_ms:.2f}" if encode_ms else "-"
    print(f"ratios: moving auto/off={med['prewarm_auto'] / med['prewarm_off']:.2f} "
          f"auto/old_default={med['prewarm_auto'] / med['old_default']:.2f} "
          f"auto/frame_encode={per_encode} still/moving (auto)={med['still_prewarm_auto'] / med['prewarm_auto']:.2f} "
          f"first/median (auto)={med['first_question'] / med['prewarm_auto']:.2f} "
          f"still_median_ms_off={med['still_prewarm_off']} questions={report['questions']} "
          f"({prewarm.get('reason', '')})")
    print(f"page: preset={preset} median_ms_off={med['prewarm_off']} median_ms_auto={med['prewarm_auto']} "
          f"p95_ms_auto={report['prewarm_auto']['enter_to_first_token_ms']['p95']} "
          f"still_median_ms_auto={med['still_prewarm_auto']} old_median_ms={med['old_default']} "
          f"frame_encode_ms={encode} first_question_ms={med['first_question']} "
          f"new_frames_median={report['prewarm_auto']['new_frames']['median']:g}")


def server_args(preset: str, true_size: bool) -> list[str]:
    """app.py's model options: the tiny model, or a preset's random-weight build (bench/engine.py)."""
    if not preset:
        return list(harness.TINY_ARGS)
    from engine import preset_model  # bench/engine.py

    return ["--model", str(preset_model(preset, true_size)), "--preset", preset]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=20, help="questions in each moving-scene row")
    parser.add_argument("--still-questions", type=int, default=20, help="questions in each still-scene row")
    parser.add_argument("--first-questions", type=int, default=5,
                        help="new tabs, each timing its first question after Start camera")
    parser.add_argument("--preset", default="", help="the server runs this preset's true architecture "
                        "(random weights; bench/engine.py), e.g. smolvlm2-256m; default: the tiny model")
    parser.add_argument("--true-size", action="store_true", help="with --preset: every layer, not a reduced depth")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="an extra app.py argument for the server this starts (repeatable)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vidchat-page-bench-") as tmp:
        work = Path(tmp)
        # The report reads the server's own timings from its log: it starts the server itself.
        # Short answers from the first question on (the rows set the same in the page).
        server = harness.start_server([*server_args(args.preset, args.true_size), "--max-tokens", "8",
                                       *args.server_arg],
                                      RESULTS / "page-server.log", timeout=600)
        try:
            report = asyncio.run(measure(server, args.questions, args.still_questions, work,
                                         first_questions=args.first_questions))
        finally:
            harness.stop_server(server)
    (RESULTS / "page.json").write_text(json.dumps(report, indent=2))
    print_report(report, (args.preset or "tiny") + ("" if not args.preset or args.true_size else "-reduced"))


if __name__ == "__main__":
    main()
