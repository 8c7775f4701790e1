"""Files that someone else may read, or write, while we write them: a QA
suite's suite.toml and baseline.json (the server's Add to suite and the
command line's ``vidchat suite run --update-baseline`` and ``suite add`` edit
the same two files) and a recorded bundle's manifest (marked from the page).

A file is written whole: under a temporary name beside it, checked if the
caller asks, then renamed over it, so a reader sees the old file or the new
one, never half of one, and a write that fails leaves nothing behind. Writers
that read, change and write a file take the folder's lock file first
(:func:`locked`): an ``flock`` on one path, so it holds between threads and
between processes alike, and a writer that dies lets it go with its process."""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from pathlib import Path
from typing import Callable, Iterator

LOCK_FILE = ".vidchat.lock"


class Unwritable(ValueError):
    """Text that no UTF-8 file can hold; ``field`` names where it was given."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def writable(field: str, text: str) -> str:
    """``text``, when a UTF-8 file can hold it: Unwritable naming ``field``
    for a lone surrogate (which JSON can carry, as ``"\\ud800"``), checked
    before anything is made, so a refusal leaves nothing behind."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise Unwritable(field, f"{field} can't be written to a file: character {exc.start + 1} is "
                                f"U+{ord(text[exc.start]):04X}, a lone surrogate, which UTF-8 cannot hold") from None
    return text


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s lock file (made, with the folder, when missing) for the block.
    Not re-entrant: a holder that takes it again waits for itself."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_whole(path: Path, text: str, check: Callable[[str], None] | None = None) -> None:
    """Replace ``path`` with ``text`` (UTF-8) in one rename. ``check`` is given
    the text read back from the temporary file and raises to refuse it; the
    file then stays as it was. The new file keeps the old one's permissions
    (a new one gets the umask's, as any file the user makes)."""
    data = text.encode("utf-8")  # a lone surrogate raises here, before anything is made
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        if check is not None:
            check(tmp.read_text(encoding="utf-8"))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
