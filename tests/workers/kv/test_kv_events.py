"""KV events: the log (epoch, gapless seq, bounds, since), the exact block model of
stored and removed events, snapshots, and replay into a fresh RadixTree."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from radix.events import EventBlock, decode_event, encode_event
from radix.hashing import BlockHasher
from radix.keys import to_key
from radix.tree import PUBLIC
from tests.workers.kv.kv_test_support import (
    NAMESPACE_DIGEST,
    EventConsumer,
    assert_replay_equivalent,
    make_manager,
    worker_paths,
)
from workers.kv.event_log import KVEventLog

B = 4
HASHER = BlockHasher(NAMESPACE_DIGEST)


def h(parent: bytes | None, scope: str, tokens: list[int]) -> bytes:
    return HASHER.block_hash(
        HASHER.root_hash(scope) if parent is None else parent, scope, to_key(tokens)
    )


def serve(manager, seq_id, tokens, scope="t1", num_public=0):
    num_cached = manager.admit(seq_id, tokens, scope, num_public)
    assert num_cached is not None
    assert manager.append_slots(seq_id, len(tokens) - num_cached)
    manager.commit(seq_id, tokens)
    manager.free(seq_id)


def new_events(manager, after: int):
    return manager.event_log.since(after, manager.event_log.epoch)


# ---- the log -------------------------------------------------------------------------


def test_a_log_starts_a_new_epoch_with_cleared_at_seq_0():
    first, second = KVEventLog("w", b"ns"), KVEventLog("w", b"ns")
    assert first.epoch != second.epoch and len(first.epoch) == 32
    (cleared,) = first.since(-1, first.epoch)
    assert (cleared.seq, cleared.type, cleared.worker, cleared.namespace) == (
        0,
        "cleared",
        "w",
        b"ns".hex(),
    )
    assert first.since(0, first.epoch) == []
    assert first.since(0, second.epoch) is None  # another epoch: snapshot


def test_since_is_gapless_and_asks_for_a_snapshot_when_too_old_or_ahead():
    log = KVEventLog("w", b"ns", max_events=3)
    for i in range(5):
        log.append("removed", "t1", (EventBlock(hash=f"{i:02x}"),))
    assert log.head_seq == 5
    assert [e.seq for e in log.since(2, log.epoch)] == [3, 4, 5]  # oldest kept is 3
    assert log.since(1, log.epoch) is None
    assert log.since(5, log.epoch) == []
    assert log.since(6, log.epoch) is None


def test_the_log_is_bounded_by_stored_tokens_too():
    log = KVEventLog("w", b"ns", max_events=100, max_tokens=10)
    for i in range(4):
        log.append("stored", "t1", (EventBlock(hash=f"{i:02x}", key=to_key([1, 2, 3, 4])),))
    assert [e.seq for e in log.since(2, log.epoch)] == [3, 4]
    assert log.since(1, log.epoch) is None


# ---- the block model -----------------------------------------------------------------


def test_stored_and_removed_blocks_follow_the_protocol_exactly():
    manager = make_manager(num_blocks=8, block_size=B)
    x = list(range(1, 11))  # 10 tokens
    serve(manager, 1, x)
    (stored,) = new_events(manager, 0)
    h0 = h(None, "t1", [1, 2, 3, 4])
    h1 = h(h0, "t1", [5, 6, 7, 8])
    hx = h(h1, "t1", [9, 10])
    assert (stored.seq, stored.type, stored.scope) == (1, "stored", "t1")
    assert stored.blocks == (
        EventBlock(h0.hex(), None, to_key([1, 2, 3, 4])),
        EventBlock(h1.hex(), h0.hex(), to_key([5, 6, 7, 8])),
        EventBlock(hx.hex(), h1.hex(), to_key([9, 10])),
    )

    y = [1, 2, 3, 4, 5, 6, 20, 21, 22]  # diverges at 6: adds [6, 9)
    serve(manager, 2, y)
    (stored,) = new_events(manager, 1)
    hy1 = h(h0, "t1", [5, 6, 20, 21])  # block 1 cut at its absolute start, repeating 5, 6
    hy2 = h(hy1, "t1", [22])
    assert stored.blocks == (
        EventBlock(hy1.hex(), h0.hex(), to_key([5, 6, 20, 21])),
        EventBlock(hy2.hex(), hy1.hex(), to_key([22])),
    )

    cache = manager.prefix_cache
    cache.evict(1)  # x's tail [6, 10): ends 8 and 10
    (removed,) = new_events(manager, 2)
    assert (removed.type, removed.scope) == ("removed", "t1")
    assert [(b.hash, b.parent, b.tokens) for b in removed.blocks] == [
        (h1.hex(), h0.hex(), None),
        (hx.hex(), h1.hex(), None),
    ]
    # y's match split x's edge at its last whole block (4), y's insert split it at 6:
    # y's tail [6, 9) frees 3, 4; then [4, 6) frees 1; then [0, 4) frees 0
    assert cache.evict(4) == 4
    (removed,) = new_events(manager, 3)  # one event per eviction call and scope
    hsplit = h(h0, "t1", [5, 6])  # the partial block at the split point, never stored
    assert [b.hash for b in removed.blocks] == [hy1.hex(), hy2.hex(), hsplit.hex(), h0.hex()]
    assert cache.tree.num_nodes == 0
    for event in new_events(manager, -1):
        assert decode_event(encode_event(event)) == event


def test_a_public_prefix_gets_a_public_event_then_a_tenant_event():
    manager = make_manager(num_blocks=8, block_size=B)
    tokens = [7, 8, 9, 7, 1, 2]
    serve(manager, 1, tokens, scope="t1", num_public=4)
    public, tenant = new_events(manager, 0)
    hp = h(None, PUBLIC, [7, 8, 9, 7])
    assert (public.scope, public.blocks) == (PUBLIC, (EventBlock(hp.hex(), None, to_key([7, 8, 9, 7])),))
    ht = h(hp, "t1", [1, 2])
    assert (tenant.scope, tenant.blocks) == ("t1", (EventBlock(ht.hex(), hp.hex(), to_key([1, 2])),))
    assert manager.admit(2, [7, 8, 9, 7, 3], "t2") == 4  # another tenant shares the public part
    assert manager.admit(3, [7, 8, 9, 7, 1, 2, 5], "t2") == 4  # ... but not t1's part


def test_the_conservative_case_a_partial_block_at_a_split_point():
    """After a split at 6 and the eviction of both tails, the worker holds [0, 6) but
    the partial block [4, 6) was never stored: the replay knows only [0, 4)."""
    manager = make_manager(num_blocks=8, block_size=B)
    consumer = EventConsumer(B)
    serve(manager, 1, list(range(1, 11)))
    serve(manager, 2, [1, 2, 3, 4, 5, 6, 20, 21, 22])
    manager.prefix_cache.evict(2)
    consumer.apply(new_events(manager, -1))
    tree = manager.prefix_cache.tree
    assert worker_paths(tree, B) - consumer.paths() == {(("t1", "t1"), (1, 2, 3, 4, 5, 6))}
    assert consumer.paths() == {(("t1",), (1, 2, 3, 4))}
    assert_replay_equivalent(tree, consumer, exact=False)
    head, snapshot = manager.snapshot()
    from_snapshot = EventConsumer(B)
    from_snapshot.apply(snapshot, snapshot=True)
    assert from_snapshot.last_seq == head
    assert from_snapshot.paths() == worker_paths(tree, B)  # a snapshot describes every node
    assert manager.prefix_cache.evict(2) == 2  # the rest: [4, 6), then [0, 4)
    consumer.apply(new_events(manager, consumer.last_seq))
    from_snapshot.apply(new_events(manager, head))
    assert consumer.blocks == from_snapshot.blocks == {}


# ---- replay on random block-aligned workloads ----------------------------------------

CHUNKS = ((1, 1, 2, 3), (2, 3, 1, 1), (3, 2, 2, 1))  # distinct first tokens
PUBLIC_CHUNKS = ((9, 8, 9, 8), (8, 9, 8, 9))
OPS = st.one_of(
    st.tuples(
        st.just("serve"),
        st.integers(0, 2),  # public chunks
        st.lists(st.sampled_from(CHUNKS), min_size=1, max_size=4),
        st.sampled_from(("t1", "t2")),
    ),
    st.tuples(st.just("evict"), st.integers(1, 4)),
    st.tuples(st.just("snapshot")),
)


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(OPS, min_size=1, max_size=20))
def test_replay_and_snapshot_equal_the_worker_tree_on_block_aligned_workloads(ops):
    """Chunks of one block with distinct first tokens, whole-block prompts: every node
    boundary is a block boundary, so the conservative case cannot arise and the
    replay (from the log, or from a snapshot plus the log) equals the worker's tree
    exactly: the same block paths with the same scopes, the same match per scope."""
    manager = make_manager(num_blocks=12, block_size=B)
    log_consumer = EventConsumer(B)
    log_consumer.apply(new_events(manager, -1))
    snap_consumer: EventConsumer | None = None
    for seq_id, op in enumerate(ops):
        if op[0] == "serve":
            _, num_public, chunks, scope = op
            tokens = [t for chunk in (*PUBLIC_CHUNKS[:num_public], *chunks) for t in chunk]
            if manager.admit(seq_id, tokens, scope, num_public * B) is not None:
                assert manager.append_slots(
                    seq_id, len(tokens) - manager.num_computed_tokens(seq_id)
                )
                manager.commit(seq_id, tokens)
                manager.free(seq_id)
        elif op[0] == "evict":
            manager.prefix_cache.evict(op[1])
        else:
            head, events = manager.snapshot()
            snap_consumer = EventConsumer(B)
            snap_consumer.apply(events, snapshot=True)
        tree = manager.prefix_cache.tree
        log_consumer.apply(new_events(manager, log_consumer.last_seq))
        assert_replay_equivalent(tree, log_consumer, exact=True)
        if snap_consumer is not None:
            snap_consumer.apply(new_events(manager, snap_consumer.last_seq))
            assert_replay_equivalent(tree, snap_consumer, exact=True)
            assert snap_consumer.blocks == log_consumer.blocks
