"""The host-memory tier: a bounded pool of full KV blocks evicted from the device.

Blocks are named by their chained block hash (``radix.hashing``: it covers the
namespace, every block's scope and all tokens up to the block's end), so a hash
found here holds exactly the KV of that prefix. Each entry keeps the block's
scope, parent hash and tokens (for KV events) and its K/V bytes sealed with
``BlockSealer``. The pool is ordered by arrival: the prefix cache demotes blocks in
its own LRU order and takes them back on a hit, so the oldest entry is always the
least recently used block of both tiers (one LRU), and it is the one dropped when
the pool is full. ``take`` opens a block and removes it; a block that fails
authentication is dropped and counted, never returned.

Expiry. With a TTL each entry carries ``expires_at`` (wall-clock seconds: a tier
that outlives the process keeps its meaning); ``expire(now)`` removes the entries
whose time has come and returns them, like the entries ``put`` drops, so their
owner logs them ``removed``. A put refreshes an entry's expiry with its place.

This is a data structure: it reads and writes the device tensors it is given but
emits no events; the prefix cache reports what ``put`` and ``take`` did.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from radix.hashing import BlockHash
from workers.kv.ids import BlockId
from workers.kv.tensors import KVCacheTensors
from workers.kv.tiers.host_crypto import BlockSealer


@dataclass(frozen=True)
class HostBlock:
    """One demoted block: who owns it, where it chains from, its tokens (key bytes),
    its sealed K/V and when it expires (None: never)."""

    scope: str
    parent: BlockHash | None
    tokens: bytes
    sealed: bytes
    expires_at: float | None = None

    def is_expired(self, now: float) -> bool:
        """True once ``now`` (wall-clock seconds) reached ``expires_at``."""
        return self.expires_at is not None and now >= self.expires_at


@dataclass(frozen=True)
class HostTierStats:
    """Gauges and counters for ``/metrics``."""

    num_host_blocks_total: int
    num_host_blocks_used: int
    host_hit_blocks_total: int
    host_bytes_to_host_total: int
    host_bytes_to_device_total: int
    host_auth_failures_total: int
    host_blocks_to_host_total: int = 0
    host_expired_blocks_total: int = 0


class HostTier(ABC):
    """What the prefix cache needs from a host tier. Engine thread only."""

    @abstractmethod
    def put(
        self, block_hash: BlockHash, scope: str, parent: BlockHash | None, tokens: bytes,
        slots: Sequence[int],
    ) -> list[tuple[BlockHash, HostBlock]]:
        """Copy the K/V at device ``slots`` (one block's positions) into the pool as
        ``block_hash`` of ``scope``. Returns the entries dropped to make room, oldest
        first."""

    @abstractmethod
    def holds(self, block_hash: BlockHash, scope: str, tokens: bytes) -> bool:
        """True when ``block_hash`` is in the pool as a block of ``scope`` with exactly
        ``tokens``: a hash never decides alone (``xxh3_128`` is not collision
        resistant, and a colliding block would hand one tenant another's K/V)."""

    @abstractmethod
    def take(self, block_hash: BlockHash, device_block: BlockId) -> HostBlock | None:
        """Remove ``block_hash`` and write its K/V into ``device_block``; None (the entry
        dropped) when it is absent or fails authentication."""

    @abstractmethod
    def discard(self, block_hash: BlockHash) -> HostBlock | None:
        """Remove ``block_hash`` without reading it (the device holds it again)."""

    @abstractmethod
    def entries(self) -> list[tuple[BlockHash, HostBlock]]:
        """Every block held, oldest first (snapshots)."""

    @abstractmethod
    def expire(self, now: float) -> list[tuple[BlockHash, HostBlock]]:
        """Remove and return the entries expired at ``now`` (wall-clock seconds),
        oldest first."""

    @abstractmethod
    def stats(self) -> HostTierStats:
        """Current gauges and counters."""


class HostMemoryTier(HostTier):
    """Up to ``num_blocks`` sealed blocks in host memory, each kept at most ``ttl_s``
    seconds of ``clock`` (None: no expiry)."""

    def __init__(self, num_blocks: int, tensors: KVCacheTensors, sealer: BlockSealer,
                 ttl_s: float | None = None, clock: Callable[[], float] = time.time) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        if ttl_s is not None and ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        self.num_blocks = num_blocks
        self._tensors = tensors
        self._sealer = sealer
        self._ttl_s = ttl_s
        self._clock = clock
        self._blocks: OrderedDict[BlockHash, HostBlock] = OrderedDict()
        self._num_hits = self._bytes_in = self._bytes_out = self._num_auth_failures = 0
        self._num_puts = self._num_expired = 0

    def put(
        self, block_hash: BlockHash, scope: str, parent: BlockHash | None, tokens: bytes,
        slots: Sequence[int],
    ) -> list[tuple[BlockHash, HostBlock]]:
        """See ``HostTier.put``; a hash already present is refreshed, not duplicated."""
        data = self._tensors.read_slots(slots)
        sealed = self._sealer.seal(scope, block_hash, data)
        expires_at = None if self._ttl_s is None else self._clock() + self._ttl_s
        self._blocks.pop(block_hash, None)
        self._blocks[block_hash] = HostBlock(scope, parent, tokens, sealed, expires_at)
        self._bytes_in += len(data)
        self._num_puts += 1
        dropped = []
        while len(self._blocks) > self.num_blocks:
            dropped.append(self._blocks.popitem(last=False))
        return dropped

    def holds(self, block_hash: BlockHash, scope: str, tokens: bytes) -> bool:
        """See ``HostTier.holds``."""
        block = self._blocks.get(block_hash)
        return block is not None and block.scope == scope and block.tokens == tokens

    def take(self, block_hash: BlockHash, device_block: BlockId) -> HostBlock | None:
        """See ``HostTier.take``."""
        block = self._blocks.pop(block_hash, None)
        if block is None:
            return None
        data = self._sealer.open(block.scope, block_hash, block.sealed)
        if data is None:
            self._num_auth_failures += 1
            return None
        self._tensors.write_block(device_block, data)
        self._num_hits += 1
        self._bytes_out += len(data)
        return block

    def discard(self, block_hash: BlockHash) -> HostBlock | None:
        """See ``HostTier.discard``."""
        return self._blocks.pop(block_hash, None)

    def entries(self) -> list[tuple[BlockHash, HostBlock]]:
        """See ``HostTier.entries``."""
        return list(self._blocks.items())

    def expire(self, now: float) -> list[tuple[BlockHash, HostBlock]]:
        """See ``HostTier.expire``: one TTL for all, so arrival order is expiry order
        and only the expired entries at the front are visited."""
        expired = []
        while self._blocks:
            block = next(iter(self._blocks.values()))
            if not block.is_expired(now):
                break
            expired.append(self._blocks.popitem(last=False))
        self._num_expired += len(expired)
        return expired

    def stats(self) -> HostTierStats:
        """See ``HostTier.stats``."""
        return HostTierStats(
            num_host_blocks_total=self.num_blocks,
            num_host_blocks_used=len(self._blocks),
            host_hit_blocks_total=self._num_hits,
            host_bytes_to_host_total=self._bytes_in,
            host_bytes_to_device_total=self._bytes_out,
            host_auth_failures_total=self._num_auth_failures,
            host_blocks_to_host_total=self._num_puts,
            host_expired_blocks_total=self._num_expired,
        )
