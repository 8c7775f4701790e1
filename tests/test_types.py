"""The type checker: ``mypy --strict`` passes over the packages below, with
pyproject's [tool.mypy] configuration (docs/how-it-works.md says why mypy).

The first run in a fresh clone builds mypy's cache (.mypy_cache, which mypy
keeps out of git itself) from numpy and the rest: about 10 s of CPU (vLLM,
torch and transformers are not read: pyproject says why); after that a run
reads the cache and takes seconds.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import pytest
from conftest import ROOT

pytestmark = pytest.mark.unit

PACKAGES = ("vidchat/conversation", "vidchat/media", "vidchat/engine", "vidchat/qa")


# Longer than a unit test's 30 s: a cold cache analyses torch and vLLM.
@pytest.mark.timeout(600)
def test_mypy_strict_passes():
    # --config-file: pyproject's section, whatever mypy.ini or setup.cfg a
    # checkout might also hold (mypy would read those first).
    checked = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--config-file", "pyproject.toml",
                              "--no-error-summary", "--no-color-output", *PACKAGES],
                             cwd=ROOT, capture_output=True, text=True, timeout=570)
    if checked.returncode != 0:
        pytest.fail(f"mypy --strict found errors:\n{checked.stdout[-20000:]}{checked.stderr[-5000:]}", pytrace=False)


def test_nothing_is_ignored_wholesale():
    """No blanket escapes from the check: no ``# type: ignore`` without an
    error code (mypy's ignore-without-code enforces it too), no per-file
    ``# mypy:`` switches, and the configuration ignores no module's errors."""
    bare = re.compile(r"#\s*type:\s*ignore(?!\[)")
    switches = re.compile(r"#\s*mypy:")
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if bare.search(line) or switches.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert config["strict"] is True
    assert "ignore-without-code" in config["enable_error_code"]
    for override in config.get("overrides", []):
        assert not override.get("ignore_errors"), override
        assert not override.get("disable_error_code"), override
        modules = override["module"] if isinstance(override["module"], list) else [override["module"]]
        if override.get("ignore_missing_imports"):
            # only third-party libraries, each by name
            assert all(not m.startswith("vidchat") and "*" not in m for m in modules), modules
