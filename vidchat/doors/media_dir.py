"""--media-dir: video files the page may pick as a source.

The browser plays the file itself and sends it over the session's peer like a
camera, so this module only lists the folder and serves its files. Only
regular files directly inside the folder, with a video or audio extension,
are listed or served: no subfolders, no links out, nothing else on the disk.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

log = logging.getLogger(__name__)

MEDIA_EXTENSIONS = frozenset({".mp4", ".webm", ".mkv", ".mov", ".ogv", ".ogg", ".m4v", ".mp3", ".wav", ".m4a"})


def media_files(folder: str) -> dict[str, Path]:
    """Name -> path of the playable files directly in `folder` (empty when unset)."""
    if not folder:
        return {}
    root = Path(folder).expanduser().resolve()
    if not root.is_dir():
        return {}
    out = {}
    for path in sorted(root.iterdir()):
        if path.suffix.lower() in MEDIA_EXTENSIONS and path.is_file() and not path.is_symlink() \
                and path.resolve().parent == root:
            out[path.name] = path
    return out


def router(state: Any) -> APIRouter:
    api = APIRouter()

    @api.get("/api/media")
    async def listing() -> dict[str, Any]:
        files = media_files(state.settings.media_dir)
        return {"files": [{"name": name, "bytes": path.stat().st_size} for name, path in files.items()]}

    @api.get("/media/{name}")
    async def media(name: str) -> FileResponse:
        path = media_files(state.settings.media_dir).get(name)
        if path is None:
            raise HTTPException(404, "no such file in --media-dir")
        return FileResponse(path)

    return api
