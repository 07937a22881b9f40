"""Block pool: states, counts, exact allocation order, misuse."""

from __future__ import annotations

import pytest

from workers.kv.block_pool import BlockPool, OutOfBlocksError


def test_allocation_is_fifo_and_counts_add_up():
    pool = BlockPool(4, block_size=16)
    assert [pool.allocate() for _ in range(3)] == [0, 1, 2]
    assert (pool.num_free_blocks, pool.num_used_blocks, pool.num_cached_blocks) == (1, 3, 0)
    pool.decref([1])
    assert pool.is_free(1)
    assert pool.allocate() == 3  # the freed block goes to the back
    assert pool.allocate() == 1
    with pytest.raises(OutOfBlocksError):
        pool.allocate()
    pool.check_invariants()


def test_a_block_is_free_cached_or_in_use():
    pool = BlockPool(2, block_size=4)
    block = pool.allocate()
    pool.ref_tree_slots(block, 3)
    pool.decref([block])  # the tree still references it: cached
    assert (pool.num_free_blocks, pool.num_used_blocks, pool.num_cached_blocks) == (1, 0, 1)
    pool.incref([block])  # a prefix hit takes it back into use
    assert pool.num_used_blocks == 1 and not pool.is_writable(block)
    pool.decref([block])
    assert not pool.is_free(block)
    assert pool.unref_tree_slots(block, 2) is False
    assert pool.unref_tree_slots(block, 1) is True
    assert pool.is_free(block) and pool.num_free_blocks == 2
    pool.check_invariants()


def test_writable_only_when_one_holder_and_no_tree_slots():
    pool = BlockPool(1, block_size=4)
    block = pool.allocate()
    assert pool.is_writable(block)
    pool.incref([block])
    assert not pool.is_writable(block)
    pool.decref([block])
    pool.ref_tree_slots(block, 1)
    assert not pool.is_writable(block)


def test_misuse_raises():
    pool = BlockPool(2, block_size=4)
    with pytest.raises(ValueError):
        pool.incref([0])
    with pytest.raises(ValueError):
        pool.decref([0])
    with pytest.raises(ValueError):
        pool.ref_tree_slots(0, 1)
    block = pool.allocate()
    with pytest.raises(ValueError):
        pool.unref_tree_slots(block, 1)
