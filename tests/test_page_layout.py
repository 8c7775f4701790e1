"""The page's layout holds at desktop and phone width (Chromium, a fake
camera, the shared server): a long unbroken answer wraps inside the chat and
the compare view, the checkboxes' borders can be seen (WCAG's non-text
contrast, 3:1 against what is behind them), nothing the page loads is
missing, and a refused setting is named by vidchat and leaves the chat be.
The settings show labels, not identifiers, and the re-ask list tells a
repeated question apart and forgets a cleared chat."""

from __future__ import annotations

import contextlib
import re
from typing import Any, AsyncIterator

import pytest
from conftest import TEST_MAX_MODEL_LEN, eventually_async
from playwright.async_api import async_playwright

from vidchat.conversation.asking import SETTINGS
from vidchat.devtools.page import ask, launch, open_and_start, set_setting, wait_for_answer, write_wav, write_y4m

pytestmark = pytest.mark.browser

LONG_RUN = 2000  # characters without a space: a URL, code, the random model's output

# The newest answer's text and both compare columns hold a long unbroken run.
FILL_LONG = """(n) => {
  const bots = [...document.querySelectorAll('#vc-chat [data-testid="bot"]')]
    .filter((m) => !m.querySelector('.vc-fold'));
  const answer = bots[bots.length - 1];
  const leaves = [...answer.querySelectorAll('*')].filter((e) => e.children.length === 0 && e.textContent.trim());
  (leaves[leaves.length - 1] || answer).textContent = 'x'.repeat(n);
  const col = (c) => `<div class='vc-compare-col'><h4>${c}</h4><div class='vc-compare-text'>${c.repeat(n)}</div>`
    + `<table><tr><th>prompt</th><td>${c.repeat(n)}</td></tr></table></div>`;
  document.querySelector('#vc-compare').innerHTML = `<div class='vc-compare'>${col('y')}${col('z')}</div>`;
}"""

# Elements wider than their box (scrollWidth > clientWidth), by a short description.
OVERFLOWING = """() => {
  const picks = ['#vc-chat', '#vc-chat [data-testid="bot"]', '#vc-chat .vc-msg', '#vc-compare',
                 '#vc-compare .vc-compare', '#vc-compare .vc-compare-col'];
  const out = [];
  for (const sel of picks) for (const e of document.querySelectorAll(sel)) {
    if (e.clientWidth > 0 && e.scrollWidth > e.clientWidth + 1)
      out.push(`${sel}: ${e.scrollWidth} > ${e.clientWidth}`);
  }
  return out;
}"""

# Labels cut short (wider than their box), in the chat's controls: the ask
# row, Watch and Talk.
CLIPPED_LABELS = """() => {
  const out = [];
  for (const e of document.querySelectorAll('.vc-ask *, .vc-watch label *, .vc-talk label *, .vc-watch label, .vc-talk label')) {
    // (a 1-px box is a label kept for screen readers only, hidden on purpose)
    if (e.clientWidth > 2 && e.scrollWidth > e.clientWidth + 1 && e.textContent.trim())
      out.push(`${e.textContent.trim().slice(0, 40)}: ${e.scrollWidth} > ${e.clientWidth}`);
  }
  const send = document.querySelector('#vc-send').getBoundingClientRect();
  const stop = document.querySelector('#vc-stop-answer').getBoundingClientRect();
  if (Math.abs(send.top - stop.top) > 4) out.push('Stop is not beside Send');
  return out;
}"""

# The lowest contrast of a visible checkbox's border against the first opaque
# background behind it, with what it compared.
CHECKBOX_CONTRAST = """() => {
  const rgb = (s) => (s.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => {
    const f = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const behind = (e) => {
    for (let p = e.parentElement; p; p = p.parentElement) {
      const c = rgb(getComputedStyle(p).backgroundColor);
      if (c.length >= 3 && (c.length < 4 || c[3] > 0.5)) return c.slice(0, 3);
    }
    return [255, 255, 255];
  };
  let worst = null;
  for (const box of document.querySelectorAll('input[type="checkbox"]')) {
    if (!box.offsetParent) continue;
    const border = rgb(getComputedStyle(box).borderTopColor).slice(0, 3), back = behind(box);
    const [hi, lo] = [lum(border), lum(back)].sort((a, b) => b - a);
    const ratio = (hi + 0.05) / (lo + 0.05);
    if (worst === null || ratio < worst.ratio) worst = { ratio, border, back, id: box.closest('[id]')?.id };
  }
  return worst;
}"""


