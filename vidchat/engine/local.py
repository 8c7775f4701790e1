"""The in-process engine: one vLLM `AsyncLLM`, questions in, text deltas out.
Frames reach vLLM as arrays/PIL images, never through base64 or JSON; the
prompt a question becomes is built in :mod:`vidchat.engine.vllm_media`."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from typing import Any, AsyncIterator, Sequence

import numpy as np
from PIL import Image

from vidchat.engine import ModelEngine, native_memory
from vidchat.engine.errors import EngineDead, EngineError, engine_dead_message
from vidchat.engine.families import Family, family_of, model_type_of
from vidchat.engine.hardware import on_gpu
from vidchat.engine.interface import WARMUP_PRIORITY
from vidchat.engine.payload import audio_clips, inputs_digest, video_fps
from vidchat.engine.records import EngineOptions, Prepared, ReplyStats, Turn
from vidchat.engine.revision import model_revision
from vidchat.engine.start_log import note_engine_start
from vidchat.engine.vllm_args import dtype_for, load_processor, stat_loggers, vllm_engine_kwargs
from vidchat.engine.vllm_errors import core_exit_codes, death_cause, reworded_error
from vidchat.engine.vllm_media import accepted_media, vllm_prompt
from vidchat.media import AUDIO_RATE

log = logging.getLogger(__name__)


class LocalReply:
    """One streamed answer. Iterate for text deltas; `stats` is final after the
    stream ends. Leaving the stream early (break, `aclose`, or the
    task being cancelled) aborts the request inside vLLM."""

    def __init__(self, engine: "LocalEngine", request_id: str, prompt: dict, params: Any, stats: ReplyStats):
        self.engine = engine
        self.request_id = request_id
        self.stats = stats
        self.text = ""
        self._prompt = prompt
        self._params = params
        self._gen: AsyncIterator | None = None
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
            self._gen = self.engine._llm.generate(self._prompt, self._params, self.request_id)
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
                    return delta
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
        native_memory.bound_onednn_cache()  # before vLLM spawns its engine core
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from vidchat.engine import core_exit

        core_exit.install()
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
        log.info("model loaded on %s in %.1f s", "GPU" if gpu else "CPU", start_s)
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
        (vidchat.engine.native_memory); one ``{"pid", "trimmed"}`` per worker."""
        llm = self._llm
        if llm is None:
            return []
        return list(await llm.collective_rpc("vidchat_trim_heap", timeout=30))

    # ---- state ---------------------------------------------------------
    @property
    def running_requests(self) -> int:
        """Answers vLLM still holds (0 after every answer ends or is
        aborted); warm-ups are counted apart, in :attr:`running_warmups`."""
        return max(0, self._llm.get_num_unfinished_requests() - len(self._warming))

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
        return LocalReply(self, rid, prepared.prompt, prepared.params, prepared.stats)

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


def _prefill_s(out: Any) -> float | None:
    """Scheduled -> first token on the engine core's clock (vLLM keeps it
    where its stat loggers run: the server's main engine)."""
    metrics = getattr(out, "metrics", None)
    first, scheduled = getattr(metrics, "first_token_ts", 0.0), getattr(metrics, "scheduled_ts", 0.0)
    if not first or not scheduled or first < scheduled:
        return None
    return first - scheduled
