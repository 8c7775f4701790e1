"""A shared bundle is untrusted input (issue 21), in Chromium: a bundle with
markup in every string field, and one with markup in a number field, loaded
through the page's Re-ask panel, show as text and run nothing: no dialog,
no element created from them, no script run."""

from __future__ import annotations

from pathlib import Path

import hostile_bundles as hb
import pytest
from playwright.async_api import async_playwright

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
# Records every element the payloads would create, wherever it appears.
WATCH = """
window.__created = [];
new MutationObserver(records => {
  for (const r of records) for (const n of r.addedNodes) {
    if (!(n instanceof Element)) continue;
    for (const el of [n, ...n.querySelectorAll('*')]) {
      const tag = el.tagName.toLowerCase();
      if ((tag === 'img' && el.getAttribute('src') === 'x') || el.hasAttribute('onerror') ||
          el.hasAttribute('onload') || (tag === 'script' && el.textContent.includes('__pwned')))
        window.__created.push(el.outerHTML.slice(0, 120));
    }
  }
}).observe(document, {childList: true, subtree: true});
"""


async def load(page, path: Path, expect: str) -> str:
    """Upload ``path`` and return the compare panel's text once it says ``expect``
    (waiting for the message itself: meanwhile the panel shows Gradio's progress timer)."""
    panel = page.locator("#vc-compare")
    await page.locator("#vc-bundle-file input[type=file]").set_input_files(str(path))
    await page.wait_for_function(
        "([expect]) => (document.querySelector('#vc-compare')?.innerText || '').includes(expect)",
        arg=[expect], timeout=30_000)
    return await panel.inner_text()


async def test_a_hostile_bundle_shows_text_and_runs_nothing(server, tmp_path, artifacts_dir):
    hostile = hb.hostile_zip(tmp_path / "<img src=x onerror=alert(7)>.zip")
    pixels = hb.frames()
    refused = hb.write_zip(tmp_path / "refused.zip", pixels,
                           hb.with_value(hb.manifest(pixels), "settings", "temperature", hb.MARKUP))
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            dialogs: list[str] = []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            await page.add_init_script(WATCH)
            await page.goto(server.url + "/")
            await page.locator("#vc-reask-panel").click()  # the accordion holding the bundle upload
            await page.locator("#vc-bundle-file input[type=file]").wait_for(state="attached", timeout=30_000)
            shown = await load(page, hostile, "Loaded the bundle")
            assert "<img src=x onerror=" in shown  # the markup, as text
            await page.locator("#vc-reask-from").click()  # the Re-ask list, whose label holds the markup too
            await page.screenshot(path=str(artifacts_dir / "bundle-hostile.png"))
            shown = await load(page, refused, "Invalid type for 'temperature'")
            assert await page.evaluate("window.__pwned") is None
            assert await page.evaluate("window.__created") == []
            assert await page.locator("#vc-compare img, #vc-compare script, #vc-compare svg").count() == 0
            assert dialogs == []
        finally:
            await browser.close()