# The connection pill in each tone: its text against its fill (WCAG AA, 4.5:1)
# and its fill against the black preview behind it (3:1).
PILL_CONTRAST = """() => {
  const rgb = (s) => (s.match(/[\\d.]+/g) || []).map(Number).slice(0, 3);
  const lum = ([r, g, b]) => {
    const f = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const ratio = (a, b) => { const [hi, lo] = [lum(a), lum(b)].sort((x, y) => y - x); return (hi + 0.05) / (lo + 0.05); };
  const pill = document.querySelector('#vc-conn'), was = pill.dataset.tone, out = {};
  const behind = rgb(getComputedStyle(pill.parentElement).backgroundColor);
  for (const tone of ['idle', 'live', 'busy', 'error']) {
    pill.dataset.tone = tone;
    const st = getComputedStyle(pill), fill = rgb(st.backgroundColor);
    out[tone] = { text: ratio(rgb(st.color), fill), edge: ratio(fill, behind) };
  }
  pill.dataset.tone = was;
  return out;
}"""


@pytest.mark.parametrize("width, height", [(1280, 800), (390, 844)], ids=["desktop", "phone"])
async def test_long_answers_wrap_and_checkboxes_can_be_seen(server, tmp_path, artifacts_dir, width, height):
    write_y4m(tmp_path / "cam.y4m", (40, 120, 200))
    write_wav(tmp_path / "mic.wav")
    async with async_playwright() as pw:
        browser = await launch(pw, tmp_path / "cam.y4m", tmp_path / "mic.wav", tmp_path)
        try:
            failures: list[str] = []
            page = await open_and_start(browser, server.url + "/", viewport=(width, height), min_buffer=4,
                                        failures=failures)
            assert failures == []  # nothing the page loads is missing (no 404), and no script error
            # The stats line says what frames are really stored at (the camera decides, not the rule's example).
            assert re.search(r"stored \d+×\d+", await page.text_content("#vc-stats"))
            await set_setting(page, "vc-max-tokens", "4")
            await ask(page, "Anything there?")
            await wait_for_answer(page, 1)
            await _settings_speak_in_labels(page)
            # The same question again (its strategy sent by name, not by label:
            # refused, it would get a notice), then the re-ask list tells them apart.
            await ask(page, "Anything there?")
            texts = await wait_for_answer(page, 2)
            assert "⚠" not in "".join(texts), texts
            await page.click("#vc-reask-panel button")  # unfold the compare view
            await page.wait_for_function(f"/^latest, at [\\d.]+ s: Anything there\\?/.test({REASK_SHOWN})",
                                         timeout=30_000)
            # The list takes the second answer with that answer's last update:
            # on a loaded machine it can still show the first answer alone here.
            async def both_listed() -> list[str]:
                labels = await _reask_labels(page)
                if len(labels) != 2:
                    raise LookupError(labels)
                return labels

            labels = await eventually_async(both_listed, 30, "the re-ask list holds both answers")
            assert len(set(labels)) == 2, labels  # told apart by when they were asked
            await page.wait_for_selector("#vc-compare", state="attached")
            await page.evaluate(FILL_LONG, LONG_RUN)
            assert await page.evaluate(OVERFLOWING) == []
            assert await page.evaluate(CLIPPED_LABELS) == []
            worst = await page.evaluate(CHECKBOX_CONTRAST)
            assert worst is not None and worst["ratio"] >= 3.0, worst
            pill = await page.evaluate(PILL_CONTRAST)
            assert all(t["text"] >= 4.5 for t in pill.values()) and pill["idle"]["edge"] >= 3.0, pill
            await page.screenshot(path=str(artifacts_dir / f"page-layout-{width}.png"), full_page=True)
            # Clear chat empties the re-ask list too: nothing of the old chat is offered.
            await page.click("#vc-clear")
            await page.wait_for_function(f"{REASK_SHOWN} === ''", timeout=30_000)
            assert await _reask_labels(page) == []
        finally:
            await browser.close()


