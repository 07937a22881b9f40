"""Loader: sharded and single files, errors naming the file or tensor, weights digest."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from workers.model.demo import write_demo_checkpoint
from workers.model.loader import load_model


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return write_demo_checkpoint(tmp_path_factory.mktemp("demo"))


@pytest.fixture
def checkpoint(tmp_path, demo_dir):
    path = tmp_path / "ckpt"
    shutil.copytree(demo_dir, path)
    return path


def rewrite_weights(path, edit):
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def shard(path):
    tensors = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, path / file, metadata={"format": "pt"})
    weight_map = {n: file for file, part in halves.items() for n in part}
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_sharded_checkpoint_loads_the_same_weights(checkpoint, demo_dir):
    single = load_model(demo_dir)
    shard(checkpoint)
    sharded = load_model(checkpoint)
    for (name, a), (_, b) in zip(
        single.model.state_dict().items(), sharded.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert sharded.weights_digest != single.weights_digest  # different files, different digest


def test_digest_is_stable_and_sees_one_changed_weight(checkpoint, demo_dir):
    before = load_model(checkpoint).weights_digest
    assert before == load_model(demo_dir).weights_digest

    def nudge(tensors):
        tensors["model.norm.weight"][7] += 1e-3

    rewrite_weights(checkpoint, nudge)
    assert load_model(checkpoint).weights_digest != before


def test_dtype_and_eval_mode(demo_dir):
    loaded = load_model(demo_dir, dtype=torch.bfloat16)
    assert loaded.model.lm_head.weight.dtype is torch.bfloat16
    assert not loaded.model.training
    assert loaded.tokenizer.eos_token_ids == (257,)


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda p: (p / "config.json").unlink(), "config.json: missing model config"),
        (lambda p: (p / "model.safetensors").unlink(), "model.safetensors: missing weights"),
        (lambda p: (p / "tokenizer.json").unlink(), "tokenizer.json: missing tokenizer file"),
        (lambda p: (p / "model.safetensors").write_bytes(b"garbage"), "model.safetensors: invalid"),
        (
            lambda p: rewrite_weights(p, lambda t: t.pop("model.layers.3.mlp.up_proj.weight")),
            "tensor 'model.layers.3.mlp.up_proj.weight' missing from model.safetensors",
        ),
        (
            lambda p: rewrite_weights(
                p, lambda t: t.update({"model.norm.weight": torch.ones(255)})
            ),
            r"model.safetensors: tensor 'model.norm.weight' has shape \(255,\)",
        ),
        (
            lambda p: rewrite_weights(p, lambda t: t.update({"extra.weight": torch.ones(2)})),
            "model.safetensors: unexpected tensor 'extra.weight'",
        ),
    ],
)
def test_broken_checkpoints_name_the_file_or_tensor(checkpoint, breakage, message):
    breakage(checkpoint)
    with pytest.raises(ValueError, match=message):
        load_model(checkpoint)


def test_missing_shard_is_named(checkpoint):
    shard(checkpoint)
    (checkpoint / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ValueError, match="index.json: shard model-00002-of-00002.safetensors"):
        load_model(checkpoint)


def test_tokenizer_larger_than_vocab_is_rejected(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())
    config["vocab_size"] = 128
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="tokenizer.json: 262 tokens exceed vocab_size 128"):
        load_model(checkpoint)
