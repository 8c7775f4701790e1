"""The remote engine's replicas as its sessions meet them: the pool a
request's replica is chosen from (vidchat.engine.replicas), the replica that
last answered each session (to say when one moved, its caches cold there),
and a failing replica, marked down and told in the user's words."""

from __future__ import annotations

import collections
import logging

import httpx

from vidchat.engine.records import ReplyStats
from vidchat.engine.replicas import ReplicaPool, shown_url

log = logging.getLogger(__name__)

# Sessions whose last replica is remembered (to say when one moved).
MAX_HOMES = 10_000


class SessionReplicas:
    """The replica pool, and each session's home in it (by routing key)."""

    def __init__(self, urls: list[str], first_byte_timeout: float) -> None:
        self.pool = ReplicaPool(urls)
        self.first_byte_timeout = first_byte_timeout  # for the words of a silent replica
        self._homes: collections.OrderedDict[str, str] = collections.OrderedDict()  # routing key -> replica

    def placed(self, key: str | None, url: str, warmup: bool, stats: ReplyStats) -> None:
        """Note which replica answers; say so when the session moved. Warm-ups
        don't move a session: the question after them says it moved."""
        stats.replica = shown_url(url)
        if key is None or warmup:
            return
        before = self._homes.get(key)
        if before is not None and before != url:
            stats.session_moved = {"from": shown_url(before), "to": shown_url(url), "caches": "cold"}
            log.info("a session moved from replica %s to %s: its caches there are cold",
                     shown_url(before), shown_url(url))
        self._homes[key] = url
        self._homes.move_to_end(key)
        while len(self._homes) > MAX_HOMES:
            self._homes.popitem(last=False)

    def failed(self, url: str, exc: Exception, before_answer: bool = False) -> str:
        """Mark the replica down and say what happened, in words for the user."""
        what = (f"did not answer within {self.first_byte_timeout:g} s" if isinstance(exc, httpx.TimeoutException)
                else f"stopped answering ({type(exc).__name__}: {exc})".replace(" ()", ""))
        self.pool.mark_down(url, what)
        where = "before answering" if before_answer else "mid-answer"
        text = f"The model server at {shown_url(url)} {what} {where}."
        if len(self.pool.urls) > 1:
            text += " Ask again: this session's next question goes to another replica (its caches start cold)."
        return text
