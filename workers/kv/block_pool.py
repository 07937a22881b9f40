"""Physical KV blocks: a free list, per-block sequence references and tree slot counts.

Each block is in exactly one state:

- **free**: on the free list; nobody references it;
- **in use**: ``refcount > 0`` (held by that many sequences' block tables);
- **cached**: ``refcount == 0`` but ``num_tree_slots > 0`` (only the prefix cache
  references it; it returns to the free list when its tree nodes are evicted).

So ``num_free + num_cached + num_used == num_total`` at every moment. A block goes
back to the free list the moment both counts reach zero. ``num_tree_slots`` counts
slot references from the prefix cache's tree payloads (see ``radix_cache``), not
distinct slots: two nodes naming the same slot count twice.

The free list is FIFO (allocate from the front, return to the back), so a freed
block is reused last and allocation order is deterministic for tests.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from workers.kv.ids import BlockId


class OutOfBlocksError(RuntimeError):
    """``allocate`` was called with no free block (callers check ``num_free_blocks``)."""


class BlockPool:
    """Reference-counted block allocator for ``num_blocks`` blocks of ``block_size``."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(
                f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}"
            )
        self.num_total_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[BlockId] = deque(BlockId(b) for b in range(num_blocks))
        self._is_free = bytearray(b"\x01") * num_blocks
        self._refcount = [0] * num_blocks
        self._tree_slots = [0] * num_blocks
        self._num_used = 0

    # ---- gauges --------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks on the free list."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one sequence."""
        return self._num_used

    @property
    def num_cached_blocks(self) -> int:
        """Blocks referenced only by the prefix cache (reclaimable by eviction)."""
        return self.num_total_blocks - len(self._free) - self._num_used

    def refcount(self, block: BlockId) -> int:
        """Number of sequences holding ``block``."""
        return self._refcount[block]

    def num_tree_slots(self, block: BlockId) -> int:
        """Slot references to ``block`` from the prefix cache."""
        return self._tree_slots[block]

    def is_free(self, block: BlockId) -> bool:
        """True when ``block`` is on the free list."""
        return bool(self._is_free[block])

    def is_writable(self, block: BlockId) -> bool:
        """True when one sequence holds ``block`` and the prefix cache references none of
        its slots: the only case where it may be written in place."""
        return self._refcount[block] == 1 and self._tree_slots[block] == 0

    # ---- sequence references -------------------------------------------------------

    def allocate(self) -> BlockId:
        """Take the oldest free block, held once by the caller (refcount 1)."""
        if not self._free:
            raise OutOfBlocksError("no free KV block")
        block = self._free.popleft()
        self._is_free[block] = 0
        self._refcount[block] = 1
        self._num_used += 1
        return block

    def incref(self, blocks: Iterable[BlockId]) -> None:
        """One more sequence holds each of ``blocks`` (none may be free). Takes a whole
        block table at once: this runs per admitted or forked sequence."""
        refcount, is_free = self._refcount, self._is_free
        for block in blocks:
            if is_free[block]:
                raise ValueError(f"incref of free block {block}")
            if refcount[block] == 0:
                self._num_used += 1
            refcount[block] += 1

    def decref(self, blocks: Iterable[BlockId]) -> None:
        """A sequence releases each of ``blocks``; those left with no reference at all go
        back to the free list."""
        refcount = self._refcount
        for block in blocks:
            count = refcount[block]
            if count <= 0:
                raise ValueError(f"decref of block {block} with refcount {count}")
            refcount[block] = count - 1
            if count == 1:
                self._num_used -= 1
                if not self._tree_slots[block]:
                    self._is_free[block] = 1
                    self._free.append(block)

    # ---- prefix-cache references ---------------------------------------------------

    def ref_tree_slots(self, block: BlockId, count: int) -> None:
        """The prefix cache now references ``count`` more slots of ``block``."""
        if self._is_free[block]:
            raise ValueError(f"tree reference to free block {block}")
        self._tree_slots[block] += count

    def unref_tree_slots(self, block: BlockId, count: int) -> bool:
        """The prefix cache dropped ``count`` slot references; True if ``block`` went back
        to the free list."""
        left = self._tree_slots[block] - count
        if left < 0:
            raise ValueError(f"block {block} has fewer than {count} tree slots")
        self._tree_slots[block] = left
        if left or self._refcount[block]:
            return False
        self._is_free[block] = 1
        self._free.append(block)
        return True

    # ---- self-check ----------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise AssertionError unless every block is in exactly one state and the
        counts add up: free + cached + in use == total."""
        assert len(set(self._free)) == len(self._free), "a block is on the free list twice"
        assert sum(self._is_free) == len(self._free), "free flags disagree with the free list"
        num_used = num_cached = 0
        for block in range(self.num_total_blocks):
            refs, slots = self._refcount[block], self._tree_slots[block]
            assert refs >= 0 and slots >= 0, f"block {block}: negative count"
            if self._is_free[block]:
                assert refs == 0 and slots == 0, f"free block {block} is referenced"
            else:
                assert refs or slots, f"block {block} is unreferenced but not free (leak)"
            num_used += refs > 0
            num_cached += refs == 0 and slots > 0
        assert num_used == self._num_used, "num_used_blocks is stale"
        assert len(self._free) + num_cached + num_used == self.num_total_blocks
