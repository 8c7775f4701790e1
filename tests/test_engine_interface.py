"""The engine is an interface: two implementations, neither a kind of the
other (that the doors import only the interface is tests/test_layers.py)."""

from __future__ import annotations

import inspect

import pytest

from vidchat.engine import ChatEngine, ModelEngine
from vidchat.engine.local import LocalEngine
from vidchat.engine.remote import RemoteEngine

pytestmark = pytest.mark.unit

def test_two_implementations_neither_a_kind_of_the_other():
    assert not issubclass(RemoteEngine, LocalEngine) and not issubclass(LocalEngine, RemoteEngine)
    for cls in (LocalEngine, RemoteEngine):
        assert issubclass(cls, ModelEngine)
        # Every member of the interface is implemented, not left to the shared base's placeholder.
        for name in ("prepare", "submit", "warm", "shutdown", "is_dead", "running_requests",
                     "running_warmups", "encoder_cache_tokens"):
            member = inspect.getattr_static(cls, name)
            assert name in cls.__dict__ or not _placeholder(member), f"{cls.__name__}.{name}"


def _placeholder(member) -> bool:
    func = member.fget if isinstance(member, property) else member
    return "NotImplementedError" in inspect.getsource(func)


def test_the_interface_lists_what_the_doors_call():
    members = set(ChatEngine.__annotations__) | {n for n in vars(ChatEngine) if not n.startswith("_")}
    for name in ("prepare", "submit", "warm", "check_request", "accepts_audio", "running_requests", "is_dead",
                 "options", "model_path", "model_revision", "shutdown"):
        assert name in members, name
