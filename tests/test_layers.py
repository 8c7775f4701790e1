"""The packages show the architecture, and the imports keep to it: data goes
downward, doors -> conversation -> engine and media.

* vidchat.media imports nothing of vidchat above it;
* vidchat.engine imports only itself and media;
* vidchat.conversation imports only itself, the engine's interface and media
  (never a door, the app, qa or devtools);
* vidchat.doors imports nothing of the app, qa or devtools (what a door needs
  of the server is in vidchat.doors);
* the doors, the conversation and the app's shared state reach an engine only
  through its interface (vidchat.engine), never vidchat.engine.local or
  .remote, nor vLLM itself; only the app's server (which starts one) and the
  dev tools do.

Read from the source (every import, lazy ones too), as ../shared/tools/shape.py does.
"""

from __future__ import annotations

import ast

import pytest
from conftest import ROOT

pytestmark = pytest.mark.unit

PACKAGE = ROOT / "vidchat"
BELOW = {"vidchat.media": {"vidchat.media"},
         "vidchat.engine": {"vidchat.engine", "vidchat.media"},
         "vidchat.conversation": {"vidchat.conversation", "vidchat.engine", "vidchat.media"},
         # A door is an adapter: what it needs of the server is in vidchat.doors.
         "vidchat.doors": {"vidchat.doors", "vidchat.conversation", "vidchat.engine", "vidchat.media"}}
IMPLEMENTATIONS = ("vidchat.engine.local", "vidchat.engine.remote", "vllm")
# The module that builds an engine: the app's (the server at start-up; replay and suites start theirs through it).
STARTS_ENGINES = {"vidchat.app.engine_keeper", "vidchat.app.server"}


def _modules() -> dict[str, ast.AST]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = ast.parse(path.read_text())
    return out


def _imports(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _package(name: str) -> str:
    return ".".join(name.split(".")[:2])


MODULES = _modules()


def test_every_module_lives_in_a_package_that_says_what_it_is():
    flat = sorted(m for m in MODULES if m.count(".") == 1 and not (PACKAGE / m.split(".")[1]).is_dir()
                  and m not in {"vidchat.replay", "vidchat.client", "vidchat.suite"})
    # vidchat.replay, vidchat.client and vidchat.suite only keep the documented `python -m` commands.
    assert not flat, f"modules outside the packages: {flat}"
    assert {_package(m) for m in MODULES if m.count(".") >= 1} >= {
        "vidchat.media", "vidchat.engine", "vidchat.conversation", "vidchat.doors", "vidchat.qa", "vidchat.app",
        "vidchat.devtools"}


@pytest.mark.parametrize("layer", sorted(BELOW))
def test_a_lower_layer_imports_nothing_above_it(layer):
    allowed = BELOW[layer]
    bad = {f"{module} -> {name}" for module, tree in MODULES.items() if _package(module) == layer
           for name in _imports(tree) if name.startswith("vidchat.") and _package(name) not in allowed}
    assert not bad, f"{layer} imports above itself: {sorted(bad)}"


def test_only_what_starts_an_engine_imports_an_implementation():
    users = {f"{module} -> {name}" for module, tree in MODULES.items()
             if _package(module) not in {"vidchat.engine", "vidchat.devtools"} and module not in STARTS_ENGINES
             for name in _imports(tree) if name.startswith(IMPLEMENTATIONS) or name.split(".")[0] == "vllm"}
    assert not users, f"modules that should use only vidchat.engine's interface: {sorted(users)}"


def test_the_check_sees_a_violation():
    # The rules read real imports: a lower layer importing a door is caught.
    tree = ast.parse("from vidchat.doors.socket import seed\nimport vidchat.engine.local\n")
    assert {"vidchat.doors.socket", "vidchat.doors.socket.seed", "vidchat.engine.local"} <= _imports(tree)


DOOR_NAMES = {"webrtc", "ws", "realtime", "page", "socket"}
# The one place the core names doors: the labels of metrics, logs and bundles.
DOOR_LABELS = "vidchat.conversation.events"


def _door_names(tree: ast.AST) -> list[int]:
    """Lines of the core that name a door: a session kind compared with, or
    looked up among, door names is a decision that belongs to the door."""
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in DOOR_NAMES]


def test_the_core_never_decides_by_a_doors_kind():
    # What differs between doors (the words of a refusal, what a door keeps)
    # is the door's own: the core carries a session's kind only as a label.
    bad = {f"{module}:{line}" for module, tree in MODULES.items()
           if _package(module) in {"vidchat.conversation", "vidchat.media", "vidchat.engine"} and module != DOOR_LABELS
           for line in _door_names(tree)}
    assert not bad, f"the core names a door at {sorted(bad)}"
    assert _door_names(ast.parse("if entry.kind == 'webrtc':\n    pass\nx = {'ws': 1}.get(entry.kind)\n")) == [1, 3]
