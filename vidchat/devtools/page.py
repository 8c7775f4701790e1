"""Driving the live page in Debian's headless Chromium (Playwright) with a
fake camera and microphone: shared by the browser tests and bench/page.py.

Every wait here is for something the page says happened (a message shown,
the panel of what the model got, a chat event ended), never for a stretch of
time.
"""

from __future__ import annotations

import wave
from pathlib import Path
from typing import Any

import numpy as np

CHROMIUM = "/usr/bin/chromium"
# Flags that keep Chromium off this machine's closed network and quiet.
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
FPS = 15
# The fake camera's picture in tests: the size sessions store frames at
# (vidchat.media), so Chromium's encoder and the server's decoder handle a
# quarter of a webcam's pixels for the same stored frames. The page
# benchmark passes WEBCAM_SIZE: what a user's browser sends.
TEST_CAMERA_SIZE = (320, 240)
WEBCAM_SIZE = (640, 480)

# The model's messages in the chat, without the "What the model got" panels
# folded under them (a <details class="vc-fold">, vidchat/doors/page/chat.py)
# or the "Thinking…" that stands for an answer until its first token.
BOT_MESSAGES = ("[...document.querySelectorAll('#vc-chat [data-testid=\"bot\"]')]"
                ".filter((m) => !m.querySelector('.vc-fold, .vc-typing'))")
# JS predicate: the n-th bot message exists and shows text.
BOT_HAS_TEXT = ("(() => { const b = " + BOT_MESSAGES + ";"
                " return b.length >= %d && b[b.length - 1].innerText.trim().length > 0; })()")
# JS predicate: the n-th bot message is final. Either a "What the model got"
# panel follows it (the page appends one in an answer's last update, after any
# notice; watched and spoken answers too), or it is the newest message and
# the chat shows every typed question's outcome (a refused question's notice,
# or the camera-stopped hint, has no panel).
ANSWER_FINAL = ("(() => { const all = [...document.querySelectorAll('#vc-chat [data-testid=\"bot\"]')];"
                " let seen = 0;"
                " for (const m of all) { if (m.querySelector('.vc-typing')) continue;"
                " if (m.querySelector('.vc-fold')) { if (seen >= %(n)d) return true; }"
                " else seen++; }"
                " const q = window.vidchat.questions;"
                " return seen === %(n)d && q.asked > 0 && q.asked === q.finished; })()")


def write_y4m(path: Path, colour: tuple[int, int, int], seconds: float = 4.0, moving_s: float | None = None,
              cuts: list[tuple[int, int, int]] | None = None, cut_every_s: float = 1.0,
              size: tuple[int, int] = TEST_CAMERA_SIZE) -> None:
    """A clip Chromium plays as its fake camera: a coloured room with a white
    square sliding across it (real motion, so the filter keeps frames).
    ``moving_s``: the square slides only during the first moving_s of each
    loop and then stands still (someone who moved, then sits and types).
    ``cuts``: the room's colour goes through these, one every ``cut_every_s``
    (scene changes, for Watch). ``size``: width, height."""
    W, H = size
    n = int(seconds * FPS)
    moving = n if moving_s is None else int(moving_s * FPS)
    with open(path, "wb") as f:
        f.write(f"YUV4MPEG2 W{W} H{H} F{FPS}:1 Ip A1:1 C420jpeg\n".encode())
        for i in range(n):
            rgb = np.empty((H, W, 3), np.float32)
            rgb[:] = colour if not cuts else cuts[int(i / FPS / cut_every_s) % len(cuts)]
            side = H // 3
            x = int(min(i, moving) * (W - side) / moving)
            rgb[H // 3 : H // 3 + side, x : x + side] = 240
            r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
            y = 0.299 * r + 0.587 * g + 0.114 * b
            u = (b - y) * 0.564 + 128
            v = (r - y) * 0.713 + 128
            f.write(b"FRAME\n")
            f.write(np.clip(y, 0, 255).astype(np.uint8).tobytes())
            for plane in (u, v):
                f.write(np.clip(plane[::2, ::2], 0, 255).astype(np.uint8).tobytes())


def write_wav(path: Path, seconds: float = 4.0, rate: int = 48_000) -> None:
    """A 330 Hz tone: the fake microphone."""
    t = np.arange(int(seconds * rate)) / rate
    pcm = (np.sin(2 * np.pi * 330 * t) * 9000).astype(np.int16)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())


