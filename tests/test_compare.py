"""Re-ask and compare across two models (--compare-model) and from a bundle
loaded into the page: real vLLM (the tiny omni model and, beside it in the
same process, the tiny vision-only one), real aiortc, and Chromium."""

from __future__ import annotations

import asyncio
import io
import json
import re
import urllib.request
import zipfile
from pathlib import Path

import pytest
from conftest import (
    SERVER_ARGS,
    TEST_MAX_IMAGES,
    TEST_MAX_MODEL_LEN,
    eventually,
    eventually_async,
    start_server,
    stop_server,
    until_idle,
)
from gradio_client import Client, handle_file

from vidchat.app.settings import Settings
from vidchat.conversation.bundles import png_bytes, read_bundle
from vidchat.devtools.rtc_client import RtcClient, SyntheticVideo

CHROMIUM = "/usr/bin/chromium"
# /ask and /reask settings after the session id: k, sampling, window, filter on,
# threshold, max frames kept, frames as, audio, max tokens, temperature, seed, record.
SETTINGS = [4, "uniform", 10, True, 0.95, 64, "images", True, 6, 0.0, "5"]



async def _at_least(stats, key: str, n: int) -> bool:
    return (await stats).get(key, 0) >= n

@pytest.fixture(scope="module")
def two_models(tiny_omni_path, tiny_vl_path, artifacts_dir, tmp_path_factory):
    record_dir = tmp_path_factory.mktemp("recordings")
    srv = start_server(["--model", "tiny", "--compare-model", "tiny-vl", "--max-images", str(TEST_MAX_IMAGES),
                        "--max-model-len", str(TEST_MAX_MODEL_LEN), "--kv-cache-gb", "0.25",
                        "--record-dir", str(record_dir), *SERVER_ARGS], artifacts_dir / "server-compare.log")
    eventually(lambda: srv.get_json("/api/health")["compare_model"]["status"] == "ready", 180,
               "the compare model is ready")
    srv.record_dir = record_dir
    yield srv
    stop_server(srv)


async def _recorded_bundle(srv, tmp_path: Path) -> tuple[Path, dict]:
    """One recorded answer of a camera without microphone, downloaded as the page offers it."""
    client = RtcClient(srv.url, SyntheticVideo(fps=15))
    await client.connect()
    try:
        await eventually_async(lambda: _at_least(client.stats(), "frames_received", 10), 20, "10 frames received")
        gradio = Client(srv.url + "/", verbose=False)
        history = (await asyncio.to_thread(gradio.predict, "What moves?", [], client.session_id, *SETTINGS, True,
                                           api_name="/ask"))[0]
        answer_id = history[-1]["metadata"]["id"]
        record = srv.get_json(f"/inputs/{answer_id}/record.json")
        path = tmp_path / "bundle.zip"
        with urllib.request.urlopen(f"{srv.url}/inputs/{answer_id}/bundle.zip") as r:
            path.write_bytes(r.read())
    finally:
        await client.close()  # the session ends: what follows uses only the downloaded bundle
    return path, record


def _load(srv, path: Path) -> tuple[Client, str, str]:
    """A fresh tab (no camera) loads a bundle: (the tab, the answer id it selected, the message shown)."""
    tab = Client(srv.url + "/", verbose=False)
    dropdown, shown, _ = tab.predict(handle_file(str(path)), "", api_name="/load_bundle")
    chosen = dropdown.get("value") if isinstance(dropdown, dict) else dropdown  # an update, or its value
    return tab, chosen or "", shown


# The chat's folded "what the model got" panels, one under each answer.
FOLDS = "#vc-chat .vc-fold [role=button]"
# The chat's links to its answers' records, one per answer's "what the model got" fold.
RECORD_LINKS = "() => [...document.querySelectorAll('#vc-chat a[href*=\"/record.json\"]')].map((a) => a.href)"


def _columns(html: str) -> list[str]:
    return html.split("class='vc-compare-col'")[1:]


