"""The Qwen presets on their true architectures, through real vLLM.

`vidchat.devtools.qwen_build` writes, for each Qwen preset, a random-weight model
with the checkpoint's own configuration (widths, heads, KV heads, M-RoPE,
vision tower, Omni audio encoder, vocabulary size, special-token ids, chat
template, processor sizes); only the depth is cut (2 text layers, 2 vision
blocks, 2 audio layers). Each engine is started with the preset's own
settings, exactly as ``app.py --model NAME`` would, then asked 16-frame
questions as images and as a video (and with audio for Omni). Replies are
gibberish, so no test looks at words: they check that answers stream to the
requested length and that prompts cost what the transformers processor says.

A cheap check on the meta device also builds every preset at full depth and
compares its parameter count with the published size.

Presets: qwen2.5-omni-3b, qwen2.5-vl-3b and qwen3-vl-4b by default; the 7B
ones (qwen2.5-omni-7b, qwen2.5-vl-7b: ~3.2 GB of bf16 weights each even at
reduced depth, mostly the 152064×3584 embedding and LM head) only with
VIDCHAT_TEST_7B=1.

Overridden for a CPU test machine, nothing else:
  * kv_cache_gb 0.5 (default 1 GiB): at 2 layers even the 16k context of the
    3B presets needs at most 128 MiB of KV; the rest would only take shared RAM.
The dtype stays "auto" (float32 on a CPU without native bfloat16, such as
this project's machines; the config's bfloat16 where the CPU has it), max_model_len, max_images, max_audios and the pixel cap are the
preset's.

One engine runs at a time: the fixture is module-scoped and parametrized, so
pytest finishes (shuts down) one preset's engine before starting the next.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
from conftest import CACHE_DIR

from vidchat.app import models, server
from vidchat.app.settings import Settings
from vidchat.devtools import qwen_build
from vidchat.engine import video_fps
from vidchat.engine.local import LocalEngine
from vidchat.media import AUDIO_RATE

DEFAULT_PRESETS = ["qwen2.5-omni-3b", "qwen2.5-vl-3b", "qwen3-vl-4b"]
LARGE_PRESETS = ["qwen2.5-omni-7b", "qwen2.5-vl-7b"]
PRESETS = DEFAULT_PRESETS + (LARGE_PRESETS if os.environ.get("VIDCHAT_TEST_7B") == "1" else [])

# LLM tokens one 320×240 frame costs, plus <|vision_start|>/<|vision_end|>:
# Qwen2.5 at the presets' cap of 76800 pixels resizes it to 308×224 → 22×16
# patches / 4 = 88; Qwen3-VL (no cap passed, patch 16) to 320×256 → 80.
TOKENS_PER_IMAGE = {"omni": 88 + 2, "qwen2.5-vl": 88 + 2, "qwen3-vl": 80 + 2}
QUESTION = "What is happening?"
N_FRAMES = 16
FRAME_TIMES = [0.5 * i for i in range(N_FRAMES)]  # 2 frames a second, as the buffer samples them


def frames(n: int, seed: int = 0) -> list[np.ndarray]:
    """320×240 RGB uint8 frames, as vidchat stores them."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (240, 320, 3), dtype=np.uint8) for _ in range(n)]


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * AUDIO_RATE)) / AUDIO_RATE
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


@dataclasses.dataclass
class Running:
    name: str
    arch: qwen_build.Arch
    path: str
    settings: Settings
    engine: LocalEngine


_current: list[LocalEngine] = []


@pytest.fixture(scope="module", params=PRESETS)
def qwen(request) -> Running:
    name = request.param
    while _current:  # never two engines at once, whatever order pytest picks
        _current.pop().shutdown()
    path = qwen_build.ensure(CACHE_DIR, name)
    settings = models.apply_preset(Settings(), models.preset_named(name))
    options = dataclasses.replace(server.engine_options(settings, str(path), tiny=False), kv_cache_gb=0.5)
    engine = LocalEngine.start(options)
    _current.append(engine)
    yield Running(name, qwen_build.ARCHS[name], str(path), settings, engine)
    if engine in _current:
        _current.remove(engine)
    engine.shutdown()


