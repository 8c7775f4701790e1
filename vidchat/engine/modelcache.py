"""Model folders built here once and reused: the tiny test models and the
true-architecture builds (no weights can be downloaded on this project's
machines, so these are made locally)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def build_once(cache_dir: str | os.PathLike, folder: str, build: Callable[[Path], object]) -> Path:
    """``cache_dir/folder``, made by ``build(tmp_folder)`` if it isn't there yet.

    Built into a temporary folder and renamed into place, so a crash mid-build
    or two processes building at once never leave a half-written model. Name
    the folder after everything the build depends on (e.g. a hash of the
    builder's source), so a changed builder makes a new folder."""
    root = Path(cache_dir)
    target = root / folder
    if (target / "config.json").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder}-", dir=root))
    try:
        build(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
