"""SmolVLM2's vocabulary for the random-weight builds of
:mod:`vidchat.devtools.archbuild_smolvlm`: its special tokens at their real
ids, its chat template, and a small trained byte-level BPE padded so those
tokens land where the real checkpoints have them (see archbuild_smolvlm's
docstring for where each value comes from).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from vidchat.devtools.tinymodel import training_text

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

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

