"""The engine's interface: what the doors, the conversation code, replay and
the benchmarks may use of an engine (:class:`ChatEngine`) and of the answer
it streams (:class:`Reply`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np
from PIL import Image

from vidchat.engine.prompts import Family

# The records that cross the engine's interface: the options an engine
# starts with, a chat turn, a question prepared for vLLM and the stats its
# reply carries.

# vLLM (and numpy's random generator under it) takes a signed 64-bit seed.
SEED_RANGE = (-(2**63), 2**63 - 1)


@dataclass
class EngineOptions:
    model: str
    # The model's one name (vidchat.engine.weights.model_name), as the app
    # resolved --model: its log lines say it; "" names it by ``model``.
    name: str = ""
    dtype: str = "auto"
    max_model_len: int = 8192
    kv_cache_gb: float = 1.0
    mm_cache_gb: float = 1.0  # vLLM's processed-frame cache (mm_processor_cache_gb)
    gpu_memory_utilization: float = 0.85
    max_images: int = 32
    max_videos: int = 1
    max_audios: int = 1
    split_audio: bool = False  # the audio's segments, one clip each (see audio_clips)
    # 0 keeps the model's own processor setting.
    max_image_pixels: int = 0
    enforce_eager: bool = True
    seed: int = 0
    priority_scheduling: bool = False  # vLLM's priority policy (for warm-ups)
    # Frames vLLM's encoder cache must hold (frames per question x sessions);
    # 0 leaves vLLM's own size. See encoder_cache_budget.
    encoder_cache_frames: int = 0
    video_pruning_rate: float = 0.0  # vLLM's video token pruning (Qwen2.5-VL, Qwen3-VL); 0: off
    tensor_parallel_size: int = 1  # vLLM's own parallelism, passed through (GPU)
    data_parallel_size: int = 1
    # vLLM's Prometheus stat logger (its vllm: families in the process's
    # default registry, as `vllm serve` has them): the main engine's only,
    # since a second engine's would replace them.
    prometheus_stats: bool = False
    # Which of the server's engines this is ("main" or "compare", --compare-model):
    # an answer's record, bundle, baseline and metrics name the engine that answered.
    role: str = "main"


@dataclass
class Turn:
    role: str  # "user" | "assistant"
    text: str


@dataclass
class ReplyStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens vLLM took from its prefix cache
    completion_tokens: int = 0
    frames: int = 0
    audio_seconds: float = 0.0
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    total_s: float = 0.0
    finish_reason: str | None = None
    cancelled: bool = False
    inputs_sha256: str = ""  # see inputs_digest
    # The audio's segments as the engine got them (samples each, oldest
    # first; see audio_clips); empty when it went as one clip.
    audio_parts: list[int] = field(default_factory=list)
    # Chat turns the prompt carried, of those the question came with: the
    # oldest are left out when the whole chat no longer fits (Engine.fit_history).
    history_turns: int = 0
    history_turns_total: int = 0
    # --engine-url: the model server that answered (a router counts as one),
    # and, when the session's previous question went to another replica
    # (which failed), {"from", "to", "caches": "cold"} (vidchat.engine.remote).
    replica: str | None = None
    session_moved: dict[str, str] | None = None
    # The engine's own time from scheduling the request to its first token:
    # encoding the frames new to it and prefilling the uncached prompt
    # (None where the engine keeps no per-request stats: a remote one, or
    # one started without vLLM's stat loggers).
    prefill_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def ended(self, started: float) -> None:
        """Total time and decode rate, for an answer started at ``started``
        (time.perf_counter) and ending now."""
        self.total_s = time.perf_counter() - started
        if self.ttft_s is not None and self.completion_tokens > 1:
            gen_time = self.total_s - self.ttft_s
            if gen_time > 0:
                self.tokens_per_s = (self.completion_tokens - 1) / gen_time


@dataclass
class Prepared:
    """A question made ready for vLLM: the rendered prompt and its media."""

    prompt: dict[str, Any]
    prompt_text: str
    params: Any
    stats: "ReplyStats"
    video_fps: float | None = None
    # The session's routing key (vidchat.engine.remote.routing_key): what
    # pins its requests, warm-ups included, to one model server.
    routing_key: str | None = None
    # vLLM's scheduling priority where the engine schedules by priority
    # (answers 0; the memory's captions CAPTION_PRIORITY, behind everything).
    priority: int = 0


# vLLM's priority scheduling handles lower values first; answers use 0.
WARMUP_PRIORITY = 10

CAPTION_PRIORITY = 20


@runtime_checkable
class Reply(Protocol):
    """One answer as the conversation and the doors read it, whichever made
    it: an engine streaming it (vidchat.engine.local.LocalReply, .remote.RemoteReply)
    or a bundle that recorded it (vidchat.conversation.bundles.RecordedReply,
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


# What an engine raises when a question cannot be answered, and the words
# the user is told: a refusal to change the question, or the engine's death.

class EngineError(RuntimeError):
    """A question could not be answered; the message tells the user what to change."""


class EngineDead(EngineError):
    """The engine process is gone (vidchat.app.engine_keeper starts a new one)."""


ENGINE_DEAD_MESSAGE = "The model engine has stopped (see the server log for the cause)."


def engine_dead_message(cause: str | None) -> str:
    """What an answer in flight says when the engine dies: one failure naming the cause."""
    return f"The model engine has stopped: {cause}." if cause else ENGINE_DEAD_MESSAGE


# What a page or client asking by voice is told when the model hears nothing.
NO_SPOKEN_QUESTIONS = (
    "This model does not take audio, so it can't be asked by voice. For Talk mode run a model "
    "that hears: --preset qwen2.5-omni-3b on a GPU (or --model tiny-omni to try the pipeline "
    "with random weights)."
)
