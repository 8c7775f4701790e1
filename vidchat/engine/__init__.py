"""The engine package's public face, and what every engine shares
(:class:`ModelEngine`: the model's prompt, limits, history budget and input
checks).

The interface itself (:class:`ChatEngine`, :class:`Reply`) is
:mod:`vidchat.engine.interface`; the records that cross it (options, turns,
prepared questions, reply stats) :mod:`vidchat.engine.interface`; its errors
:mod:`vidchat.engine.interface`. Two engines implement it, neither a kind of
the other: the in-process vLLM `AsyncLLM` (:mod:`vidchat.engine.local`) and
a remote ``vllm serve`` (:mod:`vidchat.engine.remote`). Doors and the
conversation code import only this package's names, never an implementation.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image

# The interface's names are this package's too ("X as X": re-exported, for
# mypy's strict no-implicit-reexport); so are the prompt helpers that doors
# and the conversation use.
from vidchat.engine.interface import ENGINE_DEAD_MESSAGE as ENGINE_DEAD_MESSAGE
from vidchat.engine.interface import NO_SPOKEN_QUESTIONS as NO_SPOKEN_QUESTIONS
from vidchat.engine.interface import SEED_RANGE as SEED_RANGE
from vidchat.engine.interface import WARMUP_PRIORITY as WARMUP_PRIORITY
from vidchat.engine.interface import ChatEngine as ChatEngine
from vidchat.engine.interface import EngineDead as EngineDead
from vidchat.engine.interface import EngineError as EngineError
from vidchat.engine.interface import EngineOptions as EngineOptions
from vidchat.engine.interface import Prepared as Prepared
from vidchat.engine.interface import Reply as Reply
from vidchat.engine.interface import ReplyStats as ReplyStats
from vidchat.engine.interface import Turn as Turn
from vidchat.engine.interface import engine_dead_message as engine_dead_message
from vidchat.engine.prompts import (
    Family,
    chat_template_kwargs,
    cut_step,
    family_of,
    history_start,
)
from vidchat.engine.prompts import audio_clips as audio_clips
from vidchat.engine.prompts import inputs_digest as inputs_digest
from vidchat.engine.prompts import tokens_per_frame as tokens_per_frame
from vidchat.engine.prompts import video_fps as video_fps
from vidchat.media import AUDIO_RATE, FRAMES_AS, MIN_AUDIO_SAMPLES

log = logging.getLogger(__name__)


# What the machine can do for the model: a GPU, or a CPU that computes
# bfloat16 natively (vidchat.engine.local picks the dtype from it).

def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes bfloat16 natively (x86 avx512_bf16 or
    amx_bf16, Arm's bf16 feature). Unknown platforms count as yes, so vLLM's
    own choice stands there."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return True
    flags = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    if not flags:
        return True
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def on_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # a CPU-only torch may not even have the CUDA module
        return False


# The record of every vLLM engine a run starts, kept for the test suite:
# it counts them in its own process and in the servers, replays and
# benchmarks it launches (vidchat.devtools.tiers).

# Each start appends a line to this file when the variable names one.
ENGINE_START_LOG_ENV = "VIDCHAT_ENGINE_START_LOG"


def note_engine_start(model: str, start_s: float) -> None:
    """Append this start (process, seconds it took, model) to the file
    ``ENGINE_START_LOG_ENV`` names, if it names one."""
    path = os.environ.get(ENGINE_START_LOG_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {start_s:.1f} {model}\n")


# The history budget (Engine.fit_history): audio encoders of the supported
# families give at most 25 tokens a second; a turn's chat-template markup
# costs a few tokens beyond its text; a small margin absorbs the rest.
AUDIO_TOKENS_PER_S = 25

TURN_TEMPLATE_TOKENS = 8

HISTORY_MARGIN_TOKENS = 32

# Inside the chat template a turn tokenizes at most this much longer than
# counted alone plus its markup allowance (about half a token on the tiny
# model's small vocabulary). While the kept turns leave this much room each,
# they fit for certain and the rendered prompt is not checked: rendering and
# tokenizing a long chat costs tens of milliseconds a question.
TURN_SLACK_TOKENS = 4

TURN_TOKENS_REMEMBERED = 2048  # turns' token counts kept (all sessions' chats together)


class ModelEngine:
    """What every engine shares: the model's chat template, its limits, the
    history budget and the checks made before a question is built. An
    implementation adds how questions reach vLLM (prepare, submit, warm) and
    its lifecycle; ``accepts_audio``/``accepts_video`` are what it found the
    model takes."""

    def __init__(self, options: EngineOptions, processor: Any, model_path: str, start_s: float,
                 family: Family | None, revision: str, accepts_audio: bool, accepts_video: bool) -> None:
        self.options = options
        self.model_path = model_path
        self.model_revision = revision  # vidchat.engine.weights.model_revision: which exact weights
        self.start_s = start_s
        self.family = family or family_of(None)
        self._processor = processor
        self._ids = itertools.count(1)
        self.accepts_audio = accepts_audio
        self.accepts_video = accepts_video and self.family.video is not None
        # The engine-wide processor settings (pixel cap, tiling), for anyone
        # who must reproduce vLLM's preprocessing (tests, token budgets).
        self.processor_kwargs = self.family.processor_kwargs(options.max_image_pixels)
        self.tokens_per_frame: int | None = None  # measured at start when the encoder cache is sized
        # A turn's token count, by its text: a long chat's turns are counted
        # for every question, and never change (fit_history).
        self._turn_tokens: dict[bytes, int] = {}  # by the turn's hash: the texts themselves are not kept

    @property
    def splits_audio(self) -> bool:
        """Whether a question's audio goes as its segments (--audio-segments)."""
        return self.accepts_audio and self.options.split_audio and self.options.max_audios > 1

    def build_prompt(
        self,
        question: str,
        *,
        n_frames: int = 0,
        frames_as: str = "images",
        with_audio: bool | int = False,
        history: Sequence[Turn] = (),
        system_prompt: str | None = None,
    ) -> str:
        """The prompt text from the model's own chat template. ``with_audio``:
        whether (or, as a number, how many clips of) audio follows the frames."""
        # Frames, then audio, then the question: what changes least between
        # two questions of a session comes first, so a later question (or a
        # warm-up, vidchat.conversation.warmup) shares the longest prefix with this one.
        # The audio window grows with every chunk received: placed before the
        # frames, it would make every frame token new each time.
        parts: list[dict[str, Any]] = []
        if n_frames:
            if frames_as == "video":
                parts.append({"type": "video"})
            else:
                parts.extend({"type": "image"} for _ in range(n_frames))
        parts.extend({"type": "audio"} for _ in range(int(with_audio)))
        if question:
            parts.append({"type": "text", "text": question})
        messages: list[dict[str, Any]] = []
        if system_prompt:
            messages.append({"role": "system", "content": [{"type": "text", "text": system_prompt}]})
        for turn in history:
            messages.append({"role": turn.role, "content": [{"type": "text", "text": turn.text}]})
        messages.append({"role": "user", "content": parts})
        prompt: str = self._processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                          **chat_template_kwargs(self.processor_kwargs))
        return prompt

    def check_request(self, n_frames: int, frames_as: str) -> None:
        """Raise EngineError for a frame count or form this engine would refuse."""
        if frames_as not in FRAMES_AS:
            raise EngineError(f"frames_as must be one of {', '.join(FRAMES_AS)}, not {frames_as!r}.")
        if frames_as == "video" and n_frames and (not self.accepts_video or self.options.max_videos < 1):
            raise EngineError("This model does not take video; send frames as images.")
        # A video's frames are counted against the same cap as images: each
        # one is encoded, and the cap is what --max-images promises to hold.
        if n_frames > self.options.max_images:
            form = "images" if frames_as == "images" else "video frames"
            raise EngineError(
                f"This question carries {n_frames} frames but the engine takes at most "
                f"{self.options.max_images} {form} per prompt: lower 'frames per question' "
                f"or restart with --max-images {n_frames}."
            )

    def fit_history(self, history: Sequence[Turn], question: str, n_frames: int, frames_as: str, clips: int,
                    audio_s: float, max_tokens: int, system_prompt: str | None) -> Sequence[Turn]:
        """The newest whole turns of ``history`` that fit --max-model-len
        beside what this question needs first: its frames, audio, the
        question and room for the answer. The oldest question-and-answer
        pairs go first, so a long chat (watch mode adds an answer every few
        seconds) never makes every later question fail for length; they go a
        step at a time, so that what is kept stays cached (vidchat.engine.prompts)."""
        tokenizer = getattr(self._processor, "tokenizer", None)
        if not history or tokenizer is None:
            return history
        base = self.build_prompt(question, n_frames=n_frames, frames_as=frames_as, with_audio=clips,
                                 system_prompt=system_prompt)
        # Frame and audio placeholders expand inside vLLM: counted at their
        # expanded size (an upper bound for video, whose frames merge in time).
        expanded = (n_frames * (self.tokens_per_frame or 0) + math.ceil(audio_s * AUDIO_TOKENS_PER_S)
                    + max_tokens + HISTORY_MARGIN_TOKENS)
        budget = self.options.max_model_len - len(tokenizer(base)["input_ids"]) - expanded
        costs = [self._turn_cost(tokenizer, turn.text) for turn in history]
        is_question = [turn.role == "user" for turn in history]
        step = cut_step(self.options.max_model_len)
        start = history_start(costs, is_question, budget, step)
        # Each turn is counted alone; inside the chat template a turn can
        # tokenize a little longer (about a token in two on the tiny model's
        # small vocabulary), which a hundred turns add up to. The prompt
        # itself is the check: the budget shrinks by what it was over.
        for _ in range(3):
            kept = len(history) - start
            if kept == 0 or budget - sum(costs[start:]) >= TURN_SLACK_TOKENS * kept:
                break
            prompt = self.build_prompt(question, n_frames=n_frames, frames_as=frames_as, with_audio=clips,
                                       history=history[start:], system_prompt=system_prompt)
            over = len(tokenizer(prompt)["input_ids"]) + expanded - self.options.max_model_len
            if over <= 0:
                break
            budget -= over
            start = history_start(costs, is_question, budget, step)
        return history[start:]

    def count_tokens(self, text: str) -> int:
        """``text``'s tokens by the model's tokenizer (about four characters a token without one)."""
        tokenizer = getattr(self._processor, "tokenizer", None)
        if tokenizer is None:
            return (len(text) + 3) // 4
        return len(tokenizer(text)["input_ids"])

    def _turn_cost(self, tokenizer: Any, text: str) -> int:
        """A turn's tokens alone, and the allowance for its markup."""
        key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        tokens = self._turn_tokens.get(key)
        if tokens is None:
            if len(self._turn_tokens) >= TURN_TOKENS_REMEMBERED:
                self._turn_tokens.clear()
            tokens = self._turn_tokens[key] = len(tokenizer(text)["input_ids"])
        return tokens + TURN_TEMPLATE_TOKENS

    def ask(self, question: str, frames: Sequence[np.ndarray | Image.Image] = (),
            audio: np.ndarray | None = None, *, request_id: str | None = None, **options: Any) -> Reply:
        """prepare() and submit() in one call (benchmarks and tests; the app
        prepares off the event loop)."""
        return self.submit(self.prepare(question, frames, audio, **options), request_id)

    def _checked_inputs(self, question: str, n_frames: int, audio: np.ndarray | None, frames_as: str,
                        max_tokens: int, temperature: float, seed: int | None,
                        warmup: bool, spoken: bool = False) -> tuple[str, int, float, int | None, np.ndarray | None]:
        """The checks every engine makes before building a question (raising
        EngineError for what it would refuse), and the warm-up's settings:
        (question, max_tokens, temperature, seed, usable audio)."""
        if self.is_dead:
            raise EngineDead(engine_dead_message(self.death_cause()))
        usable = self._usable_audio(audio)
        if spoken and not self.accepts_audio:
            raise EngineError(NO_SPOKEN_QUESTIONS)
        if spoken and usable is None:
            raise EngineError("The spoken question is too short for the model's audio encoder "
                              f"(at least {MIN_AUDIO_SAMPLES / AUDIO_RATE * 1000:.0f} ms of audio).")
        if warmup:
            question, max_tokens, temperature, seed = "", 1, 0.0, None
        elif not spoken and not n_frames and (not question or not question.strip()):
            # Frames with no text are a question (the Realtime door's picture
            # alone, which the API answers); nothing at all is not.
            raise EngineError("The question is empty.")
        self.check_request(n_frames, frames_as)
        if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
            raise EngineError(f"seed must fit a signed 64-bit integer, got {seed}.")
        return question, max_tokens, temperature, seed, usable

    def _usable_audio(self, audio: np.ndarray | None) -> np.ndarray | None:
        if audio is None or audio.size == 0 or not self.accepts_audio:
            return None  # a vision-only model still gets its frames
        if audio.size < MIN_AUDIO_SAMPLES:
            # A sliver of audio (e.g. a chunk that arrived just before the
            # question) is too short for the audio encoder and fails the
            # whole request; the question is still worth answering from frames.
            log.debug("dropping %d audio samples: below the %d-sample minimum", audio.size, MIN_AUDIO_SAMPLES)
            return None
        return np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)

    @property
    def is_dead(self) -> bool:
        raise NotImplementedError

    def death_cause(self) -> str | None:
        """Why the engine died, in words, where it knows (None: it runs, or it cannot say)."""
        return None

    async def replica_health(self) -> list[dict[str, Any]] | None:
        """Each model server's health (--engine-url); None in-process."""
        return None

    def prepare(self, question: str, frames: Sequence[np.ndarray | Image.Image] = (),
                audio: np.ndarray | None = None, *, frame_times: Sequence[float] | None = None,
                history: Sequence[Turn] = (), system_prompt: str | None = None, frames_as: str = "images",
                max_tokens: int = 256, temperature: float = 0.7, seed: int | None = None,
                ignore_eos: bool = False, cache_salt: str | None = None,
                frame_ids: Sequence[str] | None = None, warmup: bool = False, spoken: bool = False,
                audio_parts: Sequence[tuple[int, str | None]] = ()) -> Prepared:
        """The question made ready for the engine (its keywords: each implementation's docstring)."""
        raise NotImplementedError

    def submit(self, prepared: Prepared, request_id: str | None = None) -> Reply:
        raise NotImplementedError
