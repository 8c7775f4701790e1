"""The engine is an interface: two implementations, neither a kind of the
other, and the doors and conversation code import only the interface
(vidchat.engine), never an implementation or vLLM itself."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from vidchat.engine import ChatEngine, ModelEngine
from vidchat.local_engine import LocalEngine
from vidchat.remote_engine import RemoteEngine

from conftest import ROOT

pytestmark = pytest.mark.unit

# The doors and what they share below them: they reach an engine only through vidchat.engine.
INTERFACE_ONLY = ["ui/view", "ui/answers", "ui/modes", "ui/layout", "protocol", "protocol_config", "webrtc", "answer_inputs", "chat", "sessions", "session",
                  "watch", "talk", "prewarm", "answer_queue", "recording", "state", "access"]
IMPLEMENTATIONS = {"vidchat.local_engine", "vidchat.remote_engine", "vllm"}


def _imports(module: str) -> set[str]:
    tree = ast.parse((ROOT / "vidchat" / f"{module}.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", INTERFACE_ONLY)
def test_doors_and_the_conversation_code_import_only_the_interface(module):
    bad = {name for name in _imports(module) if name.split(".")[0] == "vllm" or name in IMPLEMENTATIONS}
    assert not bad, f"vidchat/{module}.py imports an engine implementation: {sorted(bad)}"


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
