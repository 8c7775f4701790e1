"""The true architecture of each Qwen preset and the transformers config a
random-weight build of it writes.

:data:`ARCHS` holds each preset's real widths, heads, vocabulary and depths;
:func:`depth_of` gives the real depth or the reduced one (with the index
lists following the real pattern), and :func:`transformers_config` the
Omni / Qwen2.5-VL / Qwen3-VL config for an architecture at a depth. Where
each value comes from (true, assumed [A] or reduced on purpose) is in
:mod:`vidchat.devtools.archbuild_qwen`'s docstring, which builds the folders.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PretrainedConfig

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
