"""Which exact weights a model names, for answer records: a hub snapshot's
commit, or a fingerprint of a local folder's files. A leaf: the engines and
the model resolver both use it."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

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
