"""Random-weight SmolVLM2 folders with the real checkpoints' architecture.

The presets ``smolvlm2-256m`` and ``smolvlm2-2.2b`` point at
``HuggingFaceTB/SmolVLM2-256M-Video-Instruct`` and
``HuggingFaceTB/SmolVLM2-2.2B-Instruct``. No weights can be downloaded where
vidchat is developed and tested, so this module writes a model folder laid
out like the published one (``config.json``, ``generation_config.json``,
``tokenizer.json``/``tokenizer_config.json``, ``chat_template.json``,
``preprocessor_config.json``, ``processor_config.json``, safetensors) whose
every shape that reaches vLLM's SmolVLM/Idefics3 code is the real one, with
random weights. vLLM, transformers' processor and vidchat's engine then run
exactly the code paths the real checkpoint takes: config parsing, weight
names, the processor (including its ``num2words`` import), the image
placeholder expansion, the vision tower, the pixel-shuffle connector and the
text model's attention shapes. Replies are gibberish.

    python -m vidchat.devtools.smolvlm_build OUT_DIR [--variant 256m|2.2b]

What is TRUE (the published values; provenance in /tmp/preset_research.md §4):

* 256M: text (Llama) hidden 576, intermediate 1536, 9 heads / 3 KV heads,
  head_dim 64, vocab 49280, max_position_embeddings 8192, rope_theta 100000,
  rms_norm_eps 1e-5, untied embeddings; vision (SigLIP-style) hidden 768,
  intermediate 3072, 12 heads, image 512, patch 16; pixel-shuffle
  ``scale_factor`` 4; ``image_token_id`` 49190; ``image_seq_len`` 64
  (= (512/16)² / 4²). Checked against three independent copies of the 256M
  config and the verbatim 500M-Video config (same vision stack and tokenizer).
* Special tokens at their real ids: ``<|endoftext|>`` 0, ``<|im_start|>`` 1
  (bos), ``<|im_end|>`` 2 (pad), ``<global-img>`` 49152,
  ``<row_r_col_c>`` 49153 + 6(r-1) + (c-1), ``<fake_token_around_image>``
  49189, ``<image>`` 49190, ``<|reserved_special_token_i|>`` 49191 + i,
  ``<end_of_utterance>`` 49279 (eos); vocabulary 49280.
* The chat template is transformers' ``DEFAULT_CHAT_TEMPLATE`` for SmolVLM
  (the one SmolVLM2 checkpoints ship; it renders ``User:<image>…``).
* Processor: ``SmolVLMImageProcessor`` with size {longest_edge 2048},
  max_image_size {longest_edge 512}, LANCZOS, mean/std 0.5, splitting on by
  default (vidchat turns it off), and the 256M's ``video_sampling``
  {fps 1, max_frames 64, video_size 512} — the 500M-Video file verbatim.

What is ASSUMED [A] (not verified against the Hub here):

* 256M: the top-level ``torch_dtype`` ("float32" in the 500M copy; the
  weights here are stored in bfloat16 and the config says so — under vLLM's
  "auto" dtype a float32 config is downcast to the platform's bfloat16
  anyway, so the engine runs the same either way), and
  ``generation_config.json`` (bos 1, eos 49279, pad 2).
* 2.2B (whole function :func:`config_2_2b`): text hidden 2048, intermediate
  8192, 24 layers, 32 heads / 32 KV heads are SmolVLM (v1) 2.2B's verified
  values, assumed unchanged in SmolVLM2; vocab 49280 and the special-token
  ids are assumed to be the 256M's (SmolVLM2 shares one tokenizer);
  rope_theta 273768 (the v1 value) and max_position_embeddings 8192 are
  assumptions; vision hidden 1152, intermediate 4304, 27 layers, 16 heads,
  image 384, patch 14, scale_factor 3 (image_seq_len 81) are v1's verified
  values; processor size 1536 and video_sampling {fps 1, max_frames 50,
  video_size 384} are assumptions.
* The tokenizer's ordinary text vocabulary: the real one is SmolLM2's 49152
  learned BPE entries. Here a small byte-level BPE is trained on generated
  English (deterministically), then padded with never-produced filler
  entries so the added tokens land on their real ids. Token ids of ordinary
  words therefore differ from the real model's; the number of tokens per
  image does not (image placeholders are added tokens), and ordinary text
  costs roughly as many tokens.
* SmolLM2's other special tokens at ids 3..16 (``<repo_name>`` …) are left
  out: nothing vidchat or vLLM does reads them.

What is REDUCED, and why:

* Text depth: 2 decoder layers instead of 30 (256M) / 24 (2.2B). Depth
  changes no shape vLLM checks and no token count; it only makes the build
  and a CPU forward pass affordable on the 2-core test machine.
* Vision depth: ``vision_layers`` (default: 2 of 12 for the 256M, 2 of 27
  for the 2.2B). Depth changes no shape and no token count, and a
  true-depth tower costs ~2 s a frame on 2 cores for the 256M (~0.6 TFLOP a
  frame for the 2.2B): the tests prove the architecture, the benchmarks'
  ``--true-size`` measure its cost at full depth. Widths, heads, patch and
  image sizes stay true.

Builds are cached like :func:`vidchat.devtools.tinymodel.ensure`: a folder under the
cache dir named by the variant, the depths and a hash of this file and
:mod:`vidchat.devtools.smolvlm_build` (which builds the tokenizer), built
into a temporary folder and renamed into place, so CI builds once. The build
is deterministic for a fixed seed.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vidchat.devtools.tinymodel import training_text
from vidchat.engine.weights import build_once

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

log = logging.getLogger(__name__)


# SmolVLM2's vocabulary for the random-weight builds of
# :mod:`vidchat.devtools.smolvlm_build`: its special tokens at their real
# ids, its chat template, and a small trained byte-level BPE padded so those
# tokens land where the real checkpoints have them (see archbuild_smolvlm's
# docstring for where each value comes from).

VOCAB_SIZE = 49280

BASE_VOCAB = 49152  # ids below: ordinary text (SmolLM2); at and above: SmolVLM's added tokens

TRAINED_VOCAB = 2048  # the small BPE that stands in for SmolLM2's learned entries

# The three SmolLM2 specials the tokenizer config names, at their real ids.
BASE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

ADDED_TOKENS: dict[str, int] = {
    "<global-img>": BASE_VOCAB,
    **{f"<row_{r}_col_{c}>": BASE_VOCAB + 1 + (r - 1) * 6 + (c - 1) for r in range(1, 7) for c in range(1, 7)},
    "<fake_token_around_image>": 49189,
    "<image>": 49190,
    **{f"<|reserved_special_token_{i}|>": 49191 + i for i in range(88)},
    "<end_of_utterance>": 49279,
}

IMAGE_TOKEN_ID = ADDED_TOKENS["<image>"]

EOS_TOKEN_ID = ADDED_TOKENS["<end_of_utterance>"]

# transformers' SmolVLM DEFAULT_CHAT_TEMPLATE, which SmolVLM2 checkpoints ship.
CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% elif line['type'] == 'video' %}{{ '<video>' }}"
    "{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


# SmolVLM2's own words for its tokenizer's training text (vidchat.devtools.tinymodel.training_text).
_WORDS = (
    "the a an person hand face camera video frame light room table cup phone book moving holding "
    "looking left right up down red green blue white black small large what is in this picture who "
    "where how many there are you see describe answer question yes no maybe because and or with "
    "without near far front behind window door chair screen wall shirt hair user assistant system "
    "provided following series of frames from video image helpful watching live about hear"
)

_TIMES = tuple(f"{i:02d}:{j:02d}" for i in range(3) for j in range(0, 60, 7))  # its prompts' frame times


def build_tokenizer(out_dir: Path, seed: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with SmolVLM2's special tokens at their real
    ids and its vocabulary size; saves tokenizer.json and tokenizer_config.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trained.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TRAINED_VOCAB,
        special_tokens=BASE_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    trained.train_from_iterator(training_text(seed, _WORDS, ".?!,:", _TIMES), trainer=trainer)

    # Pad the vocabulary with entries no merge produces, so the added tokens
    # below take the ids the real tokenizer gives them.
    spec = json.loads(trained.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    for name, i in zip(BASE_SPECIALS, range(3)):
        assert vocab[name] == i, (name, vocab[name])
    for i in range(len(vocab), BASE_VOCAB):
        vocab[f"<filler_{i}>"] = i
    assert len(vocab) == BASE_VOCAB and sorted(vocab.values()) == list(range(BASE_VOCAB))
    tok = Tokenizer.from_str(json.dumps(spec))
    for token, token_id in sorted(ADDED_TOKENS.items(), key=lambda kv: kv[1]):
        tok.add_special_tokens([AddedToken(token, special=True, normalized=False)])
        got = tok.token_to_id(token)
        if got != token_id:
            raise AssertionError(f"{token}: id {got}, expected {token_id}")
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise AssertionError(f"vocabulary {tok.get_vocab_size()}, expected {VOCAB_SIZE}")

    extra = {
        "end_of_utterance_token": "<end_of_utterance>",
        "fake_image_token": "<fake_token_around_image>",
        "global_image_token": "<global-img>",
        "image_token": "<image>",
    }
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        extra_special_tokens=extra,
        model_max_length=8192,
        truncation_side="left",
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(out_dir)
    return fast


# Bump when the files produced change in a way the source hash can't see.
BUILD_VERSION = "1"

SEED = 1234

VARIANTS = ("256m", "2.2b")

HUB_IDS = {
    "256m": "HuggingFaceTB/SmolVLM2-256M-Video-Instruct",
    "2.2b": "HuggingFaceTB/SmolVLM2-2.2B-Instruct",
}

TEXT_LAYERS = 2

# Other names for the variants: the vidchat preset names and the hub ids.
ALIASES = {"smolvlm2-256m": "256m", "smolvlm2-2.2b": "2.2b", **{h.lower(): v for v, h in HUB_IDS.items()}}

# Default vision depth per variant (None: the true depth).
DEFAULT_VISION_LAYERS = {"256m": 2, "2.2b": 2}


def config_256m() -> dict[str, Any]:
    """``config.json`` of SmolVLM2-256M-Video-Instruct at its true depth, in
    the Hub's own (transformers 4.x) spelling."""
    return {
        "architectures": ["SmolVLMForConditionalGeneration"],
        "image_token_id": IMAGE_TOKEN_ID,
        "model_type": "smolvlm",
        "pad_token_id": 128002,  # a leftover at the top level; the text config's is 2
        "scale_factor": 4,
        "text_config": {
            "architectures": ["VLlama3ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "head_dim": 64,
            "hidden_act": "silu",
            "hidden_size": 576,
            "intermediate_size": 1536,
            "is_llama_config": True,
            "max_position_embeddings": 8192,
            "mlp_bias": False,
            "model_type": "llama",
            "num_attention_heads": 9,
            "num_hidden_layers": 30,
            "num_key_value_heads": 3,
            "pad_token_id": 2,
            "pixel_shuffle_factor": 4,
            "qk_layer_norms": False,
            "rms_norm_eps": 1e-05,
            "rope_interleaved": False,
            "rope_scaling": None,
            "rope_theta": 100000,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "use_resampler": False,
            "vocab_size": VOCAB_SIZE,
        },
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",  # [A] the 500M copy says "float32"; see the module docstring
        "use_cache": True,
        "vision_config": {
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_size": 768,
            "image_size": 512,
            "intermediate_size": 3072,
            "layer_norm_eps": 1e-06,
            "max_image_size": {"longest_edge": 512},
            "model_type": "smolvlm_vision",
            "num_attention_heads": 12,
            "num_channels": 3,
            "num_hidden_layers": 12,
            "patch_size": 16,
            "size": {"longest_edge": 2048},
            "tie_word_embeddings": False,
            "use_base_siglip": False,
        },
        "vocab_size": VOCAB_SIZE,
    }


def config_2_2b() -> dict[str, Any]:
    """``config.json`` of SmolVLM2-2.2B-Instruct at its true depth [A: see the
    module docstring for which values are verified (v1 2.2B) and which assumed]."""
    cfg = config_256m()
    cfg["scale_factor"] = 3
    cfg["text_config"].update(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
        num_key_value_heads=32, head_dim=64, pixel_shuffle_factor=3, rope_theta=273768.0,
        max_position_embeddings=8192,
    )
    cfg["vision_config"].update(
        hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
        image_size=384, patch_size=14, max_image_size={"longest_edge": 384}, size={"longest_edge": 1536},
    )
    return cfg


def preprocessor_config(variant: str) -> dict[str, Any]:
    variant = variant_of(variant)
    edge = 512 if variant == "256m" else 384
    return {
        "do_convert_rgb": True,
        "do_image_splitting": True,
        "do_normalize": True,
        "do_pad": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "SmolVLMImageProcessor",
        "image_std": [0.5, 0.5, 0.5],
        "max_image_size": {"longest_edge": edge},
        "processor_class": "SmolVLMProcessor",
        "resample": 1,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": 4 * edge},
        "video_sampling": {"fps": 1, "max_frames": 64 if variant == "256m" else 50,
                           "video_size": {"longest_edge": edge}},
    }


def image_seq_len(config: dict[str, Any]) -> int:
    """<image> tokens per tile: (image_size / patch_size)² / scale_factor²."""
    v = config["vision_config"]
    return (v["image_size"] // v["patch_size"]) ** 2 // config["scale_factor"] ** 2


def tokens_per_frame(variant: str) -> int:
    """Prompt tokens one frame costs with tiling off: fake + global + image_seq_len + fake."""
    return image_seq_len(_true_config(variant)) + 3


def variant_of(name: str) -> str:
    """"256m" or "2.2b" from a variant, a preset name or a hub id."""
    variant = ALIASES.get(name.lower(), name.lower())
    if variant not in VARIANTS:
        raise ValueError(f"unknown SmolVLM2 variant {name!r}; choose one of {VARIANTS} or {sorted(ALIASES)}")
    return variant


def _true_config(variant: str) -> dict[str, Any]:
    return config_256m() if variant_of(variant) == "256m" else config_2_2b()


def reduced_config(variant: str, text_layers: int = TEXT_LAYERS, vision_layers: int | None = None) -> dict[str, Any]:
    cfg = copy.deepcopy(_true_config(variant))
    cfg["text_config"]["num_hidden_layers"] = text_layers
    if vision_layers is not None:
        cfg["vision_config"]["num_hidden_layers"] = vision_layers
    return cfg


def build(out_dir: str | os.PathLike, variant: str = "256m", *, text_layers: int = TEXT_LAYERS,
          vision_layers: int | None = None, seed: int = SEED) -> Path:
    """Write a random-weight SmolVLM2 folder for `variant` (or its preset
    name or hub id) into `out_dir`."""
    import torch
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

    variant = variant_of(variant)
    cfg = reduced_config(variant, text_layers, vision_layers)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out, seed)
    ids = tokenizer.convert_tokens_to_ids
    assert ids("<image>") == cfg["image_token_id"] and ids("<end_of_utterance>") == EOS_TOKEN_ID

    torch.manual_seed(seed)
    config = SmolVLMConfig(**copy.deepcopy(cfg))
    model = SmolVLMForConditionalGeneration(config).to(torch.bfloat16).eval()
    model.save_pretrained(out, safe_serialization=True)
    # The folder carries the published files, spelled as on the Hub (what a
    # downloaded checkpoint gives transformers and vLLM to parse).
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": EOS_TOKEN_ID, "pad_token_id": 2}, indent=2) + "\n")
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor_config(variant), indent=2) + "\n")
    (out / "processor_config.json").write_text(json.dumps(
        {"image_seq_len": image_seq_len(cfg), "processor_class": "SmolVLMProcessor"}, indent=2) + "\n")
    # The Hub checkpoints keep the template in chat_template.json (legacy
    # spelling); transformers 5 saved the tokenizer's as chat_template.jinja.
    (out / "chat_template.jinja").unlink(missing_ok=True)
    (out / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}, indent=2) + "\n")
    n_params = sum(p.numel() for p in model.parameters())
    log.info("built SmolVLM2-%s (text %d layers, vision %d layers) in %s: %.1f M parameters",
             variant, cfg["text_config"]["num_hidden_layers"], cfg["vision_config"]["num_hidden_layers"],
             out, n_params / 1e6)
    return out


