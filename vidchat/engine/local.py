"""The in-process engine: one vLLM `AsyncLLM`, questions in, text deltas out.
Frames reach vLLM as arrays/PIL images, never through base64 or JSON; the
prompt a question becomes is built in :mod:`vidchat.engine.local`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import time
import uuid
from typing import TYPE_CHECKING, Any, AsyncGenerator, Callable, Sequence

import numpy as np
from PIL import Image
from vllm.v1.engine.core import EngineCoreProc

from vidchat.engine import (
    ModelEngine,
    cpu_has_native_bf16,
    note_engine_start,
    on_gpu,
    tokens_per_frame,
)
from vidchat.engine.interface import (
    WARMUP_PRIORITY,
    EngineDead,
    EngineError,
    EngineOptions,
    Prepared,
    ReplyStats,
    Turn,
    engine_dead_message,
)
from vidchat.engine.native_heap import WORKER_EXTENSION, bound_onednn_cache
from vidchat.engine.prompts import (
    Family,
    as_video,
    audio_clips,
    family_of,
    inputs_digest,
    model_type_of,
    to_pil,
    video_fps,
)
from vidchat.engine.weights import model_name, model_revision
from vidchat.media import AUDIO_RATE

if TYPE_CHECKING:  # for annotations only: the code imports what it calls where it calls it
    from vllm import SamplingParams
    from vllm.outputs import RequestOutput

log = logging.getLogger(__name__)


# vLLM's engine arguments for vidchat's options on this machine: the
# dtype, the processor and its tokens per frame, the per-prompt limits, the
# caches' sizes, the scheduling policy and the stat loggers.

# vLLM's encoder cache is as large as its per-step token budget
# (max_num_batched_tokens; 2,048 on CPU, at least 8,192 on a GPU), which
# cannot be set apart. Raised only when a sample per session needs more, and
# never past this: a step that large is as long as the budget allows.
ENCODER_CACHE_FLOOR_TOKENS = {"cpu": 2048, "gpu": 8192}

ENCODER_CACHE_MAX_TOKENS = 65536


def dtype_for(dtype: str, gpu: bool) -> str:
    """The dtype vLLM runs the model in: ``auto`` means float32 on a CPU without native bfloat16."""
    if dtype == "auto" and not gpu and not cpu_has_native_bf16():
        # vLLM's "auto" runs a bfloat16 checkpoint in bfloat16 on a CPU
        # too; without native bf16 instructions every matmul is emulated,
        # about 100x slower than float32 here (AVX2: 2.7 s against 21 ms).
        log.info("this CPU has no native bfloat16 (avx512_bf16, amx_bf16 or Arm bf16): running the model in "
                 "float32, which is many times faster here; --dtype bfloat16 overrides")
        return "float32"
    return dtype


def vllm_engine_kwargs(options: EngineOptions, dtype: str, gpu: bool, processor_kwargs: dict[str, Any],
                       per_frame: int | None) -> dict[str, Any]:
    """vLLM's engine arguments for these options on this machine (``per_frame``:
    the processor's tokens per frame, which sizes the encoder cache when asked)."""
    limits = {"image": options.max_images, "video": options.max_videos, "audio": options.max_audios}
    kwargs: dict[str, Any] = dict(
        model=options.model,
        # vLLM's own metrics and outputs name the model by its one name (not its cache path).
        **({"served_model_name": options.name} if options.name else {}),
        dtype=dtype,
        max_model_len=options.max_model_len,
        limit_mm_per_prompt=limits,
        enforce_eager=options.enforce_eager,
        disable_log_stats=True,
        seed=options.seed,
    )
    # vLLM keeps processed frames for reuse (4 GiB by default): bounded
    # here, since live video makes every frame new and the cache only grows.
    kwargs["mm_processor_cache_gb"] = options.mm_cache_gb
    # No "Loading safetensors checkpoint shards" progress bar on the console:
    # the model loads in seconds and "engine ready" says when it has.
    kwargs["use_tqdm_on_load"] = False
    # The engine core gives its free native memory back now and then (vidchat.engine.local).
    kwargs["worker_extension_cls"] = WORKER_EXTENSION
    # Warm-ups (vidchat.conversation.warmup) run at a lower priority than answers, so
    # a question never waits behind a queued warm-up. Only when warm-ups
    # are on from the start: otherwise vLLM schedules first come, first
    # served, exactly as before warm-ups existed.
    if options.priority_scheduling:
        kwargs["scheduling_policy"] = "priority"
    if processor_kwargs:
        kwargs["mm_processor_kwargs"] = processor_kwargs
    if options.encoder_cache_frames > 0:
        if per_frame:
            budget = encoder_cache_budget(per_frame, options.encoder_cache_frames, gpu)
            if budget is not None:
                kwargs["max_num_batched_tokens"] = budget
    if gpu:
        kwargs["gpu_memory_utilization"] = options.gpu_memory_utilization
    if options.video_pruning_rate > 0:
        kwargs["video_pruning_rate"] = options.video_pruning_rate
    if options.tensor_parallel_size > 1:
        kwargs["tensor_parallel_size"] = options.tensor_parallel_size
    if options.data_parallel_size > 1:
        kwargs["data_parallel_size"] = options.data_parallel_size
    else:
        # Unset, vLLM on CPU reserves most of the RAM and starts slowly.
        kwargs["kv_cache_memory_bytes"] = int(options.kv_cache_gb * (1 << 30))
        kwargs["distributed_executor_backend"] = "uni"
    return kwargs


