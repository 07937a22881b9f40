"""The prefix token cache returns exactly what a full encode returns, on every
tokenizer we ship, for texts built to share prefixes and to put seams in bad places."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from radix.gguf_tokenizer import SPLIT_REGEXES
from radix.token_cache import NullTokenCache, PrefixTokenCache, eligible, safe_cuts, token_cache
from radix.tokenizer import DEMO_CHAT_TEMPLATE, DEMO_SPECIAL_TOKENS, PromptTokenizer
from radix.tree import PUBLIC, Scope
from tests.support.bpe import merging_bpe
from tests.support.tokenizers import packaged_smollm2

CORPUS = [f"Document {i}: the quick brown fox's {i * 37} jumps, over 'lazy' dogs!\n" for i in range(300)]
PIECES = [" ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", " \n", "\xa0", "\x85", "\u2009", "\u3000",
          "\x1c", "the", " the", "fox", "'s", "'ll", "123", "4567", "1", ".", "!!", "é", "日本",
          "😀", "👩\u200d💻", "e\u0301", "<|", "|>", *DEMO_SPECIAL_TOKENS]
WORDS = st.lists(st.sampled_from(PIECES) | st.text(max_size=4), max_size=40).map("".join)


def _split_bpe(pattern: str) -> PromptTokenizer:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=list(DEMO_SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(CORPUS, trainer)
    return PromptTokenizer(bpe.to_str(), DEMO_CHAT_TEMPLATE, "<|bos|>", "<|eos|>")


def _tokenizers() -> dict[str, PromptTokenizer]:
    found = {
        "demo": PromptTokenizer.demo(),
        "gpt2-bpe": merging_bpe(CORPUS, DEMO_CHAT_TEMPLATE),
        "llama3-split": _split_bpe(SPLIT_REGEXES["llama3"]),
        "qwen2-split": _split_bpe(SPLIT_REGEXES["qwen2"]),
    }
    smollm2 = packaged_smollm2()
    if smollm2 is not None:
        found["smollm2"] = smollm2
    return found


TOKENIZERS = _tokenizers()


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def tokenizer(request):
    return TOKENIZERS[request.param]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=WORDS, tails=st.lists(st.tuples(st.integers(0, 400), WORDS), min_size=1, max_size=6),
       bos=st.booleans())
def test_every_encode_equals_a_full_encode(tokenizer, base, tails, bos):
    cache = PrefixTokenCache(tokenizer, chunk_chars=8)
    texts = [base]
    for keep, tail in tails:
        texts.append(texts[keep % len(texts)][:keep] + tail)
        texts.append(texts[-1] + tail)
    for text in texts:
        assert cache.encode(text, Scope("t"), bos) == tokenizer.encode(text, bos), repr(text)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.lists(WORDS, min_size=1, max_size=6))
def test_growing_chats_equal_full_encodes(tokenizer, turns):
    cache = PrefixTokenCache(tokenizer, chunk_chars=16).scoped(Scope("alice"))
    messages = []
    for i, content in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": content})
        assert cache.encode_chat(messages) == tokenizer.encode_chat(messages)


def test_a_repeated_document_is_tokenized_once_and_only_in_its_scope():
    tokenizer = TOKENIZERS["gpt2-bpe"]
    cache = PrefixTokenCache(tokenizer)
    document = " ".join(CORPUS[:40])
    cache.encode(document + " Question one?", Scope("alice"))
    reused = cache.stats().num_reused_chars
    assert cache.encode(document + " Question two?", Scope("bob")) == tokenizer.encode(
        document + " Question two?")
    assert cache.stats().num_reused_chars == reused  # bob sees nothing of alice's
    cache.encode(document + " Question three?", Scope("alice"))
    # reused up to its first new word, the last safe cut it shares with "one?"
    assert cache.stats().num_reused_chars - reused == len(document + " Question")
    cache.encode(document, PUBLIC)
    before = cache.stats().num_reused_chars
    cache.encode(document + " Four?", Scope("carol"))
    assert cache.stats().num_reused_chars - before > len(document) - 128


def test_the_cache_stays_within_its_character_budget():
    tokenizer = TOKENIZERS["gpt2-bpe"]
    cache = PrefixTokenCache(tokenizer, max_chars=2_000)
    for i in range(50):
        text = f"{i} " + CORPUS[i] * 3
        assert cache.encode(text, Scope("t")) == tokenizer.encode(text)
    assert cache.num_stored_units() <= 2_000
    cache.check_invariants()


def test_safe_cuts_are_spaces_after_non_whitespace():
    text = "ab  cd ef\tgh ij"
    assert safe_cuts(text, 1) == [2, 6, 12]
    assert safe_cuts("   ", 1) == [] and safe_cuts("", 4) == []


def test_tokenizers_that_cuts_would_change_get_the_null_cache():
    bpe = Tokenizer.from_str(merging_bpe(CORPUS).tokenizer_json)
    bpe.normalizer = normalizers.Lowercase()
    lowered = PromptTokenizer(bpe.to_str(), None, "<|bos|>", "<|eos|>")
    assert not eligible(lowered.tokenizer_json)
    assert isinstance(token_cache(lowered, 1000), NullTokenCache)
    assert isinstance(token_cache(TOKENIZERS["gpt2-bpe"], 0), NullTokenCache)
    assert all(eligible(t.tokenizer_json) for t in TOKENIZERS.values())


def test_memory_is_bounded_by_the_budget_for_a_long_shared_prefix():
    """A long prefix plus short unique suffixes: each entry's ids count, not only its
    new characters, so memory stays proportional to the budget."""
    tokenizer = TOKENIZERS["gpt2-bpe"]
    budget = 200_000
    cache = PrefixTokenCache(tokenizer, max_chars=budget)
    prefix = " ".join(CORPUS[:300])[:40_000]
    cache.encode(prefix, Scope("t"))
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        for i in range(100):
            cache.encode(f"{prefix} {i:05d}", Scope("t"))
        grown, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert grown - base < 8 * budget
    cache.check_invariants()


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.tuples(st.integers(0, 300), WORDS), min_size=1, max_size=12),
       budget=st.integers(1, 3_000))
def test_what_the_cache_holds_never_exceeds_its_budget(texts, budget):
    tokenizer = TOKENIZERS["gpt2-bpe"]
    cache = PrefixTokenCache(tokenizer, max_chars=budget, chunk_chars=8)
    document = " ".join(CORPUS[:10])
    for keep, tail in texts:
        text = document[:keep] + tail
        assert cache.encode(text, Scope("t")) == tokenizer.encode(text)
        cache.check_invariants()
        assert cache.num_stored_units() <= budget


def _shared_chars(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=WORDS, steps=st.lists(st.tuples(st.sampled_from([Scope("a"), Scope("b"), PUBLIC]),
                                            st.integers(0, 400), WORDS), min_size=1, max_size=10))
def test_scopes_share_only_public_text_and_every_encode_is_exact(tokenizer, base, steps):
    """Texts sharing prefixes, encoded by two tenants and the public scope: each encode
    equals a full encode, and what one reuses (stats) never exceeds what its own or
    public earlier texts share with it, so a private prefix never serves another."""
    cache = PrefixTokenCache(tokenizer, chunk_chars=8)
    seen: dict[Scope, list[str]] = {Scope("a"): [], Scope("b"): [], PUBLIC: []}
    texts = [base]
    for scope, keep, tail in steps:
        text = texts[keep % len(texts)][:keep] + tail
        texts.append(text)
        before = cache.stats().num_reused_chars
        assert cache.encode(text, scope, False) == tokenizer.encode(text, False), repr(text)
        visible = seen[scope] + (seen[PUBLIC] if scope != PUBLIC else [])
        assert cache.stats().num_reused_chars - before <= max(
            (_shared_chars(text, old) for old in visible), default=0)
        seen[scope].append(text)
    cache.check_invariants()

