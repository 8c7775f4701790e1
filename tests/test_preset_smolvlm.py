"""The SmolVLM2 presets on their true architecture, through real vLLM.

`vidchat.devtools.smolvlm_build` writes a random-weight SmolVLM2-256M-Video-Instruct
folder with the published configuration (depth cut to 2 text layers and 2
vision layers; widths, heads, vocabulary, special-token ids and processor
settings true: depth changes no shape and no token count, and the full
12-layer tower costs ~2 s a frame here, which the benchmarks' --true-size
measure).
The engine is started with the preset's own settings, exactly as
``app.py --model smolvlm2-256m`` would, so these tests prove that the preset
loads, streams a full 16-frame question, costs the expected tokens a frame,
and refuses what vLLM's SmolVLM cannot take (video, audio). Replies are
gibberish, so no test looks at words.

Only one setting is overridden: the KV cache (0.5 GiB instead of the
default 1 GiB), to leave the shared 24 GB test machine room; it changes
nothing that is checked here. The dtype stays "auto", as for the real
checkpoint: float32 on a CPU without native bfloat16 (this project's
machines; vidchat.engine.local), bfloat16 where the CPU has it.
"""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np
import pytest
from conftest import CACHE_DIR

from vidchat.app import models, server
from vidchat.app.settings import Settings
from vidchat.conversation import asking
from vidchat.conversation.answers import AnswerOptions
from vidchat.conversation.asking import OptionError
from vidchat.devtools import smolvlm_build
from vidchat.engine import EngineError
from vidchat.engine.local import LocalEngine
from vidchat.media.session import SessionSettings

PRESET = "smolvlm2-256m"
TOKENS_PER_FRAME = 67  # 64 <image> + <fake_token_around_image><global-img>…<fake_token_around_image>
QUESTION = "What is in this picture?"


def frames(n: int, seed: int = 0) -> list[np.ndarray]:
    """320×240 RGB uint8 frames, as vidchat stores them."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (240, 320, 3), dtype=np.uint8) for _ in range(n)]


def preset_settings(name: str = PRESET) -> Settings:
    return models.apply_preset(Settings(), models.preset_named(name))


@pytest.fixture(scope="module")
def smol_path():
    return smolvlm_build.ensure(CACHE_DIR, "256m")


@pytest.fixture(scope="module")
def smol_engine(smol_path):
    options = server.engine_options(preset_settings(), str(smol_path), tiny=False)
    options = dataclasses.replace(options, kv_cache_gb=0.5)
    engine = LocalEngine.start(options)
    yield engine
    engine.shutdown()


async def answer(engine: LocalEngine, n_frames: int, seed: int = 0):
    reply = engine.ask(QUESTION, frames(n_frames, seed), frames_as="images", max_tokens=4, ignore_eos=True,
                       temperature=0.0)
    async for _ in reply:
        pass
    return reply


def hf_prompt_tokens(engine: LocalEngine, n_frames: int) -> int:
    """The HF processor's token count for the prompt vidchat builds, with
    vidchat's engine-wide processor settings (tiling off)."""
    text = engine.build_prompt(QUESTION, n_frames=n_frames, frames_as="images")
    # Flat keyword arguments, as vLLM passes its mm_processor_kwargs.
    out = engine._processor(text=text, images=[frames(n_frames)], **engine.processor_kwargs,
                            return_tensors="np")
    return int(out["input_ids"].shape[1])


@pytest.mark.unit
def test_the_folder_has_the_true_architecture(smol_path):
    """The processor really loads (num2words present) and carries SmolVLM2's
    special tokens at their real ids; the config is the published one."""
    from transformers import AutoConfig, AutoProcessor

    processor = AutoProcessor.from_pretrained(smol_path)  # ImportError here without num2words
    assert type(processor).__name__ == "SmolVLMProcessor"
    assert type(processor.image_processor).__name__ == "SmolVLMImageProcessor"
    assert processor.image_seq_len == 64
    assert processor.image_processor.max_image_size == {"longest_edge": 512}
    tok = processor.tokenizer
    assert len(tok) == 49280
    ids = tok.convert_tokens_to_ids
    assert [ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    assert ids("<global-img>") == 49152 and ids("<row_1_col_1>") == 49153 and ids("<row_6_col_6>") == 49188
    assert ids("<fake_token_around_image>") == 49189 and ids("<image>") == 49190
    assert ids("<end_of_utterance>") == 49279 == tok.eos_token_id
    rendered = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}],
        tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>User:<image>Hi<end_of_utterance>\nAssistant:"

    config = AutoConfig.from_pretrained(smol_path)
    assert config.model_type == "smolvlm" and config.scale_factor == 4 and config.image_token_id == 49190
    text, vision = config.text_config, config.vision_config
    assert (text.hidden_size, text.intermediate_size, text.num_attention_heads, text.num_key_value_heads,
            text.vocab_size) == (576, 1536, 9, 3, 49280)
    assert text.num_hidden_layers == smolvlm_build.TEXT_LAYERS  # reduced from 30
    assert (vision.hidden_size, vision.intermediate_size, vision.num_attention_heads,
            vision.image_size, vision.patch_size) == (768, 3072, 12, 512, 16)
    assert vision.num_hidden_layers == smolvlm_build.DEFAULT_VISION_LAYERS["256m"] == 2
    assert smolvlm_build._true_config("256m")["vision_config"]["num_hidden_layers"] == 12  # the true depth


