"""Build tiny, randomly initialised vision-language models that vLLM loads.

No weights can be downloaded on the machines this project is developed and
tested on, so tests (and `app.py --model tiny`) run the real vLLM engine on a
model folder made here: a Qwen2.5-Omni thinker (images, video, audio) and a
Qwen2-VL (images, video), each about a million parameters, with a byte-level
BPE tokenizer trained locally on generated text, the family's special tokens,
a chat template and a processor config. Their replies are gibberish; they
exercise the exact code path of the real models.

    python -m vidchat.devtools.tinymodel OUT_DIR [--family omni|vl]

The build is deterministic for a fixed seed and takes a few seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import random
import sys
from pathlib import Path
from typing import Sequence

from vidchat.engine.weights import build_once

log = logging.getLogger(__name__)

FAMILIES = ("omni", "vl")
# Bump when the files produced change, so cached builds are rebuilt.
BUILD_VERSION = "2"
SEED = 1234

HIDDEN = 128
HEAD_DIM = 64  # vLLM's CPU attention accepts 32, 64, 80, ...
# The tiny processor caps each frame at 224x224 pixels: a 640x480 frame costs
# ~108 prompt tokens, so a 16-frame question stays well inside a small context.
MAX_PIXELS = 224 * 224
MIN_PIXELS = 56 * 56

_QWEN_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
_OMNI_TOKENS = [
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|AUDIO|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
]

# One template for both families; the placeholders differ. It renders content
# given as a string or as a list of typed parts (text, image, video, audio).
_CHAT_TEMPLATE = """{%- for message in messages -%}
{%- if loop.first and message['role'] != 'system' -%}
<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif -%}
<|im_start|>{{ message['role'] }}
{% if message['content'] is string -%}
{{ message['content'] }}
{%- else -%}
{%- for part in message['content'] -%}
{%- if part['type'] == 'image' or part['type'] == 'image_url' -%}
@IMAGE@
{%- elif part['type'] == 'video' -%}
@VIDEO@
{%- elif part['type'] == 'audio' -%}
@AUDIO@
{%- elif part['type'] == 'text' -%}
{{ part['text'] }}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
<|im_end|>
{% endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}"""

_PLACEHOLDERS = {
    "vl": {
        "@IMAGE@": "<|vision_start|><|image_pad|><|vision_end|>",
        "@VIDEO@": "<|vision_start|><|video_pad|><|vision_end|>",
        "@AUDIO@": "",
    },
    "omni": {
        "@IMAGE@": "<|vision_bos|><|IMAGE|><|vision_eos|>",
        "@VIDEO@": "<|vision_bos|><|VIDEO|><|vision_eos|>",
        "@AUDIO@": "<|audio_bos|><|AUDIO|><|audio_eos|>",
    },
}


def chat_template(family: str) -> str:
    text = _CHAT_TEMPLATE
    for key, value in _PLACEHOLDERS[family].items():
        text = text.replace(key, value)
    return text


TRAINING_WORDS = (
    "the a an person hand face camera video frame light room table cup phone book "
    "moving holding looking left right up down red green blue white black small large "
    "what is in this picture who where how many there are you see I can hear sound "
    "speaking music quiet loud describe answer question yes no maybe because and or "
    "with without near far front behind window door chair screen wall shirt hair"
)


def training_text(seed: int, words: str = TRAINING_WORDS, stops: str = ".?!,", extra: Sequence[str] = ()) -> list[str]:
    """Plausible English-ish lines so BPE learns ordinary merges (each test
    model's tokenizer: its own words and punctuation, the same rule)."""
    rng = random.Random(seed)
    vocabulary = words.split()
    lines = []
    for _ in range(4000):
        n = rng.randint(3, 14)
        line = " ".join(rng.choice(vocabulary) for _ in range(n))
        lines.append(line.capitalize() + rng.choice(list(stops)))
    return lines + [str(i) for i in range(200)] + list(extra)


def qwen_processor_tokens(omni: bool) -> dict[str, str]:
    """The special tokens a Qwen processor reads as tokenizer attributes
    (the Omni processor has its own names for them)."""
    if omni:
        return {
            "image_token": "<|IMAGE|>",
            "video_token": "<|VIDEO|>",
            "audio_token": "<|AUDIO|>",
            "vision_bos_token": "<|vision_bos|>",
            "vision_eos_token": "<|vision_eos|>",
            "audio_bos_token": "<|audio_bos|>",
            "audio_eos_token": "<|audio_eos|>",
        }
    return {
        "image_token": "<|image_pad|>",
        "video_token": "<|video_pad|>",
        "vision_start_token": "<|vision_start|>",
        "vision_end_token": "<|vision_end|>",
    }


def build_tokenizer(family: str, out_dir: Path) -> "PreTrainedTokenizerFast":  # noqa: F821
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = _QWEN_TOKENS + (_OMNI_TOKENS if family == "omni" else [])
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_text(SEED), trainer=trainer)
    return save_qwen_tokenizer(tok, family == "omni", 32768, chat_template(family), out_dir)


