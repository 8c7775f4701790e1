"""A session watching one of the server's streams (--stream,
vidchat.media.streams): the one rule every door follows when its client
chooses a stream (the seed socket's ``session.config {"source": {"stream":
NAME}}``, the Realtime door's ``session.update``, the page's Source menu).
The session is attached to the stream's one reader, leaves any stream it
watched before, and is detached when it ends; while attached its client
sends no frames of its own (:func:`refuse_own_frames` says so, naming the
stream), and each answer's record says whether the stream was live when it
was asked (``source_state``)."""

from __future__ import annotations

from typing import Any

from vidchat.media.streams import Streams, UnknownStream  # noqa: F401 (the doors' name for a refused one)


def attach_stream(entry: Any, streams: Streams, name: str) -> Any:
    """Attach ``entry``'s session to stream ``name``; raises UnknownStream naming it and the streams there are."""
    reader = streams.attach(name, entry.session)
    if entry.stream is None:
        async def leave() -> None:
            streams.detach(entry.session)

        entry.closers.append(leave)
    entry.stream = reader
    return reader


def detach_stream(entry: Any, streams: Streams) -> None:
    """The session watches no stream any more (its frames stay)."""
    if entry.stream is not None:
        streams.detach(entry.session)
        entry.stream = None


def refuse_own_frames(entry: Any) -> str | None:
    """Why a client's own frame is refused (its session watches a stream), or None."""
    if entry.stream is None:
        return None
    return (f"this session watches the stream {entry.stream.name!r}: it takes no frames of its own "
            "(choose no stream to send your own)")
