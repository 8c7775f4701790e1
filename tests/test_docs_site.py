"""The documentation site builds (MkDocs, Material theme, --strict: a broken
link or anchor fails), every page is in its navigation, and the README stays
the short front page that links into it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT

pytestmark = pytest.mark.unit


def _nav_files(nav) -> set[str]:
    out = set()
    for item in nav:
        for value in item.values() if isinstance(item, dict) else [item]:
            out |= _nav_files(value) if isinstance(value, list) else {value}
    return out


def test_the_site_builds_strictly(tmp_path):
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                           cwd=ROOT, capture_output=True, text=True, timeout=120,
                           env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert built.returncode == 0, built.stderr[-3000:]
    assert (tmp_path / "site" / "options" / "index.html").is_file()


def test_every_page_is_in_the_navigation():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages == _nav_files(config["nav"])


def test_the_readme_is_a_front_page_that_links_into_the_docs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", readme))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert pages <= linked, f"pages the README does not link: {sorted(pages - linked)}"
    assert all((ROOT / "docs" / page).is_file() for page in linked)
    assert not re.search(r"^#", readme.split("---\n", 2)[1], re.M), "the Space card has no comment lines"
