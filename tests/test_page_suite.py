"""The page's verdict and Add to suite (--suite-dir), in Chromium against
the app with real vLLM: an answer marked bad with a note (its record says
so) and added from its "What the model got" panel becomes a case (its
bundle, its question, the note, the verdict, its answer as this model's
baseline) that ``python -m vidchat.suite run`` then passes, its report
showing the verdict; the page's Suites panel runs the same suite on the
server's own model, with its progress, its table and its report. (Without
--suite-dir the form is not shown: tests/test_compare.py looks.)"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest
from conftest import CACHE_DIR, ROOT, TINY_SERVER_ARGS
from playwright.async_api import async_playwright

from vidchat.devtools.page import ask, launch, open_and_start, set_setting, wait_for_answer, write_wav, write_y4m

pytestmark = pytest.mark.browser


async def test_an_answer_added_to_the_suite_from_the_page_passes_suite_run(server, tmp_path, artifacts_dir):
    suite_server = server  # the shared server keeps its suite in a folder of its own (--suite-dir)
    write_y4m(tmp_path / "cam.y4m", (40, 160, 90))
    write_wav(tmp_path / "mic.wav")
    async with async_playwright() as pw:
        browser = await launch(pw, tmp_path / "cam.y4m", tmp_path / "mic.wav", tmp_path)
        try:
            page = await open_and_start(browser, suite_server.url + "/", min_buffer=4)
            await set_setting(page, "vc-max-tokens", "6")
            await set_setting(page, "vc-temperature", "0")
            await ask(page, "What is in front of the camera?")
            await wait_for_answer(page, 1)
            await page.click("#vc-inputs button, #vc-inputs .label-wrap")
            verdict = page.locator("#vc-inputs .vc-mark")
            await verdict.wait_for(state="visible", timeout=30_000)
            await verdict.locator("input[name=note]").fill("said nothing of the card")
            await verdict.locator("button[data-mark=bad]").click()
            await page.wait_for_function("document.querySelector('#vc-inputs .vc-mark-said')"
                                         "?.textContent.startsWith('marked bad')", timeout=30_000)
            assert await verdict.locator("button[data-mark=bad]").get_attribute("aria-pressed") == "true"
            record = await page.evaluate("(id) => fetch(`/inputs/${id}/record.json`).then((r) => r.json())",
                                         await verdict.get_attribute("data-answer"))
            assert record["mark"] == {"mark": "bad", "note": "said nothing of the card"}  # its record says it
            form = page.locator("#vc-inputs .vc-add-suite")
            await form.wait_for(state="visible", timeout=30_000)
            await form.locator("input[name=note]").fill("the colour of the card")
            await form.locator("button").click()
            said = form.locator(".vc-add-suite-said")
            await page.wait_for_function("document.querySelector('#vc-inputs .vc-add-suite-said')"
                                         "?.textContent.startsWith('added as case')", timeout=30_000)
            # Named within the suite's folder: the server's own paths are not the page's to show.
            assert await said.inner_text() == "added as case “what-is-in-front-of-the-camera” to suite.toml"
            await page.screenshot(path=str(artifacts_dir / "page-add-to-suite.png"), full_page=True)

            # The Suites panel: the case is listed, and a run on the server's own model passes it.
            await page.click("#vc-suites-panel button, #vc-suites-panel .label-wrap")
            panel = page.locator("#vc-suites")
            await panel.locator(".vc-suite-table td", has_text="what-is-in-front-of-the-camera").wait_for(
                timeout=30_000)
            assert await panel.locator(".vc-suite-run").count() == 1  # no --compare-model: this model only
            await panel.locator(".vc-suite-run[data-engine=main]").click()
            await page.wait_for_function("document.querySelector('#vc-suites .vc-suite-progress')"
                                         "?.dataset.state === 'finished'", timeout=120_000)
            progress = await panel.locator(".vc-suite-progress").inner_text()
            assert progress.startswith("Finished on tiny: 1 passed, 0 failed, 0 errors"), progress
            rows = panel.locator(".vc-suite-results tbody tr")
            assert await rows.count() == 1
            assert await rows.first.get_attribute("data-status") == "passed"
            assert "same" in await rows.first.inner_text()  # the answer equals its baseline
            report_url = await panel.locator("a.vc-suite-report").get_attribute("href")
            report = await page.evaluate("(u) => fetch(u).then(async (r) => [r.status, await r.text()])",
                                         report_url)
            assert report[0] == 200 and "Marked bad ✗ when recorded: said nothing of the card" in report[1]
            await page.screenshot(path=str(artifacts_dir / "page-suites-panel.png"), full_page=True)

        finally:
            await browser.close()

    suite_dir = suite_server.suite_dir
    (page_run,) = (suite_dir / "runs").iterdir()  # the page's run wrote its reports where the command line does
    page_results = json.loads((page_run / "results.json").read_text())
    assert page_results["models"] == ["tiny"] and page_results["summary"] == {"passed": 1, "failed": 0, "errors": 0}
    assert (page_run / "junit.xml").is_file() and (page_run / "report.html").is_file()
    case = tomllib.loads((suite_dir / "suite.toml").read_text())["case"][0]
    assert case["name"] == "what-is-in-front-of-the-camera" and case["note"] == "the colour of the card"
    assert case["ask"] == [{"expect": {"same_as_baseline": True}}]
    assert case["mark"] == {"mark": "bad", "note": "said nothing of the card"}  # the verdict, carried into the case
    manifest = json.loads((suite_dir / case["bundle"] / "manifest.json").read_text())
    assert manifest["mark"] == case["mark"] == manifest["record"]["mark"]  # and into its bundle
    baseline = json.loads((suite_dir / "baseline.json").read_text())
    assert list(baseline) == ["tiny"] and list(baseline["tiny"]) == [case["name"]]
    run = subprocess.run([sys.executable, "-m", "vidchat.suite", "run", str(suite_dir), *TINY_SERVER_ARGS,
                          "--cache-dir", str(CACHE_DIR), "--out", str(tmp_path / "run")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout, run.stderr[-3000:])
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["summary"] == {"passed": 1, "failed": 0, "errors": 0}
    (asked,) = results["asks"]
    assert asked["question"] == "What is in front of the camera?" and asked["answer"] == baseline["tiny"][case["name"]]["0"]
    assert asked["mark"] == case["mark"] and asked["note"] == "the colour of the card"
    # The server's run and the command line's engine asked the same inputs and said the same.
    assert asked["inputs_sha256"] == page_results["asks"][0]["inputs_sha256"]
    assert asked["answer"] == page_results["asks"][0]["answer"]
    assert "Marked bad ✗ when recorded: said nothing of the card" in (tmp_path / "run" / "report.html").read_text()
