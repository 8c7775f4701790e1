"""Random-weight models with the TRUE architecture of each Qwen preset, only shallower.

vidchat's presets (:mod:`vidchat.app.models`) name real checkpoints that cannot be
downloaded on the machines this project is tested on. This module builds, for
each Qwen preset, a model folder whose configuration is the checkpoint's own
(widths, heads, KV heads, head_dim, M-RoPE sections, rope theta, vision tower,
patch / merge / temporal sizes, Omni audio encoder, vocabulary size and the
real special-token ids), whose tokenizer has the family's special tokens at
their real ids, whose chat template is the family's own and whose processor
config gives explicit image AND video sizes. Only the DEPTH is reduced, so
vLLM runs the real model classes with the real tensor shapes, placeholder
expansion, M-RoPE, window attention, deepstack and audio paths in seconds.

    python -m vidchat.devtools.qwen_build PRESET OUT_DIR [--true-size]

``--true-size`` (``ensure(..., true_size=True)``) keeps every layer too, for
benchmarks on a machine with the memory of the real model (the 3B thinker
is ~8.8 GB of bf16, the 7B ~18 GB, built in RAM before saving).

Provenance of the values (from the project's research notes; "true" values
were read from copies of the official config files, "assumed" ones come from
model cards or memory and were not verified against the Hub):

True (verified copies of the official configs, or forced by the wiring):
  * Qwen2.5-Omni-7B thinker: text 3584 / 18944 / 28 heads / 4 KV / head_dim
    128 / vocab 152064 / rope theta 1e6 / mrope [16, 24, 24] / untied; vision
    1280 wide, 3420 MLP, 16 heads, patch 14, merge 2, temporal 2, window 112,
    tokens_per_second 25; audio d_model 1280, 20 heads, FFN 5120, 128 mel
    bins, n_window 100, 1500 source positions; token ids 151643-151656
    (<|AUDIO|> 151646, <|audio_bos|> 151647, <|audio_eos|> 151648,
    <|vision_bos|> 151652, <|vision_eos|> 151653, <|IMAGE|> 151655,
    <|VIDEO|> 151656); its tokenizer_config and chat template.
  * Qwen2.5-Omni-3B thinker text: 2048 / 11008 / 16 heads / 2 KV / vocab
    151936 / theta 1e6; vision and audio output width 2048 (must equal the
    text width).
  * Qwen2.5-VL-3B: text 2048 / 11008 / 16 heads / 2 KV / vocab 151936 /
    theta 1e6 / mrope [16, 24, 24] / tied embeddings; vision as Omni's but
    tokens_per_second 2; token ids 151652-151656.
  * Qwen3-VL-4B: text 2560 / 9728 / 32 heads / 8 KV / head_dim 128 / vocab
    151936 / theta 5e6 / interleaved mrope [24, 20, 20] / tied; vision 1024
    wide, 4096 MLP, 16 heads, gelu_pytorch_tanh, patch 16, merge 2, temporal
    2, 2304 position embeddings, out 2560; its chat template (no default
    system prompt).

Assumed ([A] in the research notes):
  * Qwen2.5-VL-7B: all numbers (3584 / 18944 / 28 heads / 4 KV / vocab
    152064 / untied, vision out 3584). They equal transformers' defaults for
    the 7B class and a third-party weight listing.
  * Qwen2.5-Omni-3B: tied embeddings, mrope [16, 24, 24] (as the 7B).
  * The Qwen2.5-VL chat template (the widely copied Qwen2-VL one, with the
    default system prompt "You are a helpful assistant.").
  * Qwen3's extra tokens 151665-151668 (<tool_response>, </tool_response>,
    <think>, </think>).
  * Processor defaults: Qwen2.5 image min/max pixels 3136 / 12845056 and the
    same for video (the checkpoints ship no video config, so transformers
    falls back to the image one); Qwen3-VL image 65536 / 16777216 and video
    4096 / 25165824 (a clip-wide budget) with mean/std 0.5; the Omni
    Whisper feature extractor's chunk_length 300 s.

Reduced (on purpose):
  * Depth (unless ``true_size``): TEXT_LAYERS text layers, VISION_DEPTH
    vision blocks, AUDIO_LAYERS audio layers (:mod:`vidchat.devtools.qwen_build`
    holds them, the architectures and the configs). Index lists follow the real pattern:
    Qwen2.5 ``fullatt_block_indexes`` = [VISION_DEPTH - 1] (the real
    [7, 15, 23, 31] makes every 8th block, ending with the last, full
    attention; the others use windows) and Qwen3-VL
    ``deepstack_visual_indexes`` = [0] (the real [5, 11, 17] taps
    non-final blocks; one tap feeds text layer 0, as the first of three does).
  * Tokenizer: a 1024-entry byte-level BPE trained locally on
    :mod:`vidchat.devtools.tinymodel`'s generated text, padded with unreachable
    filler tokens up to id 151642 so every special token sits at its real
    id. Ordinary words therefore get other ids (and other token counts,
    e.g. for Qwen3-VL's "<1.2 seconds>" video timestamps) than with the
    real vocabulary; the config's ``user_token_id`` 872 keeps the real
    value. The tokenizer's length (151665; 151669 for Qwen3) is the real one.
  * ``max_window_layers`` follows the reduced depth (sliding windows are off
    in every real config, so it changes nothing).
  * The Omni talker and code2wav are not built (vLLM serves the thinker
    only); the weights are random (normal, std 0.02), saved as bfloat16.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vidchat.engine.weights import build_once

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

log = logging.getLogger(__name__)


# The true architecture of each Qwen preset and the transformers config a
# random-weight build of it writes.
#
# :data:`ARCHS` holds each preset's real widths, heads, vocabulary and depths;
# :func:`depth_of` gives the real depth or the reduced one (with the index
# lists following the real pattern), and :func:`transformers_config` the
# Omni / Qwen2.5-VL / Qwen3-VL config for an architecture at a depth. Where
# each value comes from (true, assumed [A] or reduced on purpose) is in
# :mod:`vidchat.devtools.qwen_build`'s docstring, which builds the folders.

TEXT_LAYERS = 2

VISION_DEPTH = 2

AUDIO_LAYERS = 2


@dataclass(frozen=True)
class Arch:
    """One preset's true architecture (before the depth is reduced)."""

    preset: str
    kind: str  # "omni", "qwen2.5-vl" or "qwen3-vl"
    vocab_size: int
    hidden: int
    intermediate: int
    layers: int  # the real text depth
    heads: int
    kv_heads: int
    tie: bool
    vision_out: int
    max_positions: int
    model_max_length: int
    vision_depth: int = 32
    max_window_layers: int = 28  # no effect: sliding windows are off in every config
    notes: tuple[str, ...] = field(default=())

    @property
    def head_dim(self) -> int:
        return 128


