"""vidchat.doors.page.layout on real Gradio state: what Gradio 6 keeps
per tab grows with every answer and every closed tab, and the rounds bring
it back to the page's own (docs/operations.md, "What the soak found"). The
same through the real server, real vLLM and a WebRTC peer: tests/test_webrtc.py."""

from __future__ import annotations

import asyncio
import datetime

import gradio as gr
import pytest
from gradio.state_holder import StateHolder

from vidchat.devtools.harness import eventually_async
from vidchat.doors.page.layout import (
    drop_stray_copies,
    forget_closed_tabs,
    keep_tab_states_bounded,
    tab_counts,
)

pytestmark = pytest.mark.unit


def _page() -> tuple[gr.Blocks, StateHolder]:
    with gr.Blocks() as blocks:
        view = gr.HTML("first")
        details = gr.JSON(value=None)
        gr.State({})
        button = gr.Button()
        button.click(lambda: ("x", {}), None, [view, details])
    holder = StateHolder()
    holder.set_blocks(blocks)
    return blocks, holder


async def _an_answer(blocks: gr.Blocks, holder: StateHolder, tab: str, n: int) -> None:
    """What the page's answer does to its views: skipped while it streams, then set once done."""
    block_fn = blocks.fns[0]
    await blocks.postprocess_data(block_fn, [gr.skip(), gr.skip()], holder[tab])
    await blocks.postprocess_data(block_fn, [f"<p>answer {n}</p>", {"n": n}], holder[tab])


async def test_each_answer_leaves_a_stray_copy_in_gradio_and_a_round_drops_them_all():
    blocks, holder = _page()
    own = len(holder["tab"].config_values)
    for n in range(5):
        await _an_answer(blocks, holder, "tab", n)
    # Gradio 6's own behaviour, which the round is for: should it stop, this says the round can go.
    assert tab_counts(holder)["stray_copies"] == 10, holder["tab"].config_values.keys()
    assert drop_stray_copies(holder) == 20  # its config entries and its component copies
    assert tab_counts(holder) == {"held": 1, "closed": 0, "stray_copies": 0}
    assert len(holder["tab"].config_values) == own
    # The tab works on: its next answer is stored, and the round drops what it leaves again.
    await _an_answer(blocks, holder, "tab", 5)
    assert tab_counts(holder)["stray_copies"] == 2
    assert drop_stray_copies(holder) == 4


def test_a_closed_tab_is_forgotten_once_unused_for_the_timeout_and_an_open_or_recent_one_is_kept():
    _, holder = _page()
    for tab in ("open", "closed-long-ago", "closed-just-now", "closed-never-used"):
        holder[tab]
    now = datetime.datetime.now()
    holder.time_last_used["closed-long-ago"] = now - datetime.timedelta(seconds=601)
    holder.time_last_used["closed-just-now"] = now - datetime.timedelta(seconds=5)
    holder.time_last_used["open"] = now - datetime.timedelta(seconds=3600)
    del holder.time_last_used["closed-never-used"]
    for tab in ("closed-long-ago", "closed-just-now", "closed-never-used"):
        holder.session_data[tab].is_closed = True
    assert tab_counts(holder) == {"held": 4, "closed": 3, "stray_copies": 0}
    assert forget_closed_tabs(holder, 600, now=now) == 2
    assert sorted(holder.session_data) == ["closed-just-now", "open"]
    assert sorted(holder.time_last_used) == ["closed-just-now", "open"]


async def test_the_rounds_run_until_cancelled_and_a_missing_page_is_no_error():
    blocks, holder = _page()
    await _an_answer(blocks, holder, "tab", 0)
    holder.session_data["gone"] = holder["gone"]
    holder.session_data["gone"].is_closed = True
    holder.time_last_used["gone"] -= datetime.timedelta(seconds=10)
    pages = iter([None, holder])
    task = asyncio.create_task(keep_tab_states_bounded(lambda: next(pages, holder), keep_s=1.0))
    try:
        await eventually_async(lambda: tab_counts(holder) == {"held": 1, "closed": 0, "stray_copies": 0}, 30,
                               "the closed tab forgotten and the open one's stray copies dropped")
        assert not task.done()  # a round with no page mounted went on to the next
    finally:
        task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
