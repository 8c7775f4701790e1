"""Media through a real TURN relay: Debian's coturn, started here on
loopback, with ICE forced to relay-only in the scripted client and in
Chromium. The chosen candidate pair must be a relay one and frames must
reach the server's session."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess

import pytest
from aiortc import RTCConfiguration, RTCIceServer
from aiortc.rtcconfiguration import RTCIceTransportPolicy
from conftest import eventually, eventually_async, free_port
from playwright.async_api import async_playwright
from test_page import media  # noqa: F401  (the fake camera clip fixture)

from vidchat.devtools.page import launch
from vidchat.devtools.rtc_client import RtcClient, SyntheticVideo

USER, PASSWORD = "vidchat", "relay-secret"


@pytest.fixture(scope="module")
def coturn(tmp_path_factory):
    binary = shutil.which("turnserver")
    if binary is None:
        pytest.fail("coturn is missing: scripts/setup.sh installs it with the test extras")
    port = free_port()
    log = tmp_path_factory.mktemp("coturn") / "turnserver.log"
    proc = subprocess.Popen(
        [binary, "-n", "-v", "--listening-ip", "127.0.0.1", "--relay-ip", "127.0.0.1", "--listening-port", str(port),
         "--min-port", "49160", "--max-port", "49200", "--lt-cred-mech", "--user", f"{USER}:{PASSWORD}",
         "--realm", "vidchat.test", "--no-tls", "--no-dtls", "--no-cli", "--fingerprint",
         # The peers here are on loopback, which a public relay refuses to reach.
         "--allow-loopback-peers", "--no-multicast-peers", "--log-file", str(log), "--simple-log"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    def listening() -> bool:  # coturn answers on UDP; its TCP listener on the same port says it is up
        assert proc.poll() is None, "coturn exited"
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True

    eventually(listening, 10, "coturn listens")
    yield f"turn:127.0.0.1:{port}", log
    proc.terminate()
    proc.wait(timeout=10)


async def _at_least(count, n: int) -> bool:
    return await count >= n


async def frames_received(server, sid: str) -> int:
    stats = await asyncio.to_thread(server.get_json, f"/webrtc/stats?session_id={sid}")
    return stats.get("frames_received", 0)


@pytest.mark.engine
async def test_the_scripted_client_streams_through_the_relay_only(server, coturn):
    url, log = coturn
    relay_only = RTCConfiguration(iceServers=[RTCIceServer(urls=url, username=USER, credential=PASSWORD)],
                                  iceTransportPolicy=RTCIceTransportPolicy.RELAY)
    client = RtcClient(server.url, SyntheticVideo(), configuration=relay_only)
    try:
        sid = await client.connect()
        assert all(" typ relay " in line for line in client.pc.localDescription.sdp.splitlines()
                   if line.startswith("a=candidate:")), "relay-only offered a non-relay candidate"
        await eventually_async(lambda: _at_least(frames_received(server, sid), 5), 30,
                               "5 frames come through the relay")
        assert client.selected_pair() == ("relay", "host")
    finally:
        await client.close()
    assert "ALLOCATE processed, success" in log.read_text()  # coturn did allocate the relay


@pytest.mark.browser
async def test_chromium_streams_through_the_relay_only(server, coturn, media, tmp_path):  # noqa: F811
    url, _ = coturn
    async with async_playwright() as pw:
        browser = await launch(pw, media["red"], media["tone"], tmp_path)
        try:
            page = await browser.new_page()
            # Whatever the server's configuration says, this tab's peer uses
            # only the relay (the policy a page behind a strict NAT ends up with).
            await page.add_init_script(f"""(() => {{
              const Native = window.RTCPeerConnection;
              window.RTCPeerConnection = class extends Native {{
                constructor(config) {{
                  super({{...(config || {{}}), iceTransportPolicy: "relay",
                          iceServers: [{{urls: "{url}", username: "{USER}", credential: "{PASSWORD}"}}]}});
                }}
              }};
            }})();""")
            await page.goto(server.url + "/")
            await page.click("#vc-start")
            await page.wait_for_function("document.querySelector('#vc-conn')?.dataset.tone === 'live'",
                                         timeout=30_000)
            sid = await page.evaluate("window.vidchat.sessionId")
            await eventually_async(lambda: _at_least(frames_received(server, sid), 5), 30,
                                   "5 frames come through the relay")
            pair = await page.evaluate("window.vidchat.selectedPair()")
            assert pair == {"local": "relay", "remote": "host"}, pair
            await page.evaluate("window.vidchat.stop()")
        finally:
            await browser.close()