async def launch(pw: Any, video: Path, audio: Path, tmp: Path | None = None) -> Any:
    """Chromium whose camera plays ``video`` and whose microphone plays ``audio``."""
    return await pw.chromium.launch(
        executable_path=CHROMIUM,
        args=[
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-video-capture={video}",
            f"--use-file-for-fake-audio-capture={audio}",
            *CHROMIUM_FLAGS,
            "--autoplay-policy=no-user-gesture-required",
        ],
    )


async def open_and_start(browser: Any, url: str, viewport: tuple[int, int] = (1280, 800), min_buffer: int = 16,
                         failures: list[str] | None = None) -> Any:
    """A new tab on ``url`` with the camera started and ``min_buffer`` kept
    frames. ``failures``, when given, collects every HTTP answer of 400 or
    more and every console error the tab sees, from its first request on."""
    page = await browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
    if failures is not None:
        page.on("response", lambda r: failures.append(f"HTTP {r.status} {r.url}") if r.status >= 400 else None)
        page.on("console", lambda m: failures.append(f"console error: {m.text}") if m.type == "error" else None)
    await page.goto(url)
    await page.click("#vc-start")
    await wait_live(page)
    await page.wait_for_function(
        f"/buffer (\\d+)/.exec(document.querySelector('#vc-stats').textContent)?.[1] >= {min_buffer}",
        timeout=30_000)
    return page


async def wait_live(page: Any, timeout_ms: int = 30_000) -> None:
    """Until the tab's connection says Live; if it never does, fail with
    what the status and the note said instead."""
    try:
        await page.wait_for_function("document.querySelector('#vc-conn')?.dataset.tone === 'live'",
                                     timeout=timeout_ms)
    except Exception as err:
        said = await page.evaluate("[document.querySelector('#vc-conn')?.textContent, "
                                   "document.querySelector('#vc-note')?.textContent]")
        raise AssertionError(f"the tab never went live: status {said[0]!r}, note {said[1]!r}") from err


async def session_id(page: Any) -> str:
    return await page.evaluate("window.vidchat.sessionId")


async def ask(page: Any, text: str) -> None:
    box = page.locator("#vc-question textarea")
    await box.fill(text)
    await box.press("Enter")


async def bot_texts(page: Any) -> list[str]:
    return await page.evaluate(f"{BOT_MESSAGES}.map((m) => m.innerText)")


class AnswerNotShown(AssertionError):
    """The page never showed the answer waited for; the message says what it showed instead."""


async def wait_for_answer(page: Any, n: int, timeout: float = 60) -> list[str]:
    """Wait until the n-th bot message is final (ANSWER_FINAL) and return all bot texts."""
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    try:
        await page.wait_for_function(BOT_HAS_TEXT % n, timeout=timeout * 1000)
        await page.wait_for_function(ANSWER_FINAL % {"n": n}, timeout=timeout * 1000)
    except PlaywrightTimeout:
        shown = [text[:80] for text in await bot_texts(page)]
        questions = await page.evaluate("window.vidchat?.questions ?? null")
        raise AnswerNotShown(f"within {timeout:g} s the page never showed bot message {n} as final; "
                             f"it shows {len(shown)}: {shown}; questions {questions}") from None
    return await bot_texts(page)


async def set_setting(page: Any, elem_id: str, value: str) -> None:
    """Type ``value`` into a number setting (opening the settings panel when closed)."""
    if not await page.locator(f"#{elem_id}").is_visible():
        await page.click("#vc-settings button, #vc-settings .label-wrap")
    box = page.locator(f"#{elem_id} input[type=number]")
    held = """([id, v]) => { const root = document.getElementById(id);
                const range = root.querySelector('input[type=range]');
                const number = root.querySelector('input[type=number]');
                return Number(number.value) === Number(v) && (!range || Number(range.value) === Number(v)); }"""
    # Taken once the component holds it (a slider's range moves with its
    # value): a question sent before then would carry the old value. The
    # number box commits on change (Enter or leaving it); a commit the
    # component missed is typed again.
    for attempt in range(3):
        await box.fill(value)
        await box.press("Enter")
        await box.dispatch_event("change")
        await box.blur()
        try:
            await page.wait_for_function(held, arg=[elem_id, value], timeout=3_000 if attempt < 2 else 10_000)
            return
        except Exception:
            if attempt == 2:
                raise


async def next_frame(page: Any) -> None:
    """Two animation frames: the page has laid out and painted what changed."""
    await page.evaluate("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")
