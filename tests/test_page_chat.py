"""The page's chat is the conversation's, in a real Chromium against the app
with real vLLM: a typed question is one request that returns its ticket,
and the chat is drawn from the session's events (the stream the tab
already has open), so an answer runs on whoever reads it: a tab reloaded
mid-answer finds it still streaming and sees it end."""

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
)
from vidchat.doors.page import REPLACED_MID, REPLACED_NOTE, STOPPED

pytestmark = pytest.mark.browser


async def test_a_typed_question_is_one_request_that_returns_its_ticket(server, camera, tmp_path):
    """The question goes as one POST /webrtc/ask (the question, the session,
    the settings: never the chat), answered with its ticket; no Gradio event
    runs for it, and the chat shows it from the session's events."""
    async with async_playwright() as pw:
        browser = await launch(pw, *camera, tmp_path)
        try:
            page = await open_and_start(browser, server.url + "/", min_buffer=4)
            await set_setting(page, "vc-max-tokens", "6")
            await ask(page, "First?")
            await wait_for_answer(page, 1)
            sent: list = []
            page.on("request", lambda r: sent.append((r.method, r.url, r.post_data))
                    if r.url.startswith(server.url) and ("/gradio_api/" in r.url or "/webrtc/" in r.url)
                    and "/webrtc/stats" not in r.url and "/webrtc/live" not in r.url else None)
            answered: list = []
            page.on("response", lambda r: answered.append(r) if r.url.endswith("/webrtc/ask") else None)
            await ask(page, "Second?")
            await wait_for_answer(page, 2)
            asks = [s for s in sent if s[1].endswith("/webrtc/ask")]
            # One request for the question, and at most the typing report that warms its prompt.
            assert len(asks) == 1 and asks[0][0] == "POST", sent
            assert [s for s in sent if s not in asks and "/webrtc/typing" not in s[1]] == [], sent
            body = json.loads(asks[0][2])
            assert body["question"] == "Second?" and body["session_id"] == await session_id(page)
            assert body["settings"]["max_tokens"] == 6 and not any(isinstance(v, list) for v in body.values())
            reply = await answered[0].json()
            assert isinstance(reply["ticket"], int), reply
            # The chat came from the session's events, on the stream the tab already had open.
            assert await page.evaluate("document.querySelectorAll('#vc-chat [data-testid=\"user\"]').length") == 2
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


MESSAGES = ("[...document.querySelectorAll('#vc-chat .vc-msg')].filter((m) => !m.querySelector('.vc-fold'))"
            ".map((m) => [m.dataset.testid, m.innerText.trim()])")


@pytest.mark.parametrize("width, height", [(1280, 900), (390, 844)], ids=["desktop", "phone"])
async def test_questions_in_a_row_each_say_their_fate_and_the_chat_follows_past_an_open_fold(server, camera, tmp_path,
                                                                                              width, height):
    """Issue 59, point 11: four questions typed one right after another each keep their
    bubble, as typed (not Markdown), and say what became of them; with an
    answer's fold opened, the chat still follows the next answer to its end."""
    async with async_playwright() as pw:
        browser = await launch(pw, *camera, tmp_path)
        try:
            page = await open_and_start(browser, server.url + "/", viewport=(width, height), min_buffer=4)
            # None ends before the next is typed, even on a loaded machine (300 tokens once did).
            await set_setting(page, "vc-max-tokens", "1000")
            await set_setting(page, "vc-temperature", "0")
            typed = ["one", "*two*", "three <img src=x>", "four"]
            for text in typed:  # one after another, as fast as the box takes them
                await ask(page, text)
            await page.wait_for_function("(q => q.asked === 4 && q.finished === 4)(window.vidchat.questions)",
                                         timeout=90_000)
            said = await page.evaluate(MESSAGES)
            users = [text for who, text in said if who == "user"]
            assert users == typed, said  # every question, as typed: no italics, no image
            assert await page.locator("#vc-chat img:not(.vc-frames img):not(figure img)").count() == 0
            fates: dict[str, list[str]] = {}
            for who, text in said:
                if who == "user":
                    current = text
                    fates[current] = []
                else:
                    fates[current].append(text)
            # Each question says its fate: replaced by the next (before answering, or while answering:
            # its words so far, then the note) or, on a machine so starved that an answer ended
            # before the next was typed, answered; none stopped. The last was answered.
            notes = (REPLACED_NOTE, REPLACED_MID)
            assert all(replies and STOPPED not in replies for replies in fates.values()), said
            replaced = [q for q, replies in fates.items() if replies[-1] in notes]
            assert replaced and set(replaced) <= set(typed[:3]), said

            # A fold opened, then another question: the chat follows its answer to the end.
            await set_setting(page, "vc-max-tokens", "60")
            fold = page.locator("#vc-chat .vc-fold").last
            await fold.locator("[role=button]").click()
            await fold.locator(".vc-inputs").wait_for(state="visible")
            await ask(page, "five")
            await page.wait_for_function("(q => q.asked === 5 && q.finished === 5)(window.vidchat.questions)",
                                         timeout=60_000)
            end = await page.evaluate("(() => { const l = document.querySelector('#vc-chat .vc-chat-list');"
                                      " return l.scrollHeight - l.scrollTop - l.clientHeight; })()")
            assert end < 24, f"the chat stopped {end} px above its end"
        finally:
            await browser.close()