def load_processor(options: EngineOptions, family: Family) -> tuple[Any, dict[str, Any], int | None]:
    """The model's processor, the kwargs vLLM's processor gets, and its tokens per frame (None: not measurable)."""
    from transformers import AutoProcessor

    processor_kwargs = family.processor_kwargs(options.max_image_pixels)
    if options.max_image_pixels and family.pixel_cap is None:
        log.info("%s: the per-frame pixel cap is not passed to this model family's processor "
                 "(frames are still stored at no more than %d pixels)", family.name, options.max_image_pixels)
    try:
        processor = AutoProcessor.from_pretrained(options.model)
    except ImportError as exc:  # e.g. SmolVLM's processor needs num2words
        raise EngineError(f"the processor of {options.model!r} needs a package that is missing: {exc}") from exc
    # Measured always: the history budget (fit_history) reserves each
    # frame's tokens; the encoder cache is sized by it when asked.
    per_frame = None
    try:
        per_frame = tokens_per_frame(processor, options.max_image_pixels, processor_kwargs)
    except Exception as exc:  # a processor with other call conventions: vLLM's size stays
        log.warning("could not measure tokens per frame for %s (%s); vLLM's encoder cache keeps "
                    "its default size", options.model, exc)
    return processor, processor_kwargs, per_frame


def stat_loggers(options: EngineOptions) -> list[Any] | None:
    """vLLM's stat loggers: its Prometheus one alone where asked (its vllm:
    families for /metrics; vLLM's default logger would print a stats line
    every few seconds), none otherwise."""
    if not options.prometheus_stats:
        return None
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    return [PrometheusStatLogger]


