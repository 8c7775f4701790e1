"""Talk mode in the page: Chromium's fake microphone plays a question spoken
by espeak-ng; with Talk on, a spoken-question bubble and a streamed answer
appear without typing, and the answer is handed to the browser's speech
synthesis (read from the page's own state, not from audio output)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import eventually_async
from playwright.async_api import async_playwright
from test_page import media, wav_samples  # noqa: F401 (media is a fixture)

from vidchat.devtools import synthetic as sa
from vidchat.devtools.page import BOT_MESSAGES, launch, open_and_start, session_id, set_setting

pytestmark = pytest.mark.browser

# (text width, room for it): the selected option's text measured in the
# select's own font, against the select's width less its padding (the arrow).
VOICE_TEXT_ROOM = """() => {
  const el = document.querySelector('#vc-voice'), css = getComputedStyle(el);
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = `${css.fontWeight} ${css.fontSize} ${css.fontFamily}`;
  const text = ctx.measureText(el.options[el.selectedIndex].text).width;
  return {text, box: el.clientWidth - parseFloat(css.paddingLeft) - parseFloat(css.paddingRight)};
}"""

# The fake microphone loops this: a question, then a long silence (Talk is
# switched on at some point of the loop; the next question is heard whole).
SILENCE_AFTER_S = 7.0


@pytest.fixture(scope="module")
def spoken_wav(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("talk") / "question.wav"
    question = sa.speech("What is the colour of the wall behind me?")
    track = sa.compose([(sa.silence(0.5), False), (question, True), (sa.silence(SILENCE_AFTER_S), False)])
    path.write_bytes(sa.wav_file_bytes(track.audio))
    return path


def access_lines(server) -> int:
    """Request lines in the server's access log so far."""
    return sum(1 for ln in server.log().splitlines() if ' "GET ' in ln or ' "POST ' in ln)


def fetch_json(server, path: str) -> dict:
    with urllib.request.urlopen(server.url + path, timeout=10) as r:
        return json.loads(r.read())


def read_last(state: dict, text: str) -> bool:
    """The page's last reading aloud was all of ``text``, in order (its
    pieces are cut where the text has whitespace, which reading trims)."""
    words, spoken = text.split(), " ".join(state["spoken"]).split()
    return bool(words) and spoken[-len(words):] == words


