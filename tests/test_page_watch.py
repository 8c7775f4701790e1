"""Watch in the page (Chromium with a fake camera whose scene cuts every
second, the real server and vLLM): ticking Watch asks on scene changes;
unticking it ends watching at once (later scene changes ask nothing), and
ticking it again resumes; the chat's Stop ends watching too and unticks the
box. (Before, an unticked Watch went on asking: the "off" waited behind the
running watch event, which never ended.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import eventually_async
from playwright.async_api import async_playwright

from vidchat.devtools.page import (
    BOT_HAS_TEXT,
    ask,
    bot_texts,
    launch,
    next_frame,
    open_and_start,
    session_id,
    set_setting,
    write_wav,
    write_y4m,
)

pytestmark = pytest.mark.browser

CUTS = [(200, 40, 40), (40, 60, 200), (40, 180, 60), (230, 230, 230)]
WATCH_BOX = "#vc-watch input[type=checkbox]"
SCENE_NOTICES = ("[...document.querySelectorAll('#vc-chat [data-testid=\"bot\"]')]"
                 ".filter((m) => m.innerText.includes('Scene changed')).length")


@pytest.fixture(scope="module")
def cutting_camera(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("watch")
    video, audio = folder / "cuts.y4m", folder / "tone.wav"
    write_y4m(video, CUTS[0], seconds=8.0, cuts=CUTS, cut_every_s=1.0)
    write_wav(audio)
    return video, audio


def _health(server) -> dict:
    return server.get_json("/api/health")


async def _stats(server, sid: str) -> dict:
    return await asyncio.to_thread(server.get_json, f"/webrtc/stats?session_id={sid}")


async def _scene_changes(server, sid: str, n: int) -> None:
    start = (await _stats(server, sid))["scene_changes"]

    async def more() -> bool:
        return (await _stats(server, sid))["scene_changes"] >= start + n

    await eventually_async(more, 30, f"{n} more scene change(s)", interval=0.1)


async def _asks_nothing_more(server, page, sid: str, why: str) -> None:
    """Once the server says it stopped watching, scene changes ask nothing."""
    async def not_watching() -> bool:
        return (await _stats(server, sid))["watching"] is False

    await eventually_async(not_watching, 10, f"the server stops watching once {why}", interval=0.05)
    # A question that was already under way when the switch arrived is
    # counted by then: the next scene change is a second or more away.
    await _scene_changes(server, sid, 1)
    asked = (await asyncio.to_thread(_health, server))["questions_asked"]
    notices = await page.evaluate(SCENE_NOTICES)
    await _scene_changes(server, sid, 3)
    assert (await asyncio.to_thread(_health, server))["questions_asked"] == asked, f"watch asked after {why}"
    assert await page.evaluate(SCENE_NOTICES) == notices, f"a scene-change notice after {why}"


async def _watch_asks(page, server) -> None:
    """A scene change is asked about: a new notice, and a question asked."""
    notices = await page.evaluate(SCENE_NOTICES)
    asked = (await asyncio.to_thread(_health, server))["questions_asked"]
    await page.check(WATCH_BOX)
    await page.wait_for_function(f"{SCENE_NOTICES} > {notices}", timeout=30_000)

    async def one_more_asked() -> bool:
        return (await asyncio.to_thread(_health, server))["questions_asked"] > asked

    await eventually_async(one_more_asked, 30, "the watch question is asked", interval=0.1)


async def test_watch_switches_off_at_once_resumes_and_ends_with_stop(server, cutting_camera, tmp_path, artifacts_dir):
    async with async_playwright() as pw:
        browser = await launch(pw, *cutting_camera, tmp_path)
        try:
            page = await open_and_start(browser, server.url)
            sid = await session_id(page)
            await set_setting(page, "vc-max-tokens", "4")
            await set_setting(page, "vc-watch-every", "1")
            await _watch_asks(page, server)
            await page.uncheck(WATCH_BOX)
            await _asks_nothing_more(server, page, sid, "Watch was unticked")
            # Ticked again, it watches again (the "off" left nothing queued).
            await _watch_asks(page, server)
            await page.screenshot(path=str(artifacts_dir / "page-watch.png"), full_page=True)
            # Stop ends the answer and the watching, and the box says so.
            await page.click("#vc-stop-answer")
            await page.wait_for_function(f"!document.querySelector('{WATCH_BOX}').checked", timeout=10_000)
            await _asks_nothing_more(server, page, sid, "Stop was pressed")
        finally:
            await browser.close()


async def test_watch_and_talk_refused_without_a_camera_untick(server, cutting_camera, tmp_path):
    async with async_playwright() as pw:
        browser = await launch(pw, *cutting_camera, tmp_path)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            await page.goto(server.url)
            for box, said in (("#vc-watch", "Watch mode needs a running source"),
                              ("#vc-talk", "Talk mode needs a running source")):
                # A click, not check(): the refusal may untick the box before
                # Playwright looks at it again.
                await page.click(f"{box} input[type=checkbox]")
                await page.get_by_text(said).first.wait_for(timeout=30_000)
                await page.wait_for_function(f"!document.querySelector('{box} input[type=checkbox]').checked",
                                             timeout=10_000)
        finally:
            await browser.close()


EVENTS_ENDED = "window.vidchat.questions.asked > 0 && window.vidchat.questions.asked === window.vidchat.questions.finished"
NOTICE_TEXTS = ("[...document.querySelectorAll('#vc-chat [data-testid=\"bot\"]')]"
                ".map((m) => m.innerText).filter((t) => t.includes('Scene changed'))")
PANEL_SHOWN = ("[...document.querySelectorAll('#vc-chat [data-testid=\"bot\"]')]"
               ".some((m) => m.querySelector('.vc-fold'))")
BOT_COUNT = "document.querySelectorAll('#vc-chat [data-testid=\"bot\"]').length"


async def test_clear_chat_stops_the_answer_and_nothing_of_the_old_chat_comes_back(server, cutting_camera, tmp_path):
    """Clear mid-answer: the answer stops on the server and its later updates
    (and its event's last message, which repeats the whole chat) never
    refill the chat. Clear while watching: the next watched answer starts on
    the empty chat, not on the watch loop's own copy of the old one."""
    async with async_playwright() as pw:
        browser = await launch(pw, *cutting_camera, tmp_path)
        try:
            page = await open_and_start(browser, server.url)
            sid = await session_id(page)
            await set_setting(page, "vc-max-tokens", "2000")
            await set_setting(page, "vc-temperature", "0")  # greedy: the random model runs on, no early end
            await ask(page, "Describe everything, at length.")
            await page.wait_for_function(BOT_HAS_TEXT % 1, timeout=60_000)
            await page.click("#vc-clear")

            async def nothing_generating() -> bool:
                return (await asyncio.to_thread(_health, server))["running_requests"] == 0

            await eventually_async(nothing_generating, 30, "Clear stops the answer's generation", interval=0.05)
            # Both events ended, in either order: Clear waits for the answer
            # it stops, so the question's event may end before Clear's empty chat shows.
            await page.wait_for_function(f"{EVENTS_ENDED} && window.vidchat.clears === 1", timeout=30_000)
            await next_frame(page)
            assert await page.evaluate(BOT_COUNT) == 0, ("the cleared chat came back", await bot_texts(page))
            await _stats(server, sid)  # the session itself goes on (a 404 once it ended)

            await set_setting(page, "vc-max-tokens", "4")
            await set_setting(page, "vc-watch-every", "1")
            await _watch_asks(page, server)
            await page.wait_for_function(PANEL_SHOWN, timeout=30_000)  # a watched answer is whole
            # Each notice names its own scene change's time: none comes twice.
            old = set(await page.evaluate(NOTICE_TEXTS))
            assert old
            await page.click("#vc-clear")
            # The old chat goes. (Not "the chat is empty": watching every
            # second, the next scene's notice may already be there.)
            await page.wait_for_function(f"(old) => !{NOTICE_TEXTS}.some((t) => old.includes(t))", arg=sorted(old),
                                         timeout=10_000)
            # The next watched answer starts on the empty chat.
            await page.wait_for_function(PANEL_SHOWN, timeout=30_000)
            now = set(await page.evaluate(NOTICE_TEXTS))
            assert now and not now & old, f"the watch loop put the cleared chat back: {sorted(now & old)}"
            await page.uncheck(WATCH_BOX)
        finally:
            await browser.close()


def _write_still(path: Path, seconds: float = 4.0) -> None:
    """A still room with sensor noise (a fake camera pointed at a wall)."""
    import numpy as np

    from vidchat.devtools.page import FPS, TEST_CAMERA_SIZE

    w, h = TEST_CAMERA_SIZE
    rng = np.random.default_rng(3)
    room = np.linspace(60, 170, w)[None, :] + np.linspace(0, 30, h)[:, None]
    with open(path, "wb") as f:
        f.write(f"YUV4MPEG2 W{w} H{h} F{FPS}:1 Ip A1:1 C420jpeg\n".encode())
        for _ in range(int(seconds * FPS)):
            y = np.clip(room + rng.normal(0, 2.5, (h, w)), 0, 255).astype(np.uint8)
            f.write(b"FRAME\n" + y.tobytes() + np.full((h // 2) * (w // 2) * 2, 128, np.uint8).tobytes())


@pytest.mark.parametrize("width, height", [(1280, 900), (390, 844)], ids=["desktop", "phone"])
async def test_watch_says_what_it_does_and_an_object_crossing_is_a_scene_change(server, tmp_path, width, height,
                                                                                 artifacts_dir):
    """Issue 59, point 7: a square a sixth of the picture's height sliding
    across a still room (no cut, no colour change) is a scene change that
    Watch asks about, and the page says what watching is doing; pointed at a
    still wall with camera noise, it says it has seen no scene change."""
    moving, still, tone = tmp_path / "moving.y4m", tmp_path / "still.y4m", tmp_path / "tone.wav"
    write_y4m(moving, (90, 110, 140))
    _write_still(still)
    write_wav(tone)
    status = "#vc-watch-status"
    async with async_playwright() as pw:
        browser = await launch(pw, moving, tone, tmp_path)
        try:
            page = await open_and_start(browser, server.url, viewport=(width, height), min_buffer=4)
            await set_setting(page, "vc-max-tokens", "4")
            await set_setting(page, "vc-watch-every", "1")
            await _watch_asks(page, server)
            await page.wait_for_function(
                f"/^Watching for \\d+ s: [1-9]\\d* scene changes?, asked [1-9]/"
                f".test(document.querySelector('{status}')?.textContent || '')", timeout=30_000)
            await page.locator(status).scroll_into_view_if_needed()
            await page.screenshot(path=str(artifacts_dir / f"page-watch-status-{width}.png"))
            await page.uncheck(WATCH_BOX)
            await page.wait_for_function(f"document.querySelector('{status}').hidden", timeout=10_000)
        finally:
            await browser.close()
        browser = await launch(pw, still, tone, tmp_path)
        try:
            page = await open_and_start(browser, server.url, viewport=(width, height), min_buffer=1)
            sid = await session_id(page)
            await page.check(WATCH_BOX)

            async def watched_a_while() -> dict | None:
                watch = (await _stats(server, sid)).get("watch")
                return watch if watch and watch["for_s"] >= 6 else None

            watch = await eventually_async(watched_a_while, 30, "six seconds of watching", interval=0.2)
            assert watch["scene_changes"] == 0 and watch["asked"] == 0 and watch["waiting"] == "scene_change"
            await page.wait_for_function(
                f"(document.querySelector('{status}')?.textContent || '').includes('no scene change yet')",
                timeout=10_000)
            assert await page.evaluate(SCENE_NOTICES) == 0
        finally:
            await browser.close()
