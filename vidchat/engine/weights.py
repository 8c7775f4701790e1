"""Model folders built here once and reused: the tiny test models and the
true-architecture builds (no weights can be downloaded on this project's
machines, so these are made locally).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def build_once(cache_dir: str | os.PathLike[str], folder: str, build: Callable[[Path], object]) -> Path:
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


# Which exact weights a model names, for answer records: a hub snapshot's
# commit, or a fingerprint of a local folder's files. A leaf: the engines and
# the model resolver both use it.

_COMMIT = re.compile(r"^[0-9a-f]{40}$")

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def model_revision(model: str) -> str:
    """Which exact weights a model path or hub id names, for answer records.

    A hub download lives in ``…/snapshots/<commit>/``: that commit is the
    revision. Any other folder (a built test model, a local copy) gets a
    fingerprint of its config and weight files (names, sizes, modification
    times and their first and last MiB), so two records with the same
    fingerprint came from the same files; hashing every byte of a 15 GB model
    at start-up would cost tens of seconds. An uncached hub id is its own
    name: vLLM resolves it to the hub's current main."""
    path = Path(model).expanduser()
    if not path.is_dir():
        try:
            from huggingface_hub import snapshot_download

            path = Path(snapshot_download(model, local_files_only=True))
        except Exception:
            return "hub main (not cached here)"
    resolved = path.resolve()
    for part in (path, resolved):
        if part.parent.name == "snapshots" and _COMMIT.match(part.name):
            return part.name
    return "fingerprint " + _fingerprint(resolved)


def _fingerprint(folder: Path) -> str:
    digest = hashlib.sha256()
    for name in ("config.json", "generation_config.json", "preprocessor_config.json"):
        if (folder / name).is_file():
            digest.update(name.encode() + b"\0" + (folder / name).read_bytes())
    for weights in sorted(p for p in folder.iterdir() if p.name.endswith(_WEIGHT_SUFFIXES)):
        stat = weights.stat()
        digest.update(f"{weights.name} {stat.st_size} {stat.st_mtime_ns}\n".encode())
        with weights.open("rb") as f:
            digest.update(f.read(1 << 20))
            if stat.st_size > 2 << 20:
                f.seek(-(1 << 20), os.SEEK_END)
                digest.update(f.read(1 << 20))
    return digest.hexdigest()[:16]


# One name per model (issue 59, point 3): the page, records, reports, logs,
# metrics and a suite's baselines name a model by what --model resolved to,
# never by the option's literal text ("auto" is resolved before anything is
# written: vidchat.app.models.resolve_settings). A preset or hub id is its own
# name; the tiny test model is "tiny" whichever alias chose it; a folder is
# named by its last part. Which exact weights: model_revision, beside it.
TINY_ALIASES = {"tiny-omni": "tiny"}


def model_name(option: str) -> str:
    """The one name of the model ``option`` (a --model or --compare-model
    value, or an engine's model path) chooses."""
    option = option.strip()
    if option.startswith(("/", ".", "~")):
        return option.rstrip("/").rsplit("/", 1)[-1] or option
    return TINY_ALIASES.get(option, option)
