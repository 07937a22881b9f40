"""What the prefix cache and the KV manager see of the tiers below the device, and the
null object for a worker without them.

The prefix cache demotes the full blocks of the leaves it evicts and forgets the
blocks it caches again; the KV manager finds and takes back, at admission, the
blocks that continue a device hit, and runs the housekeeping (expiry, the spill to
disk before the worker stops). Every move is logged in the cache's KV event log.
Engine thread only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from radix.events import EventBlock, KVEvent
from radix.hashing import BlockHash
from radix.tree import Scope
from workers.kv.block_events import PathEnd
from workers.kv.ids import BlockId
from workers.kv.tiers.disk_tier import DiskTierStats
from workers.kv.tiers.host_tier import HostTierStats

# The full blocks of an evicted leaf: each one's event block (with its tokens) and its
# device slots, made on demand (tiers that keep nothing never ask).
Demoted = Callable[[], Sequence[tuple[EventBlock, Sequence[int]]]]


class HostHit(NamedTuple):
    """A full block of a prompt that a tier holds: its hash, scope and tokens (key
    bytes)."""

    block_hash: BlockHash
    scope: Scope
    tokens: bytes


@dataclass(frozen=True)
class TierStats:
    """The host and disk tiers' gauges and counters for ``/metrics``."""

    host: HostTierStats
    disk: DiskTierStats


class Tiers(ABC):
    """The tiers below the device. Engine thread only."""

    @abstractmethod
    def demote(self, scope: str, blocks: Demoted) -> None:
        """An evicted leaf of ``scope`` is about to release its slots: keep copies of its
        full blocks (``blocks()``, asked at most once, while the slots still hold
        their K/V) and log them ``stored``, and what that pushes out ``removed``."""

    @abstractmethod
    def forget(self, scope: str, blocks: Sequence[EventBlock]) -> None:
        """The device caches ``blocks`` of ``scope`` again: drop (and log) any copy."""

    @abstractmethod
    def find(
        self, key: bytes, num_cached_tokens: int, scope: Scope, path_end: Callable[[], PathEnd]
    ) -> list[HostHit]:
        """The consecutive full blocks of ``key`` held here that continue a device hit of
        ``num_cached_tokens`` tokens from its last whole block, whose path ends at
        ``path_end()`` (asked only by tiers that hold blocks); empty unless they reach
        past the hit. Each is of ``scope``, or PUBLIC while the path and every block
        found before it are public. Changes nothing."""

    @abstractmethod
    def take(self, found: Sequence[HostHit]) -> tuple[list[BlockId], int]:
        """Copy ``found`` (from ``find``; the pool must have a free block for each) into
        freshly allocated device blocks, held once by the caller, stopping at the first
        block gone or failing authentication (dropped and logged); the blocks taken
        leave the tiers, logged ``removed``. Returns the blocks and how many of the
        first are public; the caller caches them."""

    @abstractmethod
    def expire(self, now: float) -> int:
        """Drop the entries expired at ``now`` (wall-clock seconds), logged ``removed``;
        returns how many."""

    @abstractmethod
    def spill(self, evict: Callable[[], int]) -> int:
        """With a disk tier, call ``evict`` (which must evict every evictable cached
        block, demoting it here), move every host block down to disk in LRU order and
        return once all of it is on disk; returns ``evict``'s count of device blocks
        freed. Without one, nothing is called or moved: 0."""

    @abstractmethod
    def snapshot(self) -> list[KVEvent]:
        """Every block held, as ``stored`` events at the log's head, parents first."""

    @abstractmethod
    def stats(self) -> TierStats:
        """Current gauges and counters."""


class NoTiers(Tiers):
    """No host or disk tier: evicted blocks are dropped and nothing comes back."""

    def demote(self, scope: str, blocks: Demoted) -> None:
        """Keeps nothing (``blocks`` is never asked)."""

    def forget(self, scope: str, blocks: Sequence[EventBlock]) -> None:
        """No copy exists."""

    def find(
        self, key: bytes, num_cached_tokens: int, scope: Scope, path_end: Callable[[], PathEnd]
    ) -> list[HostHit]:
        """Nothing is held."""
        return []

    def take(self, found: Sequence[HostHit]) -> tuple[list[BlockId], int]:
        """Nothing to take."""
        return [], 0

    def expire(self, now: float) -> int:
        """Nothing expires."""
        return 0

    def spill(self, evict: Callable[[], int]) -> int:
        """No disk: nothing moves."""
        return 0

    def snapshot(self) -> list[KVEvent]:
        """Nothing held."""
        return []

    def stats(self) -> TierStats:
        """All zero."""
        return TierStats(HostTierStats(0, 0, 0, 0, 0, 0), DiskTierStats(0, 0, 0, 0, 0, 0))
