"""What a new user met on the page at desktop (1280×900) and phone
(390×844) size (issue 48), each checked at both sizes in Chromium with a
fake camera and the shared server:

- nothing is wider than its box at 390 px: the question row, the chat's
  bubbles (an answer's code block scrolls inside its bubble) and the
  section headers; the question box takes most of its row, its
  placeholder on one line;
- the chat's label and its icons never cover a message, however it scrolls,
  and its clear icon clears the conversation (not only the browser's copy);
- the question box is named by its label, the Stop beside Send says that
  it ends Watch too (and the chat says so when it does), the pickers
  greyed while live say why, the Start button and the placeholder follow
  the chosen source, every emoji has words beside it, and "Thinking…"
  stands for the answer from the question to its first token;
- while the model loads, the page's readiness poll logs no console error
  and its line sits on the preview instead of pushing the column down;
- a chat cut to fit the model's context says so, in one line with the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from typing import Any, AsyncIterator

import pytest
from conftest import eventually_async, start_server, stop_server
from playwright.async_api import async_playwright

from vidchat.devtools.page import (
    BOT_HAS_TEXT,
    BOT_MESSAGES,
    ask,
    launch,
    open_and_start,
    session_id,
    set_setting,
    wait_for_answer,
    write_wav,
    write_y4m,
)
from vidchat.doors.page.layout import WATCH_STOPPED

pytestmark = pytest.mark.browser

SIZES = pytest.mark.parametrize("width, height", [(1280, 900), (390, 844)], ids=["desktop", "phone"])

# Into the newest answer: a paragraph long enough to scroll the chat, a run
# without spaces (as text and as inline code: the random model writes
# backticks), and a code block with a line wider than any phone.
FILL_ANSWER = """() => {
  const bots = %s;
  const answer = bots[bots.length - 1];
  const body = answer.querySelector('.vc-md') || answer;
  body.insertAdjacentHTML('beforeend',
    '<p>' + 'A long answer that goes on. '.repeat(60) + '</p><p>' + 'x'.repeat(400) + '</p><p>Inline: <code>' + '68K`'.repeat(60) + '</code></p>'
    + '<pre><code>for frame in frames: print(frame.index, frame.time, frame.width, frame.height, '
    + 'frame.kept_by_the_filter, frame.seen_at)</code></pre>'
    // The fold's audio player, as vidchat.doors.answer_routes draws it when the
    // question had audio (timing decides whether it had: CI's flake of stop 56).
    + '<p>Audio 0.00–4.00 s (4.0 s): <audio controls preload="metadata"></audio></p>');
}""" % BOT_MESSAGES

# Boxes wider than themselves (scrollWidth > clientWidth), by a short description.
OVERFLOWING = """() => {
  const picks = {
    page: [document.documentElement], 'question row': document.querySelectorAll('.vc-ask'),
    chat: document.querySelectorAll('#vc-chat, #vc-chat .vc-chat-list'),
    bubble: document.querySelectorAll('#vc-chat .vc-msg, #vc-chat [data-testid="bot"], #vc-chat [data-testid="user"]'),
    header: document.querySelectorAll('#vc-settings > .label-wrap, #vc-inputs > .label-wrap, '
                                      + '#vc-reask-panel > .label-wrap, #vc-settings button, '
                                      + '#vc-inputs button, #vc-reask-panel button'),
  };
  const out = [];
  for (const [what, elements] of Object.entries(picks)) for (const e of elements) {
    if (e.clientWidth > 0 && e.scrollWidth > e.clientWidth + 1) {
      // Name what sticks out furthest, so a failure says what to fix.
      const right = e.getBoundingClientRect().right;
      let widest = null, reach = 0;
      for (const d of e.querySelectorAll('*')) {
        const over = d.getBoundingClientRect().right - right;
        if (over > reach) { reach = over; widest = d; }
      }
      const who = widest ? ` (widest: <${widest.tagName.toLowerCase()} class="${widest.className}"> `
        + `${JSON.stringify((widest.textContent || '').slice(0, 80))})` : '';
      out.push(`${what} ${e.id || e.className}: ${e.scrollWidth} > ${e.clientWidth}${who}`);
    }
  }
  return out;
}"""

# A question with a code block (the chat renders it as it would an
# answer's) and a long link: what the page's markdown makes of them.
CODE_QUESTION = ("What does this print?\n```\nfor frame in frames: print(frame.index, frame.time, frame.width,"
                 " frame.height, frame.kept_by_the_filter)\n```\nSee https://example.com/" + "a" * 120)

# The code blocks in the chat (the question's, the answer's): each scrolls
# inside, within its bubble.
CODE_BLOCKS = """() => [...document.querySelectorAll('#vc-chat pre')].map((pre) => {
  const bubble = pre.closest('.vc-msg');
  const [p, b] = [pre.getBoundingClientRect(), bubble.getBoundingClientRect()];
  return {scrolls: pre.scrollWidth > pre.clientWidth, overflowX: getComputedStyle(pre).overflowX,
          inside: p.left >= b.left - 1 && p.right <= b.right + 1};
})"""

# The question box's share of its row, and how many lines it shows.
QUESTION_BOX = """() => {
  const row = document.querySelector('.vc-ask').getBoundingClientRect();
  const box = document.querySelector('#vc-question').getBoundingClientRect();
  const area = document.querySelector('#vc-question textarea'), st = getComputedStyle(area);
  const inner = area.clientHeight - parseFloat(st.paddingTop) - parseFloat(st.paddingBottom);
  return {share: box.width / row.width, lines: inner / parseFloat(st.lineHeight)};
}"""

# The chat's own chrome (its label, its icons) against the messages as they
# show in the scrolled list: any overlap, by what overlaps.
CHROME_OVER_MESSAGES = """() => {
  const chat = document.querySelector('#vc-chat');
  const list = chat.querySelector('.vc-chat-list');
  const view = list.getBoundingClientRect();
  const shown = (r) => r.width > 0 && r.height > 0;
  const chrome = [...chat.querySelectorAll('.vc-chat-label, .vc-chat-clear')]
    .filter((e) => !list.contains(e) && getComputedStyle(e).visibility !== 'hidden')
    .map((e) => [e.dataset.testid || e.className, e.getBoundingClientRect()]).filter(([, r]) => shown(r));
  const out = [];
  for (const m of list.querySelectorAll('.vc-msg')) {
    const r = m.getBoundingClientRect();
    const top = Math.max(r.top, view.top), bottom = Math.min(r.bottom, view.bottom);
    if (bottom <= top) continue;  // scrolled out of the list's view
    for (const [name, c] of chrome) {
      if (c.left < r.right && r.left < c.right && c.top < bottom && top < c.bottom)
        out.push(`${name} covers "${m.innerText.trim().slice(0, 30)}"`);
    }
  }
  return {overlaps: out, chrome: chrome.length,
          // the list scrolls under the strip, not the whole chat block
          listScrolls: list.scrollHeight > list.clientHeight && chat.scrollHeight <= chat.clientHeight + 1};
}"""

# The chat's list scrolled to a fraction of its height, and held there (the
# chat scrolls itself to its end as content comes: scrolled again until it stays).
SCROLLED = """(fraction) => {
  const list = document.querySelector('#vc-chat .vc-chat-list');
  const target = Math.round(fraction * (list.scrollHeight - list.clientHeight));
  if (Math.abs(list.scrollTop - target) <= 2) return true;
  list.scrollTop = target;
  return false;
}"""

# Every text on the page with an emoji also has words of its own: on a
# machine without an emoji font the emoji is a box, and the words still read.
EMOJI_ALONE = r"""() => {
  const emoji = /\p{Extended_Pictographic}/u;
  const out = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const text = n.textContent.trim();
    if (emoji.test(text) && !/\p{L}{3,}/u.test(text)) out.push(text);
  }
  return out;
}"""

# Between asking and the first token: the order the chat showed "Thinking…"
# and the answer's first text in (a MutationObserver sees every change).
WATCH_TYPING = """() => {
  window.__typing = [];
  const seen = window.__typing;
  new MutationObserver(() => {
    if (document.querySelector('#vc-chat .vc-typing') && !seen.includes('thinking')) seen.push('thinking');
    const b = %s;
    if (b.length && b[b.length - 1].innerText.trim() && !seen.includes('text')) seen.push('text');
  }).observe(document.querySelector('#vc-chat'), {subtree: true, childList: true, characterData: true});
}""" % BOT_MESSAGES

PICKERS = ["#vc-res", "#vc-fps", "#vc-camera", "#vc-mic"]

# The "left out to fit" line: how many turns went, of how many, and the context they had to fit.
HISTORY_CUT = re.compile(r"(\d+) older turns? of the chat left out to fit the model's ([\d,]+) tokens: "
                         r"the model got the last (\d+) of (\d+)\.")


@contextlib.asynccontextmanager
async def tab(browser_dir, url: str, viewport: tuple[int, int], start: bool = True,
              failures: list[str] | None = None) -> AsyncIterator[Any]:
    """A tab on ``url`` at ``viewport``, its fake camera started (``start``) with a few frames kept."""
    write_y4m(browser_dir / "cam.y4m", (40, 120, 200))
    write_wav(browser_dir / "mic.wav")
    async with async_playwright() as pw:
        browser = await launch(pw, browser_dir / "cam.y4m", browser_dir / "mic.wav", browser_dir)
        try:
            if start:
                yield await open_and_start(browser, url, viewport=viewport, min_buffer=4, failures=failures)
            else:
                page = await browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
                if failures is not None:
                    page.on("response", lambda r: failures.append(f"HTTP {r.status} {r.url}")
                            if r.status >= 400 else None)
                    page.on("console", lambda m: failures.append(f"console error: {m.text}")
                            if m.type == "error" else None)
                await page.goto(url)
                yield page
        finally:
            await browser.close()


@SIZES
async def test_the_chat_fits_the_width_and_its_chrome_covers_no_message(server, tmp_path, artifacts_dir, width,
                                                                         height):
    async with tab(tmp_path, server.url + "/", (width, height)) as page:
        # A long answer (greedy decoding of the random model runs to
        # max_tokens), then a question that keeps room for a longer one: the
        # first answer no longer fits the shared server's 4,096-token context
        # beside it. The cut is made when the prompt is, so the second answer
        # is stopped at its first words (generating 3,000 tokens would only
        # take the machine's time).
        await set_setting(page, "vc-max-tokens", "1200")
        await set_setting(page, "vc-temperature", "0")
        # "Thinking…" stands for the answer until its first token.
        await page.evaluate(WATCH_TYPING)
        await ask(page, "What do you see?")
        await wait_for_answer(page, 1)
        assert await page.evaluate("window.__typing") == ["thinking", "text"]
        assert await page.locator("#vc-chat .vc-typing").count() == 0  # gone once the answer shows
        await set_setting(page, "vc-max-tokens", "3000")
        await ask(page, CODE_QUESTION)
        await page.wait_for_function(BOT_HAS_TEXT % 2, timeout=60_000)
        await page.click("#vc-stop-answer")
        await page.wait_for_function("(q => q.asked === 2 && q.finished === 2)(window.vidchat.questions)",
                                     timeout=30_000)
        await set_setting(page, "vc-max-tokens", "24")

        # The second question's chat was cut to fit the context (point 7): What
        # the model got and the answer's fold say so, in one line that fits.
        if not await page.locator("#vc-inputs .vc-inputs-for").is_visible():  # Gradio draws it open only
            await page.click("#vc-inputs button, #vc-inputs .label-wrap")
        await page.wait_for_function("(document.querySelector('#vc-inputs .vc-inputs-for')?.textContent || '')"
                                     ".startsWith('For “What does this print?')", timeout=30_000)
        line = page.locator("#vc-inputs .vc-history-cut")
        await line.wait_for(state="visible", timeout=30_000)
        said = HISTORY_CUT.fullmatch((await line.inner_text()).strip())
        assert said is not None, await line.inner_text()
        left, context, sent, total = int(said[1]), said[2], int(said[3]), int(said[4])
        assert context == "4,096" and total == 2 and left >= 2 and left + sent == total, said.group(0)
        await page.locator("#vc-chat .vc-fold [role=button]").last.click()  # the second answer's fold
        await page.locator("#vc-chat .vc-history-cut").first.wait_for(state="visible", timeout=10_000)
        assert HISTORY_CUT.fullmatch((await page.locator("#vc-chat .vc-history-cut").first.inner_text()).strip())
        assert await line.evaluate("(e) => e.scrollWidth <= e.clientWidth + 1")
        # Point 4: the record's download link leads What the model got, above its frames.
        links = page.locator("#vc-inputs .vc-record-links")
        assert "Download the record" in await links.inner_text()
        first_frame = page.locator("#vc-inputs .vc-frames figure").first
        assert (await links.bounding_box())["y"] < (await first_frame.bounding_box())["y"]
        await page.evaluate(FILL_ANSWER)

        assert await page.evaluate(OVERFLOWING) == []
        blocks = await page.evaluate(CODE_BLOCKS)
        # The injected code block (a long random answer may hold more; a
        # question is shown as typed, its fences as text).
        assert len(blocks) >= 1 and all(b["scrolls"] and b["overflowX"] in ("auto", "scroll") and b["inside"]
                                        for b in blocks), blocks
        box = await page.evaluate(QUESTION_BOX)
        assert box["share"] >= 0.55 and box["lines"] < 1.5, box

        for where in (0, 0.5, 1):  # the list scrolled to its top, its middle, its end
            await page.wait_for_function(SCROLLED, arg=where, timeout=10_000)
            covered = await page.evaluate(CHROME_OVER_MESSAGES)
            assert covered["chrome"] >= 1 and covered["listScrolls"] and covered["overlaps"] == [], (where, covered)
        await page.screenshot(path=str(artifacts_dir / f"page-polish-{width}.png"))

        # The chat's own clear icon clears the conversation, as Clear chat does:
        # the next answer's chat holds only its own question.
        await page.click("#vc-chat .vc-chat-clear")
        await page.wait_for_function("window.vidchat.clears === 1", timeout=30_000)
        await ask(page, "After the clear?")
        await wait_for_answer(page, 1)
        users = await page.evaluate("[...document.querySelectorAll('#vc-chat [data-testid=\"user\"]')]"
                                    ".map((m) => m.innerText.trim())")
        assert users == ["After the clear?"], users


@SIZES
async def test_the_controls_say_what_they_do(server, tmp_path, width, height):
    """Named by its label; Stop says it ends Watch too, and the chat says so
    when it did; the pickers greyed while live say why; emoji come with words."""
    async with tab(tmp_path, server.url + "/", (width, height)) as page:
        question = page.get_by_role("textbox", name="Question", exact=True)
        assert await question.count() == 1
        assert await question.evaluate("(e) => e.closest('#vc-question') !== null")

        for picker in PICKERS:
            state = await page.evaluate("(s) => { const e = document.querySelector(s);"
                                        " return {disabled: e.disabled, title: e.title,"
                                        " label: e.closest('label')?.title}; }", picker)
            assert state["disabled"] and "Fixed while live" in state["title"] and "Stop camera" in state["title"], \
                (picker, state)
            assert state["label"] == state["title"], (picker, state)  # the tooltip also shows over its label

        stop = await page.get_attribute("#vc-stop-answer", "title")
        assert stop and "answer" in stop and "Watch" in stop, stop
        sid = await session_id(page)
        await page.check("#vc-watch input[type=checkbox]")

        async def watching() -> bool:
            return (await asyncio.to_thread(server.get_json, f"/webrtc/stats?session_id={sid}"))["watching"]

        await eventually_async(watching, 30, "the server watches")
        await page.click("#vc-stop-answer")
        await page.get_by_text(WATCH_STOPPED).first.wait_for(timeout=30_000)
        await page.wait_for_function("!document.querySelector('#vc-watch input[type=checkbox]').checked",
                                     timeout=10_000)
        assert await page.evaluate(EMOJI_ALONE) == []

        await page.click("#vc-stop")  # stopped, the pickers are free again and say nothing
        await page.wait_for_function("!document.querySelector('#vc-res').disabled", timeout=10_000)
        for picker in PICKERS:
            assert await page.get_attribute(picker, "title") is None, picker


@SIZES
async def test_the_start_button_and_the_placeholder_follow_the_source(server, tmp_path, width, height):
    async with tab(tmp_path, server.url + "/", (width, height), start=False) as page:
        await page.wait_for_function("document.querySelector('#vc-start')?.disabled === false", timeout=30_000)
        for source, start, asks in (("screen", "Share screen", "Ask about the screen…"),
                                    ("file", "Play video file", "Ask about the video…"),
                                    ("camera", "Start camera", "Ask about the camera…")):
            await page.select_option("#vc-source", source)
            await page.wait_for_function("([s, a]) => document.querySelector('#vc-start').textContent === s"
                                         " && document.querySelector('#vc-question textarea').placeholder === a",
                                         arg=[start, asks], timeout=10_000)
        box = await page.evaluate(QUESTION_BOX)
        assert box["lines"] < 1.5, box  # the placeholder on one line


@pytest.fixture(scope="module")
def loading_server(tiny_omni_path, artifacts_dir):
    """A server whose model never finishes loading: its --engine-url is a
    port that takes the connection and never answers, so the page shows
    "Loading the model…" for as long as a test looks (a real load is over
    in seconds, a race with the page). No model runs anywhere."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(8)
    srv = start_server(["--model", str(tiny_omni_path), "--engine-url", f"http://127.0.0.1:{held.getsockname()[1]}",
                        "--engine-connect-timeout", "600"], artifacts_dir / "server-loading.log", loaded=False)
    try:
        yield srv
    finally:
        held.close()  # the held request fails, so the load ends and the server stops at once
        stop_server(srv)