ARCHS: dict[str, Arch] = {a.preset: a for a in (
    Arch("qwen2.5-omni-3b", "omni", 151936, 2048, 11008, 36, 16, 2, tie=True, vision_out=2048,
         max_positions=32768, model_max_length=32768, max_window_layers=36,
         notes=("tie [A]", "mrope [A]", "max_window_layers [A]")),
    Arch("qwen2.5-omni-7b", "omni", 152064, 3584, 18944, 28, 28, 4, tie=False, vision_out=3584,
         max_positions=32768, model_max_length=32768),
    Arch("qwen2.5-vl-3b", "qwen2.5-vl", 151936, 2048, 11008, 36, 16, 2, tie=True, vision_out=2048,
         max_positions=128000, model_max_length=131072, max_window_layers=70),
    Arch("qwen2.5-vl-7b", "qwen2.5-vl", 152064, 3584, 18944, 28, 28, 4, tie=False, vision_out=3584,
         max_positions=128000, model_max_length=131072, notes=("all [A]",)),
    Arch("qwen3-vl-4b", "qwen3-vl", 151936, 2560, 9728, 36, 32, 8, tie=True, vision_out=2560,
         max_positions=262144, model_max_length=262144, vision_depth=24, max_window_layers=36),
)}


@dataclass(frozen=True)
class Depth:
    text: int
    vision: int
    audio: int
    fullatt_blocks: tuple[int, ...]  # Qwen2.5 vision blocks with full (not window) attention
    deepstack_blocks: tuple[int, ...]  # Qwen3-VL vision blocks whose features feed the first text layers
    max_window_layers: int