async def test_talk_asks_by_voice_and_reads_the_answer_aloud(server, media, spoken_wav, tmp_path, artifacts_dir):
    async with async_playwright() as pw:
        browser = await launch(pw, media["red"], spoken_wav, tmp_path)
        try:
            page = await open_and_start(browser, server.url)
            sid = await session_id(page)
            # Headless Chromium has no voices: a synthesizer that speaks until
            # cancelled stands in, so "still speaking" can be interrupted.
            await page.evaluate("""() => {
                window.__speech = { spoken: [], cancels: 0 };
                speechSynthesis.speak = (u) => { window.__speech.spoken.push(u.text); };
                speechSynthesis.cancel = () => { window.__speech.cancels += 1;
                                                 window.__speech.spokenAtCancel = window.__speech.spoken.length; };
            }""")
            # The answer must finish inside the microphone's silence even on a
            # loaded machine (the default 256 tokens may not: each is then cut
            # by the next spoken question and none is read whole), yet read
            # long enough that the next question starts over the reading (the
            # page assumes a reading lasts 2 s + 90 ms a character). The tiny
            # model never stops early, so 48 tokens is always 48.
            await set_setting(page, "vc-max-tokens", "48")
            log_lines_before, talk_began = access_lines(server), time.monotonic()
            await page.click("#vc-talk input[type=checkbox]")
            await page.wait_for_function("window.vidchat.talk.status !== 'off'", timeout=10_000)
            # A spoken question appears without typing, with a player of what the model heard.
            bubble = page.locator("#vc-chat [data-testid='user']", has_text="spoken question")
            await bubble.first.wait_for(timeout=40_000)
            label = await bubble.first.inner_text()
            seconds = float(re.search(r"spoken question \(([\d.]+) s\)", label).group(1))
            src = await bubble.first.locator("audio").get_attribute("src")
            assert src and src.startswith("/inputs/") and src.endswith("/audio.wav")
            # The answer streams into the chat and is then handed to speech synthesis.
            await page.wait_for_function(
                f"(() => {{ const b = {BOT_MESSAGES}; return b.length >= 1 && b[b.length-1].innerText.trim(); }})()",
                timeout=60_000)
            # Everything the model said in an answer was read aloud, in order
            # (whitespace aside), as the last thing read. The file loops: by
            # then the next spoken question may have started a newer answer,
            # so every finished answer the server showed is remembered.
            finished: dict[int, dict] = {}

            async def an_answer_was_read_whole():
                talk = await asyncio.to_thread(fetch_json, server, f"/webrtc/talk?session_id={sid}")
                if talk["answer"] and talk["answer"]["done"] and not talk["answer"]["cancelled"]:
                    finished[talk["answer"]["n"]] = talk["answer"]
                state = await page.evaluate("window.vidchat.talk")
                read = [a for a in finished.values() if state["spoken"] and read_last(state, a["text"])]
                return (talk, state, read[-1]) if read else None

            talk, state, answer = await eventually_async(an_answer_was_read_whole, 60,
                                                         "a finished answer is read aloud whole", interval=0.1)
            assert talk["listening"] is True and talk["utterances"] >= 1
            assert answer["spoken"] is True
            # The player serves exactly the audio the model got: the utterance.
            with urllib.request.urlopen(server.url + src, timeout=10) as r:
                samples = wav_samples(r.read())
            record = fetch_json(server, src.replace("audio.wav", "record.json"))
            assert record["spoken_question"]["seconds"] == pytest.approx(samples.size / 16000, abs=0.01)
            assert abs(record["spoken_question"]["seconds"] - seconds) <= 0.051
            assert record["question"] == "" and record["audio_seconds"] == pytest.approx(samples.size / 16000, abs=0.01)
            assert (await page.evaluate("window.__speech.spoken")) == state["spoken"]
            # Talk's state is pushed to the page (one request), and what the
            # open page polls stays out of the access log: a handful of lines
            # for the whole of Talk so far, not seven a second.
            added, talked = access_lines(server) - log_lines_before, time.monotonic() - talk_began
            requests = [ln for ln in server.log().splitlines() if ' "GET ' in ln or ' "POST ' in ln][-added:]
            # A spoken question's player fetches its audio (a bubble's player
            # only: the fold's waits to be played), one per utterance heard;
            # everything else is a handful for the whole of Talk.
            players = [ln for ln in requests if "/inputs/" in ln]
            others = [ln for ln in requests if "/inputs/" not in ln]
            utterances = (await asyncio.to_thread(fetch_json, server, f"/webrtc/talk?session_id={sid}"))["utterances"]
            print(f"Talk on for {talked:.0f} s: {len(others)} access-log lines, {len(players)} player fetches "
                  f"for {utterances} utterances")
            assert len(others) <= 8, (talked, others)
            assert len(players) <= utterances + 2, (utterances, players)  # + the test's own two fetches
            await page.screenshot(path=str(artifacts_dir / "page-talk.png"), full_page=True)
            # The voice picker's chosen name is whole, not cut under its arrow.
            room = await page.evaluate(VOICE_TEXT_ROOM)
            assert room["text"] <= room["box"], room
            # Barge-in: the page is still reading the answer aloud when the
            # microphone's next question starts (the fake file loops); the
            # reading stops at once, and the question is heard over it.
            assert (await page.evaluate("window.vidchat.talk"))["speaking"] is True
            await page.wait_for_function("window.__speech.cancels > 0", timeout=30_000)
            # Stopped at once: nothing is being read now, or what is was handed
            # over after the cancel (the new question's answer, on a machine
            # slow enough for this check to come after it).
            after = await page.evaluate("[window.vidchat.talk.speaking, window.__speech.spoken.length,"
                                        " window.__speech.spokenAtCancel]")
            assert after[0] is False or after[1] > after[2], after
            await bubble.nth(1).wait_for(timeout=30_000)  # and it became the next question
            # Talk off: the server stops listening.
            await page.click("#vc-talk input[type=checkbox]")
            await eventually_async(lambda: not fetch_json(server, f"/webrtc/talk?session_id={sid}")["listening"], 5,
                                   "the server stops listening")
            assert not fetch_json(server, f"/webrtc/talk?session_id={sid}")["listening"]
            # The page learns it from its stream of Talk's state.
            await page.wait_for_function("window.vidchat.talk.status === 'off'", timeout=10_000)
        finally:
            await browser.close()


@pytest.mark.parametrize("width, height", [(1280, 900), (390, 844)], ids=["desktop", "phone"])
async def test_talk_shows_that_the_microphone_is_heard(server, media, tmp_path, width, height):
    """A steady tone and no speech: Talk's meter moves with the microphone's
    level as the server hears it, and "listening" says sound is heard but no
    speech yet (not a minute of plain "listening")."""
    async with async_playwright() as pw:
        browser = await launch(pw, media["red"], media["tone"], tmp_path)
        try:
            page = await open_and_start(browser, server.url, viewport=(width, height), min_buffer=4)
            meter = page.locator("#vc-talk-level")
            assert await meter.is_hidden()  # nothing to show while Talk is off
            await page.click("#vc-talk input[type=checkbox]")
            await page.wait_for_function(
                "(() => { const m = document.querySelector('#vc-talk-level');"
                " return m && !m.hidden && m.dataset.dbfs !== '' && Number(m.dataset.dbfs) > -50; })()",
                timeout=30_000)
            await page.wait_for_function(
                "document.querySelector('#vc-talk-status').textContent.includes('hearing sound, no speech yet')",
                timeout=30_000)
            fill = await page.evaluate(
                "getComputedStyle(document.querySelector('#vc-talk-level')).getPropertyValue('--level')")
            assert float(fill) > 0.1, fill  # the bar is drawn, not empty
            bar = await page.evaluate("(() => { const b = document.querySelector('#vc-talk-bar');"
                                      " return [b.scrollWidth, b.clientWidth]; })()")
            assert bar[0] <= bar[1], f"Talk's bar overflows at {width} px: {bar}"
            await page.click("#vc-talk input[type=checkbox]")  # off: the meter goes
            await page.wait_for_function("document.querySelector('#vc-talk-level').hidden", timeout=30_000)
        finally:
            await browser.close()
