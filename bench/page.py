"""The page's latency: Enter -> first token visible, in headless Chromium with
a fake camera, against a real server (real vLLM).

    .venv/bin/python bench/page.py [--questions 20] [--still-questions 10]
    .venv/bin/python bench/page.py --server-arg=--preset=NAME   # any app.py option for its server

Rows, each over --questions questions with 16 frames each, every question on a
fresh chat (so every question costs the same):

* moving scene, warm-ups off (uniform sampling);
* moving scene, warm-ups on (idle mode, stable sampling: the question shares
  the warm-up's prefix);
* mostly still scene (moves 2 s in every 8), warm-ups off and on, and on
  without audio (--still-questions each);

each split into Enter -> server event (the browser's and Gradio's share),
server event -> first token (vidchat and vLLM) and first token -> visible.
The full report is written to bench/results/page.json.

Last lines: `latency: {…json…}` (the whole report) and
`page: preset=… questions=… median_ms_off=… median_ms_idle=… p95_ms_idle=…
still_median_ms_off=… still_median_ms_idle=…`.
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

from vidchat.devtools import harness  # noqa: E402
from vidchat.devtools.page import (  # noqa: E402
    BOT_MESSAGES, launch, next_frame, open_and_start, set_setting, wait_for_answer, write_wav, write_y4m,
)

log = logging.getLogger("bench.page")
RESULTS = Path(__file__).resolve().parent / "results"
RED = (210, 40, 40)
FRAMES = 16


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


async def _round(page, server: harness.Server, questions: int) -> tuple[list, list, list]:
    """Enter -> first token visible for ``questions`` questions, each on a fresh chat."""
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
        # Typed at 60 ms a key (a fast typist): the page tells the server a
        # question is coming at the first key.
        await box.press_sequentially(f"Question {i}: what is moving?", delay=60)
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
    server_ttft = [(float(ms), float(at)) for ms, at in re.findall(
        r"chat event -> first token: ([\d.]+) ms \(.*?event at ([\d.]+)\)", log_text)]
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
        later = [(ms, at) for ms, at in server if wall0 - 50 <= at * 1000 < next_enter]
        if later:
            paired.append(((total, wall0), min(later, key=lambda line: line[1])))
    if len(paired) < max(1, questions // 2):
        raise RuntimeError(f"{len(timed)} answers timed in the page, {len(paired)} matched on the server")
    timed, server = [p for p, _ in paired], [line for _, line in paired]
    results = [total for total, _ in timed]
    server_ttft = [ms for ms, _ in server]
    # Browser and server share this machine's wall clock: Enter -> the
    # server's chat event is the page's and Gradio's share before the model,
    # first token -> visible theirs after it.
    before = [event_at * 1000 - wall0 for (_, wall0), (_, event_at) in zip(timed, server)]
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
    }


async def _mode(page, server: harness.Server, questions: int, mode: str, sampling: str) -> dict:
    await page.locator("#vc-sampling input").fill(sampling)
    await page.keyboard.press("Enter")
    await next_frame(page)
    if server.post_json("/api/prewarm", {"mode": mode}).get("mode") != mode:
        raise RuntimeError(f"the server refused warm-up mode {mode}")
    pins_before = server.get_json("/api/health")["prewarm"]["pins_used"]
    summary = summarise(*await _round(page, server, questions), questions)
    health = server.get_json("/api/health")
    # With warm-ups on, the page's Enter has the server take each question's
    # sample at once and warm it (vidchat.conversation.prewarm question_now); off, never.
    taken_at_enter = health["prewarm"]["pins_used"] - pins_before
    summary.update(sampling=sampling, loop_lag_so_far=health["loop_lag"], samples_taken_at_enter=taken_at_enter)
    return summary


async def measure(server: harness.Server, questions: int, still_questions: int, work: Path) -> dict:
    from playwright.async_api import async_playwright

    media = {"moving": work / "moving.y4m", "still": work / "still.y4m", "tone": work / "tone.wav"}
    write_y4m(media["moving"], RED)
    write_y4m(media["still"], RED, seconds=8.0, moving_s=2.0)
    write_wav(media["tone"])
    report: dict = {"questions": questions, "still_questions": still_questions, "frames_per_question": FRAMES}
    async with async_playwright() as pw:
        browser = await launch(pw, media["moving"], media["tone"])
        try:
            page = await open_and_start(browser, server.url + "/")
            await set_setting(page, "vc-max-tokens", "8")
            await _observe_latency(page)
            # Warm-ups with the sampling that lets a question share their prefix.
            for mode, sampling in (("off", "uniform"), ("idle", "stable")):
                report[f"prewarm_{mode}"] = await _mode(page, server, questions, mode, sampling)
            # A scene that is mostly still while the question is typed: the
            # sample then changes little between the warm-up and Enter. A
            # sliding window over a scene in constant motion changes at both
            # ends every few kept frames, so warm-ups can't keep up with it.
            await browser.close()
            browser = await launch(pw, media["still"], media["tone"])
            page = await open_and_start(browser, server.url + "/")
            await set_setting(page, "vc-max-tokens", "8")
            await _observe_latency(page)
            for mode in ("off", "idle"):
                report[f"still_prewarm_{mode}"] = await _mode(page, server, still_questions, mode, "stable")
            # The same without audio: the audio since the first sampled frame
            # grows with every chunk, so it is prefilled anew at each
            # question, warm-ups or not; this is what the frames alone cost.
            await page.click("#vc-settings label:has-text('Include audio')")
            report["still_prewarm_idle_no_audio"] = await _mode(page, server, still_questions, "idle", "stable")
            report["prewarm"] = server.get_json("/api/health")["prewarm"]
        finally:
            if server.post_json("/api/prewarm", {"mode": "off"}).get("mode") != "off":  # the default
                log.error("could not switch warm-ups back off")
            await browser.close()
    return report


ROWS = [("moving, warm-ups off", "prewarm_off"), ("moving, warm-ups on", "prewarm_idle"),
        ("still, warm-ups off", "still_prewarm_off"), ("still, warm-ups on", "still_prewarm_idle"),
        ("still, warm-ups on, no audio", "still_prewarm_idle_no_audio")]


def print_report(report: dict, preset: str) -> None:
    print(f"{'row':<32}{'median':>8}{'p95':>8}{'->event':>9}{'->token':>9}{'->shown':>9}  (ms, Enter -> first token)")
    for label, key in ROWS:
        row = report[key]
        total, parts = row["enter_to_first_token_ms"], row["breakdown_median_ms"]
        print(f"{label:<32}{total['median']:>8.1f}{total['p95']:>8.1f}{parts['enter_to_server_event']:>9.1f}"
              f"{parts['server_event_to_first_token']:>9.1f}{parts['first_token_to_visible']:>9.1f}")
    print("latency:", json.dumps(report))
    med = {key: report[key]["enter_to_first_token_ms"]["median"] for _, key in ROWS}
    print(f"page: preset={preset} questions={report['questions']} median_ms_off={med['prewarm_off']} "
          f"median_ms_idle={med['prewarm_idle']} p95_ms_idle={report['prewarm_idle']['enter_to_first_token_ms']['p95']} "
          f"still_median_ms_off={med['still_prewarm_off']} still_median_ms_idle={med['still_prewarm_idle']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=20, help="questions in each moving-scene row")
    parser.add_argument("--still-questions", type=int, default=10, help="questions in each still-scene row")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="an extra app.py argument for the server this starts (repeatable)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vidchat-page-bench-") as tmp:
        work = Path(tmp)
        # The report reads the server's own timings from its log: it starts the server itself.
        server = harness.start_server([*harness.TINY_ARGS, *args.server_arg], RESULTS / "page-server.log")
        try:
            report = asyncio.run(measure(server, args.questions, args.still_questions, work))
        finally:
            harness.stop_server(server)
    (RESULTS / "page.json").write_text(json.dumps(report, indent=2))
    preset = next((a.split("=", 1)[1] for a in args.server_arg if a.startswith("--preset=")), "tiny")
    print_report(report, preset)


if __name__ == "__main__":
    main()