@pytest.mark.engine
async def test_a_loaded_bundle_is_reasked_on_either_model_with_the_same_inputs(two_models, tmp_path):
    health = two_models.get_json("/api/health")
    assert health["compare_model"]["model"].rstrip("/").rsplit("/", 1)[-1].startswith("tiny-vl")
    path, record = await _recorded_bundle(two_models, tmp_path)
    assert record["model_revision"].startswith("fingerprint ")
    assert record["audio_seconds"] == 0  # no microphone: both models get exactly the same inputs

    # A fresh tab that never started a camera loads the bundle and re-asks it.
    tab, chosen, shown = await asyncio.to_thread(_load, two_models, path)
    assert chosen.startswith("bundle-") and "Recorded (bundle.zip)" in shown and "Loaded the bundle (4 frames" in shown

    def reask(which: str, system_prompt: str = Settings().system_prompt):
        return tab.predict("", chosen, *SETTINGS, False, system_prompt, which, api_name="/reask")

    on_main = await asyncio.to_thread(reask, "main")
    on_second = await asyncio.to_thread(reask, "compare")
    for html, model in ((on_main, "tiny-omni"), (on_second, "tiny-vl")):
        assert "Same inputs (inputs_sha256 matches)" in html, html
        recorded, again = _columns(html)
        assert record["inputs_sha256"][:16] in recorded and record["inputs_sha256"][:16] in again
        assert "tiny-omni" in recorded and model in again  # each column names the model that answered
        assert re.search(r"<th>model</th><td>.*fingerprint [0-9a-f]{16}", again)
    assert "Re-asked on the second model" in on_second

    # Another system prompt is part of "other settings".
    other = await asyncio.to_thread(reask, "main", "Answer in one word.")
    assert "Answer in one word." in _columns(other)[1] and "Answer in one word." not in _columns(other)[0]
    assert await until_idle(two_models, within=2.0) == 0
    assert not path.exists() or path.stat().st_size > 0  # our copy is ours; the server's upload copy is gone


@pytest.mark.engine
async def test_a_file_that_is_not_a_bundle_says_so(two_models, tmp_path):
    junk = tmp_path / "junk.zip"
    with zipfile.ZipFile(junk, "w") as zf:
        zf.writestr("readme.txt", "not a bundle")
    tab, chosen, shown = await asyncio.to_thread(_load, two_models, junk)
    assert not chosen and "Not a bundle vidchat can read" in shown
    unknown = await asyncio.to_thread(tab.predict, "", "bundle-nope", *SETTINGS, False, "", "main",
                                      api_name="/reask")
    assert "load a recorded bundle" in unknown


@pytest.mark.browser
async def test_page_loads_a_bundle_and_compares_two_models_side_by_side(two_models, tmp_path, artifacts_dir):
    from playwright.async_api import async_playwright

    path, record = await _recorded_bundle(two_models, tmp_path)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = await browser.new_page(viewport={"width": 1280, "height": 1100})
        try:
            await page.goto(two_models.url + "/")
            # A server without --suite-dir offers no Add to suite.
            await page.wait_for_selector("#vc-live-access", state="attached")
            assert await page.evaluate("document.querySelector('#vc-live-access').dataset.suites") == "off"
            assert not await page.evaluate("document.body.classList.contains('vc-suites')")
            await page.click("#vc-reask-panel button")  # unfold the accordion
            await page.set_input_files("#vc-bundle-file input[type=file]", str(path))
            await page.wait_for_function(
                "document.querySelector('#vc-compare')?.innerText.includes('Loaded the bundle')", timeout=30_000)
            await page.get_by_label(re.compile(r"--compare-model")).check()
            await page.click("#vc-reask")
            await page.wait_for_function(
                "document.querySelectorAll('#vc-compare .vc-compare-col table tr').length >= 20", timeout=60_000)
            text = await page.inner_text("#vc-compare")
            assert "Same inputs" in text and "Re-asked on the second model" in text
            assert text.count(record["inputs_sha256"][:16]) == 2
            await page.locator("#vc-reask-panel").screenshot(path=str(artifacts_dir / "page-compare.png"))
        finally:
            await browser.close()