async def answer(q: Running, fr=(), audio=None, **kw):
    """A 4-token greedy answer with the preset's system prompt, as the app asks."""
    reply = q.engine.ask(QUESTION, list(fr), audio, system_prompt=q.settings.system_prompt, max_tokens=4,
                         ignore_eos=True, temperature=0.0, **kw)
    async for _ in reply:
        pass
    return reply


def hf_prompt_tokens(q: Running, fr, frames_as: str = "images", audio=None, fps=None) -> int:
    """The transformers processor's token count for the prompt vidchat builds,
    with vidchat's engine-wide processor kwargs and the same video metadata."""
    engine = q.engine
    text = engine.build_prompt(QUESTION, n_frames=len(fr), frames_as=frames_as, with_audio=audio is not None,
                               system_prompt=q.settings.system_prompt)
    kwargs = {"text": [text], "return_tensors": "np", **engine.processor_kwargs}
    if fr and frames_as == "video":
        item = engine.family.video_item(np.stack(fr), fps)
        if isinstance(item, tuple):
            video, meta = item
            kwargs["video_metadata"] = [{k: v for k, v in meta.items() if k != "do_sample_frames"}]
            kwargs["do_sample_frames"] = False
        else:
            video = item
            if fps is not None and engine.family.fps_kwarg:
                kwargs["fps"] = fps
        kwargs["videos"] = [video]
    elif fr:
        kwargs["images"] = list(fr)
    if audio is not None:
        kwargs["audio"] = [audio]
    return int(engine._processor(**kwargs)["input_ids"].shape[1])


def assert_streamed(reply) -> None:
    s = reply.stats
    assert s.completion_tokens == 4 and s.finish_reason == "length" and not s.cancelled
    assert s.ttft_s is not None and s.ttft_s > 0


# ---- the built folders -----------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("name", PRESETS)
def test_folder_has_the_true_configuration_at_reduced_depth(name, tmp_path):
    """The configuration, tokenizer and processor a preset's folder gets,
    built without its weights (the unit tier never builds real-size weights:
    the engine tests below load the whole folder, built by the same code)."""
    arch = qwen_build.ARCHS[name]
    path = qwen_build.build_configuration(name, tmp_path)
    assert not list(path.glob("*.safetensors"))
    cfg = json.loads((path / "config.json").read_text())
    if arch.kind == "omni":
        thinker = cfg["thinker_config"]
        text, vision, top = thinker["text_config"], thinker["vision_config"], thinker
        assert thinker["audio_config"]["d_model"] == 1280 and thinker["audio_config"]["output_dim"] == arch.hidden
        assert thinker["audio_config"]["encoder_layers"] == qwen_build.AUDIO_LAYERS
        assert (top["audio_token_index"], top["image_token_index"], top["video_token_index"]) == (151646, 151655, 151656)
    else:
        text, vision, top = cfg["text_config"], cfg["vision_config"], cfg
        assert (top["image_token_id"], top["video_token_id"]) == (151655, 151656)
    assert (text["hidden_size"], text["intermediate_size"], text["num_attention_heads"],
            text["num_key_value_heads"], text["vocab_size"]) == (
        arch.hidden, arch.intermediate, arch.heads, arch.kv_heads, arch.vocab_size)
    assert text["num_hidden_layers"] == qwen_build.TEXT_LAYERS < arch.layers
    assert vision["depth"] == qwen_build.VISION_DEPTH and vision["out_hidden_size"] == arch.hidden
    if arch.kind == "qwen3-vl":
        assert vision["patch_size"] == 16 and vision["hidden_size"] == 1024
        assert all(i < vision["depth"] for i in vision["deepstack_visual_indexes"])
        assert text["rope_parameters"]["mrope_section"] == [24, 20, 20]
    else:
        assert vision["patch_size"] == 14 and vision["hidden_size"] == 1280
        assert vision["fullatt_block_indexes"] == [vision["depth"] - 1]
        assert text["rope_parameters"]["mrope_section"] == [16, 24, 24]

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    for offset, (token, _) in enumerate(qwen_build.special_tokens(arch.kind)):
        assert tok.convert_tokens_to_ids(token) == qwen_build.FIRST_SPECIAL_ID + offset, token