def depth_of(arch: Arch, true_size: bool = False) -> Depth:
    """The real depth, or the reduced one with index lists that follow the real pattern."""
    if true_size:
        return Depth(arch.layers, arch.vision_depth, 32, (7, 15, 23, 31), (5, 11, 17), arch.max_window_layers)
    return Depth(TEXT_LAYERS, VISION_DEPTH, AUDIO_LAYERS, (VISION_DEPTH - 1,), (0,), TEXT_LAYERS)


# ---- configs ----------------------------------------------------------------------
def _qwen25_vision(arch: Arch, depth: Depth, tokens_per_second: int) -> dict[str, Any]:
    return {
        "depth": depth.vision,
        "hidden_size": 1280,
        "embed_dim": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "hidden_act": "silu",
        "in_channels": 3,
        "in_chans": 3,
        "patch_size": 14,
        "spatial_patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": list(depth.fullatt_blocks),
        "tokens_per_second": tokens_per_second,
        "out_hidden_size": arch.vision_out,
    }


def _text_sizes(arch: Arch, depth: Depth) -> dict[str, Any]:
    """The language model's sizes, as every Qwen generation names them."""
    return {
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden,
        "intermediate_size": arch.intermediate,
        "num_hidden_layers": depth.text,
        "num_attention_heads": arch.heads,
        "num_key_value_heads": arch.kv_heads,
    }


def _qwen25_text(arch: Arch, depth: Depth) -> dict[str, Any]:
    return {
        **_text_sizes(arch, depth),
        "hidden_act": "silu",
        "max_position_embeddings": arch.max_positions,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
        "use_sliding_window": False,
        "sliding_window": 32768,
        "max_window_layers": depth.max_window_layers,
        "tie_word_embeddings": arch.tie,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "pad_token_id": 151643,
    }


def _omni_config(arch: Arch, depth: Depth):
    from transformers import Qwen2_5OmniConfig

    thinker = {
        "text_config": _qwen25_text(arch, depth),
        "vision_config": _qwen25_vision(arch, depth, tokens_per_second=25),
        "audio_config": {
            "num_mel_bins": 128,
            "encoder_layers": depth.audio,
            "encoder_attention_heads": 20,
            "encoder_ffn_dim": 5120,
            "d_model": 1280,
            "activation_function": "gelu",
            "scale_embedding": False,
            "max_source_positions": 1500,
            "n_window": 100,
            "output_dim": arch.hidden,
        },
        "audio_token_index": 151646,
        "image_token_index": 151655,
        "video_token_index": 151656,
        "audio_start_token_id": 151647,
        "audio_end_token_id": 151648,
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "vision_token_id": 151654,
        "bos_token_id": 151644,
        "eos_token_id": 151645,
        "pad_token_id": 151643,
        "user_token_id": 872,
        "position_id_per_seconds": 25,
        "seconds_per_chunk": 2,
        "tie_word_embeddings": arch.tie,
    }
    return Qwen2_5OmniConfig(thinker_config=thinker, enable_audio_output=False)


def _qwen25_vl_config(arch: Arch, depth: Depth):
    from transformers import Qwen2_5_VLConfig

    return Qwen2_5_VLConfig(
        text_config=_qwen25_text(arch, depth),
        vision_config=_qwen25_vision(arch, depth, tokens_per_second=2),
        image_token_id=151655,
        video_token_id=151656,
        vision_start_token_id=151652,
        vision_end_token_id=151653,
        vision_token_id=151654,
        tie_word_embeddings=arch.tie,
    )


def _qwen3_vl_config(arch: Arch, depth: Depth):
    from transformers import Qwen3VLConfig

    return Qwen3VLConfig(
        text_config={
            **_text_sizes(arch, depth),
            "head_dim": arch.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": arch.max_positions,
            "rms_norm_eps": 1e-6,
            "attention_bias": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [24, 20, 20],
                                "mrope_interleaved": True},
            "tie_word_embeddings": arch.tie,
            "bos_token_id": 151643,
            "eos_token_id": 151645,
        },
        vision_config={
            "depth": depth.vision,
            "hidden_size": 1024,
            "intermediate_size": 4096,
            "num_heads": 16,
            "hidden_act": "gelu_pytorch_tanh",
            "in_channels": 3,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": arch.vision_out,
            "num_position_embeddings": 2304,
            "deepstack_visual_indexes": list(depth.deepstack_blocks),
        },
        image_token_id=151655,
        video_token_id=151656,
        vision_start_token_id=151652,
        vision_end_token_id=151653,
        tie_word_embeddings=arch.tie,
    )


