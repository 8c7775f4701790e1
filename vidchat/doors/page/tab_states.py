"""The page state Gradio keeps for each tab, kept from growing.

Gradio keeps a copy of the page's component state for every tab it has
seen (each component's configuration, the chat, the last answer's "what
the model got" and reply details, the tab's loaded bundle). Two things
grew it on a server left running (bench/soak.py found them;
docs/operations.md, "What the soak found"):

- **Every answer, in an open tab.** An output first given ``gr.skip()``
  (an update) and then a value (the answer's inputs view and details, once
  it is done) is stored by Gradio 6 under a fresh component id each time,
  beside the component's own: about 12 KB more per answer that nothing
  reads (the tab's ``config_values`` are only written, and the extra
  component copies are only looked up under ids no event has). Each round
  drops the entries under ids that are not the page's own.
- **Every tab, once closed.** When a tab closes (its heartbeat stream
  ends) Gradio only marks its copy closed; the copy stays until
  ``page_state_capacity`` newer tabs push it out. A tab closed and not used
  for ``--closed-tab-timeout`` s is forgotten. A tab whose heartbeat only
  blinked (it reconnects, stays marked closed, and its next event finds its
  state) is in use, so it is kept; one that comes back after it was
  forgotten starts from the page's defaults, as Gradio's own expiry would
  leave it after an hour.

The rounds run on the event loop, where Gradio changes these copies too.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import Any, Callable

log = logging.getLogger(__name__)

ROUND_EVERY_S = 60.0  # at most; a few times within the timeout when it is shorter


def _stray_keys(holder: Any, table: dict) -> list[int]:
    """The ids in one of a tab's tables that are not the page's own components."""
    return [key for key in table if key not in holder.blocks.blocks]


def tab_counts(holder: Any) -> dict[str, int]:
    """How many tabs' state Gradio holds, how many of those are closed, and
    how many stray component copies they hold now (/api/health's ``page_tabs``)."""
    states = list(holder.session_data.values())
    return {"held": len(states), "closed": sum(1 for s in states if getattr(s, "is_closed", False)),
            "stray_copies": sum(len(_stray_keys(holder, s.config_values)) for s in states)}


def drop_stray_copies(holder: Any) -> int:
    """Drop, in every tab's state, the entries under ids that are not the
    page's own components; returns how many went."""
    dropped = 0
    for tab_state in list(holder.session_data.values()):
        for table in (tab_state.config_values, tab_state.blocks_config.blocks):
            stray = _stray_keys(holder, table)
            for key in stray:
                del table[key]
            dropped += len(stray)
    return dropped


def forget_closed_tabs(holder: Any, keep_s: float, now: datetime.datetime | None = None) -> int:
    """Drop the state of each tab closed and unused for ``keep_s``; returns how many went."""
    now = now or datetime.datetime.now()
    idle_since = dict(holder.time_last_used)
    gone = [tab for tab, tab_state in list(holder.session_data.items())
            if getattr(tab_state, "is_closed", False)
            and (now - idle_since.get(tab, datetime.datetime.min)).total_seconds() >= keep_s]
    for tab in gone:
        holder.delete_state(tab)  # gr.State values' delete callbacks, as Gradio's own expiry runs them
        with holder.lock:
            holder.session_data.pop(tab, None)
            holder.time_last_used.pop(tab, None)
    return len(gone)


async def keep_tab_states_bounded(holder_of: Callable[[], Any], keep_s: float) -> None:
    """A round of both every so often until cancelled (the app's lifespan runs it)."""
    every_s = min(ROUND_EVERY_S, max(0.5, keep_s / 4))
    while True:
        await asyncio.sleep(every_s)
        holder = holder_of()
        if holder is None:  # no page mounted
            continue
        try:
            gone = forget_closed_tabs(holder, keep_s)
            dropped = drop_stray_copies(holder)
        except Exception:
            log.exception("keeping the tabs' page state bounded failed")
            continue
        if gone or dropped:
            log.debug("page state: forgot %d closed tab(s), dropped %d stray component copies", gone, dropped)