def encoder_cache_budget(per_frame: int, frames: int, gpu: bool) -> int | None:
    """vLLM's ``max_num_batched_tokens`` that makes its encoder cache hold
    ``frames`` frames of ``per_frame`` tokens; None where its default does."""
    floor = ENCODER_CACHE_FLOOR_TOKENS["gpu" if gpu else "cpu"]
    need = per_frame * frames
    if need <= floor:
        return None
    if need > ENCODER_CACHE_MAX_TOKENS:
        log.warning("vLLM's encoder cache would need %d tokens for %d frames of %d tokens; capped at %d "
                    "(%d frames): lower --max-sessions or frames per question to keep every session's "
                    "frames encoded", need, frames, per_frame, ENCODER_CACHE_MAX_TOKENS,
                    ENCODER_CACHE_MAX_TOKENS // per_frame)
        return ENCODER_CACHE_MAX_TOKENS
    return need


# A question's media as the in-process vLLM `AsyncLLM` takes them: which
# kinds vLLM accepts for the model, and the prompt a question becomes (its
# text, frames or video, audio clips, and the names their encodings are
# cached under within the session's salt). Frames go as arrays/PIL images,
# never through base64 or JSON.

def accepted_media(llm: Any, processor: Any) -> tuple[bool, bool]:
    """(audio, video): whether vLLM itself accepts each for this model
    within our limits, or, where that can't be read, whether the processor
    has the part for it."""
    # Not the processor first: it may have a video processor that vLLM
    # never calls (SmolVLM).
    limits = allowed_mm_limits(llm)
    if limits is None:
        audio = getattr(processor, "feature_extractor", None) is not None
        video = getattr(processor, "video_processor", None) is not None
        return audio, video
    return limits.get("audio", 0) > 0, limits.get("video", 0) > 0


def allowed_mm_limits(llm: Any) -> dict[str, int] | None:
    """Items per prompt vLLM allows for each modality of this model (its own
    support within limit_mm_per_prompt), or None when it can't be read."""
    try:
        from vllm.multimodal import MULTIMODAL_REGISTRY

        return dict(MULTIMODAL_REGISTRY.get_processing_info(llm.model_config).allowed_mm_limits)
    except Exception:
        log.debug("could not read vLLM's multimodal limits", exc_info=True)
        return None


def vllm_prompt(family: Family, prompt_text: str, frames: Sequence[np.ndarray | Image.Image], frames_as: str,
                clips: Sequence[tuple[np.ndarray, str | None]], fps: float | None, cache_salt: str | None,
                frame_ids: Sequence[str] | None) -> dict[str, Any]:
    """The prompt as vLLM takes it: text, media, the media's cache names and the salt."""
    prompt: dict[str, Any] = {"prompt": prompt_text}
    if cache_salt:
        # vLLM mixes the salt into the first block's hash: prefix-cache
        # hits then only happen between requests with the same salt.
        prompt["cache_salt"] = cache_salt
    mm = multi_modal_data(family, frames, frames_as, [clip for clip, _ in clips], fps)
    if mm:
        prompt["multi_modal_data"] = mm
    uuids = media_uuids(cache_salt, len(frames), frame_ids, frames_as, clips)
    if uuids:
        prompt["multi_modal_uuids"] = uuids
    if fps is not None and family.fps_kwarg:
        prompt["mm_processor_kwargs"] = {"fps": fps}
    return prompt


def multi_modal_data(family: Family, frames: Sequence[np.ndarray | Image.Image], frames_as: str,
                     clips: Sequence[np.ndarray], fps: float | None) -> dict[str, Any]:
    """The frames (as images, or one video in the family's form) and the audio clips, as vLLM takes them."""
    mm: dict[str, Any] = {}
    if frames:
        if frames_as == "video":
            mm["video"] = family.video_item(as_video(frames), fps)
        else:
            mm["image"] = [to_pil(f) for f in frames]
    if clips:
        mm["audio"] = [(clip, AUDIO_RATE) for clip in clips]
    return mm


def media_uuids(cache_salt: str | None, n_frames: int, frame_ids: Sequence[str] | None, frames_as: str,
                clips: Sequence[tuple[Any, str | None]]) -> dict[str, list[str]]:
    """The names vLLM caches each frame's (or the video's) and each audio
    clip's encoding under, within the session's salt; none without a salt or names."""
    uuids: dict[str, list[str]] = {}
    if cache_salt and n_frames and frame_ids is not None and len(frame_ids) == n_frames:
        if frames_as == "video":
            uuids["video"] = [f"{cache_salt}/video/{','.join(map(str, frame_ids))}"]
        else:
            uuids["image"] = [f"{cache_salt}/{fid}" for fid in frame_ids]
    if cache_salt and clips and all(name is not None for _, name in clips):
        uuids["audio"] = [f"{cache_salt}/audio/{name}" for _, name in clips]
    return uuids


# What vLLM's failures mean, in the words a user reads: an exception
# reworded as what to change, and a dead engine's cause (its process's exit).

def core_exit_codes(llm: Any) -> list[int | None] | None:
    """How vLLM's EngineCore processes ended (0: by themselves; -9: killed
    after vLLM's grace), or None when this vLLM does not say."""
    try:
        return [proc.exitcode for proc in llm.engine_core.resources.engine_manager.processes]
    except AttributeError:
        return None


def death_cause(codes: list[int | None] | None) -> str:
    """Why an engine whose EngineCore processes ended so died, in words."""
    for code in codes or ():
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"its process was killed ({name})"
        if code:
            return f"its process exited with code {code}"
    return "its process stopped"


def reworded_error(exc: BaseException, request_id: str, max_model_len: int, dead: Callable[[], bool],
                   why_dead: Callable[[], str | None] = lambda: None) -> EngineError:
    """vLLM's exception as the error a user reads: what to change, where
    something can be changed. ``dead()``: whether the engine has died;
    ``why_dead()``: why, in words."""
    from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

    cause = exc.__cause__ if isinstance(exc, EngineGenerateError) and exc.__cause__ else exc
    text = str(cause)
    if isinstance(exc, EngineDeadError) or dead():
        return EngineDead(engine_dead_message(why_dead()))
    if "longer than the maximum model length" in text or "maximum context length" in text:
        return EngineError(
            f"The question with its frames and chat history is too long for the model "
            f"(limit {max_model_len} tokens): send fewer frames, clear the "
            f"chat, or restart with a larger --max-model-len. ({text.splitlines()[0]})"
        )
    if "may be provided in one prompt" in text:
        return EngineError(f"{text.splitlines()[0]} Lower 'frames per question' or raise --max-images.")
    log.exception("request %s failed", request_id, exc_info=exc)
    return EngineError(f"The model failed to answer: {text.splitlines()[0] if text else type(cause).__name__}")


class LocalReply:
    """One streamed answer. Iterate for text deltas; `stats` is final after the
    stream ends. Leaving the stream early (break, `aclose`, or the
    task being cancelled) aborts the request inside vLLM."""

    def __init__(self, engine: "LocalEngine", request_id: str, prompt: dict[str, Any], params: SamplingParams,
                 stats: ReplyStats, priority: int = 0) -> None:
        self.engine = engine
        # Where vLLM schedules first come, first served, a priority is refused: none is sent.
        self._priority = priority if engine is not None and engine.options.priority_scheduling else 0
        self.request_id = request_id
        self.stats = stats
        self.text = ""
        self._prompt = prompt
        self._params = params
        self._gen: AsyncGenerator[RequestOutput, None] | None = None
        self._done = False
        self._busy = False
        self._abort_requested = False
        self._idle = asyncio.Event()  # set while no task is inside __anext__
        self._idle.set()
        self._started = time.perf_counter()

    def __aiter__(self) -> "LocalReply":
        return self

    async def __anext__(self) -> str:
        if self._done:
            raise StopAsyncIteration
        if self._gen is None:
            self._gen = self.engine._llm.generate(self._prompt, self._params, self.request_id,
                                                  priority=self._priority)
        self._busy = True
        self._idle.clear()
        try:
            while True:
                out = await self._gen.__anext__()
                if self._abort_requested:
                    # An abort sent while vLLM was still registering the
                    # request (its input processing runs in a thread) finds
                    # nothing to abort: repeat it now that the request exists.
                    await self.engine._llm.abort(self.request_id)
                    self.stats.cancelled = True
                    raise StopAsyncIteration
                completion = out.outputs[0]
                delta = completion.text[len(self.text) :]
                if out.prompt_token_ids is not None:
                    self.stats.prompt_tokens = len(out.prompt_token_ids)
                if out.num_cached_tokens:
                    self.stats.cached_tokens = out.num_cached_tokens
                if self.stats.prefill_s is None:
                    self.stats.prefill_s = _prefill_s(out)
                self.stats.completion_tokens = len(completion.token_ids)
                if out.finished:
                    self.stats.finish_reason = completion.finish_reason
                    if completion.finish_reason == "abort":
                        self.stats.cancelled = True
                if delta:
                    if self.stats.ttft_s is None:
                        self.stats.ttft_s = time.perf_counter() - self._started
                    self.text = completion.text
                    return str(delta)
                if out.finished:
                    raise StopAsyncIteration
        except StopAsyncIteration:
            self._finish()
            raise
        except (asyncio.CancelledError, GeneratorExit):
            self.stats.cancelled = True
            self._finish()
            raise
        except Exception as exc:
            self._finish()
            raise self.engine._translate(exc, self.request_id) from exc
        finally:
            self._busy = False
            self._idle.set()

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        self.stats.ended(self._started)

    async def aclose(self) -> None:
        """Stop the answer and abort its vLLM request. Safe from any task: when
        another task is iterating, the abort ends its stream (no more deltas)."""
        self._abort_requested = True
        if not self._done:
            self.stats.cancelled = True
        await self.engine._llm.abort(self.request_id)  # no-op if already finished
        if self._busy:
            # Wait until the iterating task has seen the end, so a caller that
            # starts a new request next never has two generating at once.
            try:
                await asyncio.wait_for(self._idle.wait(), 10.0)
            except asyncio.TimeoutError:
                log.warning("request %s: still streaming 10 s after its abort", self.request_id)
        else:
            self._finish()
            if self._gen is not None:
                gen, self._gen = self._gen, None
                await gen.aclose()


class LocalEngine(ModelEngine):
    """The model in this process: one vLLM `AsyncLLM`. Create once per
    process with `LocalEngine.start`."""

    def __init__(self, options: EngineOptions, llm: Any, processor: Any, model_path: str, start_s: float,
                 family: Family | None = None, revision: str = ""):
        audio, video = accepted_media(llm, processor)
        super().__init__(options, processor, model_path, start_s, family, revision, audio, video)
        self._llm = llm
        self._warming: set[str] = set()  # request ids of warm-ups in flight
        self.closed = False  # shut down on purpose (shutdown)
        self.core_exit_codes: list[int | None] | None = None  # set by shutdown

    @property
    def encoder_cache_tokens(self) -> int | None:
        """The size of vLLM's encoder cache, in tokens (None if not known)."""
        config = getattr(self._llm, "vllm_config", None)
        size = getattr(getattr(config, "scheduler_config", None), "encoder_cache_size", None)
        return size if isinstance(size, int) else None

    # ---- lifecycle ---------------------------------------------------
    @classmethod
    def start(cls, options: EngineOptions) -> "LocalEngine":
        """Load the model and start vLLM (blocking; seconds on the tiny model)."""
        # One engine-core child process, with the model worker inside it: the
        # fastest start, and nothing more to clean up at exit.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        bound_onednn_cache()  # before vLLM spawns its engine core
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        install()
        t0 = time.perf_counter()
        gpu = on_gpu()
        dtype = dtype_for(options.dtype, gpu)
        family = family_of(model_type_of(options.model))
        processor, processor_kwargs, per_frame = load_processor(options, family)
        kwargs = vllm_engine_kwargs(options, dtype, gpu, processor_kwargs, per_frame)
        try:
            llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs), stat_loggers=stat_loggers(options))
        except Exception as exc:
            raise EngineError(f"vLLM could not start model {options.model!r}: {exc}") from exc
        revision = model_revision(options.model)
        start_s = time.perf_counter() - t0
        log.info("%s model %s loaded on %s in %.1f s", options.role, options.name or model_name(options.model),
                 "GPU" if gpu else "CPU", start_s)
        log.debug("engine ready: %s (%s)", options.model, revision)
        note_engine_start(options.model, start_s)
        engine = cls(options, llm, processor, options.model, start_s, family, revision)
        engine.tokens_per_frame = per_frame
        if per_frame and options.encoder_cache_frames > 0 and engine.encoder_cache_tokens:
            log.debug("vLLM's encoder cache: %d tokens, %d frames of %d tokens (asked for %d frames)",
                     engine.encoder_cache_tokens, engine.encoder_cache_tokens // per_frame, per_frame,
                     options.encoder_cache_frames)
        return engine

    def shutdown(self) -> None:
        self.closed = True  # on purpose: not a death for vidchat.app.engine_keeper to heal
        llm, self._llm = self._llm, None
        if llm is not None:
            llm.shutdown()
            self.core_exit_codes = core_exit_codes(llm)
            # AsyncLLM.__del__ calls shutdown() again, which fails noisily when
            # it runs during interpreter teardown; once is enough.
            llm.shutdown = lambda *args, **kwargs: None
            log.info("engine shut down")

    async def trim_heap(self) -> list[dict[str, Any]]:
        """Give the engine core's whole free malloc pages back to the system
        (vidchat.engine.local); one ``{"pid", "trimmed"}`` per worker."""
        llm = self._llm
        if llm is None:
            return []
        return list(await llm.collective_rpc("vidchat_trim_heap", timeout=30))

    # ---- state ---------------------------------------------------------
    @property
    def running_requests(self) -> int:
        """Answers vLLM still holds (0 after every answer ends or is
        aborted); warm-ups are counted apart, in :attr:`running_warmups`."""
        unfinished: int = self._llm.get_num_unfinished_requests()
        return max(0, unfinished - len(self._warming))

    @property
    def is_dead(self) -> bool:
        return self._llm is None or bool(self._llm.errored)

    def death_cause(self) -> str | None:
        """Why the engine died, in words (None while it runs)."""
        if not self.is_dead:
            return None
        if self._llm is None:
            return death_cause(self.core_exit_codes) if not self.closed else "it was shut down"
        return death_cause(core_exit_codes(self._llm))

    # ---- questions -------------------------------------------------------
    def prepare(
        self,
        question: str,
        frames: Sequence[np.ndarray | Image.Image] = (),
        audio: np.ndarray | None = None,
        *,
        frame_times: Sequence[float] | None = None,
        history: Sequence[Turn] = (),
        system_prompt: str | None = None,
        frames_as: str = "images",
        max_tokens: int = 256,
        temperature: float = 0.7,
        seed: int | None = None,
        ignore_eos: bool = False,
        cache_salt: str | None = None,
        frame_ids: Sequence[str] | None = None,
        warmup: bool = False,
        spoken: bool = False,
        audio_parts: Sequence[tuple[int, str | None]] = (),
    ) -> Prepared:
        """Render the prompt and build the media for one question (CPU work:
        run it off the event loop). Raises EngineError for input the engine
        would refuse, so the caller can tell the user before anything streams.
        ``warmup``: the same prompt without the question (the prefix a
        question will share), for :meth:`warm`; `question` is ignored.
        ``frame_ids``: each frame's name, unique within ``cache_salt`` and
        never reused for other pixels (a session's kept-frame numbers): vLLM
        caches each frame's encoding under salt and name, not a hash of its
        pixels (no hashing, and no encoding shared between sessions: no timing
        side channel). ``spoken``: the audio is the question (Talk mode; a
        model that takes no audio refuses it). ``audio_parts``: the audio's
        segments, (samples, name) each (Sample.audio_parts): with
        --audio-segments each goes as its own clip, up to ``--max-audios``,
        so a finished segment is encoded and prefilled once."""
        question, max_tokens, temperature, seed, audio = self._checked_inputs(
            question, len(frames), audio, frames_as, max_tokens, temperature, seed, warmup, spoken)
        clips = [] if audio is None else audio_clips(audio, audio_parts if self.splits_audio else (),
                                                     self.options.max_audios)
        total_turns = len(history)
        history = self.fit_history(history, question, len(frames), frames_as, len(clips),
                                   0.0 if audio is None else audio.size / AUDIO_RATE, max_tokens, system_prompt)
        prompt_text = self.build_prompt(
            question,
            n_frames=len(frames),
            frames_as=frames_as,
            with_audio=len(clips),
            history=history,
            system_prompt=system_prompt,
        )
        fps = video_fps(frame_times, len(frames)) if frames_as == "video" else None
        prompt = vllm_prompt(self.family, prompt_text, frames, frames_as, clips, fps, cache_salt, frame_ids)
        from vllm import SamplingParams

        # ignore_eos: benchmarks and tests need replies of a known length.
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed, ignore_eos=ignore_eos)
        return Prepared(prompt, prompt_text, params, _stats(frames, audio, clips, len(history), total_turns),
                        video_fps=fps)

    async def warm(self, prepared: Prepared) -> ReplyStats:
        """Run a warm-up (a prepared ``warmup=True`` prompt): vLLM encodes its
        frames and fills the prefix cache, generating one token, behind every
        real question (lower scheduling priority). Cancelling aborts it."""
        if self.is_dead:
            raise EngineDead(engine_dead_message(self.death_cause()))
        rid = f"vidchat-warm-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        stats = prepared.stats
        started = time.perf_counter()
        self._warming.add(rid)
        try:
            priority = WARMUP_PRIORITY if self.options.priority_scheduling else 0
            async for out in self._llm.generate(prepared.prompt, prepared.params, rid, priority=priority):
                if out.prompt_token_ids is not None:
                    stats.prompt_tokens = len(out.prompt_token_ids)
                stats.cached_tokens = out.num_cached_tokens or 0
                if out.finished:
                    stats.finish_reason = out.outputs[0].finish_reason
        except (asyncio.CancelledError, GeneratorExit):
            stats.cancelled = True
            await self._llm.abort(rid)
            raise
        except Exception as exc:
            raise self._translate(exc, rid) from exc
        finally:
            self._warming.discard(rid)
            stats.total_s = time.perf_counter() - started
        return stats

    @property
    def running_warmups(self) -> int:
        return len(self._warming)

    def submit(self, prepared: Prepared, request_id: str | None = None) -> LocalReply:
        """A reply (vidchat.engine.Reply) for a prepared question; vLLM starts on its first iteration."""
        if self.is_dead:
            raise EngineDead(engine_dead_message(self.death_cause()))
        rid = request_id or f"vidchat-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        return LocalReply(self, rid, prepared.prompt, prepared.params, prepared.stats, prepared.priority)

    def _translate(self, exc: BaseException, request_id: str) -> EngineError:
        """vLLM's exceptions, reworded so a user knows what to change."""
        return reworded_error(exc, request_id, self.options.max_model_len, lambda: self.is_dead,
                              self.death_cause)