# The re-ask list's shown choice.
# ('' until the compare view has rendered its picker: a predicate that threw
# on the missing element would end the wait at once instead of retrying.)
REASK_SHOWN = "(document.querySelector('#vc-reask-from input')?.value ?? '')"


async def _reask_labels(page) -> list[str]:
    """The re-ask list's choices, as the open list shows them."""
    await page.click("#vc-reask-from input")
    options = page.locator("[data-testid=dropdown-option]")
    labels = [re.sub(r"^✓\s*", "", t).strip() for t in await options.all_inner_texts()]
    await page.keyboard.press("Escape")
    return labels


async def _settings_speak_in_labels(page) -> None:
    """No identifier shows in the settings (the Sampling picker shows labels),
    and the Sampling help follows the strategy chosen."""
    sampling = SETTINGS["sampling"]
    label_of = {value: label for label, value in sampling.page_choices()}
    shown = await page.inner_text("#vc-settings")
    assert "_" not in shown, [line for line in shown.splitlines() if "_" in line]
    assert await page.input_value("#vc-sampling input") == label_of["uniform"]
    assert sampling.choice_help("uniform") in shown
    await page.click("#vc-sampling input")
    await page.locator("[data-testid=dropdown-option]", has_text=label_of["latest_frames"]).click()
    await page.wait_for_function("(help) => document.querySelector('#vc-sampling').innerText.includes(help)",
                                 arg=sampling.choice_help("latest_frames"), timeout=10_000)
    assert sampling.choice_help("uniform") not in await page.inner_text("#vc-sampling")


# The chat's text, line by line.
CHAT_LINES = ("[...document.querySelectorAll('#vc-chat [data-testid=\"user\"], #vc-chat [data-testid=\"bot\"]')]"
              ".flatMap((m) => m.innerText.split('\\n')).map((l) => l.trim()).filter((l) => l)")


@contextlib.asynccontextmanager
async def camera_page(server, tmp_path, viewport=(1280, 800)) -> AsyncIterator[Any]:
    """A tab on the page at ``viewport`` with its (fake) camera started and a few frames kept."""
    write_y4m(tmp_path / "cam.y4m", (40, 120, 200))
    write_wav(tmp_path / "mic.wav")
    async with async_playwright() as pw:
        browser = await launch(pw, tmp_path / "cam.y4m", tmp_path / "mic.wav", tmp_path)
        try:
            yield await open_and_start(browser, server.url + "/", viewport=viewport, min_buffer=4)
        finally:
            await browser.close()


# The text of each of the chat's bot bubbles, in order.
BOT_BUBBLES = ("[...document.querySelectorAll('#vc-chat [data-testid=\"bot\"]')]"
               ".map((m) => m.innerText.trim())")


@pytest.mark.parametrize("width, height", [(1280, 900), (390, 844)], ids=["desktop", "phone"])
async def test_a_refused_setting_names_its_field_and_leaves_the_chat_as_it_was(server, tmp_path, width, height):
    """A 0 in "At most every (s)", then Watch ticked: vidchat's own notice
    naming the setting joins the chat, no Gradio error badge or toast
    replaces it, and the box unticks (ticking it again retries). A second
    refusal is a message of its own, not more words of the first."""
    async with camera_page(server, tmp_path, viewport=(width, height)) as page:
        await set_setting(page, "vc-max-tokens", "4")
        await ask(page, "Anything there?")
        await wait_for_answer(page, 1)
        before = await page.evaluate(CHAT_LINES)
        await page.fill("#vc-watch-every input", "0")
        await page.click("#vc-watch input[type=checkbox]")
        # In the user's words: the box's label, what it takes, what it held, and that Watch is off.
        said = "⚠ At most every (s): enter seconds above 0 (you typed 0); Watch is off."
        await page.get_by_text(said).first.wait_for(timeout=30_000)
        await page.wait_for_function("!document.querySelector('#vc-watch input[type=checkbox]').checked",
                                     timeout=10_000)
        after = await page.evaluate(CHAT_LINES)
        # Everything that was there stays, in order; the notice comes last.
        assert after[:len(before)] == before and after[-1] == said, (before, after)
        assert await page.locator("#vc-chat .error, .toast-body").count() == 0
        await page.fill("#vc-watch-every input", "-5")
        await page.click("#vc-watch input[type=checkbox]")
        again = "⚠ At most every (s): enter seconds above 0 (you typed -5); Watch is off."
        await page.get_by_text(again).first.wait_for(timeout=30_000)
        bubbles = await page.evaluate(BOT_BUBBLES)
        assert bubbles[-2:] == [said, again], bubbles  # each notice in its own bubble