def _source_hash() -> str:
    h = hashlib.sha256(Path(__file__).read_bytes())
    return h.hexdigest()[:12]


def ensure(cache_dir: str | os.PathLike, variant: str = "256m", *, text_layers: int = TEXT_LAYERS,
           vision_layers: int | None = -1) -> Path:
    """A ready folder under `cache_dir`, built once. `variant` may be "256m",
    "2.2b", a preset name ("smolvlm2-256m") or a hub id; vision_layers -1
    means the variant's default (DEFAULT_VISION_LAYERS), None the true depth."""
    variant = variant_of(variant)
    if vision_layers == -1:
        vision_layers = DEFAULT_VISION_LAYERS[variant]
    depth = f"t{text_layers}v{'full' if vision_layers is None else vision_layers}"
    return build_once(cache_dir, f"smolvlm2-{variant}-{depth}-v{BUILD_VERSION}-{_source_hash()}",
                      lambda tmp: build(tmp, variant, text_layers=text_layers, vision_layers=vision_layers))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--variant", type=variant_of, default="256m", help="256m, 2.2b or a preset name")
    parser.add_argument("--text-layers", type=int, default=TEXT_LAYERS)
    parser.add_argument("--vision-layers", type=int, default=None,
                        help="default: the variant's (see DEFAULT_VISION_LAYERS)")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    vision = args.vision_layers if args.vision_layers is not None else DEFAULT_VISION_LAYERS[args.variant]
    build(args.out_dir, args.variant, text_layers=args.text_layers, vision_layers=vision, seed=args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