def save_qwen_tokenizer(tok: "Tokenizer", omni: bool, model_max_length: int, template: str,  # noqa: F821
                        out_dir: Path) -> "PreTrainedTokenizerFast":  # noqa: F821
    """``tok`` as a Qwen family's fast tokenizer (its end and padding tokens,
    the special tokens its processor reads), saved into ``out_dir``."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=qwen_processor_tokens(omni=omni),
        model_max_length=model_max_length,
        chat_template=template,
    )
    fast.save_pretrained(out_dir)
    return fast


def _text_config(vocab_size: int, tokenizer) -> dict:
    return {
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": HIDDEN // HEAD_DIM,
        "num_key_value_heads": 1,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": 32768,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [8, 12, 12]},
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "bos_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
        "pad_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        "torch_dtype": "float32",
    }


def _build_vl(out_dir: Path, tokenizer, vocab_size: int):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2VLConfig(
        text_config=_text_config(vocab_size, tokenizer),
        vision_config={
            "depth": 2,
            "embed_dim": 64,
            "hidden_size": HIDDEN,
            "num_heads": 2,
            "mlp_ratio": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "in_channels": 3,
        },
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=False,
    )
    return Qwen2VLForConditionalGeneration(config)


def _build_omni(out_dir: Path, tokenizer, vocab_size: int):
    from transformers import Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration

    ids = tokenizer.convert_tokens_to_ids
    thinker = {
        "text_config": _text_config(vocab_size, tokenizer),
        "vision_config": {
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 2,
            "out_hidden_size": HIDDEN,
            "fullatt_block_indexes": [1],
            "window_size": 112,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        "audio_config": {
            "num_mel_bins": 128,
            "encoder_layers": 2,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 128,
            "d_model": 64,
            "output_dim": HIDDEN,
            "max_source_positions": 1500,
            "n_window": 100,
        },
        "audio_token_index": ids("<|AUDIO|>"),
        "image_token_index": ids("<|IMAGE|>"),
        "video_token_index": ids("<|VIDEO|>"),
        "audio_start_token_id": ids("<|audio_bos|>"),
        "audio_end_token_id": ids("<|audio_eos|>"),
        "vision_start_token_id": ids("<|vision_bos|>"),
        "vision_end_token_id": ids("<|vision_eos|>"),
        "user_token_id": tokenizer.encode("user")[0],
        "tie_word_embeddings": False,
    }
    config = Qwen2_5OmniConfig(thinker_config=thinker, enable_audio_output=False)
    model = Qwen2_5OmniForConditionalGeneration(config)
    # transformers' loader of the full Omni model insists on a speaker table.
    import torch

    torch.save({}, out_dir / "spk_dict.pt")
    return model


def _build_processor(family: str, out_dir: Path, tokenizer) -> None:
    from transformers import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    size = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    image_processor = Qwen2VLImageProcessor(size=size, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    video_processor = Qwen2VLVideoProcessor(size=size, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    if family == "vl":
        from transformers import Qwen2VLProcessor

        processor = Qwen2VLProcessor(
            image_processor=image_processor,
            video_processor=video_processor,
            tokenizer=tokenizer,
            chat_template=chat_template(family),
        )
    else:
        from transformers import Qwen2_5OmniProcessor, WhisperFeatureExtractor

        processor = Qwen2_5OmniProcessor(
            image_processor=image_processor,
            video_processor=video_processor,
            feature_extractor=WhisperFeatureExtractor(feature_size=128),
            tokenizer=tokenizer,
            chat_template=chat_template(family),
        )
    processor.save_pretrained(out_dir)


def build(out_dir: str | os.PathLike, family: str = "omni", seed: int = SEED) -> Path:
    """Write a tiny model folder for `family` into `out_dir` (created/replaced)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown tiny model family {family!r}; choose one of {FAMILIES}")
    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(family, out)
    vocab_size = (len(tokenizer) + 63) // 64 * 64
    torch.manual_seed(seed)
    builder = _build_omni if family == "omni" else _build_vl
    model = builder(out, tokenizer, vocab_size)
    model = model.to(torch.float32).eval()
    _never_stop_on_its_own(model, [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")])
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.save_pretrained(out, safe_serialization=True)
    _build_processor(family, out, tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("built tiny %s model in %s (%.2f M parameters)", family, out, n_params / 1e6)
    return out


def _never_stop_on_its_own(model, stop_ids: list[int]) -> None:
    """Zero the output weights of the end tokens: their logit is then exactly
    0 while the best of the other random logits is positive, so greedy
    decoding never ends a reply and a reply's length is ``max_tokens``.

    Tests of long answers (cancel, disconnect, idle time) need that; random
    weights ended a "long" greedy answer after 1,618 tokens on one CI machine
    and not on another (CPU kernels round differently)."""
    import torch

    heads = [m for name, m in model.named_modules() if name.endswith("lm_head")]
    if not heads:
        raise RuntimeError("tiny model has no lm_head to adjust")
    with torch.no_grad():
        for head in heads:
            head.weight[stop_ids] = 0.0


def _source_hash() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]


def ensure(cache_dir: str | os.PathLike, family: str = "omni") -> Path:
    """Return a ready tiny model folder under `cache_dir`, building it once.

    Built into a temporary folder and renamed into place, so a crash mid-build
    or two processes building at once never leave a half-written model.
    """
    return build_once(cache_dir, f"tiny-{family}-v{BUILD_VERSION}-{_source_hash()}", lambda tmp: build(tmp, family))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="folder to write the model into")
    parser.add_argument("--family", choices=FAMILIES, default="omni")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    build(args.out_dir, args.family, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