@pytest.mark.parametrize("width, height", [(1280, 900), (390, 844)], ids=["desktop", "phone"])
async def test_a_bad_value_in_a_slider_is_refused_by_name_and_nothing_is_asked(server, tmp_path, width, height):
    """Gradio's slider clamps a typed 0 to its minimum without a word; the
    page refuses it instead, naming the field alone and the server's own
    range (the model's context for max tokens, what --max-session-mb holds
    for frames kept), keeps what was typed in the box, marks the field, and
    asks nothing until it is fixed (issue 59, point 2)."""
    async with camera_page(server, tmp_path, (width, height)) as page:
        await set_setting(page, "vc-max-tokens", "4")
        if not await page.locator("#vc-frames-per-question").is_visible():
            await page.click("#vc-settings button, #vc-settings .label-wrap")
        # Frames kept: up to what the server's --max-session-mb holds at the stored size, as its help says.
        kept_high = int(await page.get_attribute("#vc-max-frames input[type=range]", "max"))
        assert 4 < kept_high < 256 and f"At most {kept_high}:" in await page.inner_text("#vc-max-frames")
        for elem_id, bad, said in (
                ("vc-frames-per-question", "0", "Frames per question must be a whole number in 1.."),
                ("vc-max-tokens", "-5", f"Max tokens must be a whole number in 1..{TEST_MAX_MODEL_LEN}, got -5"),
                ("vc-temperature", "9", "Temperature must be a number in 0..2, got 9"),
                ("vc-max-frames", "100000", f"⚠ Max frames kept must be a whole number in 4..{kept_high}, got 100000")):
            good = await page.locator(f"#{elem_id} input[type=number]").input_value()
            await page.fill(f"#{elem_id} input[type=number]", bad)
            await page.locator(f"#{elem_id} input[type=number]").blur()  # Gradio would clamp it here
            assert await page.locator(f"#{elem_id} input[type=number]").input_value() == bad  # kept as typed
            asked = await page.evaluate("window.vidchat.questions.asked")
            await ask(page, "Should not be asked?")
            refusal = page.locator("#vc-refused")
            await refusal.wait_for(state="visible", timeout=10_000)
            text = await refusal.inner_text()
            assert said in text and f", got {bad}" in text and "Nothing was asked" in text, text
            assert await page.locator(f"#{elem_id}.vc-invalid").count() == 1  # the field is marked
            assert await page.evaluate("window.vidchat.questions.asked") == asked  # nothing went
            assert "Should not be asked?" not in await page.evaluate(CHAT_LINES)
            box = await page.evaluate("(() => { const b = document.querySelector('#vc-refused');"
                                      " return [b.scrollWidth, b.clientWidth]; })()")
            assert box[0] <= box[1], f"the refusal overflows at {width} px: {box}"
            await page.fill(f"#{elem_id} input[type=number]", good)  # fixed: it goes again
            await refusal.wait_for(state="hidden", timeout=10_000)
        await ask(page, "Now?")
        await wait_for_answer(page, 1)
        assert "Now?" in await page.evaluate(CHAT_LINES)


