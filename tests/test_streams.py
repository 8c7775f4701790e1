"""Live streams as sources (--stream, issue 47) through the real server and
real vLLM (tiny model): a real RTSP camera (GStreamer's RTSP server on
loopback, H.264 320x240 at 10 fps), an HLS stream (a folder PyAV writes,
served over HTTP), the seed socket and the Realtime door (the openai SDK)
attached to them. Shapes, states and counts; never the model's words."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from conftest import STREAM_SECRET, eventually_async
from openai import AsyncOpenAI
from test_protocol import MOVING, answer, connect, expect_error, recv, send, still_alive, until

from vidchat.devtools.stream_sources import serve_folder, start_rtsp_camera, write_hls

SHORT = dict(max_tokens=4, temperature=0.0)
SECRET = STREAM_SECRET


@pytest.fixture(scope="module")
def sources(server, tmp_path_factory):
    """The shared server's streams (tests/conftest.py names them): two RTSP
    cameras (one asks for a password) and an HLS stream, on its ports."""
    ports = server.stream_ports
    cam = start_rtsp_camera(ports["cam"])
    locked = start_rtsp_camera(ports["locked"], user="viewer", password=SECRET)
    hls_dir = tmp_path_factory.mktemp("hls")
    write_hls(hls_dir, seconds=20)
    httpd = serve_folder(hls_dir, ports["hls"])
    running = {"cam": cam, "locked": locked}  # a test that restarts a camera puts the new one here
    yield running
    for camera in running.values():
        camera.stop()
    httpd.shutdown()


@pytest.fixture(scope="module")
def streams_server(server, sources):
    return server


def stream(srv, name: str) -> dict:
    return next(s for s in srv.get_json("/api/streams") if s["name"] == name)


async def until_stream(srv, name: str, what: str, **wanted) -> dict:
    def matches():
        s = stream(srv, name)
        return s if all(s.get(k) == v for k, v in wanted.items()) else None

    return await eventually_async(lambda: asyncio.to_thread(matches), 45, f"stream {name}: {what}")


@pytest.mark.engine
async def test_sessions_watch_the_rtsp_camera_through_one_reader(streams_server):
    # The first remembers (issue 60): its scene log is its own, the second keeps none.
    first = await connect(streams_server, source={"stream": "cam"}, memory=True, **SHORT)
    second = await connect(streams_server, source={"stream": "cam"}, **SHORT)
    try:
        live = await until_stream(streams_server, "cam", "live with two sessions", state="live", sessions=2)
        assert (live["width"], live["height"]) == (320, 240) and live["error"] is None
        assert live["connects"] == 1  # one connection to the camera, however many sessions watch it
        await eventually_async(lambda: asyncio.to_thread(lambda: stream(streams_server, "cam")["offered"] >= 10),
                               30, "ten frames offered")
        for ws in (first, second):
            stats = [m for m in await answer(ws, "What moves?") if m["type"] == "response.text.done"][0]["stats"]
            assert stats["frames"] >= 1 and stats["source"]["kind"] == "stream" and stats["source"]["name"] == "cam"
            assert stats["source_state"] == "live"
            times = stats["frame_source_times"]
            assert all(t is not None for t in times) and times == sorted(times)  # the stream's own clock
        logs = []
        for ws in (first, second):
            sid = (await until_session_updated(ws, {}))["session_id"]
            logs.append(await asyncio.to_thread(streams_server.get_json, f"/sessions/{sid}/memory"))
        assert logs[0]["memory"] and len(logs[0]["keyframes"]) >= 1 and logs[0]["keyframes"][0]["time_s"] == 0.0
        assert not logs[1]["memory"] and logs[1]["keyframes"] == []
        # The session takes no frames of its own while it watches a stream.
        await send(first, {"type": "video.frame", "data": MOVING[0]})
        refusal = await until(first, "error")
        assert "watches the stream 'cam'" in refusal[-1]["message"]
        await still_alive(first)
        updated = await until_session_updated(second, {"source": None})
        assert updated["settings"]["source"] is None  # back to its own frames
        await until_stream(streams_server, "cam", "one session left", sessions=1)
        assert stream(streams_server, "cam")["connects"] == 1
    finally:
        await first.close()
        await second.close()
    await until_stream(streams_server, "cam", "nobody watching", sessions=0)


async def until_session_updated(ws, changes: dict) -> dict:
    await send(ws, {"type": "session.update", **changes})
    return (await until(ws, "session.updated"))[-1]


@pytest.mark.engine
async def test_an_unknown_stream_is_refused_by_name_and_the_session_goes_on(streams_server):
    ws = await connect(streams_server, source={"stream": "nosuch"}, **SHORT)
    try:
        message = await expect_error(ws, "no stream named 'nosuch'")
        assert "cam, locked, hls" in message
        await still_alive(ws)
        await send(ws, {"type": "video.frame", "data": MOVING[0]})
        done = [m for m in await answer(ws) if m["type"] == "response.text.done"][0]
        assert done["stats"]["frames"] == 1 and "source_state" not in done["stats"]  # its own frames
    finally:
        await ws.close()


@pytest.mark.engine
async def test_a_camera_that_drops_off_is_reopened_and_its_sessions_go_on(streams_server, sources):
    cam = sources["cam"]
    ws = await connect(streams_server, source={"stream": "cam"}, **SHORT)
    try:
        await until_stream(streams_server, "cam", "live", state="live", sessions=1)
        before = stream(streams_server, "cam")["connects"]
        cam.stop()  # the camera drops off the network
        down = await until_stream(streams_server, "cam", "reconnecting", state="reconnecting")
        assert down["error"] and down["sessions"] == 1
        stats = [m for m in await answer(ws) if m["type"] == "response.text.done"][0]["stats"]
        assert stats["source_state"] == "reconnecting" and stats["frames"] >= 1  # the frames it kept
        kept = max(stats["frame_times"])  # the newest frame it had, on the session's timeline
        sources["cam"] = cam = start_rtsp_camera(cam.port, cam.path)  # back, on the same port
        await until_stream(streams_server, "cam", "live again", state="live")
        assert stream(streams_server, "cam")["connects"] > before
        again = await eventually_async(lambda: _newer_answer(ws, kept), 45, "an answer with frames after the drop")
        assert again["source_state"] == "live"
    finally:
        await ws.close()


async def _newer_answer(ws, kept: int) -> dict | None:
    stats = [m for m in await answer(ws) if m["type"] == "response.text.done"][0]["stats"]
    return stats if max(stats["frame_times"]) > kept else None


@pytest.mark.engine
async def test_a_password_in_a_stream_url_is_never_logged_shown_or_sent(streams_server):
    ws = await connect(streams_server, source={"stream": "locked"}, vidchat_events=True, **SHORT)
    try:
        await until_stream(streams_server, "locked", "live with the password", state="live")
        said = [await until_session_updated(ws, {"max_tokens": 3})]
        said.append([m for m in await answer(ws) if m["type"] == "response.text.done"][0])
        for path in ("/api/streams", "/api/health", "/api/config"):
            said.append(streams_server.get_json(path))
        assert SECRET not in json.dumps(said)
    finally:
        await ws.close()
    await until_stream(streams_server, "locked", "left", sessions=0)
    assert SECRET not in streams_server.log_path.read_text()


@pytest.mark.engine
async def test_the_realtime_door_watches_the_hls_stream(streams_server):
    client = AsyncOpenAI(base_url=f"{streams_server.url}/v1", api_key="no-token-needed")
    async with client.realtime.connect(model="vidchat") as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.send({"type": "session.update", "session": {"type": "realtime", "vidchat": {"stream": "nosuch"}}})
        refused = await conn.recv()
        assert refused.type == "error" and refused.error.param == "session.vidchat.stream"
        assert "no stream named 'nosuch'" in refused.error.message
        await conn.send({"type": "session.update", "session": {"type": "realtime", "max_output_tokens": 4,
                                                               "vidchat": {"stream": "hls"}}})
        updated = await conn.recv()
        assert updated.type == "session.updated" and updated.session.model_extra["vidchat"]["stream"] == "hls"
        await until_stream(streams_server, "hls", "live", state="live", sessions=1)
        await eventually_async(lambda: asyncio.to_thread(lambda: stream(streams_server, "hls")["offered"] >= 5),
                               30, "five HLS frames offered")
        await conn.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "What moves?"}]}})
        await conn.send({"type": "response.create"})
        while (event := await conn.recv()).type != "response.done":
            pass
        extra = event.model_extra["vidchat"]
        assert extra["frames"] >= 1
        record = streams_server.get_json(extra["record_url"])
        assert (record["source"]["kind"], record["source"]["name"], record["source_state"]) == ("stream", "hls", "live")
        times = record["frame_source_times"]
        assert all(t is not None for t in times) and times == sorted(times)  # the playlist's own clock
    await until_stream(streams_server, "hls", "left", sessions=0)


@pytest.mark.browser
@pytest.mark.parametrize("width, height", [(1280, 900), (390, 844)], ids=["desktop", "phone"])
async def test_a_page_tab_chooses_the_stream_and_asks(streams_server, tmp_path, artifacts_dir, width, height):
    """The Source menu lists the server's streams; choosing one watches it
    (no camera: the server reads the stream), the live figures say its state,
    fps, size and latency, and a question is answered on its frames. The
    preview shows the stream's frames as the server keeps them, the badge
    says the stream's own state, and its frames are captioned by the time of
    day they came (issue 59, point 6)."""
    from playwright.async_api import async_playwright

    from vidchat.devtools.page import launch, session_id, wait_for_answer, write_wav, write_y4m

    write_y4m(tmp_path / "cam.y4m", (40, 160, 90))
    write_wav(tmp_path / "mic.wav")
    async with async_playwright() as pw:
        browser = await launch(pw, tmp_path / "cam.y4m", tmp_path / "mic.wav", tmp_path)
        try:
            page = await browser.new_page(viewport={"width": width, "height": height})
            await page.goto(streams_server.url + "/")
            await page.wait_for_selector("#vc-source option[value='stream:cam']", state="attached", timeout=30_000)
            await page.select_option("#vc-source", "stream:cam")
            assert await page.inner_text("#vc-start") == "Watch stream"
            await page.click("#vc-start")
            await page.wait_for_function("/cam: live, [\\d.]+ fps, 320×240/.test("
                                         "document.querySelector('#vc-stats')?.textContent)", timeout=45_000)
            await page.wait_for_function("/buffer (\\d+)/.exec(document.querySelector('#vc-stats').textContent)"
                                         "?.[1] >= 4", timeout=30_000)
            # Not a black preview under a "Live" badge: the kept frames, and the reader's state.
            await page.wait_for_function("(i => i && !i.hidden && i.src.startsWith('data:image'))"
                                         "(document.querySelector('#vc-stream-frame'))", timeout=30_000)
            assert await page.inner_text("#vc-conn") == "Live"
            box = page.locator("#vc-question textarea")
            await box.fill("What moves?")
            await box.press("Enter")
            await wait_for_answer(page, 1)
            sid = await session_id(page)
            await page.click("#vc-inputs button, #vc-inputs .label-wrap")
            link = page.locator("#vc-inputs .vc-record-links a[href$='/record.json']")
            await link.wait_for(timeout=30_000)
            record = await page.evaluate("(u) => fetch(u).then((r) => r.json())", await link.get_attribute("href"))
            assert (record["source"]["kind"], record["source"]["name"], record["source_state"]) == \
                ("stream", "cam", "live")
            fold = page.locator("#vc-chat .vc-fold").last
            await fold.locator("[role=button]").click()
            captions = await fold.locator("figcaption").all_inner_texts()
            assert captions and all(re.fullmatch(r"#\d+ · [\d.]+ s · \d\d:\d\d:\d\d\.\d", c) for c in captions), \
                captions
            await page.locator(".vc-video-wrap").scroll_into_view_if_needed()
            await page.screenshot(path=str(artifacts_dir / f"page-stream-{width}.png"))
            await page.close(run_before_unload=True)  # the tab goes: its session ends after the reload grace
        finally:
            await browser.close()
    watched = stream(streams_server, "cam")
    assert watched["connects"] >= 1 and sid
    await until_stream(streams_server, "cam", "the tab left", sessions=0)


@pytest.mark.browser
@pytest.mark.parametrize("width, height", [(1280, 900), (390, 844)], ids=["desktop", "phone"])
async def test_a_stream_that_is_down_is_never_shown_live(streams_server, sources, tmp_path, artifacts_dir,
                                                        width, height):
    """The locked camera goes away: a tab choosing its stream gets a badge
    with the reader's own state and reason, not "Live" over nothing, and a
    question is told the stream has no frame yet, in the stream's words
    (issue 59, point 6). The camera comes back for the tests after."""
    from playwright.async_api import async_playwright

    from vidchat.devtools.page import launch, write_wav, write_y4m

    sources["locked"].stop()
    write_y4m(tmp_path / "cam.y4m", (40, 160, 90))
    write_wav(tmp_path / "mic.wav")
    try:
        async with async_playwright() as pw:
            browser = await launch(pw, tmp_path / "cam.y4m", tmp_path / "mic.wav", tmp_path)
            try:
                page = await browser.new_page(viewport={"width": width, "height": height})
                await page.goto(streams_server.url + "/")
                await page.wait_for_selector("#vc-source option[value='stream:locked']", state="attached",
                                             timeout=30_000)
                await page.select_option("#vc-source", "stream:locked")
                await page.click("#vc-start")
                await page.wait_for_function(
                    "/^(Reconnecting|Down)/.test(document.querySelector('#vc-conn').textContent)", timeout=30_000)
                badge = await page.inner_text("#vc-conn")
                assert "Live" not in badge and ":" in badge, badge  # the state with its reason
                assert await page.get_attribute("#vc-conn", "data-tone") in ("busy", "error")
                assert await page.locator("#vc-stream-frame").is_hidden()  # no picture to show
                box = page.locator("#vc-question textarea")
                await box.fill("What is there?")
                await box.press("Enter")
                said = page.locator("#vc-chat", has_text="No frames available.")
                await said.wait_for(timeout=30_000)
                text = await page.inner_text("#vc-chat")
                assert "locked" in text and "Start camera" not in text, text[-400:]
                await page.screenshot(path=str(artifacts_dir / f"page-stream-down-{width}.png"))
            finally:
                await browser.close()
    finally:
        sources["locked"] = start_rtsp_camera(streams_server.stream_ports["locked"], user="viewer", password=SECRET)
