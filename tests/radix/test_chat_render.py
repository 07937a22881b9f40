"""Chats through the token cache: incremental render + cached encode equals full render
+ full encode on every template we package or test, over conversations that grow,
branch and move between scopes; one scope's conversations never serve another's."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radix.token_cache import PrefixTokenCache
from radix.tokenizer import DEMO_SPECIAL_TOKENS
from radix.tree import PUBLIC, Scope
from tests.support.chat_templates import chat_tokenizers

TOKENIZERS = chat_tokenizers()
SCOPES = [Scope("alice"), Scope("bob"), PUBLIC]
WORDS = st.sampled_from(["the", " user", " said", "hi", "  ", "\n", "héllo", "😀", " 12",
                         "<first>", "<|"])
CONTENT = st.lists(WORDS, max_size=10).map("".join)
# now and then a special-token string in content (masked: rendered in full) or a role
# some templates refuse (an error, the same both ways)
RARE = st.sampled_from([*DEMO_SPECIAL_TOKENS[:3], "tool"])
PLAIN = st.fixed_dictionaries({
    "role": st.sampled_from(["system", "user", "assistant"]), "content": CONTENT})
MESSAGE = st.one_of(*[PLAIN] * 9, st.tuples(RARE, CONTENT).map(
    lambda rare: {"role": "tool", "content": rare[1]} if rare[0] == "tool"
    else {"role": "user", "content": rare[0] + rare[1]}))
# (scope, how many messages of the conversation, a message to branch with, generation
# prompt), in order of length: a conversation grows, now and then in another scope
REQUESTS = st.lists(st.tuples(st.sampled_from([0, 0, 0, 1, 2]), st.integers(1, 10),
                              st.one_of(st.none(), st.none(), st.none(), MESSAGE),
                              st.booleans()),
                    min_size=1, max_size=12).map(lambda rs: sorted(rs, key=lambda r: r[1]))


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def named(request):
    return TOKENIZERS[request.param]


def _full(tokenizer, messages, generation):
    try:
        return tokenizer.encode_chat(messages, generation)
    except ValueError as exc:
        return str(exc)


def _cached(cache, messages, scope, generation):
    try:
        return cache.encode_chat(messages, scope, generation)
    except ValueError as exc:
        return str(exc)


def _shared(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conversation=st.lists(MESSAGE, min_size=1, max_size=10), requests=REQUESTS)
def test_cached_chats_equal_full_renders_and_never_cross_scopes(named, conversation, requests):
    tokenizer, _ = named
    cache = PrefixTokenCache(tokenizer, chunk_chars=8)
    seen: dict[Scope, list[list]] = {scope: [] for scope in SCOPES}
    for scope_index, length, branch, generation in requests:
        scope = SCOPES[scope_index]
        messages = conversation[:length]
        if branch is not None:
            messages = [*messages[:-1], branch]
        before = cache.stats()
        assert _cached(cache, messages, scope, generation) == _full(tokenizer, messages,
                                                                    generation)
        after = cache.stats()
        visible = seen[scope] + (seen[PUBLIC] if scope != PUBLIC else [])
        most = max((_shared(messages, old) for old in visible), default=0)
        assert after.num_reused_messages - before.num_reused_messages <= most
        seen[scope].append(messages)
        cache.check_invariants()


def test_each_turn_renders_only_its_new_messages_in_its_own_scope():
    for name, (tokenizer, incremental) in TOKENIZERS.items():
        cache = PrefixTokenCache(tokenizer)
        messages = [{"role": "system", "content": "be brief"}]
        for turn in range(6):
            messages.append({"role": "user", "content": f"question {turn}"})
            before = cache.stats()
            assert _cached(cache, messages, Scope("alice"), True) == _full(tokenizer, messages,
                                                                           True)
            reused = cache.stats().num_reused_messages - before.num_reused_messages
            assert reused == (len(messages) - 2 if incremental and turn else 0), name
            messages.append({"role": "assistant", "content": f"answer {turn}"})
        before = cache.stats()
        cache.encode_chat(messages, Scope("bob"))
        assert cache.stats().num_reused_messages == before.num_reused_messages, name
        assert cache.stats().num_reused_chars == before.num_reused_chars, name


def test_a_public_conversation_prefix_serves_every_scope():
    tokenizer, _ = TOKENIZERS["demo"]
    cache = PrefixTokenCache(tokenizer)
    system = [{"role": "system", "content": "You are a helpful assistant. " * 20}]
    cache.encode_chat(system, PUBLIC, add_generation_prompt=False)
    for scope in (Scope("alice"), Scope("bob")):
        before = cache.stats()
        messages = [*system, {"role": "user", "content": f"I am {scope}"}]
        assert cache.encode_chat(messages, scope) == tokenizer.encode_chat(messages)
        assert cache.stats().num_reused_messages - before.num_reused_messages == 1
        assert cache.stats().num_reused_chars - before.num_reused_chars > 500


def test_long_conversations_stay_within_the_budget():
    tokenizer, _ = TOKENIZERS["demo"]
    budget = 100_000
    cache = PrefixTokenCache(tokenizer, max_chars=budget)
    messages: list[dict[str, str]] = []
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        for turn in range(150):
            messages.append({"role": "user" if turn % 2 else "assistant",
                             "content": f"turn {turn} " + "words and more words " * 10})
            assert cache.encode_chat(messages, Scope("t")) == tokenizer.encode_chat(messages)
        grown, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert cache.num_stored_units() <= budget
    assert grown - base < 8 * budget
    cache.check_invariants()
