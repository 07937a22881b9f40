"""The prefix-cache interface the KV manager talks to, and its null object.

A prefix cache maps token prefixes (per scope) to KV blocks that already hold them.
It references blocks through the pool's tree slot counts and frees them only by
eviction; sequences' references are the manager's business. It holds the tiers
below the device (``tiers``): its evictions demote into them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from radix.events import KVEvent
from radix.tree import PUBLIC, Node, Scope
from workers.kv.block_events import ROOT_END, PathEnd
from workers.kv.block_pool import BlockPool
from workers.kv.event_log import KVEventLog
from workers.kv.ids import BlockId
from workers.kv.tiers.base import NoTiers, Tiers


@dataclass(frozen=True)
class PrefixHit:
    """A match of ``num_cached_tokens`` tokens. ``block_ids[k]`` holds valid KV for the
    positions ``[k*B, min(num_cached_tokens, (k+1)*B))``. The ids are only safe to use
    while the caller holds references to the blocks; ``node`` is the lock handle for
    the whole blocks (None when the hit has none)."""

    num_cached_tokens: int
    block_ids: tuple[BlockId, ...]
    node: Node | None


EMPTY_HIT = PrefixHit(0, (), None)


class PrefixCache(ABC):
    """What the KV manager needs from a prefix cache. Engine thread only.

    Rules: ``insert`` never re-references tokens already cached (the caller's own
    copies of them are released when it frees its blocks); ``evict`` only frees
    blocks no sequence holds; every change is reported in ``event_log``; ``tiers``
    gets the full blocks of every leaf evicted and is told of every block cached
    again.
    """

    event_log: KVEventLog
    num_evicted_blocks_total: int
    tiers: Tiers

    @abstractmethod
    def match(self, key: bytes, scope: Scope) -> PrefixHit:
        """Longest cached prefix of ``key`` visible to ``scope``; counts as a use. The
        hit's ``node`` ends at its last whole block (None when there is none), so a lock
        keeps only matched blocks in the tree; a partly matched last block is kept
        alive by the caller's reference to it, not by the lock."""

    @abstractmethod
    def lock(self, node: Node | None) -> None:
        """Keep ``node``'s path from eviction (counted; None is a no-op)."""

    @abstractmethod
    def unlock(self, node: Node | None) -> None:
        """Release one ``lock`` (None is a no-op)."""

    @abstractmethod
    def blocks_beyond(self, node: Node | None, block_table: Sequence[BlockId]) -> list[BlockId]:
        """The blocks that slots on the path to ``node`` name although ``block_table``
        holds another block (or none) for their logical block. A lock on ``node`` keeps
        them in the tree, so its holder must also reference them: then every block no
        sequence references is evictable, and admission can count on it."""

    @abstractmethod
    def blocks_beyond_since(
        self, node: Node | None, block_table: Sequence[BlockId], since: Node | None
    ) -> list[BlockId] | None:
        """``blocks_beyond`` for the nodes on the path to ``node`` below ``since`` only
        (``since`` None: the whole path), or None when ``since`` is not on that path. A
        lock moved from ``since`` down to ``node`` needs only these on top of the blocks
        it held."""

    @abstractmethod
    def insert(self, key: bytes, scope: Scope, block_table: Sequence[BlockId]) -> Node | None:
        """Cache ``key`` for ``scope``; the tokens not cached yet take their KV from
        ``block_table`` (which must hold valid KV for all of ``key``). Returns the node
        ending at ``len(key)``, the handle to lock (None if nothing is cached)."""

    @abstractmethod
    def evict(self, num_blocks: int) -> int:
        """Evict least recently used unlocked leaves until ``num_blocks`` blocks went
        back to the free list or nothing is evictable; returns the blocks freed.
        Leaves of scopes over their quota (``set_quota``) go first."""

    @abstractmethod
    def set_quota(self, scope: Scope, max_cached_tokens: int | None) -> None:
        """The cached tokens ``scope`` may own before its leaves are evicted ahead of
        everyone else's (None: no quota). The latest call for a scope wins."""

    @abstractmethod
    def evict_path(self, key: bytes, scope: Scope) -> int:
        """Evict the unlocked leaves of ``scope`` ending ``key``'s cached path, deepest
        first, demoting their full blocks into ``tiers`` (swap-out); returns the blocks freed."""

    @abstractmethod
    def path_end(self, node: Node | None) -> PathEnd:
        """Where the path to ``node`` (a ``match`` handle, so it ends at a block
        boundary; None: the root) stands in the block-hash chain (a prompt's blocks
        past it chain from there)."""

    @abstractmethod
    def snapshot(self) -> tuple[int, list[KVEvent]]:
        """``(head_seq, events)``: a ``cleared`` event then ``stored`` events describing
        every cached block, all stamped ``head_seq``; live events follow from
        ``head_seq + 1``. Engine thread only (it walks the tree)."""

    @property
    @abstractmethod
    def num_cached_tokens(self) -> int:
        """Tokens held by the cache, all scopes."""

    @abstractmethod
    def check_invariants(self, lock_handles: Sequence[Node | None]) -> list[int]:
        """Raise AssertionError if the cache disagrees with itself or with the pool, or
        if its locks are not exactly one per handle in ``lock_handles``. Returns the
        tree slots it references per block: the pool's counts are the sum over every
        namespace's cache (the KV manager checks them)."""


class NullPrefixCache(PrefixCache):
    """No sharing at all, for comparison runs: nothing is matched, cached or evicted.
    Its event log holds only the start-up ``cleared`` event."""

    def __init__(self, pool: BlockPool, event_log: KVEventLog):
        self._pool = pool
        self.event_log = event_log
        self.num_evicted_blocks_total = 0
        self.tiers = NoTiers()

    def match(self, key: bytes, scope: Scope) -> PrefixHit:
        """Always the empty hit."""
        return EMPTY_HIT

    def lock(self, node: Node | None) -> None:
        """No-op."""

    def unlock(self, node: Node | None) -> None:
        """No-op."""

    def blocks_beyond(self, node: Node | None, block_table: Sequence[BlockId]) -> list[BlockId]:
        """Nothing is ever locked."""
        return []

    def blocks_beyond_since(
        self, node: Node | None, block_table: Sequence[BlockId], since: Node | None
    ) -> list[BlockId] | None:
        """Nothing is ever locked."""
        return []

    def insert(self, key: bytes, scope: Scope, block_table: Sequence[BlockId]) -> Node | None:
        """Caches nothing."""
        return None

    def evict(self, num_blocks: int) -> int:
        """Nothing to evict."""
        return 0

    def set_quota(self, scope: Scope, max_cached_tokens: int | None) -> None:
        """Nothing is cached, so no quota can be exceeded."""

    def evict_path(self, key: bytes, scope: Scope) -> int:
        """Nothing to evict."""
        return 0

    def path_end(self, node: Node | None) -> PathEnd:
        """Every path is the root's."""
        return ROOT_END

    def snapshot(self) -> tuple[int, list[KVEvent]]:
        """The ``cleared`` event only."""
        return self.event_log.head_seq, [self.event_log.at_head("cleared", PUBLIC, ())]

    @property
    def num_cached_tokens(self) -> int:
        """Always 0."""
        return 0

    def check_invariants(self, lock_handles: Sequence[Node | None]) -> list[int]:
        """No handle and no tree reference exist."""
        assert all(handle is None for handle in lock_handles), "null cache handed out a lock"
        return [0] * self._pool.num_total_blocks