@pytest.mark.parametrize("width, height", [(1280, 900), (390, 844)], ids=["desktop", "phone"])
async def test_the_stored_size_note_says_the_live_figures(server, tmp_path, width, height):
    """The note under the preview says what this source's frames arrive as
    and are stored at (the server's stats), not a 640×480 example that the
    status line's "stored" then contradicts."""
    async with camera_page(server, tmp_path, (width, height)) as page:
        sid = await page.evaluate("window.vidchat.sessionId")
        await page.wait_for_function("document.querySelector('#vc-store').textContent.includes('stored as')",
                                     timeout=30_000)
        note = await page.inner_text("#vc-store")
        stats = server.get_json(f"/webrtc/stats?session_id={sid}")
        received, stored = stats["received_size"].replace("x", "×"), stats["frame_size"].replace("x", "×")
        assert f"this source's {received} frames are stored as {stored}." in note, (note, stats)
        assert "640×480 camera frame" not in note
        # One rule (issue 59, point 8): the cap the note states is the one the
        # session stores at, so what it says a frame becomes is what it became.
        cap = int(re.search(r"up to ([\d,]+) pixels", note)[1].replace(",", ""))
        from vidchat.media import stored_size

        rw, rh = map(int, stats["received_size"].split("x"))
        assert stats["frame_size"] == "x".join(map(str, stored_size(rw, rh, cap))), (note, stats)
        status = await page.inner_text("#vc-stats")
        assert f"stored {stored}" in status  # the note and the status line agree
        sizes = await page.evaluate("(() => { const n = document.querySelector('#vc-store');"
                                    " return [n.scrollWidth, n.clientWidth]; })()")
        assert sizes[0] <= sizes[1], f"the note overflows at {width} px: {sizes}"


BOXES = """(sels) => Object.fromEntries(sels.map((s) => {
  const r = document.querySelector(s).getBoundingClientRect();
  return [s, {top: r.top + scrollY, bottom: r.bottom + scrollY, left: r.left, right: r.right}];
}))"""


@pytest.mark.parametrize("width, height", [(1280, 900), (390, 844)], ids=["desktop", "phone"])
async def test_on_a_phone_the_chat_and_question_come_before_the_controls(server, tmp_path, artifacts_dir, width,
                                                                         height):
    """Issue 59, point 10: at 390 px the chat and its question box come right
    under the preview and its Start/Stop, before the source pickers and the
    settings; at 1280 the chat stays beside the preview. The Sampling
    picker's text ends before its arrow, and the Suites table's headers are
    never cut mid-word."""
    async with camera_page(server, tmp_path, (width, height)) as page:
        sels = ["#vc-preview", ".vc-controls", "#vc-chat", "#vc-question", ".vc-devices", "#vc-settings"]
        b = await page.evaluate(BOXES, sels)
        if width < 640:
            assert b["#vc-preview"]["bottom"] <= b[".vc-controls"]["top"] + 1 <= b["#vc-chat"]["top"] + 1, b
            assert b["#vc-chat"]["bottom"] <= b["#vc-question"]["top"] + 1, b
            assert b["#vc-question"]["bottom"] <= b[".vc-devices"]["top"], b  # no picker to scroll past
            assert b["#vc-question"]["bottom"] <= b["#vc-settings"]["top"], b
            # The preview leaves the screen to the chat: at most about a third of it.
            assert b["#vc-preview"]["bottom"] - b["#vc-preview"]["top"] <= 0.34 * height, b
        else:
            assert b["#vc-chat"]["left"] >= b["#vc-preview"]["right"] and b["#vc-chat"]["top"] < b["#vc-preview"]["bottom"]
        await page.screenshot(path=str(artifacts_dir / f"page-layout-order-{width}.png"))
        if not await page.locator("#vc-sampling").is_visible():
            await page.click("#vc-settings button, #vc-settings .label-wrap")
        await page.locator("#vc-sampling input").wait_for(state="visible", timeout=30_000)
        fits = await page.evaluate("""() => {
          const input = document.querySelector('#vc-sampling input');
          const icon = document.querySelector('#vc-sampling .icon-wrap');
          const text = input.getBoundingClientRect().right - parseFloat(getComputedStyle(input).paddingRight);
          return [text, icon ? icon.getBoundingClientRect().left : Infinity];
        }""")
        assert fits[0] <= fits[1] + 1, f"the Sampling picker's text runs under its arrow: {fits}"
        assert await page.evaluate("""() => { const th = document.createElement('th');
          const t = document.createElement('table'); t.className = 'vc-suite-table';
          t.append(th); document.body.append(t);
          const ok = getComputedStyle(th).whiteSpace === 'nowrap'; t.remove(); return ok; }""")