def transformers_config(arch: Arch, depth: Depth) -> PretrainedConfig:
    """The config of `arch`'s transformers model class at `depth`."""
    return {"omni": _omni_config, "qwen2.5-vl": _qwen25_vl_config, "qwen3-vl": _qwen3_vl_config}[arch.kind](arch, depth)


def arch_of(preset_name: str) -> Arch:
    """The architecture of a Qwen preset, by its (case-insensitive) name."""
    arch = ARCHS.get(preset_name.lower())
    if arch is None:
        raise ValueError(f"no architecture for preset {preset_name!r}; choose one of {', '.join(ARCHS)}")
    return arch


def config_for(preset_name: str, true_size: bool = False) -> PretrainedConfig:
    """The transformers config a build writes (no weights)."""
    arch = arch_of(preset_name)
    return transformers_config(arch, depth_of(arch, true_size))


# The Qwen families' vocabulary for the random-weight builds of
# :mod:`vidchat.devtools.qwen_build`: their special tokens at their real ids,
# their own chat templates, and a small trained tokenizer padded so those tokens
# land where the real checkpoints have them (see archbuild_qwen's docstring for
# where each value comes from).

# Seeds the tokenizer's training text (vidchat.devtools.tinymodel); the
# same value the weights use, as before this module was split out.
TOKENIZER_SEED = 1234

# ---- special tokens at their real ids ---------------------------------------
FIRST_SPECIAL_ID = 151643

# Qwen2.5 (VL) tokenizer: 151643..151664. `True` marks special tokens.
_QWEN25_TOKENS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
]

# Qwen2.5-Omni renames the audio/vision tokens (same ids as the VL names above).
_OMNI_RENAME = {
    "<|object_ref_start|>": "<|AUDIO|>",
    "<|object_ref_end|>": "<|audio_bos|>",
    "<|box_start|>": "<|audio_eos|>",
    "<|vision_start|>": "<|vision_bos|>",
    "<|vision_end|>": "<|vision_eos|>",
    "<|image_pad|>": "<|IMAGE|>",
    "<|video_pad|>": "<|VIDEO|>",
}

_OMNI_TOKENS = [(_OMNI_RENAME.get(t, t), s) for t, s in _QWEN25_TOKENS]

_QWEN3_TOKENS = _QWEN25_TOKENS + [
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]

# ---- the families' own chat templates ---------------------------------------
# Qwen2.5-Omni: verbatim from the checkpoint's chat_template (a copy of the
# official file in sophgo/LLM-TPU).
OMNI_CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}{% set image_count = namespace(value=0) %}"
    "{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_bos|><|IMAGE|><|vision_eos|>"
    "{% elif content['type'] == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}{% if add_audio_id %}Audio {{ audio_count.value }}: "
    "{% endif %}<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: "
    "{% endif %}<|vision_bos|><|VIDEO|><|vision_eos|>{% elif 'text' in content %}{{ content['text'] }}"
    "{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen2-VL / Qwen2.5-VL [A]: the template published with Qwen2-VL-Instruct.
QWEN25_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: "
    "{% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}"
    "{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen3-VL-Instruct: verbatim from chat_template.json (copy in sophgo/LLM-TPU).
