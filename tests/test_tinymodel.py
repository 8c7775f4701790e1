"""The tiny model builder: deterministic, offline, complete folders."""

from __future__ import annotations

import hashlib
import json

import pytest

from vidchat.devtools import tinymodel

pytestmark = pytest.mark.unit


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_build_is_deterministic_and_complete(tmp_path):
    a = tinymodel.build(tmp_path / "a", "vl")
    b = tinymodel.build(tmp_path / "b", "vl")
    for name in ("model.safetensors", "tokenizer.json", "config.json", "chat_template.jinja"):
        assert (a / name).exists(), name
        assert digest(a / name) == digest(b / name), f"{name} differs between two builds"
    config = json.loads((a / "config.json").read_text())
    tokenizer = json.loads((a / "tokenizer.json").read_text())
    vocab = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    # Token ids in the config are the tokenizer's, not the real model's.
    assert config["image_token_id"] == vocab["<|image_pad|>"]
    assert config["video_token_id"] == vocab["<|video_pad|>"]


def test_ensure_builds_once_into_the_cache(tmp_path):
    first = tinymodel.ensure(tmp_path, "vl")
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    again = tinymodel.ensure(tmp_path, "vl")
    assert again == first and (again / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no half-built leftovers


def test_the_end_tokens_have_zero_output_weights(tmp_path):
    """Greedy decoding of the tiny model never ends a reply on its own (the
    end tokens' logits are exactly 0, the best of the others is positive), so
    tests of long answers get long answers on every CPU."""
    from safetensors.numpy import load_file

    folder = tinymodel.build(tmp_path / "m", "omni")
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    vocab = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    stops = [vocab["<|im_end|>"], vocab["<|endoftext|>"]]
    weights = load_file(str(folder / "model.safetensors"))
    heads = [name for name in weights if name.endswith("lm_head.weight")]
    assert heads
    for name in heads:
        head = weights[name]
        assert not head[stops].any(), name
        others = [i for i in range(head.shape[0]) if i not in stops]
        assert (abs(head[others]).sum(axis=1) > 0).all(), name  # only the end tokens
