"""The tiers of a worker with a host tier (and maybe a disk tier below it), with their
events.

The prefix cache decides what moves down (which blocks an evicted leaf holds) and
the KV manager what comes back (the blocks of a prompt that continue a device hit);
this link does the moving and logs it:
``stored``/``host`` for blocks demoted, ``removed``/``host`` for blocks the tier
dropped, expired, gave back to the device, or refused (failed authentication). With a
disk tier, what the host tier drops moves on to disk (``stored``/``disk``, logged
before its ``removed``/``host`` so a consumer always knows a block's parent), and the
disk tier's own drops, hits and refusals are ``removed``/``disk``. A disk tier that
came back from a previous run with blocks is announced as ``stored``/``disk`` at once.
Engine thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from radix.events import EventBlock, EventType, KVEvent, Medium
from radix.hashing import BlockHash
from radix.keys import TOKEN_BYTES
from radix.tree import PUBLIC, Scope
from workers.kv.block_events import BlockChainer, PathEnd
from workers.kv.block_pool import BlockPool
from workers.kv.event_log import KVEventLog
from workers.kv.ids import BlockId
from workers.kv.tiers.base import Demoted, HostHit, Tiers, TierStats
from workers.kv.tiers.disk_tier import DiskEntry, DiskTier, NullDiskTier
from workers.kv.tiers.host_tier import HostBlock, HostTier


class HostLink(Tiers):
    """``Tiers`` over a host tier and, below it, a disk tier (None: none)."""

    def __init__(
        self, host: HostTier, pool: BlockPool, chainer: BlockChainer, event_log: KVEventLog,
        disk: DiskTier | None = None,
    ) -> None:
        self.host = host
        self.disk = disk or NullDiskTier()
        self._tiers: tuple[tuple[HostTier | DiskTier, Medium], ...] = (
            (self.host, "host"), (self.disk, "disk"))
        self._pool = pool
        self._chainer = chainer
        self._log = event_log
        self._emit("stored", _scoped(list(reversed(self.disk.entries()))), "disk")

    def demote(self, scope: str, blocks: Demoted) -> None:
        """See ``Tiers.demote``: each block goes into the host tier, what it drops on to
        the disk tier."""
        dropped: list[tuple[BlockHash, HostBlock]] = []
        demoted = blocks()
        for block, slots in demoted:
            parent = None if block.parent is None else BlockHash(bytes.fromhex(block.parent))
            dropped += self.host.put(
                BlockHash(bytes.fromhex(block.hash)), scope, parent, block.key or b"",
                slots,
            )
        self._emit("stored", [(scope, block) for block, _ in demoted], "host")
        self._move_to_disk(dropped)

    def spill(self, evict: Callable[[], int]) -> int:
        """See ``Tiers.spill``."""
        if not self.disk.enabled:
            return 0
        num_freed = evict()
        self._spill_host()
        self.disk.flush()
        return num_freed

    def _spill_host(self) -> None:
        """Move every host block to the disk tier, oldest first (the LRU order)."""
        entries = self.host.entries()
        for block_hash, _ in entries:
            self.host.discard(block_hash)
        self._move_to_disk(entries)

    def _move_to_disk(self, dropped: Sequence[tuple[BlockHash, HostBlock]]) -> None:
        """``dropped`` left the host tier: on to disk (when there is one), logged."""
        gone_from_disk: list[tuple[BlockHash, DiskEntry]] = []
        if self.disk.enabled:
            for block_hash, entry in dropped:
                gone_from_disk += self.disk.put(block_hash, entry)
            self._emit("stored", _scoped(dropped), "disk")
        self._emit("removed", _scoped(dropped), "host")
        self._emit("removed", _scoped(gone_from_disk), "disk")

    def expire(self, now: float) -> int:
        """See ``Tiers.expire``: host and disk entries alike, as for an eviction (an
        expired host entry never moves on to disk)."""
        expired_host = self.host.expire(now)
        expired_disk = self.disk.expire(now)
        self._emit("removed", _scoped(expired_host), "host")
        self._emit("removed", _scoped(expired_disk), "disk")
        return len(expired_host) + len(expired_disk)

    def forget(self, scope: str, blocks: Sequence[EventBlock]) -> None:
        """See ``Tiers.forget``: host and disk copies alike."""
        for tier, medium in self._tiers:
            gone = [b for b in blocks if tier.discard(BlockHash(bytes.fromhex(b.hash)))]
            self._emit("removed", [(scope, block) for block in gone], medium)

    def find(
        self, key: bytes, num_cached_tokens: int, scope: Scope, path_end: Callable[[], PathEnd]
    ) -> list[HostHit]:
        """See ``Tiers.find``; a block counts only when a tier holds it with the same
        scope and tokens (``HostTier.holds``)."""
        block_size = self._chainer.block_size
        num_whole = num_cached_tokens - num_cached_tokens % block_size
        end = path_end()
        found = self._find_from(end.parent, key, num_whole, scope, end.public)
        if num_whole + len(found) * block_size <= num_cached_tokens:
            return []
        return found

    def _find_from(
        self, parent: BlockHash | None, key: bytes, start: int, scope: Scope, public_ok: bool
    ) -> list[HostHit]:
        """The consecutive full blocks of ``key`` from token ``start`` (a block
        boundary, chained under ``parent``) that a tier holds: each hashed under
        ``scope``, or under PUBLIC while ``public_ok`` and every block found before it
        is public."""
        step = self._chainer.block_size * TOKEN_BYTES
        found: list[HostHit] = []
        for at in range(start * TOKEN_BYTES + step, len(key) + 1, step):
            block_key = key[at - step : at]
            for block_scope in (scope, PUBLIC) if public_ok else (scope,):
                block_hash = self._chainer.block_hash(parent, block_scope, block_key)
                if self._holds(block_hash, block_scope, block_key):
                    break
            else:
                break
            public_ok = public_ok and block_scope == PUBLIC
            found.append(HostHit(block_hash, block_scope, block_key))
            parent = block_hash
        return found

    def take(self, found: Sequence[HostHit]) -> tuple[list[BlockId], int]:
        """See ``Tiers.take``: each block from whichever tier holds it, stopping also at
        one no longer the same scope and tokens."""
        restored: list[BlockId] = []
        num_public = 0
        for block_hash, block_scope, block_key in found:
            held = next(((tier, medium) for tier, medium in self._tiers
                         if tier.holds(block_hash, block_scope, block_key)), None)
            if held is None:
                break
            tier, medium = held
            device_block = self._pool.allocate()
            entry = tier.take(block_hash, device_block)
            if entry is None:
                self._pool.decref([device_block])
                self._emit("removed", [(block_scope, EventBlock(block_hash.hex()))], medium)
                break
            self._emit("removed", [(block_scope, _event_block(block_hash, entry))], medium)
            restored.append(device_block)
            num_public += block_scope == PUBLIC
        return restored, num_public

    def _holds(self, block_hash: BlockHash, scope: Scope, tokens: bytes) -> bool:
        return self.host.holds(block_hash, scope, tokens) or self.disk.holds(block_hash, scope, tokens)

    def snapshot(self) -> list[KVEvent]:
        """See ``Tiers.snapshot``: the host tier's blocks, then the disk tier's, each
        newest first (a block moves down after its descendants, so parents come
        first)."""
        return [
            self._log.at_head("stored", entry.scope, [_event_block(block_hash, entry)], medium)
            for tier, medium in self._tiers
            for block_hash, entry in reversed(tier.entries())
        ]

    def stats(self) -> TierStats:
        """See ``Tiers.stats``."""
        return TierStats(self.host.stats(), self.disk.stats())

    def _emit(self, kind: EventType, blocks: Sequence[tuple[str, EventBlock]], medium: Medium
              ) -> None:
        by_scope: dict[str, list[EventBlock]] = {}
        for scope, block in blocks:
            by_scope.setdefault(scope, []).append(block)
        for scope, scope_blocks in by_scope.items():
            self._log.append(kind, scope, scope_blocks, medium)


def _scoped(entries: Sequence[tuple[BlockHash, HostBlock | DiskEntry]]
            ) -> list[tuple[str, EventBlock]]:
    return [(entry.scope, _event_block(block_hash, entry)) for block_hash, entry in entries]


def _event_block(block_hash: BlockHash, entry: HostBlock | DiskEntry) -> EventBlock:
    return EventBlock(
        hash=block_hash.hex(),
        parent=None if entry.parent is None else entry.parent.hex(),
        key=entry.tokens,
    )
