"""The three kinds of reply (a local vLLM stream, a model server's stream, a
recorded bundle) are one Reply to the conversation and the doors."""

from __future__ import annotations

import asyncio

import pytest

from vidchat.conversation.bundles import RecordedReply
from vidchat.engine import Reply, ReplyStats
from vidchat.engine.local import LocalReply
from vidchat.engine.remote import RemoteReply

pytestmark = pytest.mark.unit


def test_every_reply_class_is_a_reply():
    local = LocalReply(None, "r1", {}, None, ReplyStats())
    remote = RemoteReply(None, "r2", {}, ReplyStats())
    recorded = RecordedReply({"answer": "red", "model": "m", "tokens": {"completion_tokens": 1}})
    for reply in (local, remote, recorded):
        assert isinstance(reply, Reply), type(reply).__name__
    assert not isinstance(object(), Reply)


def test_a_recorded_reply_is_whole_and_closing_it_does_nothing():
    recorded = RecordedReply({"answer": "red", "model": "m"})

    async def read() -> list[str]:
        deltas = [delta async for delta in recorded]
        await recorded.aclose()
        return deltas

    assert asyncio.run(read()) == [] and recorded.text == "red" and recorded.engine.model_path == "m"
