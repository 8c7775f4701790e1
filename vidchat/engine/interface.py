"""The engine's interface: what the doors, the conversation code, replay and
the benchmarks may use of an engine (:class:`ChatEngine`) and of the answer
it streams (:class:`Reply`)."""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np
from PIL import Image

from vidchat.engine.families import Family
from vidchat.engine.records import EngineOptions, Prepared, ReplyStats

# vLLM's priority scheduling handles lower values first; answers use 0.
WARMUP_PRIORITY = 10


@runtime_checkable
class Reply(Protocol):
    """One answer as the conversation and the doors read it, whichever made
    it: an engine streaming it (vidchat.engine.local.LocalReply, .remote.RemoteReply)
    or a bundle that recorded it (vidchat.conversation.recorded_reply.RecordedReply,
    whole already). Iterate for text deltas; ``text`` is all so far;
    ``stats`` is final once the stream ends; ``aclose`` stops it and aborts
    its request; ``engine`` says which model answered (``model_path``, ``model_revision``)."""

    text: str
    stats: ReplyStats
    engine: Any

    def __aiter__(self) -> Any: ...
    async def __anext__(self) -> str: ...
    async def aclose(self) -> None: ...


@runtime_checkable
class ChatEngine(Protocol):
    """What the doors, the conversation code, replay and the benchmarks may
    use of an engine. Both engines implement it; nothing else is public."""

    options: EngineOptions
    model_path: str
    model_revision: str
    start_s: float
    family: Family
    accepts_audio: bool
    accepts_video: bool
    processor_kwargs: dict[str, Any]
    tokens_per_frame: int | None

    @property
    def splits_audio(self) -> bool: ...
    @property
    def running_requests(self) -> int: ...
    @property
    def running_warmups(self) -> int: ...
    @property
    def is_dead(self) -> bool: ...
    @property
    def encoder_cache_tokens(self) -> int | None: ...

    def check_request(self, n_frames: int, frames_as: str) -> None: ...
    def prepare(self, question: str, frames: Sequence[np.ndarray | Image.Image] = (),
                audio: np.ndarray | None = None, **options: Any) -> Prepared: ...
    def submit(self, prepared: Prepared, request_id: str | None = None) -> Reply: ...
    async def warm(self, prepared: Prepared) -> ReplyStats: ...
    async def replica_health(self) -> list[dict[str, Any]] | None: ...
    def ask(self, question: str, frames: Sequence[np.ndarray | Image.Image] = (),
            audio: np.ndarray | None = None, *, request_id: str | None = None, **options: Any) -> Any: ...
    def shutdown(self) -> None: ...
