"""The host tier: evicted blocks move to sealed host memory and come back on a hit
with the same K/V; tampered or misfiled blocks are refused, dropped and counted."""

from __future__ import annotations

import time
from dataclasses import replace

from radix.keys import to_key
from tests.workers.kv.kv_test_support import (
    EventConsumer,
    assert_reads,
    make_manager,
    serve,
    write_kv,
)

B = 4
A = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # two full blocks and one token
FILLER = [[50 + 10 * i + j for j in range(2 * B)] for i in range(3)]


def evicted_to_host(num_host_blocks: int = 16):
    """A 6-block pool where A was cached, then pushed out by three fillers."""
    manager = make_manager(6, B, num_host_blocks=num_host_blocks)
    assert serve(manager, 1, A) == 0
    for i, filler in enumerate(FILLER):
        serve(manager, 10 + i, filler)
    tree = manager.prefix_cache.tree
    assert tree.match(bytes(4 * len(A)), "t1").num_matched_tokens == 0
    return manager


def test_an_evicted_prefix_comes_back_from_the_host_tier_as_cached():
    manager = evicted_to_host()
    host = manager.prefix_cache.tiers.host
    assert host.stats().num_host_blocks_used >= 2
    num_cached = manager.admit(99, A + [7], "t1")
    assert num_cached == 2 * B  # the two full blocks, restored, count as cached
    assert_reads(manager, 99, A + [7], num_cached)
    stats = manager.stats().host
    assert stats.host_hit_blocks_total == 2 and stats.host_auth_failures_total == 0
    assert stats.host_bytes_to_device_total == 2 * manager.tensors.spec.kv_bytes_per_block
    manager.free(99)
    manager.check_invariants()


def test_events_name_the_medium_and_replay_to_the_host_contents():
    manager = evicted_to_host()
    consumer = EventConsumer(B)
    log = manager.event_log
    consumer.apply(log.since(-1, log.epoch))
    held = {h.hex() for h, _ in manager.prefix_cache.tiers.host.entries()}
    assert held and consumer.host_hashes == held
    serve(manager, 99, A + [7])
    consumer.apply(log.since(consumer.last_seq, log.epoch))
    assert consumer.host_hashes == {h.hex() for h, _ in manager.prefix_cache.tiers.host.entries()}
    head, snapshot = manager.snapshot()
    fresh = EventConsumer(B)
    fresh.apply(snapshot, snapshot=True)
    assert fresh.host_hashes == consumer.host_hashes and fresh.blocks == consumer.blocks


def test_a_tampered_host_block_is_dropped_counted_and_never_used():
    manager = evicted_to_host()
    host = manager.prefix_cache.tiers.host
    entries = dict(host.entries())
    first = next(h for h, e in entries.items() if e.parent is None and e.tokens[:4] == b"\x01\0\0\0")
    flipped = bytearray(entries[first].sealed)
    flipped[20] ^= 1
    host._blocks[first] = replace(entries[first], sealed=bytes(flipped))
    assert manager.admit(99, A + [7], "t1") == 0
    assert manager.stats().host.host_auth_failures_total == 1
    assert first not in dict(host.entries())
    manager.free(99)
    manager.check_invariants()


def test_a_block_filed_under_another_hash_or_scope_fails_authentication():
    manager = evicted_to_host()
    host = manager.prefix_cache.tiers.host
    (h1, e1), (h2, e2) = host.entries()[:2]
    host._blocks[h1], host._blocks[h2] = replace(e1, sealed=e2.sealed), replace(e2, sealed=e1.sealed)
    assert host.take(h1, 0) is None and host.take(h2, 0) is None
    host = evicted_to_host().prefix_cache.tiers.host
    (h3, e3) = host.entries()[0]
    host._blocks[h3] = replace(e3, scope="t2")  # filed under another tenant's key
    assert host.take(h3, 0) is None
    assert host.stats().host_auth_failures_total == 1


