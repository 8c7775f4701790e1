"""Random-weight models with the TRUE architecture of each Qwen preset, only shallower.

vidchat's presets (:mod:`vidchat.app.presets`) name real checkpoints that cannot be
downloaded on the machines this project is tested on. This module builds, for
each Qwen preset, a model folder whose configuration is the checkpoint's own
(widths, heads, KV heads, head_dim, M-RoPE sections, rope theta, vision tower,
patch / merge / temporal sizes, Omni audio encoder, vocabulary size and the
real special-token ids), whose tokenizer has the family's special tokens at
their real ids, whose chat template is the family's own and whose processor
config gives explicit image AND video sizes. Only the DEPTH is reduced, so
vLLM runs the real model classes with the real tensor shapes, placeholder
expansion, M-RoPE, window attention, deepstack and audio paths in seconds.

    python -m vidchat.devtools.archbuild_qwen PRESET OUT_DIR [--true-size]

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
    vision blocks, AUDIO_LAYERS audio layers (:mod:`vidchat.devtools.qwen_arch`
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
from pathlib import Path
from typing import TYPE_CHECKING

from vidchat.devtools.qwen_arch import ARCHS, Arch, Depth, arch_of, config_for, depth_of, transformers_config
from vidchat.devtools.qwen_vocab import build_tokenizer, chat_template
from vidchat.engine.modelcache import build_once

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

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
    h.update(Path(__file__).with_name("qwen_arch.py").read_bytes())
    h.update(Path(__file__).with_name("qwen_vocab.py").read_bytes())
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