def _stats(frames: Sequence[Any], audio: np.ndarray | None, clips: Sequence[tuple[np.ndarray, str | None]],
           history_turns: int, history_turns_total: int) -> ReplyStats:
    """What a prepared question carries before it streams: its inputs' counts and digest."""
    return ReplyStats(frames=len(frames), audio_seconds=0.0 if audio is None else audio.size / AUDIO_RATE,
                      inputs_sha256=inputs_digest(frames, audio),
                      audio_parts=[clip.size for clip, _ in clips] if len(clips) > 1 else [],
                      history_turns=history_turns, history_turns_total=history_turns_total)


def _prefill_s(out: RequestOutput) -> float | None:
    """Scheduled -> first token on the engine core's clock (vLLM keeps it
    where its stat loggers run: the server's main engine)."""
    metrics = getattr(out, "metrics", None)
    first, scheduled = getattr(metrics, "first_token_ts", 0.0), getattr(metrics, "scheduled_ts", 0.0)
    if not first or not scheduled or first < scheduled:
        return None
    return first - scheduled


# The EngineCore process exits as soon as vLLM has torn it down.
#
# vLLM runs each engine's core in a spawned process. When it is told to stop
# it tears its resources down in about a second, then the interpreter's exit
# runs a final cyclic garbage collection over everything vLLM unfroze (torch,
# the model, the caches): on this project's 2-core machines that scan outlasts
# vLLM's 5-second grace, so every shutdown waited 5 s and ended in a SIGKILL
# and a "force killing" warning. vLLM already freezes the heap before exit on
# ROCm for this reason; :func:`install` does the same on every platform, by
# starting the core through :func:`run_engine_core`, which calls vLLM's own
# and freezes what survives it.

# Captured at import, in the parent and in each spawned child alike; only the
# parent installs the wrapper, so this is always vLLM's own entry point.
_VLLM_RUN_ENGINE_CORE = EngineCoreProc.__dict__["run_engine_core"].__func__


def run_engine_core(*args: Any, **kwargs: Any) -> None:
    """vLLM's EngineCore entry point; what survives it is frozen, so the exit skips the final scan."""
    try:
        _VLLM_RUN_ENGINE_CORE(*args, **kwargs)
    finally:
        gc.freeze()


def install() -> None:
    """Start every later EngineCore of this process through :func:`run_engine_core` (idempotent)."""
    EngineCoreProc.run_engine_core = staticmethod(run_engine_core)