@pytest.mark.engine
def test_engine_takes_images_only(smol_engine):
    assert smol_engine.family.name == "smolvlm"
    assert smol_engine.processor_kwargs == {"do_image_splitting": False}
    assert smol_engine.accepts_video is False
    assert smol_engine.accepts_audio is False
    with pytest.raises(EngineError, match="does not take video; send frames as images"):
        smol_engine.ask(QUESTION, frames(2), frames_as="video", max_tokens=4)
    with pytest.raises(OptionError, match="does not take video"):
        asking.check_options(AnswerOptions(frames_as="video"), smol_engine)
    with pytest.raises(OptionError, match="does not take video"):
        asking.check_options(AnswerOptions(frames_as="video"), smol_engine, SessionSettings(num_sample_frames=4))
    # The preset's own frames per question pass.
    asking.check_options(AnswerOptions(frames_as="images"), smol_engine,
                       SessionSettings(num_sample_frames=models.preset_named(PRESET).frames_per_question))


@pytest.mark.engine
async def test_audio_is_dropped_not_refused(smol_engine):
    """A question with audio still gets an answer from a vision-only model."""
    reply = smol_engine.ask(QUESTION, frames(1), np.zeros(16000, dtype=np.float32), max_tokens=2,
                            ignore_eos=True, temperature=0.0)
    async for _ in reply:
        pass
    assert reply.stats.completion_tokens == 2 and reply.stats.audio_seconds == 0.0


@pytest.mark.engine
async def test_tokens_per_frame_match_the_hf_processor(smol_engine):
    one, two = await answer(smol_engine, 1), await answer(smol_engine, 2, seed=1)
    per_frame = two.stats.prompt_tokens - one.stats.prompt_tokens
    assert per_frame == TOKENS_PER_FRAME == smolvlm_build.tokens_per_frame("256m")
    assert one.stats.prompt_tokens == hf_prompt_tokens(smol_engine, 1)
    assert two.stats.prompt_tokens == hf_prompt_tokens(smol_engine, 2)


@pytest.mark.engine
async def test_sixteen_frames_stream_to_completion(smol_engine):
    settings = preset_settings()
    n = settings.max_images
    assert n == 16
    t0 = time.perf_counter()
    reply = await answer(smol_engine, n, seed=2)
    elapsed = time.perf_counter() - t0
    assert reply.stats.completion_tokens == 4 and reply.stats.finish_reason == "length"
    assert reply.stats.frames == n
    text_tokens = reply.stats.prompt_tokens - n * TOKENS_PER_FRAME
    assert 5 <= text_tokens <= 40, reply.stats
    assert reply.stats.prompt_tokens == hf_prompt_tokens(smol_engine, n)
    assert reply.stats.prompt_tokens < settings.max_model_len
    print(f"16 frames: {reply.stats.prompt_tokens} prompt tokens, {elapsed:.1f} s")


@pytest.mark.engine
@pytest.mark.skipif(bool(os.environ.get("VIDCHAT_SKIP_SMOLVLM_2B")), reason="VIDCHAT_SKIP_SMOLVLM_2B is set")
async def test_2_2b_preset_streams():
    """The 2.2B preset: true widths, text and vision cut to 2 layers each (its
    27-layer tower costs ~0.6 TFLOP a frame); ~40 s with the build, ~25 s cached."""
    path = smolvlm_build.ensure(CACHE_DIR, "2.2b")
    options = dataclasses.replace(server.engine_options(preset_settings("smolvlm2-2.2b"), str(path), tiny=False),
                                  kv_cache_gb=0.5)
    engine = LocalEngine.start(options)
    try:
        assert engine.accepts_video is False and engine.accepts_audio is False
        assert engine._processor.image_seq_len == 81
        one, two = await answer(engine, 1), await answer(engine, 2, seed=1)
        assert two.stats.completion_tokens == 4
        assert two.stats.prompt_tokens - one.stats.prompt_tokens == smolvlm_build.tokens_per_frame("2.2b") == 84
        assert two.stats.prompt_tokens == hf_prompt_tokens(engine, 2)
        print(f"2.2B: {one.stats.prompt_tokens} prompt tokens for 1 frame, {two.stats.prompt_tokens} for 2")
    finally:
        engine.shutdown()
    # The EngineCore exited by itself once torn down, not killed after vLLM's
    # 5-s grace (vidchat.engine.local).
    assert engine.core_exit_codes == [0], engine.core_exit_codes