# Parameters of the full-depth architecture: the Hub's safetensors counts for
# the VL checkpoints (3.75B, 8.29B, 4.44B; they also pin down tied vs untied
# embeddings); for Omni, thinker only (the Hub counts talker and code2wav too),
# the research notes' own count from the configs.
TRUE_SIZE_PARAMS = {"qwen2.5-vl-3b": 3.75e9, "qwen2.5-vl-7b": 8.29e9, "qwen3-vl-4b": 4.44e9,
                    "qwen2.5-omni-3b": 4.39e9, "qwen2.5-omni-7b": 8.93e9}


@pytest.mark.unit
@pytest.mark.parametrize("name", list(qwen_build.ARCHS))
def test_full_depth_architecture_has_the_published_size(name):
    """Built on the meta device (no memory): every layer, the real index lists."""
    model = qwen_build.meta_model(name, true_size=True)
    n = sum(p.numel() for k, p in model.named_parameters() if not k.startswith(("talker", "token2wav")))
    assert n == pytest.approx(TRUE_SIZE_PARAMS[name], rel=0.005)
    arch = qwen_build.ARCHS[name]
    cfg = qwen_build.config_for(name, true_size=True)
    cfg = getattr(cfg, "thinker_config", cfg)
    assert cfg.text_config.num_hidden_layers == arch.layers
    if arch.kind == "qwen3-vl":
        assert (cfg.vision_config.depth, list(cfg.vision_config.deepstack_visual_indexes)) == (24, [5, 11, 17])
    else:
        assert (cfg.vision_config.depth, list(cfg.vision_config.fullatt_block_indexes)) == (32, [7, 15, 23, 31])


# ---- through vLLM, one preset at a time -----------------------------------------------
@pytest.mark.engine
async def test_sixteen_frames_as_images_stream(qwen: Running):
    assert qwen.settings.frames_per_question == N_FRAMES
    reply = await answer(qwen, frames(N_FRAMES), frames_as="images")
    assert_streamed(reply)
    assert reply.stats.frames == N_FRAMES
    assert reply.stats.prompt_tokens == hf_prompt_tokens(qwen, frames(N_FRAMES))


@pytest.mark.engine
async def test_sixteen_frames_as_video_stream(qwen: Running):
    """Qwen2.5-VL and Qwen3-VL refuse a bare frame array ("Video metadata is
    required"); this is the question that proves the metadata goes along."""
    fr = frames(N_FRAMES)
    assert qwen.engine.accepts_video
    reply = await answer(qwen, fr, frames_as="video", frame_times=FRAME_TIMES)
    assert_streamed(reply)
    fps = video_fps(FRAME_TIMES, N_FRAMES)
    assert fps == pytest.approx(2.0)
    assert reply.stats.prompt_tokens == hf_prompt_tokens(qwen, fr, "video", fps=fps)
    # Two frames make one temporal patch, so a video costs about half of the images.
    images = hf_prompt_tokens(qwen, fr)
    assert reply.stats.prompt_tokens < images * 0.65


@pytest.mark.engine
async def test_audio(qwen: Running):
    fr = frames(2)
    if not qwen.arch.kind == "omni":
        assert qwen.engine.accepts_audio is False
        # Audio sent to a vision-only preset is dropped, the frames still answered.
        with_audio = await answer(qwen, fr, tone(2.0))
        without = await answer(qwen, fr)
        assert_streamed(with_audio)
        assert with_audio.stats.prompt_tokens == without.stats.prompt_tokens
        return
    assert qwen.engine.accepts_audio is True
    audio = tone(2.0)
    reply = await answer(qwen, frames(N_FRAMES), audio)
    assert_streamed(reply)
    assert reply.stats.audio_seconds == pytest.approx(2.0)
    assert reply.stats.prompt_tokens == hf_prompt_tokens(qwen, frames(N_FRAMES), audio=audio)


@pytest.mark.engine
async def test_tokens_per_frame_match_the_processor(qwen: Running):
    one = await answer(qwen, frames(1))
    two = await answer(qwen, frames(2))
    per_frame = two.stats.prompt_tokens - one.stats.prompt_tokens
    assert per_frame == TOKENS_PER_IMAGE[qwen.arch.kind]
    assert one.stats.prompt_tokens == hf_prompt_tokens(qwen, frames(1))
    assert two.stats.prompt_tokens == hf_prompt_tokens(qwen, frames(2))
