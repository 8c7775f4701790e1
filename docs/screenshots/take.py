"""Take the page's screenshots at 1280×900 and 390×844: a tab live on the
tiny model, two questions answered (the second's "what the model got" fold
opened). Run from the repository root:

    .venv/bin/python docs/screenshots/take.py OUT_PREFIX

writes OUT_PREFIX-desktop.png and OUT_PREFIX-phone.png (the phone's scrolled to the chat)."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from playwright.async_api import async_playwright  # noqa: E402

from vidchat.devtools import harness  # noqa: E402
from vidchat.devtools.page import (  # noqa: E402
    ask,
    launch,
    open_and_start,
    set_setting,
    wait_for_answer,
    write_wav,
    write_y4m,
)

SIZES = {"desktop": (1280, 900), "phone": (390, 844)}
QUESTION = "What does this print?\n```\nfor frame in frames: print(frame.index, frame.time)\n```"


async def main(prefix: str) -> None:
    work = Path(tempfile.mkdtemp())
    write_y4m(work / "cam.y4m", (40, 120, 200))
    write_wav(work / "mic.wav")
    server = harness.start_server(["--model", "tiny", "--max-images", "16", "--max-model-len", "4096",
                                   "--kv-cache-gb", "0.25"], work / "server.log",
                                  timeout=600, cache_dir=Path.home() / ".cache" / "vidchat")
    try:
        async with async_playwright() as pw:
            browser = await launch(pw, work / "cam.y4m", work / "mic.wav", work)
            try:
                for name, size in SIZES.items():
                    page = await open_and_start(browser, server.url + "/", viewport=size, min_buffer=4)
                    await set_setting(page, "vc-max-tokens", "40")
                    await ask(page, "What do you see?")
                    await wait_for_answer(page, 1, timeout=240)
                    await ask(page, QUESTION)
                    await wait_for_answer(page, 2, timeout=240)
                    await page.locator("#vc-chat").scroll_into_view_if_needed()
                    await page.screenshot(path=f"{prefix}-{name}.png")
                    await page.close()
            finally:
                await browser.close()
    finally:
        harness.stop_server(server)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
