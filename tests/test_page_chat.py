"""The page's chat is the conversation's, in a real Chromium against the app
with real vLLM: a typed question sends only the question (one request on the
stream the tab already has open), and the chat is drawn from the session's
events, so an answer runs on whoever reads it: a tab reloaded mid-answer
finds it still streaming and sees it end."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from playwright.async_api import async_playwright

from vidchat.devtools.page import (
    BOT_HAS_TEXT,
    BOT_MESSAGES,
    ask,
    bot_texts,
    launch,
    open_and_start,
    session_id,
    set_setting,
    wait_for_answer,
    write_wav,
    write_y4m,
)
from vidchat.doors.page import STOPPED

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def camera(tmp_path_factory):
    d = tmp_path_factory.mktemp("camera")
    write_y4m(d / "cam.y4m", (200, 120, 40))
    write_wav(d / "mic.wav")
    return d / "cam.y4m", d / "mic.wav"


async def test_a_typed_question_sends_only_the_question_and_no_follow_up_event(server, camera, tmp_path):
    async with async_playwright() as pw:
        browser = await launch(pw, *camera, tmp_path)
        try:
            page = await open_and_start(browser, server.url + "/", min_buffer=4)
            await set_setting(page, "vc-max-tokens", "6")
            await ask(page, "First?")
            await wait_for_answer(page, 1)  # the chat feed's stream is open from here on
            sent: list = []
            page.on("request", lambda r: sent.append((r.method, r.url, r.post_data))
                    if r.url.startswith(server.url) and ("/gradio_api/" in r.url or "/webrtc/typing" in r.url)
                    else None)
            await ask(page, "Second?")
            await wait_for_answer(page, 2)
            joins = [s for s in sent if "/gradio_api/queue/join" in s[1]]
            # One Gradio event for the question (no Watch, Talk or re-ask
            # events after it), and at most the Enter report that warms its sample.
            assert len(joins) == 1, sent
            assert [s for s in sent if s not in joins and "/webrtc/typing" not in s[1]
                    and "/gradio_api/queue/data" not in s[1]] == [], sent
            assert len([s for s in sent if "/webrtc/typing" in s[1]]) <= 1, sent
            # It carries the question, the session and the settings: never the chat.
            data = json.loads(joins[0][2])["data"]
            assert data[0] == "Second?" and data[1] == await session_id(page)
            assert not any(isinstance(value, list) for value in data), data
        finally:
            await browser.close()


async def test_a_tab_reloaded_mid_answer_finds_it_streaming_and_sees_it_end(server, camera, tmp_path):
    """The tab that asked goes away mid-answer (a reload): the answer runs
    on to its last token all the same (before, the page's reading of it was
    the answer, and the reload cancelled it), and the reloaded tab shows it
    whole, streaming into it where it is still running when the tab is back."""
    async with async_playwright() as pw:
        browser = await launch(pw, *camera, tmp_path)
        try:
            page = await open_and_start(browser, server.url + "/", min_buffer=4)
            sid = await session_id(page)
            # The slider's most: late in a busy run, the tiny model wrote 1,200 tokens in 6 s, all
            # before the test could look (a flake). More tokens give the reload a wider window.
            await set_setting(page, "vc-max-tokens", "2048")
            await set_setting(page, "vc-temperature", "0")  # greedy: the random model runs on, no early end
            await ask(page, "Describe everything, at length.")
            await page.wait_for_function(BOT_HAS_TEXT % 1, timeout=60_000)

            async def generating() -> int:
                return (await asyncio.to_thread(server.get_json, "/api/health"))["running_requests"]

            assert await generating() == 1  # mid-answer as the tab goes
            await page.reload()
            await page.wait_for_function("document.querySelector('#vc-conn')?.dataset.tone === 'live'",
                                         timeout=30_000)
            assert await session_id(page) == sid
            await page.wait_for_function(BOT_HAS_TEXT % 1, timeout=30_000)
            if await generating():  # back before it ended: it streams into the reloaded tab
                shown = len((await bot_texts(page))[0])
                await page.wait_for_function(f"(n) => {BOT_MESSAGES}[0].innerText.length > n", arg=shown,
                                             timeout=60_000)
            texts = await wait_for_answer(page, 1, timeout=180)
            assert STOPPED not in "".join(texts), texts
            assert await page.evaluate("document.querySelectorAll('#vc-chat [data-testid=\"user\"]').length") == 1
            # Its record: every token it was allowed, ended by its length, not by a cancel.
            await page.click("#vc-inputs button, #vc-inputs .label-wrap")
            link = page.locator("#vc-inputs .vc-record-links a[href$='/record.json']")
            await link.wait_for(timeout=10_000)
            answer_id = re.search(r"/inputs/([^/]+)/record\.json", await link.get_attribute("href")).group(1)
            record = await asyncio.to_thread(server.get_json, f"/inputs/{answer_id}/record.json")
            assert record["completion_tokens"] == 2048 and record["finish_reason"] == "length", record
        finally:
            await browser.close()
