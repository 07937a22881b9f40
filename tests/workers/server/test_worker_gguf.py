"""A worker process serving a GGUF file: vLLM's naming rules, and greedy output equal
to transformers on the same file, also after a prefix-cache hit that ends mid-block."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from harness.procs import start_worker
from tests.support.bpe import trained_bpe
from tests.support.gguf_files import write_llama_gguf

# Its module-scoped processes start once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("worker_gguf")]
BLOCK_SIZE = 4
CORPUS = [f"report {i}: sales rose {i * 3} percent in the north" for i in range(200)]
SHARED = [17, 93, 5, 250, 31, 77, 140, 9, 66, 201]  # two whole blocks + 2 tokens
NUM_TOKENS = 24


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    bpe = trained_bpe(CORPUS)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=bpe.get_vocab_size(), hidden_size=64, intermediate_size=160,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, initializer_range=0.2)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    return write_llama_gguf(path, LlamaForCausalLM(config).eval(), bpe)


@pytest.fixture(scope="module")
def worker(gguf_path):
    process = start_worker("--model", str(gguf_path), "--served-model-name", "tiny", "alias",
                           "--block-size", str(BLOCK_SIZE))
    yield process
    process.stop()


def test_models_lists_every_served_name_with_its_context(worker, gguf_path):
    status, body = worker.get_json("/v1/models")
    assert status == 200
    assert [m["id"] for m in body["data"]] == ["tiny", "alias"]
    assert {m["root"] for m in body["data"]} == {str(gguf_path)}
    assert all(m["max_model_len"] == 256 for m in body["data"])
    status, body = worker.post_json("/v1/completions", {"model": "alias", "prompt": "report",
                                                        "max_tokens": 1})
    assert status == 200 and body["model"] == "alias"


def test_another_model_is_a_404_listing_the_served_names(worker):
    status, body = worker.post_json("/v1/completions", {"model": "gpt-5", "prompt": "x"})
    assert status == 404
    assert "'tiny', 'alias'" in body["error"]["message"]


def test_greedy_equals_transformers_after_a_mid_block_prefix_hit(worker, gguf_path):
    hf_model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    ).eval()
    hf_model.generation_config.eos_token_id = None
    hf_model.generation_config.pad_token_id = 0
    sampling = {"max_tokens": NUM_TOKENS, "temperature": 0, "ignore_eos": True}
    for suffix in ([3, 44, 120], [8, 8, 211, 57, 12]):
        prompt = SHARED + suffix
        status, body = worker.post_json("/generate", {"token_ids": prompt, "sampling": sampling})
        assert status == 200
        with torch.no_grad():
            expected = hf_model.generate(torch.tensor([prompt]), max_new_tokens=NUM_TOKENS,
                                         do_sample=False)[0, len(prompt):].tolist()
        assert body["choices"][0]["token_ids"] == expected
    assert body["usage"]["cached_tokens"] == len(SHARED)
