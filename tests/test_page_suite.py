"""The page's verdict and Add to suite (--suite-dir), in Chromium against
the app with real vLLM: from each answer's own fold, an earlier answer
marked bad with a note (its record says so) becomes a case (its bundle, its
question, the note, the verdict; not a baseline, which the page says) and
the newest, unmarked, a case held to its answer as this model's baseline;
``python -m vidchat.suite run --model tiny`` then passes both, its report
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
            # Every answer's fold carries its verdict and Add to suite (issue 59, point 5), not only the newest's.
            await ask(page, "What is in front of the camera?")
            await wait_for_answer(page, 1)
            await ask(page, "And the wall?")
            await wait_for_answer(page, 2)
            first = page.locator("#vc-chat .vc-fold").first
            await first.locator("[role=button]").click()
            verdict = first.locator(".vc-mark")
            await verdict.wait_for(state="visible", timeout=30_000)
            await verdict.locator("input[name=note]").fill("said nothing of the card")
            await verdict.locator("button[data-mark=bad]").click()
            await page.wait_for_function("document.querySelector('#vc-chat .vc-fold .vc-mark-said')"
                                         "?.textContent.startsWith('marked bad')", timeout=30_000)
            assert await verdict.locator("button[data-mark=bad]").get_attribute("aria-pressed") == "true"
            record = await page.evaluate("(id) => fetch(`/inputs/${id}/record.json`).then((r) => r.json())",
                                         await verdict.get_attribute("data-answer"))
            assert record["mark"] == {"mark": "bad", "note": "said nothing of the card"}  # its record says it
            assert record["question"] == "What is in front of the camera?"  # the first answer's, not the newest's
            form = first.locator(".vc-add-suite")
            await form.wait_for(state="visible", timeout=30_000)
            await form.locator("input[name=note]").fill("the colour of the card")
            await form.locator("button").click()
            said = form.locator(".vc-add-suite-said")
            await page.wait_for_function("document.querySelector('#vc-chat .vc-fold .vc-add-suite-said')"
                                         "?.textContent.startsWith('added as case')", timeout=30_000)
            # Named within the suite's folder (the server's own paths are not the page's to show);
            # an answer marked bad is not kept as the baseline, and the page says so (point 3).
            assert await said.inner_text() == ("added as case “what-is-in-front-of-the-camera” to suite.toml "
                                               "(marked bad: its answer is not kept as the baseline)")
            # The newest answer, unmarked, from its own fold: its answer is the baseline.
            second = page.locator("#vc-chat .vc-fold").nth(1)
            await second.locator("[role=button]").click()
            await second.locator(".vc-add-suite button").click()
            await page.wait_for_function("document.querySelectorAll('#vc-chat .vc-fold .vc-add-suite-said')[1]"
                                         "?.textContent.startsWith('added as case')", timeout=30_000)
            assert await second.locator(".vc-add-suite-said").inner_text() == \
                "added as case “and-the-wall” to suite.toml"
            await page.screenshot(path=str(artifacts_dir / "page-add-to-suite.png"), full_page=True)

            # The Suites panel: the case is listed, and a run on the server's own model passes it.
            await page.click("#vc-suites-panel button, #vc-suites-panel .label-wrap")
            panel = page.locator("#vc-suites")
            # The server's own paths are not the page's to show: the suite by its folder's name.
            assert str(suite_server.suite_dir) not in await panel.inner_text()
            await panel.locator(".vc-suite-table td", has_text="and-the-wall").wait_for(timeout=30_000)
            assert await panel.locator(".vc-suite-run").count() == 1  # no --compare-model: this model only
            await panel.locator(".vc-suite-run[data-engine=main]").click()
            await page.wait_for_function("document.querySelector('#vc-suites .vc-suite-progress')"
                                         "?.dataset.state === 'finished'", timeout=120_000)
            progress = await panel.locator(".vc-suite-progress").inner_text()
            assert progress.startswith("Finished on tiny: 2 passed, 0 failed, 0 errors"), progress
            rows = panel.locator(".vc-suite-results tbody tr")
            assert await rows.count() == 2
            assert [await rows.nth(i).get_attribute("data-status") for i in range(2)] == ["passed", "passed"]
            kept_row = rows.filter(has_text="and-the-wall")
            assert "same" in await kept_row.inner_text()  # the unmarked answer equals its baseline
            assert "no baseline" in await rows.filter(has_text="what-is-in-front").inner_text()  # the bad one
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
    assert page_results["models"] == ["tiny"] and page_results["summary"] == {"passed": 2, "failed": 0, "errors": 0}
    assert (page_run / "junit.xml").is_file() and (page_run / "report.html").is_file()
    marked, kept = tomllib.loads((suite_dir / "suite.toml").read_text())["case"]
    assert marked["name"] == "what-is-in-front-of-the-camera" and marked["note"] == "the colour of the card"
    assert marked["ask"] == [{"expect": {}}]  # marked bad: not held to its own answer
    assert marked["mark"] == {"mark": "bad", "note": "said nothing of the card"}  # the verdict, carried into the case
    manifest = json.loads((suite_dir / marked["bundle"] / "manifest.json").read_text())
    assert manifest["mark"] == marked["mark"] == manifest["record"]["mark"]  # and into its bundle
    assert manifest["model_name"] == "tiny"
    assert kept["name"] == "and-the-wall" and kept["ask"] == [{"expect": {"same_as_baseline": True}}]
    baseline = json.loads((suite_dir / "baseline.json").read_text())
    # Filed under the model's one name (the server's --model tiny), the bad answer left out.
    assert list(baseline) == ["tiny"] and list(baseline["tiny"]) == [kept["name"]]
    run = subprocess.run([sys.executable, "-m", "vidchat.suite", "run", str(suite_dir), *TINY_SERVER_ARGS,
                          "--cache-dir", str(CACHE_DIR), "--out", str(tmp_path / "run")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout, run.stderr[-3000:])
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["summary"] == {"passed": 2, "failed": 0, "errors": 0}
    first, second = results["asks"]
    assert first["question"] == "What is in front of the camera?" and first["mark"] == marked["mark"]
    assert first["note"] == "the colour of the card"
    assert second["question"] == "And the wall?" and second["answer"] == baseline["tiny"][kept["name"]]["0"]
    # The server's run and the command line's engine asked the same inputs and said the same.
    assert [a["inputs_sha256"] for a in results["asks"]] == [a["inputs_sha256"] for a in page_results["asks"]]
    assert [a["answer"] for a in results["asks"]] == [a["answer"] for a in page_results["asks"]]
    assert "Marked bad ✗ when recorded: said nothing of the card" in (tmp_path / "run" / "report.html").read_text()
