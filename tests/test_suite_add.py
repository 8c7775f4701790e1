"""Add to suite and the verdict route through the real server (uvicorn
subprocess, answers from real vLLM: the suite's shared ``vllm serve`` of the
tiny model) on a hand-edited suite (issue 57 points 4 and 13): a note with a
DEL is written escaped and the suite still reads; a lone surrogate is
refused (400, naming the field) with nothing made on disk; a question named
like a default case name makes a new name; the suite's comments survive;
past --suite-max-cases the add is refused saying so; a refused mark leaves
nothing beside the bundle's manifest. The file rules alone are
tests/test_suite_cases.py."""

from __future__ import annotations

import json
import stat

import httpx
import pytest
from conftest import SERVER_ARGS, TEST_MAX_IMAGES, TEST_MAX_MODEL_LEN, start_server, stop_server
from test_protocol import MOVING, SHORT, check_answer, connect, send, until

pytestmark = pytest.mark.engine

# Four cases without a name: a run calls them case-1 … case-4.
HAND_EDITED = '# Kept by hand: this comment and the layout stay.\nname = "by-hand"\n' + "".join(
    f'\n[[case]]\nvideo = "clips/door.mp4"  # case-{i}\n  [[case.ask]]\n  at = {i}\n  question = "Door?"\n'
    for i in range(1, 5))


@pytest.fixture(scope="module")
def suite_server(tiny_vllm_serve, artifacts_dir, tmp_path_factory):
    suite_dir, record_dir = tmp_path_factory.mktemp("suite-add"), tmp_path_factory.mktemp("suite-add-records")
    (suite_dir / "suite.toml").write_text(HAND_EDITED)
    srv = start_server(["--model", "tiny", "--engine-url", tiny_vllm_serve, "--max-images", str(TEST_MAX_IMAGES),
                        "--max-model-len", str(TEST_MAX_MODEL_LEN), *SERVER_ARGS,
                        # the session stays open while the test posts to its answers
                        "--ws-idle-timeout", "120", "--session-idle-timeout", "120",
                        "--suite-dir", str(suite_dir), "--suite-max-cases", "3", "--record-dir", str(record_dir)],
                       artifacts_dir / "server-suite-add.log")
    srv.suite_dir, srv.record_dir = suite_dir, record_dir
    yield srv
    stop_server(srv)


async def _answers(ws, questions: list[str]) -> list[dict]:
    """Each question's answer, asked one after another: its response.text.done stats."""
    await send(ws, {"type": "video.frame", "data": MOVING[0]})
    stats = []
    for question in questions:
        await send(ws, {"type": "video.query", "text": question})
        stats.append(check_answer(await until(ws, "response.text.done", timeout=60))["stats"])
    return stats


def _post(srv, path: str, body: dict) -> httpx.Response:
    # json.dumps escapes a lone surrogate as \ud800, as a browser's JSON.stringify does
    return httpx.post(srv.url + path, content=json.dumps(body), headers={"Content-Type": "application/json"},
                      timeout=30)


def _on_disk(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


async def test_add_to_suite_writes_a_suite_every_run_can_read_or_refuses_up_front(suite_server):
    srv = suite_server
    ws = await connect(srv, **SHORT)
    try:
        first, case4, case4_again, extra = await _answers(ws, ["What is there?", "Case 4", "Case 4", "More?"])
        # A DEL in the note: written escaped, and the suite still reads (it said "Illegal character '\x7f'").
        added = _post(srv, f"/inputs/{first['answer_id']}/add-to-suite", {"note": "a\x7fb", "expect": "x\x7fy"})
        assert added.status_code == 200, added.text
        assert added.json()["case"] == "what-is-there"
        listed = httpx.get(srv.url + "/suites", timeout=30).json()
        assert listed["error"] is None, listed["error"]
        assert listed["cases"][-1]["name"] == "what-is-there" and listed["cases"][-1]["note"] == "a\x7fb"
        assert (srv.suite_dir / "suite.toml").read_text().startswith(HAND_EDITED)  # comments and layout kept

        # A lone surrogate: 400 naming the field, before anything is made (no orphan bundle to block later adds).
        before = _on_disk(srv.suite_dir)
        for body, field in (({"note": "\ud800"}, "note"), ({"expect": "red, \udc00"}, "expect")):
            refused = _post(srv, f"/inputs/{case4['answer_id']}/add-to-suite", body)
            assert refused.status_code == 400 and refused.json()["detail"].startswith(f"{field} can't be written")
        assert _on_disk(srv.suite_dir) == before

        # "Case 4" beside four unnamed cases (case-1 … case-4), twice: two new names, and the suite reads.
        names = [_post(srv, f"/inputs/{a['answer_id']}/add-to-suite", {}).json().get("case")
                 for a in (case4, case4_again)]
        assert names == ["case-4-2", "case-4-3"]
        listed = httpx.get(srv.url + "/suites", timeout=30).json()
        assert listed["error"] is None
        assert [c["name"] for c in listed["cases"]] == ["case-1", "case-2", "case-3", "case-4", "what-is-there",
                                                        "case-4-2", "case-4-3"]

        # --suite-max-cases 3: the fourth add is refused, saying why, and makes nothing.
        before = _on_disk(srv.suite_dir)
        full = _post(srv, f"/inputs/{extra['answer_id']}/add-to-suite", {})
        assert full.status_code == 403 and "--suite-max-cases" in full.json()["detail"], full.text
        assert _on_disk(srv.suite_dir) == before
    finally:
        await ws.close()


async def test_a_mark_with_a_lone_surrogate_is_refused_and_leaves_nothing_beside_the_manifest(suite_server):
    srv = suite_server
    ws = await connect(srv, record=True, **SHORT)
    try:
        (stats,) = await _answers(ws, ["What is there?"])
        bundle = srv.record_dir / stats["bundle"]
        manifest = bundle / "manifest.json"
        mode, files = stat.S_IMODE(manifest.stat().st_mode), _on_disk(bundle)
        refused = _post(srv, f"/inputs/{stats['answer_id']}/mark", {"mark": "bad", "note": "\ud800"})
        assert refused.status_code == 400 and refused.json()["detail"].startswith("note can't be written")
        assert _on_disk(bundle) == files  # no .manifest-* left behind
        marked = _post(srv, f"/inputs/{stats['answer_id']}/mark", {"mark": "bad", "note": "late\x7f"})
        assert marked.status_code == 200, marked.text
        assert _on_disk(bundle) == files and stat.S_IMODE(manifest.stat().st_mode) == mode  # not made 0600
        assert json.loads(manifest.read_text())["mark"] == {"mark": "bad", "note": "late\x7f"}
    finally:
        await ws.close()
