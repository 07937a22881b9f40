"""Blocks a consumer imports from another worker are never public (docs/pd.md): they
are cached in the request's scope even when the request names them public, so another
tenant never reads bytes that came over the transfer."""

from __future__ import annotations

from radix.keys import to_key
from tests.workers.kv.kv_test_support import make_manager, serve, write_kv

B = 4


def test_imported_blocks_stay_in_the_requests_scope_even_when_named_public():
    tokens = [(i * 13) % 97 + 1 for i in range(4 * B + 1)]
    producer, consumer = make_manager(16, B), make_manager(16, B)
    serve(producer, 1, tokens)
    held = producer.pin(-1, to_key(tokens), "t1")
    assert len(held) == 4
    serve(consumer, 1, tokens[: B + 1])  # one local block (scope t1)
    data = [producer.tensors.read_block(block) for block in held[1:]]
    # The request says its first 3 blocks are public: 1 local, 2 received.
    assert consumer.import_blocks(-2, to_key(tokens), "t1", 3 * B, B, data)
    consumer.check_invariants()
    assert consumer.prefix_cache.match(to_key(tokens), "t1").num_cached_tokens == 4 * B
    # Another tenant sees no received block: at most the local block, were it public.
    assert consumer.prefix_cache.match(to_key(tokens), "t2").num_cached_tokens <= B
    consumer.free(-2)
    producer.free(-1)
    consumer.check_invariants()


def test_a_local_public_prefix_stays_public_after_an_import():
    tokens = [(i * 7) % 89 + 1 for i in range(3 * B + 2)]
    producer, consumer = make_manager(16, B), make_manager(16, B)
    serve(producer, 1, tokens)
    held = producer.pin(-1, to_key(tokens), "t1")
    assert consumer.admit(1, tokens[: B + 1], "t1", num_public_tokens=B) == 0
    assert consumer.append_slots(1, B + 1)
    write_kv(consumer, 1, tokens, 0, B + 1)
    consumer.commit(1, tokens[: B + 1])  # its first block public
    consumer.free(1)
    data = [producer.tensors.read_block(block) for block in held[1:]]
    assert consumer.import_blocks(-2, to_key(tokens), "t1", B, B, data)
    assert consumer.prefix_cache.match(to_key(tokens), "t2").num_cached_tokens == B
    assert consumer.prefix_cache.match(to_key(tokens), "t1").num_cached_tokens == 3 * B
    consumer.free(-2)
    producer.free(-1)
    consumer.check_invariants()
