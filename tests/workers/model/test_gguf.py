"""GGUF checkpoints load like HF ones: same weights, same logits and greedy tokens as
transformers loading the same file, and errors that name the file and what is wrong."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from radix.model_source import load_tokenizer
from tests.support.bpe import trained_bpe
from tests.support.gguf_files import mixed_types, write_llama_gguf
from tests.workers.model.hf_checkpoints import (
    hf_greedy,
    new_caches,
    paged_greedy,
    random_prompt,
    shuffled_blocks,
)
from workers.model.gguf_weights import unpermute_rows
from workers.model.loader import load_model
from workers.model.runner import ModelRunner
from workers.model.step_input import StepInput

CORPUS = [f"document {i}: the quick brown fox {i * 7} jumps over lazy dogs" for i in range(200)]
BLOCK_SIZE = 4
NUM_BLOCKS = 40


def tiny_llama(vocab_size: int, seed: int = 0, **overrides: object) -> LlamaForCausalLM:
    """A random transformers Llama whose greedy choices are far from ties."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        initializer_range=0.2, rope_theta=10000.0, **overrides,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def bpe():
    return trained_bpe(CORPUS)


@pytest.fixture
def gguf_file(tmp_path, bpe):
    model = tiny_llama(bpe.get_vocab_size())
    return write_llama_gguf(tmp_path / "tiny.gguf", model, bpe), model


def test_all_f32_file_loads_exactly_the_original_weights(tmp_path, bpe):
    model = tiny_llama(bpe.get_vocab_size(), tie_word_embeddings=True)
    path = write_llama_gguf(tmp_path / "f32.gguf", model, bpe,
                            tensor_type=lambda _: GGMLQuantizationType.F32)
    loaded = load_model(path)
    assert loaded.config.tie_word_embeddings
    ours = loaded.model.state_dict()
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(ours[name], tensor, rtol=0, atol=0, msg=name)


def test_logits_and_greedy_tokens_match_transformers_on_the_same_file(gguf_file):
    path, _ = gguf_file
    hf_model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    loaded = load_model(path)
    prompt = random_prompt(19, vocab=loaded.config.vocab_size)
    runner = ModelRunner(loaded.model, *new_caches(loaded.model, NUM_BLOCKS, BLOCK_SIZE), BLOCK_SIZE)
    with torch.no_grad():
        expected = hf_model(torch.tensor([prompt])).logits[0, -1]
    logits = runner.execute([StepInput(prompt, 0, shuffled_blocks(NUM_BLOCKS)[:13])])[0]
    assert (logits - expected).abs().max().item() < 1e-4
    blocks = shuffled_blocks(NUM_BLOCKS, seed=2)[:13]
    assert paged_greedy(runner, prompt, 32, blocks) == hf_greedy(hf_model, prompt, 32)


def test_unpermute_inverts_the_converter_permutation():
    rows = np.arange(2 * 8 * 3, dtype=np.float32).reshape(16, 3)
    permuted = rows.reshape(2, 2, 4, 3).swapaxes(1, 2).reshape(16, 3)
    np.testing.assert_array_equal(unpermute_rows(permuted, 2), rows)


def test_gguf_tokenizer_is_the_same_for_router_and_worker(gguf_file):
    path, _ = gguf_file
    assert load_tokenizer(str(path)).digest == load_model(path).tokenizer.digest


def test_weights_digest_covers_the_file(tmp_path, bpe):
    model = tiny_llama(bpe.get_vocab_size())
    first = load_model(write_llama_gguf(tmp_path / "a.gguf", model, bpe)).weights_digest
    with torch.no_grad():
        model.model.norm.weight[0] += 1.0
    second = load_model(write_llama_gguf(tmp_path / "b.gguf", model, bpe)).weights_digest
    assert first != second
    assert load_model(tmp_path / "a.gguf").weights_digest == first


def test_unsupported_architecture_is_one_line_naming_it(tmp_path):
    writer = GGUFWriter(str(tmp_path / "m.gguf"), "mamba")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"m\.gguf: general.architecture 'mamba' is not supported"):
        load_model(tmp_path / "m.gguf")


def test_unsupported_tensor_type_is_named(tmp_path, bpe):
    def types(name):
        return GGMLQuantizationType.IQ4_NL if name == "blk.0.ffn_up.weight" else mixed_types(name)

    path = write_llama_gguf(tmp_path / "iq.gguf", tiny_llama(bpe.get_vocab_size()), bpe, types)
    with pytest.raises(ValueError, match=r"iq\.gguf: tensor 'blk.0.ffn_up.weight' has type IQ4_NL"):
        load_model(path)
