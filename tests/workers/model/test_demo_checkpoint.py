"""The demo checkpoint: deterministic bytes, cached once, a real HF directory."""

from __future__ import annotations

import hashlib

import torch
import transformers

from radix.tokenizer import PromptTokenizer
from tests.workers.model.hf_checkpoints import (
    hf_greedy,
    new_caches,
    paged_greedy,
    random_prompt,
    shuffled_blocks,
)
from workers.model.demo import demo_dir_name, ensure_demo_checkpoint, write_demo_checkpoint
from workers.model.loader import load_model
from workers.model.runner import ModelRunner
from workers.model.step_input import StepInput

# Golden hashes: a change here changes what "demo" means; bump DEMO_VERSION with it.
GOLDEN_SHA256 = {
    "config.json": "a816fd989c5cd66b24debc0210a00bee3b747a66f25e058ba32fa2a3d3ae9c7c",
    "generation_config.json": "a0d88dd58d4b57d77a17e268a5af2c442936eed5cae64e43d746aa99c3ff80ed",
    "model.safetensors": "0b36f7a06904d0c41f25c8ae7b47badb904352358957a8ea92242e7b655afc39",
    "tokenizer.json": "7439227104705848acca2a58be758747ce628f272fa4daa3ac06c7689c05074b",
    "tokenizer_config.json": "1d4fc2114cec321b2ef0b7a0d49547c0807026a6b8dcf9e6cacf2db2e01326f1",
}


def file_hashes(path):
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


def test_two_writes_are_byte_identical_and_golden(tmp_path):
    first = file_hashes(write_demo_checkpoint(tmp_path / "a"))
    assert first == file_hashes(write_demo_checkpoint(tmp_path / "b"))
    assert first == GOLDEN_SHA256


def test_ensure_writes_once_and_loads_like_any_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIX_ROUTER_CACHE", str(tmp_path))
    path = ensure_demo_checkpoint()
    assert path == tmp_path / demo_dir_name()
    assert path.name.startswith("demo-1-")
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_demo_checkpoint() == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no staging left behind

    loaded = load_model(path)
    config = loaded.config
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (256, 4, 320)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (8, 4, 32)
    assert loaded.tokenizer.digest == PromptTokenizer.demo().digest


def test_transformers_runs_the_demo_checkpoint_identically(tmp_path):
    path = ensure_demo_checkpoint(tmp_path)
    hf_model = transformers.LlamaForCausalLM.from_pretrained(path).eval()
    loaded = load_model(path)
    prompt = loaded.tokenizer.encode("The demo model speaks bytes. ") + random_prompt(20)
    runner = ModelRunner(loaded.model, *new_caches(loaded.model, 16, 16), 16)
    logits = runner.execute([StepInput(prompt, 0, [3, 1, 2, 0])])
    with torch.no_grad():
        expected = hf_model(torch.tensor([prompt])).logits[0, -1]
    assert (logits[0] - expected).abs().max().item() < 1e-4
    tokens = paged_greedy(runner, prompt, 8, shuffled_blocks(16)[:4])
    assert tokens == hf_greedy(hf_model, prompt, 8)
