"""The CPU default preset end to end through the page: a SmolVLM2-256M with
its true configuration (random weights, reduced depth; see
vidchat/devtools/smolvlm_build.py) served with `--preset smolvlm2-256m`, driven in
Chromium with a fake camera."""

from __future__ import annotations

import re

import pytest
from conftest import CACHE_DIR, SERVER_ARGS, start_server, stop_server
from playwright.async_api import async_playwright
from test_page import media  # noqa: F401 (a fixture)

from vidchat.devtools.page import ask, launch, open_and_start, wait_for_answer

pytestmark = pytest.mark.browser

PRESET = "smolvlm2-256m"
NEW_FRAMES = re.compile(r"(?:[1-4] of 4 frames new \(encoded for this question\)|No frame new: the engine had "
                        r"encoded all 4 before the question)(?: \(.*\))? · encoding and prefill took \d+ ms")


@pytest.fixture(scope="module")
def smol_server(artifacts_dir):
    from vidchat.devtools import smolvlm_build

    path = smolvlm_build.ensure(CACHE_DIR, PRESET)
    # The preset's own limits; only the KV cache is sized for a test machine.
    srv = start_server(["--model", str(path), "--preset", PRESET, "--kv-cache-gb", "0.5", "--max-tokens", "8",
                        "--temperature", "0", *SERVER_ARGS], artifacts_dir / "server-smolvlm.log", timeout=300)
    yield srv
    stop_server(srv)


async def test_cpu_default_answers_through_the_page_with_its_preset(smol_server, media, tmp_path, artifacts_dir):
    async with async_playwright() as pw:
        browser = await launch(pw, media["red"], media["tone"], tmp_path)
        try:
            page = await open_and_start(browser, smol_server.url + "/")
            # This model hears nothing: Talk is unavailable, and the page says why and what to run instead.
            await page.wait_for_function("document.querySelector('#vc-talk input[type=checkbox]')?.disabled",
                                         timeout=30_000)
            talk_text = await page.locator("#vc-talk").inner_text()
            assert "unavailable" in talk_text and "--preset qwen2.5-omni-3b" in talk_text, talk_text
            # The preset's frames per question is the page's default.
            await page.click("#vc-settings button, #vc-settings .label-wrap")
            k = await page.locator("#vc-settings input[type=number]").first.input_value()
            assert k == "4"
            await ask(page, "What is in front of the camera?")
            texts = await wait_for_answer(page, 1, timeout=120)
            assert texts[0].strip() and "⚠" not in texts[0]
            await page.click("#vc-inputs button, #vc-inputs .label-wrap")
            await page.wait_for_selector("#vc-inputs .vc-frames img")
            assert await page.locator("#vc-inputs .vc-frames img").count() == 4
            # Issue 49: the preset samples 'stable', and What the model got says how
            # many of the frames the engine encoded for this question, and what it took.
            assert await page.locator("#vc-sampling input").input_value() == "Spread, reusing the last picks"
            said = (await page.locator("#vc-inputs .vc-new-frames").inner_text()).strip()
            assert NEW_FRAMES.fullmatch(said), said
            await page.locator("#vc-chat .vc-fold [role=button]").last.click()  # the answer's fold says it too
            folded = page.locator("#vc-chat .vc-new-frames").last
            await folded.wait_for(state="visible", timeout=10_000)
            assert NEW_FRAMES.fullmatch((await folded.inner_text()).strip())
            await folded.scroll_into_view_if_needed()
            await page.screenshot(path=str(artifacts_dir / "page-smolvlm2-256m-fold.png"))
            await page.screenshot(path=str(artifacts_dir / "page-smolvlm2-256m.png"), full_page=True)

            # Frames as one video: this model takes none in vLLM; the page says so and keeps working.
            await page.click("#vc-settings label:has-text('video')")
            await ask(page, "And as a video?")
            texts = await wait_for_answer(page, 2, timeout=60)
            assert "does not take video" in texts[1] and "send frames as images" in texts[1]
            await page.click("#vc-settings label:has-text('images')")
            await ask(page, "Once more as images?")
            texts = await wait_for_answer(page, 3, timeout=120)
            assert texts[2].strip() and "⚠" not in texts[2]
        finally:
            await browser.close()
    health = smol_server.get_json("/api/health")
    assert health["ok"] and health["running_requests"] == 0