@pytest.mark.engine
async def test_a_socket_client_records_each_answer_as_a_bundle(two_models, tmp_path):
    """The server has --record-dir and the client says nothing of record:
    each answer, typed or watched, is saved (the flag's "every answer"), and
    response.text.done.stats.bundle names its folder (bundle_url: its zip);
    session.update {"record": false} turns it off for this session alone."""
    from test_protocol import SHORT, check_answer, connect, frames, recv, send, until

    ws = await connect(two_models, watch={"question": "What changed?", "every_s": 0.3}, **SHORT)
    try:
        await frames(ws, n=4)
        watched = await until(ws, "response.text.done", timeout=60)
        await send(ws, {"type": "session.update", "watch": None})
        while (await recv(ws, 30))["type"] != "session.updated":
            pass
        await send(ws, {"type": "video.query", "text": "What is there?"})
        typed = check_answer(await until(ws, "response.text.done", timeout=60))
        for done in (watched[-1], typed):
            stats = done["stats"]
            folder = two_models.record_dir / stats["bundle"]
            assert (folder / "manifest.json").is_file(), stats["bundle"]
            bundle = read_bundle(folder)
            assert bundle.digest() == bundle.inputs_sha256 == stats["inputs_sha256"] and len(bundle.frames) == stats["frames"]
            assert stats["bundle_url"] == f"/inputs/{stats['answer_id']}/bundle.zip"
            with urllib.request.urlopen(two_models.url + stats["bundle_url"]) as r:
                names = zipfile.ZipFile(io.BytesIO(r.read())).namelist()
            assert any(n.endswith("manifest.json") for n in names), names
        assert watched[next(i for i, m in enumerate(watched) if m["type"] == "response.start")].get("watch") is True
        manifests = set(two_models.record_dir.rglob("manifest.json"))
        await send(ws, {"type": "session.update", "record": False})
        assert (await recv(ws))["settings"]["record"] is False
        await send(ws, {"type": "video.query", "text": "Once more?"})
        done = check_answer(await until(ws, "response.text.done", timeout=60))
        assert "bundle" not in done["stats"] and set(two_models.record_dir.rglob("manifest.json")) == manifests
    finally:
        await ws.close()


