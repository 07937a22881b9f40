"""The tokenizer built from GGUF metadata equals the one transformers builds from the
same file, on generated text full of unicode, whitespace, digits and special tokens."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from radix.model_source import load_tokenizer
from radix.tokenizer import DEMO_SPECIAL_TOKENS
from tests.support.bpe import trained_bpe
from tests.support.gguf_files import write_llama_gguf

CORPUS = [f"document {i}: the quick brown fox {i * 7} jumps over lazy dogs" for i in range(200)]
PIECES = [*DEMO_SPECIAL_TOKENS, " ", "  ", "\n", "\t", "\r\n", "don't", "123", "4567", "é", "日本",
          "😀", "\u200d", "fox", " the", "quick", "<|", "|>", "\ufffd"]
TEXTS = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=6)), max_size=12).map("".join)


def tiny_tokenizer_gguf(path, add_bos_token):
    """A GGUF holding a tiny model and a trained BPE with the demo specials."""
    bpe = trained_bpe(CORPUS)
    config = LlamaConfig(vocab_size=bpe.get_vocab_size(), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)
    return write_llama_gguf(path, LlamaForCausalLM(config), bpe, add_bos_token=add_bos_token)


@pytest.fixture(scope="module", params=[True, False], ids=["bos", "no-bos"])
def tokenizers(request, tmp_path_factory):
    path = tiny_tokenizer_gguf(tmp_path_factory.mktemp("gguf") / "tok.gguf", request.param)
    return load_tokenizer(str(path)), AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXTS)
def test_encode_and_decode_equal_transformers(tokenizers, text):
    ours, theirs = tokenizers
    ids = ours.encode(text)
    assert ids == theirs.encode(text)
    assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False)
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)


def test_specials_and_chat_template_come_from_the_metadata(tokenizers):
    ours, theirs = tokenizers
    assert (ours.bos_token, ours.eos_token) == ("<|bos|>", "<|eos|>")
    messages = [{"role": "user", "content": "the quick fox"}]
    rendered = theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert ours.apply_chat_template(messages) == rendered
    assert ours.encode_chat(messages) == theirs.encode(rendered, add_special_tokens=False)
