"""TokenSpans finds exactly the ids a separate encode of a text's head would give, on
every byte-level tokenizer we ship, and refuses (None) where it cannot be sure."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radix.token_cache import safe_cuts
from radix.token_spans import TokenSpans
from radix.tokenizer import PromptTokenizer
from tests.radix.test_token_cache import TOKENIZERS, WORDS


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def tokenizer(request):
    return TOKENIZERS[request.param]


def _num_bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=WORDS, every=st.integers(1, 12))
def test_the_ids_before_each_safe_cut_are_the_encoding_of_the_text_before_it(
        tokenizer, text, every):
    spans = TokenSpans.of(tokenizer.tokenizer_json)
    ids = tokenizer.encode(text, False)
    for cut in safe_cuts(text, every):
        got = spans.tokens_before(ids, _num_bytes(text), _num_bytes(text[:cut]))
        if got is None:  # only when the tokenizer drops a byte it has no token for
            assert spans.tokens_before(ids, _num_bytes(text), 0) is None
            continue
        assert ids[:got] == tokenizer.encode(text[:cut], False)


def test_an_offset_inside_a_token_or_a_wrong_length_gives_none():
    tokenizer = TOKENIZERS["gpt2-bpe"]
    spans = TokenSpans.of(tokenizer.tokenizer_json)
    text = "Document 1: the quick brown fox"
    ids = tokenizer.encode(text, False)
    inside = [n for n in range(len(text) + 1) if spans.tokens_before(ids, len(text), n) is None]
    assert len(inside) == len(text) + 1 - len(ids) - 1  # merges: some token spans bytes
    assert spans.tokens_before(ids, len(text), len(text)) == len(ids)
    assert spans.tokens_before(ids, len(text) + 1, 0) is None


def test_a_byte_the_vocabulary_lacks_is_dropped_and_refused():
    spec = json.loads(PromptTokenizer.demo().tokenizer_json)
    del spec["model"]["vocab"]["ò"]  # byte 0xF2, which starts 4-byte UTF-8 sequences
    tokenizer = PromptTokenizer(json.dumps(spec), None, "<|bos|>", "<|eos|>")
    spans = TokenSpans.of(tokenizer.tokenizer_json)
    text = "a \U000b2ce1 b"
    ids = tokenizer.encode(text, False)
    assert len(ids) == _num_bytes(text) - 1
    assert spans.tokens_before(ids, _num_bytes(text), 1) is None
    assert spans.tokens_before(ids, _num_bytes(text) - 1, 1) == 1  # the bytes they stand for


def test_only_byte_level_tokenizers_have_spans():
    spec = json.loads(TOKENIZERS["gpt2-bpe"].tokenizer_json)
    spec["pre_tokenizer"] = {"type": "Whitespace"}
    assert TokenSpans.of(json.dumps(spec)) is None
    assert all(TokenSpans.of(t.tokenizer_json) is not None for t in TOKENIZERS.values())
