"""The page's script is ES modules with no build step: static/vidchat.js
loads as a module and imports one module per concern from static/js/; every
import resolves to a file the server serves, and no two modules import each
other in a circle (a module's top level runs once its imports have)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.unit

STATIC = ROOT / "static"
ENTRY = STATIC / "vidchat.js"
IMPORT = re.compile(r'^import\s+(?:[^"\']*?\s+from\s+)?["\'](\.{1,2}/[^"\']+)["\'];', re.M)


def _imports(module: Path) -> list[Path]:
    return [(module.parent / spec).resolve() for spec in IMPORT.findall(module.read_text())]


def _graph() -> dict[Path, list[Path]]:
    graph, todo = {}, [ENTRY.resolve()]
    while todo:
        module = todo.pop()
        if module in graph:
            continue
        graph[module] = _imports(module)
        todo += graph[module]
    return graph


def test_the_page_loads_its_script_as_a_module():
    from vidchat.doors.page.chat import HEAD

    assert '<script type="module" src="/static/vidchat/vidchat.js">' in HEAD


def test_every_import_resolves_inside_static_and_every_module_is_used():
    graph = _graph()
    for module, imported in graph.items():
        for target in imported:
            assert target.is_file(), f"{module.relative_to(ROOT)} imports a missing {target}"
            assert STATIC.resolve() in target.parents, f"{module.relative_to(ROOT)} imports outside static/"
    on_disk = {p.resolve() for p in (STATIC / "js").glob("*.js")}
    assert on_disk <= set(graph), f"modules nothing imports: {sorted(p.name for p in on_disk - set(graph))}"
    assert len(on_disk) >= 6  # one per concern: api, peer, source, live, talk, readiness (and more)


def _circular(graph: dict[Path, list[Path]]) -> list[str]:
    def reaches(start: Path, goal: Path, seen: set[Path]) -> bool:
        for nxt in graph.get(start, []):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    return sorted(m.name for m in graph if reaches(m, m, set()))


def test_no_module_imports_itself_through_others():
    circular = _circular(_graph())
    assert not circular, f"modules in an import cycle: {circular}"


def test_the_check_sees_a_cycle(tmp_path):
    (tmp_path / "a.js").write_text('import { b } from "./b.js";\nexport const a = 1;\n')
    (tmp_path / "b.js").write_text('import { a } from "./a.js";\nexport const b = 2;\n')
    (tmp_path / "c.js").write_text('import "./a.js";\n')
    graph = {p: _imports(p) for p in (tmp_path.resolve() / n for n in ("a.js", "b.js", "c.js"))}
    assert _circular(graph) == ["a.js", "b.js"]
