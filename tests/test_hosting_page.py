"""The page under Hugging Face sign-in, started as a Space starts it (issue
21), in Chromium: a visitor who has not signed in sees the page and its
Sign-in button but gets no page token, and the page's own calls are refused
with a message that says to sign in; a signed-in user (the session cookie
Gradio sets after the OAuth callback) gets a page token, and nothing is
refused."""

from __future__ import annotations

import pytest
from conftest import start_server, stop_server
from playwright.async_api import async_playwright
from test_hosting import BASE_ARGS, GUARDED_MODES, SPACE_ENV, hf_cookie

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
TOKEN_VALUE = "document.querySelector('#vidchat-page-token textarea, #vidchat-page-token input')?.value || ''"


@pytest.fixture(scope="module")
def space(tiny_vllm_serve, artifacts_dir):
    srv = start_server([*BASE_ARGS, "--engine-url", tiny_vllm_serve, *GUARDED_MODES["hf"]],
                       artifacts_dir / "server-hosting-page-hf.log", env_extra=SPACE_ENV)
    yield srv
    stop_server(srv)


async def test_only_a_signed_in_user_gets_the_pages_credential(space, artifacts_dir):
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            visitor = await (await browser.new_context()).new_page()
            refused = []
            visitor.on("response", lambda r: refused.append(r.url) if r.status in (401, 403) else None)
            await visitor.goto(space.url + "/")
            await visitor.get_by_text("Sign in").first.wait_for(timeout=30_000)
            await visitor.get_by_text("Sign in first").first.wait_for(timeout=30_000)  # the load calls, refused
            assert any("/gradio_api/" in url for url in refused), refused
            assert await visitor.evaluate(TOKEN_VALUE) == ""
            await visitor.screenshot(path=str(artifacts_dir / "hf-visitor.png"))

            context = await browser.new_context()
            await context.add_cookies([{"name": "session", "value": hf_cookie("alice")["session"],
                                        "url": space.url}])
            user = await context.new_page()
            refused.clear()
            user.on("response", lambda r: refused.append(r.url) if r.status in (401, 403) else None)
            await user.goto(space.url + "/")
            await user.wait_for_function(f"({TOKEN_VALUE}).startsWith('p.')", timeout=30_000)
            await user.get_by_text("Logout").first.wait_for(timeout=30_000)
            assert refused == []
        finally:
            await browser.close()
