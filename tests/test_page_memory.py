"""The session's memory on the page (issue 60, point 5): the switch turns it
on for the tab's session, the strip under the preview shows the scene log's
keyframes with their times, a caption appears once the model has written it,
and a keyframe picked on the strip goes with the next question (its record
and its fold say so). Real Chromium, real aiortc, real vLLM, both sizes."""

from __future__ import annotations

import asyncio

import pytest
from playwright.async_api import async_playwright

from vidchat.devtools.harness import eventually_async
from vidchat.devtools.page import ask, launch, open_and_start, session_id, set_setting, wait_for_answer

pytestmark = pytest.mark.browser

SIZES = pytest.mark.parametrize("width, height", [(1280, 900), (390, 844)], ids=["desktop", "phone"])
RECORDS = "[...document.querySelectorAll('#vc-chat a[href$=\"/record.json\"]')].map((a) => a.getAttribute('href'))"
KEYFRAMES = "document.querySelectorAll('#vc-memory-strip .vc-keyframe').length"
CAPTIONED = "document.querySelectorAll('#vc-memory-strip .vc-kf-caption:not(.vc-kf-pending)').length"


@SIZES
async def test_the_memory_strip_shows_keyframes_and_captions_and_a_pick_goes_with_the_next_question(
        server, camera, tmp_path, width, height, artifacts_dir):
    async with async_playwright() as pw:
        browser = await launch(pw, *camera, tmp_path)
        try:
            page = await open_and_start(browser, server.url + "/", viewport=(width, height), min_buffer=4)
            sid = await session_id(page)
            await page.wait_for_function("!document.querySelector('#vc-memory').hidden", timeout=30_000)
            assert not await page.is_checked("#vc-memory-on")  # the CPU's default (--memory auto)
            assert "Off: tick it" in await page.inner_text("#vc-memory-note")

            await page.check("#vc-memory-on")
            # The tick reaches the server as its own request: the log starts with the scene on screen.
            await eventually_async(lambda: asyncio.to_thread(
                lambda: (m := server.get_json(f"/sessions/{sid}/memory"))["memory"] is True and len(m["keyframes"]) >= 1),
                30, "the session remembers, from the scene on screen")
            await page.wait_for_function(f"{KEYFRAMES} >= 1", timeout=30_000)
            # The captioner writes its caption while the engine is idle; the strip shows it when written.
            await page.wait_for_function(f"{CAPTIONED} >= 1", timeout=60_000)
            first = page.locator("#vc-memory-strip .vc-keyframe").first
            assert await first.locator(".vc-kf-time").inner_text() != ""
            seq = int(await first.get_attribute("data-seq"))

            await first.click()
            await page.wait_for_function(
                f"document.querySelector('#vc-memory-strip .vc-keyframe[data-seq=\"{seq}\"]')"
                ".getAttribute('aria-pressed') === 'true'", timeout=10_000)
            assert "goes with the next question" in await page.inner_text("#vc-memory-note")
            await page.screenshot(path=str(artifacts_dir / f"page-memory-{width}.png"))

            await set_setting(page, "vc-max-tokens", "6")
            await ask(page, "What is this one?")
            await wait_for_answer(page, 1)
            await page.wait_for_function(f"{RECORDS}.length === 1", timeout=30_000)
            record = await asyncio.to_thread(server.http_json, (await page.evaluate(RECORDS))[0])
            assert [f["seq"] for f in record["memory_frames"]] == [seq]
            assert record["memory_tokens"] > 0 and "Memory of this session" in record["prompt"]
            # Used once: the pin is gone, and the answer's fold shows the keyframe it got.
            await page.wait_for_function(
                "[...document.querySelectorAll('#vc-memory-strip .vc-keyframe')].every("
                "(k) => k.getAttribute('aria-pressed') === 'false')", timeout=10_000)
            assert await page.locator("#vc-chat .vc-memory-used").count() == 1
            assert "1 pinned keyframe" in await page.locator("#vc-chat .vc-memory-used").first.text_content()

            # Off again: nothing more is logged, and the strip says so.
            await page.uncheck("#vc-memory-on")
            await page.wait_for_function("document.querySelector('#vc-memory-note').textContent.startsWith('Off')",
                                         timeout=10_000)
            assert (await asyncio.to_thread(server.get_json, f"/sessions/{sid}/memory"))["memory"] is False
        finally:
            await browser.close()