@SIZES
async def test_while_the_model_loads_the_page_says_so_quietly_and_in_place(loading_server, tmp_path, width,
                                                                            height):
    failures: list[str] = []
    async with tab(tmp_path, loading_server.url + "/", (width, height), start=False, failures=failures) as page:
        await page.wait_for_function("document.querySelector('#vc-ready')?.textContent"
                                     ".startsWith('Loading the model')", timeout=30_000)
        # Three polls answered while loading: none of them an error in the console.
        await page.wait_for_function("(n) => performance.getEntriesByType('resource')"
                                     ".filter((e) => e.name.includes('/readyz')).length >= n", arg=3,
                                     timeout=30_000)
        assert (await page.text_content("#vc-ready")).startswith("Loading the model")  # still loading
        assert failures == [], failures
        # The line lies on the preview: the page's main row starts with the preview, as it does once the
        # model is ready (on a phone the live panel's parts are laid out by that row itself).
        place = await page.evaluate("""() => {
          const r = (s) => document.querySelector(s).getBoundingClientRect();
          const laidOut = getComputedStyle(document.querySelector('.vc-live')).display === 'contents';
          const [line, video, column] = [r('#vc-ready'), r('.vc-video-wrap'), r(laidOut ? '.vc-main' : '.vc-live')];
          return {inside: line.top >= video.top && line.bottom <= video.bottom, videoTop: video.top - column.top};
        }""")
        assert place["inside"] and abs(place["videoTop"]) <= 1, place