def test_another_tenant_never_hits_the_host_blocks():
    manager = evicted_to_host()
    assert manager.admit(99, A + [7], "t2") == 0
    assert manager.stats().host.host_hit_blocks_total == 0


def test_a_full_host_tier_drops_its_oldest_blocks():
    manager = evicted_to_host(num_host_blocks=2)
    host = manager.prefix_cache.tiers.host
    assert host.stats().num_host_blocks_used == 2
    assert serve(manager, 99, A + [7]) == 0  # A's blocks were the oldest: dropped


def test_swap_out_moves_a_preempted_sequence_to_the_host_tier():
    manager = make_manager(6, B, num_host_blocks=8)
    tokens = A + [10, 11, 12]
    assert manager.admit(1, tokens, "t1") == 0
    assert manager.append_slots(1, len(tokens))
    write_kv(manager, 1, tokens, 0, len(tokens))
    freed = manager.swap_out(1, tokens)
    assert freed == 3 and manager.pool.num_free_blocks == 6
    assert manager.prefix_cache.tiers.host.stats().num_host_blocks_used == 3
    assert manager.admit(2, tokens + [1], "t1") == 3 * B
    assert_reads(manager, 2, tokens + [1], 3 * B)
    manager.check_invariants()


def file_under(manager, scope: str, tokens: list[int]) -> None:
    """Put the first block of A (tenant t1's) in the host tier under the hash of the
    first block of ``tokens`` in ``scope``, sealed for that hash: what a hash collision
    (possible with ``xxh3_128``) would hold there."""
    link, host = manager.prefix_cache.tiers, manager.prefix_cache.tiers.host
    own = link._chainer.block_hash(None, "t1", to_key(A[:B]))
    entry = dict(host.entries())[own]
    data = host._sealer.open("t1", own, entry.sealed)
    other = link._chainer.block_hash(None, scope, to_key(tokens[:B]))
    host._blocks[other] = replace(entry, sealed=host._sealer.seal("t1", other, data))


def test_a_colliding_hash_never_gives_a_block_of_another_scope_or_other_tokens():
    manager = evicted_to_host()
    file_under(manager, "t2", A)
    assert manager.admit(98, A + [7], "t2") == 0  # same tokens, another tenant
    manager.free(98)
    other = [21, 22, 23, 24, 25]
    file_under(manager, "t1", other)
    assert manager.admit(99, other, "t1") == 0  # same tenant, other tokens
    manager.free(99)
    assert manager.stats().host.host_hit_blocks_total == 0
    manager.check_invariants()


def test_expired_host_entries_are_dropped_with_removed_events():
    manager = make_manager(6, B, num_host_blocks=16, host_ttl_s=60.0)
    serve(manager, 1, A)
    for i, filler in enumerate(FILLER):
        serve(manager, 10 + i, filler)
    host = manager.prefix_cache.tiers.host
    held = {h.hex() for h, _ in host.entries()}
    assert held
    log = manager.event_log
    head = log.since(-1, log.epoch)[-1].seq
    assert manager.expire_host(time.time()) == 0, "nothing expires before its TTL"
    assert manager.expire_host(time.time() + 61) == len(held)
    events = log.since(head, log.epoch)
    assert {(e.type, e.medium) for e in events} == {("removed", "host")}
    assert {b.hash for e in events for b in e.blocks} == held
    assert host.entries() == [] and manager.stats().host.host_expired_blocks_total == len(held)
    assert manager.admit(99, A + [7], "t1") == 0, "an expired prefix is not served"
    manager.free(99)
    manager.check_invariants()


def test_transfer_counts_match_the_bytes():
    manager = evicted_to_host()
    stats = manager.stats().host
    block_bytes = manager.tensors.spec.kv_bytes_per_block
    assert stats.host_blocks_to_host_total > 0
    assert stats.host_bytes_to_host_total == stats.host_blocks_to_host_total * block_bytes
