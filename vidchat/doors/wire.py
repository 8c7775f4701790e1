"""Large WebSocket messages without stalling the event loop.

A ``video.frame`` may be an 8 MB JPEG: ~11 MB of base64 inside JSON. Moving
``json.loads`` and ``base64.b64decode`` to a worker thread is not enough,
because both hold the interpreter lock for their whole run (measured here:
~10 ms and ~46 ms for such a frame), so the event loop waits as if they ran
on it. Instead the worker does the same work in slices of about a
millisecond each and yields the lock between them:

* :func:`parse` finds the big ``"data"`` string in the raw text and parses
  only the rest of the message; the string stays where it is, as a
  :class:`BigText` view (never copied whole).
* :func:`b64decode` decodes base64 from a ``str`` or a ``BigText`` slice by slice.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from typing import Any

# ~1 ms of base64 decoding or string scanning per slice on these machines;
# a multiple of 4 so every slice but the last is whole base64 quanta.
SLICE_CHARS = 256 * 1024
_DATA_KEY = re.compile(r'"data"\s*:\s*"')


class BigText:
    """A span of the raw message holding a JSON string without escapes."""

    def __init__(self, raw: str, start: int, end: int) -> None:
        self.raw, self.start, self.end = raw, start, end

    def __len__(self) -> int:
        return self.end - self.start

    def head(self, n: int) -> str:
        return self.raw[self.start:min(self.end, self.start + n)]

    def skip(self, n: int) -> "BigText":
        return BigText(self.raw, min(self.end, self.start + n), self.end)

    def slices(self):
        for s in range(self.start, self.end, SLICE_CHARS):
            yield self.raw[s:min(self.end, s + SLICE_CHARS)]

    def __str__(self) -> str:
        return self.raw[self.start:self.end]


def _find(raw: str, sub: str, start: int, end: int) -> int:
    """str.find in slices, yielding the lock between them."""
    for s in range(start, end, SLICE_CHARS):
        hit = raw.find(sub, s, min(end, s + SLICE_CHARS + len(sub) - 1))
        if hit != -1:
            return hit
        time.sleep(0)
    return -1


def parse(raw: str) -> Any:
    """json.loads, leaving a large ``"data"`` string in place as a BigText.

    Falls back to a plain json.loads when the message has no such field, the
    field is not most of the message, or it holds escapes (raises ValueError
    for invalid JSON, as json.loads does)."""
    key = raw.find('"data"', 0, 4096)
    match = _DATA_KEY.match(raw, key) if key != -1 else None
    if match is None:
        return json.loads(raw)
    start = match.end()
    end = _find(raw, '"', start, len(raw))
    if end == -1 or end - start < len(raw) // 2 or _find(raw, "\\", start, end) != -1:
        return json.loads(raw)
    msg = json.loads(raw[:key] + '"data": null' + raw[end + 1:])
    if isinstance(msg, dict) and msg.get("data", "") is None:
        msg["data"] = BigText(raw, start, end)
    return msg


def _decode_slices(slices) -> bytes:
    parts = []
    for piece in slices:
        parts.append(base64.b64decode(piece, validate=True))
        time.sleep(0)  # let the event loop in between slices
    return b"".join(parts)


def b64decode(text: str | BigText) -> bytes:
    """Strict base64 (whitespace tolerated), decoded slice by slice."""
    if isinstance(text, str):
        text = BigText(text, 0, len(text))
    try:
        return _decode_slices(text.slices())
    except binascii.Error:
        # Line breaks or spaces shift the 4-character quanta across slices:
        # take them out, then decode as before.
        compact = "".join(str(text).split())
        return _decode_slices(compact[s:s + SLICE_CHARS] for s in range(0, len(compact), SLICE_CHARS))