QWEN3_VL_CHAT_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' }}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content_item in message.content %}
                {%- if 'text' in content_item %}
                    {{- content_item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and message.content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def special_tokens(kind: str) -> list[tuple[str, bool]]:
    return {"omni": _OMNI_TOKENS, "qwen2.5-vl": _QWEN25_TOKENS, "qwen3-vl": _QWEN3_TOKENS}[kind]


def chat_template(kind: str) -> str:
    return {"omni": OMNI_CHAT_TEMPLATE, "qwen2.5-vl": QWEN25_VL_CHAT_TEMPLATE,
            "qwen3-vl": QWEN3_VL_CHAT_TEMPLATE}[kind]


# ---- tokenizer ------------------------------------------------------------------
def build_tokenizer(kind: str, model_max_length: int, out_dir: Path) -> "PreTrainedTokenizerFast":  # noqa: F821
    """A small trained byte-level BPE whose vocabulary is padded with
    unreachable fillers so the family's special tokens land at their real ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    from vidchat.devtools.tinymodel import save_qwen_tokenizer, training_text

    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=1024, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    trained.train_from_iterator(training_text(TOKENIZER_SEED), trainer=trainer)
    model = json.loads(trained.to_str())["model"]
    vocab: dict[str, int] = dict(model["vocab"])
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    # Fillers: strings no merge ever produces, so they are never emitted by
    # encoding; a (random) model that samples one decodes to its text.
    n = len(vocab)
    for i in range(n, FIRST_SPECIAL_ID):
        vocab[f"<filler_{i}>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    for content, special in special_tokens(kind):  # one at a time: ids follow the list order
        token = AddedToken(content, special=special, normalized=False)
        (tok.add_special_tokens if special else tok.add_tokens)([token])
    for offset, (content, _) in enumerate(special_tokens(kind)):
        got = tok.token_to_id(content)
        if got != FIRST_SPECIAL_ID + offset:
            raise RuntimeError(f"{content} got id {got}, expected {FIRST_SPECIAL_ID + offset}")
    return save_qwen_tokenizer(tok, kind == "omni", model_max_length, chat_template(kind), out_dir)


# Bump when the files produced change (the source hash covers code changes).
BUILD_VERSION = "1"

SEED = 1234

# ---- processor defaults --------------------------------------------------------
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]

CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

QWEN25_PIXELS = {"shortest_edge": 56 * 56, "longest_edge": 16384 * 28 * 28}  # 3136 / 12845056 [A]

QWEN3_IMAGE_PIXELS = {"shortest_edge": 65536, "longest_edge": 16777216}  # [A]

QWEN3_VIDEO_PIXELS = {"shortest_edge": 4096, "longest_edge": 25165824}  # whole-clip budget [A]


def _model_class(kind: str):
    import transformers

    return {
        "omni": transformers.Qwen2_5OmniForConditionalGeneration,
        "qwen2.5-vl": transformers.Qwen2_5_VLForConditionalGeneration,
        "qwen3-vl": transformers.Qwen3VLForConditionalGeneration,
    }[kind]


def meta_model(preset_name: str, true_size: bool = False) -> PreTrainedModel:
    """The model on the meta device: shapes and parameter counts, no memory."""
    import torch

    arch = arch_of(preset_name)
    with torch.device("meta"):
        return _model_class(arch.kind)._from_config(config_for(preset_name, true_size), dtype=torch.bfloat16)


def _build_weights(arch: Arch, depth: Depth, out: Path, seed: int) -> int:
    """Instantiate on the meta device, allocate bf16 storage once, fill it and
    save: the 7B's 545M-parameter embedding never exists in float32."""
    import torch

    with torch.device("meta"):
        model = _model_class(arch.kind)._from_config(transformers_config(arch, depth), dtype=torch.bfloat16)
    model.to_empty(device="cpu")
    model.tie_weights()  # to_empty gives each module its own storage, untying lm_head
    gen = torch.Generator().manual_seed(seed)
    n_params = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            n_params += p.numel()
            if p.ndim >= 2:
                p.normal_(0.0, 0.02, generator=gen)
            elif name.endswith("bias"):
                p.zero_()
            else:  # 1-D weights are norms
                p.fill_(1.0)
    model.generation_config.eos_token_id = [151645, 151643]
    model.generation_config.pad_token_id = 151643
    model.generation_config.bos_token_id = 151643
    model.save_pretrained(out, safe_serialization=True)
    del model
    gc.collect()
    if arch.kind == "omni":
        # transformers' loader of the full Omni model insists on a speaker table.
        torch.save({}, out / "spk_dict.pt")
    return n_params


def _build_processor(arch: Arch, out: Path, tokenizer) -> None:
    from transformers import Qwen2VLImageProcessor

    if arch.kind == "qwen3-vl":
        from transformers import Qwen3VLProcessor, Qwen3VLVideoProcessor

        image = Qwen2VLImageProcessor(size=dict(QWEN3_IMAGE_PIXELS), patch_size=16, temporal_patch_size=2,
                                      merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3)
        video = Qwen3VLVideoProcessor(size=dict(QWEN3_VIDEO_PIXELS), patch_size=16, temporal_patch_size=2,
                                      merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3, fps=2)
        processor = Qwen3VLProcessor(image_processor=image, video_processor=video, tokenizer=tokenizer,
                                     chat_template=chat_template(arch.kind))
    else:
        from transformers import Qwen2VLVideoProcessor

        px = dict(QWEN25_PIXELS)
        image = Qwen2VLImageProcessor(size=px, min_pixels=px["shortest_edge"], max_pixels=px["longest_edge"],
                                      patch_size=14, temporal_patch_size=2, merge_size=2,
                                      image_mean=CLIP_MEAN, image_std=CLIP_STD)
        # Explicit: the class default (min 100352 pixels) would upscale 320x240 frames.
        video = Qwen2VLVideoProcessor(size=dict(px), min_pixels=px["shortest_edge"], max_pixels=px["longest_edge"],
                                      patch_size=14, temporal_patch_size=2, merge_size=2,
                                      image_mean=CLIP_MEAN, image_std=CLIP_STD)
        if arch.kind == "omni":
            from transformers import Qwen2_5OmniProcessor, WhisperFeatureExtractor

            processor = Qwen2_5OmniProcessor(
                image_processor=image,
                video_processor=video,
                feature_extractor=WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160,
                                                          n_fft=400, chunk_length=300),
                tokenizer=tokenizer,
                chat_template=chat_template(arch.kind),
            )
        else:
            from transformers import Qwen2_5_VLProcessor

            processor = Qwen2_5_VLProcessor(image_processor=image, video_processor=video, tokenizer=tokenizer,
                                            chat_template=chat_template(arch.kind))
    processor.save_pretrained(out)


def build_configuration(preset_name: str, out_dir: str | os.PathLike, *, true_size: bool = False) -> Path:
    """Write everything of a preset's folder but its weights: config.json,
    the tokenizer and the processor. A check of the configuration needs no
    more, and takes seconds where the weights take minutes and hundreds of MB
    (the unit tier builds this; the engine tier the whole folder)."""
    arch = arch_of(preset_name)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(arch.kind, arch.model_max_length, out)
    transformers_config(arch, depth_of(arch, true_size)).save_pretrained(out)
    _build_processor(arch, out, tokenizer)
    return out


def build(preset_name: str, out_dir: str | os.PathLike, seed: int = SEED, *, true_size: bool = False) -> Path:
    """Write the true-architecture model folder of a Qwen preset (reduced
    depth unless `true_size`)."""
    arch = arch_of(preset_name)
    depth = depth_of(arch, true_size)
    out = build_configuration(preset_name, out_dir, true_size=true_size)
    n_params = _build_weights(arch, depth, out, seed)  # its config.json is the same configuration, as the model saves it
    (out / "vidchat_archbuild.json").write_text(json.dumps({
        "preset": arch.preset, "true_size": true_size, "text_layers": depth.text, "vision_depth": depth.vision,
        "audio_layers": depth.audio if arch.kind == "omni" else 0, "real_text_layers": arch.layers,
        "parameters": n_params, "build_version": BUILD_VERSION,
    }, indent=1))
    log.info("built %s (%s) in %s: %.0f M parameters", arch.preset, "true size" if true_size else "reduced depth",
             out, n_params / 1e6)
    return out


def _source_hash() -> str:
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(Path(__file__).with_name("tinymodel.py").read_bytes())  # the training text lives there
    return h.hexdigest()[:12]


def ensure(cache_dir: str | os.PathLike, preset_name: str, *, true_size: bool = False) -> Path:
    """A ready model folder for the preset under `cache_dir`, built once (into
    a temporary folder renamed into place, so a crash leaves nothing half-built)."""
    name = arch_of(preset_name).preset
    folder = f"arch-{name}-{'full' if true_size else 'reduced'}-v{BUILD_VERSION}-{_source_hash()}"
    return build_once(cache_dir, folder, lambda tmp: build(name, tmp, true_size=true_size))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("preset", choices=sorted(ARCHS))
    parser.add_argument("out_dir", help="folder to write the model into")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--true-size", action="store_true", help="every layer, not a reduced depth")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    build(args.preset, args.out_dir, args.seed, true_size=args.true_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
