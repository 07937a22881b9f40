"""Pinning a cached prefix for a transfer and importing pulled blocks (prefill/decode
disaggregation, docs/pd.md): what a consumer imports reads exactly as the producer's
cache held it, whatever part of the prefix the consumer had already, and the pool's
invariants hold throughout."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radix.keys import to_key
from tests.workers.kv.kv_test_support import assert_reads, make_manager, serve

B = 4


@settings(max_examples=40, deadline=None)
@given(num_blocks=st.integers(1, 6), tail=st.integers(0, B - 1),
       num_local=st.integers(0, 6), seed=st.integers(0, 1000))
def test_imported_blocks_read_as_the_producer_wrote_them(num_blocks, tail, num_local, seed):
    tokens = [(seed * 7 + i * 13) % 97 + 1 for i in range(num_blocks * B + tail)]
    producer, consumer = make_manager(16, B), make_manager(16, B)
    serve(producer, 1, tokens)
    held = producer.pin(-1, to_key(tokens), "t1")
    assert len(held) == num_blocks
    producer.check_invariants()
    num_local = min(num_local, num_blocks)
    if num_local:
        serve(consumer, 1, tokens[: num_local * B])
    data = [producer.tensors.read_block(block) for block in held[num_local:]]
    assert consumer.import_blocks(-1, to_key(tokens), "t1", 0, num_local * B, data)
    consumer.check_invariants()
    producer.free(-1)
    producer.check_invariants()
    assert consumer.admit(2, tokens, "t1") == min(num_blocks * B, len(tokens) - 1)
    assert_reads(consumer, 2, tokens, num_blocks * B if tail else len(tokens) - 1)
    consumer.free(2)
    consumer.free(-1)
    consumer.check_invariants()


def test_a_pin_keeps_its_blocks_from_eviction_and_import_refuses_a_lost_prefix():
    producer = make_manager(4, B)
    tokens = list(range(1, 2 * B + 1))
    serve(producer, 1, tokens)
    held = producer.pin(-1, to_key(tokens), "t1")
    assert len(held) == 2
    assert producer.admit(2, list(range(50, 50 + 3 * B)), "t1") is None  # 2 free, 2 pinned
    producer.free(-1)
    assert producer.admit(2, list(range(50, 50 + 3 * B)), "t1") == 0  # evictable now
    producer.check_invariants()
    consumer = make_manager(8, B)
    with pytest.raises(ValueError, match="whole blocks"):
        consumer.import_blocks(-1, to_key(tokens), "t1", 0, 1, [])
    assert not consumer.import_blocks(-1, to_key(tokens), "t1", 0, B, [b"x"])  # not held
    consumer.check_invariants()
    assert producer.pin(-5, to_key([99] * 3), "t1") == []  # nothing whole to hold