@pytest.mark.engine
async def test_the_page_the_socket_and_replay_give_the_same_record_for_the_same_inputs(two_models, tmp_path):
    """One answer's frames through the three doors: asked in the page (its
    API, on a WebRTC session), the same frames sent to the socket, and the
    page's recording re-asked by replay. Each door goes through the same
    conversation core: the same inputs_sha256 and the same record keys."""
    import base64
    import json

    from test_protocol import check_answer, connect, send, until
    from test_replay import ENGINE_ARGS, json_lines, replay

    path, page_record = await _recorded_bundle(two_models, tmp_path)
    bundle = read_bundle(path)
    assert page_record["audio_seconds"] == 0 and len(bundle.frames) == 4

    # The socket: the recorded frames, losslessly, with nothing dropped and all four sampled.
    ws = await connect(two_models, evs_enabled=False, num_sample_frames=4, max_tokens=6, temperature=0.0)
    try:
        for frame in bundle.frames:
            await send(ws, {"type": "video.frame", "data": base64.b64encode(png_bytes(frame)).decode()})
        await send(ws, {"type": "video.query", "text": bundle.question})
        socket_stats = check_answer(await until(ws, "response.text.done", timeout=60))["stats"]
    finally:
        await ws.close()

    res = await asyncio.to_thread(replay, str(path), *ENGINE_ARGS, "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    (replay_record,) = json_lines(res.stdout)

    digests = {page_record["inputs_sha256"], socket_stats["inputs_sha256"], replay_record["inputs_sha256"]}
    assert digests == {bundle.inputs_sha256}, json.dumps([page_record, socket_stats, replay_record])[:3000]
    for record in (page_record, socket_stats, replay_record):
        assert record["frames"] == 4 and record["frame_sizes"] == page_record["frame_sizes"]
    # The answer record is the core's (Answer.summary): what each door adds is its own wrapping.
    # Where the record is (inputs.record_links), and its bundle: with --record-dir every door records.
    core = set(socket_stats) - {"answer_id", "record_url", "bundle", "bundle_url"}
    assert {"bundle", "bundle_url"} <= set(socket_stats)
    assert core <= set(page_record) and set(page_record) - core == {"id", "question", "answer"}
    assert core <= set(replay_record)
    assert set(replay_record) - core == {"t", "question", "answer", "watch", "settings", "bundle",
                                         "bundle_inputs_sha256"}


@pytest.mark.browser
async def test_both_models_answers_each_question_with_both_side_by_side(two_models, tmp_path, artifacts_dir):
    """Both models: a typed question is answered by the server's model and by
    --compare-model's on the same frames, chat and seed, side by side in the
    chat, each answer with its own record; unticked, the next question has one answer."""
    from playwright.async_api import async_playwright

    from vidchat.devtools.page import launch, open_and_start, set_setting, write_wav, write_y4m

    write_y4m(tmp_path / "cam.y4m", (200, 60, 40))
    write_wav(tmp_path / "mic.wav")
    async with async_playwright() as pw:
        browser = await launch(pw, tmp_path / "cam.y4m", tmp_path / "mic.wav", tmp_path)
        try:
            page = await open_and_start(browser, two_models.url + "/", viewport=(1280, 1000), min_buffer=4)
            await set_setting(page, "vc-max-tokens", "8")
            await page.get_by_label(re.compile("Both models")).check()
            box = page.locator("#vc-question textarea")
            await box.fill("What colour is it?")
            await box.press("Enter")
            both = page.locator("#vc-chat .vc-both")
            await both.wait_for(timeout=60_000)
            # Both answers end, each with its own "what the model got" fold (the second's is named so).
            await page.wait_for_function(
                "[...document.querySelectorAll('#vc-chat .vc-both .vc-both-text')].length === 2 && "
                "[...document.querySelectorAll('#vc-chat button, #vc-chat span')].some("
                "(e) => e.textContent.startsWith('Second model ·'))", timeout=120_000)
            heads = await both.locator(".vc-both-model").all_inner_texts()
            assert len(heads) == 2 and "(second model)" in heads[1] and heads[0] != heads[1], heads
            # One "what the model got" per answer (each comes as its answer ends).
            await page.wait_for_function(f"document.querySelectorAll('{FOLDS}').length === 2", timeout=60_000)
            folds = page.locator(FOLDS)
            await page.locator("#vc-chat").screenshot(path=str(artifacts_dir / "page-both-models.png"))
            for k in range(2):
                await folds.nth(k).click()
            await page.wait_for_function("document.querySelectorAll('#vc-chat .vc-inputs').length === 2")
            entry_records = await page.evaluate(RECORD_LINKS)
            assert len(entry_records) == 2, entry_records  # one record per answer
            first, second = [await page.evaluate("(u) => fetch(u).then((r) => r.json())", u) for u in entry_records]
            assert first["frame_indices"] == second["frame_indices"] and first["frame_times"] == second["frame_times"]
            assert first["seed"] == second["seed"] and first["question"] == second["question"] == "What colour is it?"
            assert first["model"] != second["model"]
            # Unticked: the next question is the first model's alone, and the chat continues with its answers.
            await page.get_by_label(re.compile("Both models")).uncheck()
            await box.fill("And now?")
            await box.press("Enter")
            await page.wait_for_function(f"document.querySelectorAll('{FOLDS}').length === 3", timeout=120_000)
            assert await both.count() == 1  # the new answer's fold came, and no second answer beside it
        finally:
            await browser.close()


@pytest.mark.engine
async def test_the_second_models_answer_is_recorded_counted_and_logged_as_its_own(two_models):
    """Both models with recording on: the second model's bundle names the
    second model (--compare-model, its engine's options), so a replay re-asks
    that model; /metrics counts each answer under the engine that gave it and
    what it was for (engine, kind), never the second's as the chat's; and the
    server's log names the answers by a hash, never by their ids (the only
    guard of /inputs/<id>/ when no login is configured)."""
    from test_operations import scrape, value

    client = RtcClient(two_models.url, SyntheticVideo(fps=15))
    await client.connect()
    try:
        await eventually_async(lambda: _at_least(client.stats(), "frames_received", 10), 20, "10 frames received")
        gradio = Client(two_models.url + "/", verbose=False)
        await asyncio.to_thread(gradio.predict, True, client.session_id, api_name="/both_models")
        folder = lambda: [p for p in two_models.record_dir.rglob("manifest.json")  # noqa: E731
                          if client.session_id[:8] in str(p)]
        before = scrape(two_models)
        history = (await asyncio.to_thread(gradio.predict, "Which model?", [], client.session_id, *SETTINGS, True,
                                           api_name="/ask"))[0]
        answer_id = history[-1]["metadata"]["id"]
        await eventually_async(lambda: len(folder()) == 2, 60, "both answers recorded")
        await until_idle(two_models, within=2.0)
    finally:
        await client.close()
    after = scrape(two_models)
    manifests = {m["engine"]["role"]: m for m in (json.loads(p.read_text()) for p in folder())}
    assert set(manifests) == {"main", "compare"}
    assert manifests["main"]["model_option"] == "tiny" and manifests["compare"]["model_option"] == "tiny-vl"
    assert "tiny-vl" in manifests["compare"]["model"] and "tiny-vl" not in manifests["main"]["model"]
    assert manifests["compare"]["engine"]["max_model_len"] == TEST_MAX_MODEL_LEN

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    for engine, kind in (("main", "chat"), ("compare", "second")):
        labels = {"door": "page", "engine": engine, "kind": kind}
        assert grew("vidchat_answers_total", status="completed", **labels) == 1, labels
        assert grew("vidchat_first_token_seconds_count", **labels) == 1, labels
    assert grew("vidchat_answers_total", door="page", status="completed", engine="main", kind="second") == 0

    from vidchat.conversation.events import session_hash
    log_text = two_models.log_path.read_text()
    assert answer_id not in log_text and f"answer {session_hash(answer_id)} completed" in log_text


@pytest.mark.browser
@pytest.mark.parametrize("width, height", [(1280, 900), (390, 844)], ids=["desktop", "phone"])
async def test_the_page_records_every_answer_with_record_dir_until_its_tick_is_cleared(two_models, tmp_path,
                                                                                        width, height):
    """--record-dir alone records (issue 59, point 4): a new tab's Record tick
    is on, its typed answer is a bundle on disk with its download under the
    answer; the tick cleared, the next answer writes nothing."""
    from playwright.async_api import async_playwright

    from vidchat.devtools.page import ask, launch, open_and_start, set_setting, wait_for_answer, write_wav, write_y4m

    write_y4m(tmp_path / "cam.y4m", (180, 90, 40))
    write_wav(tmp_path / "mic.wav")
    async with async_playwright() as pw:
        browser = await launch(pw, tmp_path / "cam.y4m", tmp_path / "mic.wav", tmp_path)
        try:
            page = await open_and_start(browser, two_models.url + "/", viewport=(width, height), min_buffer=4)
            await set_setting(page, "vc-max-tokens", "4")
            if not await page.locator("#vc-record").is_visible():
                await page.click("#vc-settings button, #vc-settings .label-wrap")
            tick = page.locator("#vc-record input")
            await tick.wait_for(state="visible", timeout=30_000)
            assert await tick.is_checked()
            before = set(two_models.record_dir.rglob("manifest.json"))
            await ask(page, "Recorded?")
            await wait_for_answer(page, 1)
            bundle_links = "#vc-chat a[href$='/bundle.zip']"
            await page.wait_for_selector(bundle_links, state="attached")
            answer_id = (await page.get_attribute(bundle_links, "href")).split("/")[2]
            after = set(two_models.record_dir.rglob("manifest.json"))
            assert len(after - before) == 1, after - before
            assert json.loads(next(iter(after - before)).read_text())["question"] == "Recorded?"

            await tick.uncheck()
            await ask(page, "Not recorded?")
            await wait_for_answer(page, 2)
            assert set(two_models.record_dir.rglob("manifest.json")) == after
            status = await asyncio.to_thread(
                lambda: urllib.request.urlopen(two_models.url + f"/inputs/{answer_id}/bundle.zip").status)
            assert status == 200
        finally:
            await browser.close()
