"""Stop is a pause (issue 59, point 1): stopping and starting the camera, or
reloading a stopped tab, keeps the session with its chat and kept answers;
the next question carries the chat. When the session does end, the chat
says so. Real Chromium, real aiortc, real vLLM, at both page sizes."""

from __future__ import annotations

import asyncio

import pytest
from playwright.async_api import async_playwright

from vidchat.devtools.harness import eventually_async
from vidchat.devtools.page import ask, launch, open_and_start, session_id, set_setting, wait_for_answer, wait_live
from vidchat.doors.webrtc_routes import KEEPALIVE_S, RELOAD_GRACE_S

pytestmark = pytest.mark.browser

SIZES = pytest.mark.parametrize("width, height", [(1280, 900), (390, 844)], ids=["desktop", "phone"])
RECORDS = "[...document.querySelectorAll('#vc-chat a[href$=\"/record.json\"]')].map((a) => a.getAttribute('href'))"
USER_BUBBLES = "document.querySelectorAll('#vc-chat .vc-user').length"


async def _stats(server, sid: str) -> dict:
    return await asyncio.to_thread(server.http_json, f"/webrtc/stats?session_id={sid}")


async def _paused(server, sid: str) -> dict:
    async def check():
        stats = await _stats(server, sid)
        return stats if stats.get("paused") is True else None

    return await eventually_async(check, 20, "the session paused", interval=0.1)


@SIZES
async def test_stop_start_and_a_stopped_reload_keep_the_chat_and_its_answers(server, camera, tmp_path, width, height,
                                                                             artifacts_dir):
    async with async_playwright() as pw:
        browser = await launch(pw, *camera, tmp_path)
        try:
            page = await open_and_start(browser, server.url + "/", viewport=(width, height), min_buffer=4)
            sid = await session_id(page)
            await set_setting(page, "vc-max-tokens", "6")
            await ask(page, "Remember me?")
            await wait_for_answer(page, 1)
            first_record = (await page.evaluate(RECORDS))[0]

            await page.click("#vc-stop")
            await page.wait_for_function("document.querySelector('#vc-conn').textContent === 'Stopped'")
            await _paused(server, sid)
            assert await session_id(page) == sid
            assert "Start carries on" in await page.inner_text("#vc-note")
            assert (await page.inner_text("#vc-stats")).startswith("Stopped: this session")  # not "No session"
            assert await page.evaluate(USER_BUBBLES) == 1
            await page.screenshot(path=str(artifacts_dir / f"page-paused-{width}.png"))

            # Reloaded while stopped: the tab claims its session again and shows its chat.
            await page.reload()
            await page.wait_for_function(f"{USER_BUBBLES} === 1", timeout=30_000)
            assert await session_id(page) == sid
            assert await page.inner_text("#vc-conn") != "Live"
            assert (await page.inner_text("#vc-stats")).startswith("Stopped: this session")
            # The reload's grace passes and the session stays (the server says so in its log).
            await eventually_async(lambda: f"session {sid[:6]}… kept: its tab came back" in server.log() or None, 20,
                                   "the reload grace found the tab back")
            assert (await _stats(server, sid))["paused"] is True

            await page.click("#vc-start")
            await wait_live(page)
            assert await session_id(page) == sid
            assert (await _stats(server, sid))["paused"] is False
            assert await page.evaluate(USER_BUBBLES) == 1
            await ask(page, "Still me?")
            await wait_for_answer(page, 2)
            # The second question carried the first exchange, and the first answer is still kept.
            await page.wait_for_function(f"{RECORDS}.length === 2", timeout=30_000)
            second = await asyncio.to_thread(server.http_json, (await page.evaluate(RECORDS))[1])
            assert second["question"] == "Still me?"
            # One exchange before it: its question and its answer, two turns (messages) of two.
            assert second["history_turns"] == 2 == second["history_turns_total"], second
            kept = await asyncio.to_thread(server.http_json, first_record)
            assert kept["question"] == "Remember me?"
            await page.click("#vc-stop")
            await _paused(server, sid)
        finally:
            await browser.close()
    # Stopped, then its tab gone (a browser closed whole sends no pagehide
    # beacon): the session ends once its chat stream has been gone for the
    # reload grace, not at the idle timeout, and holds no place meanwhile for long.

    async def ended() -> dict | None:
        stats = await _stats(server, sid)
        return stats if "detail" in stats else None

    # Noticed at the chat stream's next keepalive at the latest, then the grace.
    gone = await eventually_async(ended, KEEPALIVE_S + RELOAD_GRACE_S + 20, "the stopped tab's session ends")
    assert gone["detail"] == "session ended: the tab went away", gone
