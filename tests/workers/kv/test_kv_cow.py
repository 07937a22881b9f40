"""Copy-on-write with real tensors: forks and mid-block prefix hits never let one
sequence's writes change what another reads, and copies equal their source in the
valid slots (all layers, K and V)."""

from __future__ import annotations

import torch

from tests.workers.kv.kv_test_support import (
    NUM_LAYERS,
    assert_reads,
    expected_kv,
    make_manager,
    write_kv,
)

B = 4


def block_kv(manager, block: int) -> torch.Tensor:
    """[layers, 2, B, heads, D] contents of one block."""
    tensors = manager.tensors
    return torch.stack(
        [
            torch.stack([tensors.key_caches[i][block], tensors.value_caches[i][block]])
            for i in range(NUM_LAYERS)
        ]
    )


def run(manager, seq_id: int, tokens: list[int], num_new: int) -> None:
    start = manager.num_computed_tokens(seq_id)
    assert manager.append_slots(seq_id, num_new)
    write_kv(manager, seq_id, tokens, start, start + num_new)


def test_fork_copies_the_shared_last_block_on_first_write_only():
    manager = make_manager(num_blocks=8, block_size=B)
    prompt = [1, 2, 3, 4, 5, 6]
    assert manager.admit(1, prompt, "t1") == 0
    run(manager, 1, prompt, 6)
    manager.fork(1, 2)
    assert manager.block_table(1) == manager.block_table(2) == [0, 1]
    before = block_kv(manager, 1)

    parent, child = [*prompt, 100], [*prompt, 200]
    run(manager, 1, parent, 1)  # writes position 6, in the shared block 1
    assert manager.block_table(1) == [0, 2] and manager.stats().num_cow_copies_total == 1
    assert torch.equal(block_kv(manager, 2)[:, :, :2], before[:, :, :2])  # valid slots 4, 5
    assert torch.equal(block_kv(manager, 1), before)  # the child's block is untouched

    run(manager, 2, child, 1)  # block 1 is now the child's alone: written in place
    assert manager.block_table(2) == [0, 1] and manager.stats().num_cow_copies_total == 1
    assert_reads(manager, 1, parent, 7)
    assert_reads(manager, 2, child, 7)
    assert manager.pool.refcount(0) == 2  # never written, still shared
    manager.check_invariants()


def test_mid_block_prefix_hit_copies_the_partial_block():
    manager = make_manager(num_blocks=8, block_size=B)
    first = list(range(1, 11))  # 10 tokens: blocks [1-4] [5-8] [9 10]
    manager.admit(1, first, "t1")
    run(manager, 1, first, 10)
    manager.commit(1, first)
    manager.free(1)
    assert manager.stats().num_cached_blocks == 3  # blocks 0, 1, 2 (2 holds positions 8, 9)
    cached_block_2 = block_kv(manager, 2)

    second = [*first[:9], 50, 51]  # matches 9 tokens: ends inside block 2
    assert manager.admit(2, second, "t1") == 9
    assert manager.block_table(2) == [0, 1, 3]  # block 2 copied onto 3 at admission
    assert torch.equal(block_kv(manager, 3)[:, :, :1], cached_block_2[:, :, :1])  # position 8
    run(manager, 2, second, 2)
    assert_reads(manager, 2, second, 11)
    assert torch.equal(block_kv(manager, 2), cached_block_2)  # the cached block is intact

    third = [*first, 11]  # matches all 10 cached tokens (cap: len - 1 = 10)
    assert manager.admit(3, third, "t1") == 10
    assert_reads(manager, 3, third, 10)  # position 9 read from cached block 2
    assert manager.block_table(3) == [0, 1, 4]
    run(manager, 3, third, 1)
    assert_reads(manager, 3, third, 11)
    assert_reads(manager, 2, second, 11)
    assert manager.stats().num_cow_copies_total == 2
    manager.check_invariants()


def test_cached_blocks_are_never_written_in_place():
    manager = make_manager(num_blocks=8, block_size=B)
    tokens = [1, 2, 3, 4, 5, 6]
    manager.admit(1, tokens, "t1")
    run(manager, 1, tokens, 6)
    manager.commit(1, tokens)  # caches the partial block 1 too
    snapshot = [block_kv(manager, b) for b in (0, 1)]
    for token in (7, 8, 9):
        tokens.append(token)
        run(manager, 1, tokens, 1)
    assert manager.block_table(1) == [0, 2, 3]  # block 1 was copied before the write
    assert [
        torch.equal(block_kv(manager, b), s) for b, s in zip((0, 1), snapshot, strict=True)
    ] == [True, True]
    assert_reads(manager, 1, tokens, 9)
    manager.check_invariants()


def test_expected_kv_differs_per_prefix():
    assert not torch.equal(expected_kv([1, 2], 1, 2), expected_kv([3, 2], 1, 2))
