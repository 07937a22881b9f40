"""The embedded default model, SmolLM2-135M-Instruct from its PyPI package's GGUF,
against transformers loading the same file (skipped when the package is absent)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from radix.model_source import load_tokenizer, packaged_model_path
from tests.workers.model.hf_checkpoints import hf_greedy, new_caches, paged_greedy
from workers.model.loader import load_model
from workers.model.runner import ModelRunner
from workers.model.step_input import StepInput

NAME = "SmolLM2-135M-Instruct"
PROMPTS = (
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a primary color."}],
)
TEXTS = st.text(max_size=40) | st.sampled_from(["<|im_start|>user\nhi<|im_end|>", " 2024 12345",
                                                "don't  \n\n tabs\t", "日本語 😀"])

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory):
    try:
        path = packaged_model_path(NAME)
    except ValueError as exc:
        pytest.skip(str(exc))
    root = tmp_path_factory.mktemp("smollm2")
    (root / path.name).symlink_to(path)
    return root / path.name


@pytest.fixture(scope="module")
def hf_tokenizer(gguf_dir):
    return AutoTokenizer.from_pretrained(gguf_dir.parent, gguf_file=gguf_dir.name)


@pytest.fixture(scope="module")
def ours_tokenizer(gguf_dir):
    return load_tokenizer(NAME)


@settings(max_examples=1000, deadline=None)
@given(text=TEXTS)
def test_tokenizer_equals_transformers(ours_tokenizer, hf_tokenizer, text):
    assert ours_tokenizer.encode(text) == hf_tokenizer.encode(text)


def test_logits_and_greedy_tokens_match_transformers(gguf_dir):
    hf_model = AutoModelForCausalLM.from_pretrained(
        gguf_dir.parent, gguf_file=gguf_dir.name, dtype=torch.float32
    ).eval()
    loaded = load_model(gguf_dir)
    runner = ModelRunner(loaded.model, *new_caches(loaded.model, 16, 16), 16)
    answers = []
    for messages in PROMPTS:
        prompt = loaded.tokenizer.encode_chat(messages)
        with torch.no_grad():
            expected = hf_model(torch.tensor([prompt])).logits[0, -1]
            logits = runner.execute([StepInput(prompt, 0, list(range(16)))])[0]
        assert (logits - expected).abs().max().item() < 1e-3
        answers.append(paged_greedy(runner, prompt, 8, list(range(16))))
        assert answers[-1] == hf_greedy(hf_model, prompt, 8)
    assert "Paris" in loaded.tokenizer.decode(answers[0])
