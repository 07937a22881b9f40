"""The disk tier: a bounded directory of sealed KV blocks below the host tier.

Blocks arrive from the host tier as it drops its oldest (already sealed, so they are
written as they are; ``workers.kv.tiers.disk_files`` has the layout) and leave on a prefix
hit, read back into a device block. The tier is ordered by arrival and drops its
oldest block when full, so device, host and disk together keep one LRU order: the
host tier drops to disk in its own LRU order, and the disk drops what is older than
everything kept anywhere.

It survives the process: each namespace has its own subdirectory, locked by one
worker at a time, and a new tier scans it, keeps the files that authenticate under
this secret and namespace (in their recorded arrival order) and deletes the others
(counted with the read failures). Reading a block opens it again: a file changed
after the scan is dropped and counted, never written to the device.

Writes and deletions run on a thread of their own (``workers.kv.tiers.disk_writer``), so a
demotion costs the engine thread an encryption and a queue slot, not a synchronous
write with two ``fsync``s; a hit on a block whose write is still queued is served
from its bytes in memory (opened and authenticated all the same), and a write that
fails is reported as a drop by the next ``put``.

A data structure: it reads files and writes device blocks but emits no events; the
host link reports what ``put`` and ``take`` did. Engine thread only (apart from its
writer).
"""

from __future__ import annotations

import logging
import math
import os
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from radix.hashing import BlockHash
from workers.kv.ids import BlockId
from workers.kv.tensors import KVCacheTensors
from workers.kv.tiers.disk_files import (
    SUFFIX,
    TEMP_SUFFIX,
    DiskRecord,
    check_private,
    decode,
    encode,
    file_name,
    lock_directory,
    sync_directory,
)
from workers.kv.tiers.disk_writer import DiskWriter
from workers.kv.tiers.host_crypto import BlockSealer
from workers.kv.tiers.host_tier import HostBlock

log = logging.getLogger(__name__)


class DiskEntry(NamedTuple):
    """What the tier keeps in memory per block: owner, chain parent, tokens (key bytes),
    and when it expires (wall-clock seconds; None: never)."""

    scope: str
    parent: BlockHash | None
    tokens: bytes
    expires_at: float | None = None


@dataclass(frozen=True)
class DiskTierStats:
    """Gauges and counters for ``/metrics``."""

    num_disk_blocks_total: int
    num_disk_blocks_used: int
    disk_hit_blocks_total: int
    disk_bytes_written_total: int
    disk_bytes_read_total: int
    disk_auth_failures_total: int


class DiskTier(ABC):
    """What the host link needs from a disk tier. Engine thread only."""

    @property
    @abstractmethod
    def enabled(self) -> bool:
        """False for the null tier."""

    @abstractmethod
    def put(self, block_hash: BlockHash, block: HostBlock) -> list[tuple[BlockHash, DiskEntry]]:
        """Keep ``block`` (sealed by the host tier) as ``block_hash``; returns the entries
        dropped to make room, oldest first (the null tier drops ``block`` itself)."""

    @abstractmethod
    def holds(self, block_hash: BlockHash, scope: str, tokens: bytes) -> bool:
        """True when ``block_hash`` is kept as a block of ``scope`` with exactly
        ``tokens`` (a hash never decides alone)."""

    @abstractmethod
    def take(self, block_hash: BlockHash, device_block: BlockId) -> DiskEntry | None:
        """Remove ``block_hash`` and write its K/V into ``device_block``; None (the entry
        dropped) when it is absent, unreadable or fails authentication."""

    @abstractmethod
    def discard(self, block_hash: BlockHash) -> DiskEntry | None:
        """Remove ``block_hash`` without reading it (the device holds it again)."""

    @abstractmethod
    def expire(self, now: float) -> list[tuple[BlockHash, DiskEntry]]:
        """Remove and return the entries expired at ``now`` (wall-clock seconds)."""

    @abstractmethod
    def entries(self) -> list[tuple[BlockHash, DiskEntry]]:
        """Every block kept, oldest first (snapshots)."""

    @abstractmethod
    def stats(self) -> DiskTierStats:
        """Current gauges and counters."""

    @abstractmethod
    def flush(self) -> None:
        """Return once every block kept so far is on disk."""

    @abstractmethod
    def close(self) -> None:
        """Release the directory (a later tier may open it); the files stay."""


class NullDiskTier(DiskTier):
    """No disk tier: what the host tier drops is gone."""

    @property
    def enabled(self) -> bool:
        """Never."""
        return False

    def put(self, block_hash: BlockHash, block: HostBlock) -> list[tuple[BlockHash, DiskEntry]]:
        """Keeps nothing: returns ``block`` as dropped."""
        return [(block_hash, DiskEntry(block.scope, block.parent, block.tokens, block.expires_at))]

    def holds(self, block_hash: BlockHash, scope: str, tokens: bytes) -> bool:
        """Never."""
        return False

    def take(self, block_hash: BlockHash, device_block: BlockId) -> DiskEntry | None:
        """Nothing to take."""
        return None

    def discard(self, block_hash: BlockHash) -> DiskEntry | None:
        """Nothing to discard."""
        return None

    def expire(self, now: float) -> list[tuple[BlockHash, DiskEntry]]:
        """Nothing expires."""
        return []

    def entries(self) -> list[tuple[BlockHash, DiskEntry]]:
        """None."""
        return []

    def stats(self) -> DiskTierStats:
        """All zero."""
        return DiskTierStats(0, 0, 0, 0, 0, 0)

    def flush(self) -> None:
        """Nothing is kept."""

    def close(self) -> None:
        """Nothing to release."""


class FileDiskTier(DiskTier):
    """Up to ``num_blocks`` sealed block files under ``root/<namespace digest hex>``."""

    def __init__(self, root: Path, num_blocks: int, tensors: KVCacheTensors, sealer: BlockSealer,
                 namespace_digest: bytes) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.directory = Path(root) / namespace_digest.hex()
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        for directory in (Path(root), self.directory):
            check_private(directory)
        self._lock_fd: int | None = lock_directory(self.directory)
        self._tensors = tensors
        self._sealer = sealer
        self._entries: OrderedDict[BlockHash, DiskEntry] = OrderedDict()
        self._next_arrival = 0
        self._next_expiry = math.inf
        self._num_hits = self._bytes_read = self._num_failures = 0
        self._writer = DiskWriter(self.directory)
        self._scan()

    @property
    def enabled(self) -> bool:
        """Always."""
        return True

    def _scan(self) -> None:
        """Keep the files that authenticate, oldest first; delete the rest."""
        records: list[DiskRecord] = []
        for path in self.directory.iterdir():
            if path.name.endswith(TEMP_SUFFIX):
                path.unlink(missing_ok=True)
            elif path.name.endswith(SUFFIX):
                record = self._read(path)
                if record is None or self._sealer.open(
                    record.scope, record.block_hash, record.sealed_kv
                ) is None:
                    self._num_failures += 1
                    path.unlink(missing_ok=True)
                else:
                    records.append(record)
        for record in sorted(records, key=lambda r: r.arrival):
            self._entries[record.block_hash] = DiskEntry(
                record.scope, record.parent, record.tokens, record.expires_at)
            self._next_arrival = record.arrival + 1
            self._next_expiry = min(self._next_expiry, record.expires_at or math.inf)
        for block_hash, _ in self.expire(time.time()):
            log.info("disk tier: block %s expired while the worker was down", block_hash.hex())
        for block_hash, _ in self._drop_over_budget():
            log.info("disk tier over its budget after the scan: dropped %s", block_hash.hex())
        if records or self._num_failures:
            log.info("disk tier %s: kept %d blocks, dropped %d that failed authentication",
                     self.directory, len(self._entries), self._num_failures)

    def _read(self, path: Path) -> DiskRecord | None:
        """The record in ``path`` if it reads and its meta authenticates under the
        name it is filed under."""
        try:
            data = path.read_bytes()
        except OSError:
            return None
        self._bytes_read += len(data)
        return self._record(data, path.name)

    def _record(self, data: bytes, name: str) -> DiskRecord | None:
        """The record ``data`` holds if its meta authenticates under ``name``."""
        record = decode(data, self._sealer)
        if record is None or file_name(record.block_hash) != name:
            return None
        return record

    def put(self, block_hash: BlockHash, block: HostBlock) -> list[tuple[BlockHash, DiskEntry]]:
        """See ``DiskTier.put``; a hash already present is rewritten as the newest. The
        write is queued; blocks whose writes failed since (disk full) are among the
        entries returned, as drops."""
        entry = DiskEntry(block.scope, block.parent, block.tokens, block.expires_at)
        record = DiskRecord(block_hash, block.scope, self._next_arrival, block.expires_at,
                            block.parent, block.tokens, block.sealed)
        self._entries.pop(block_hash, None)
        self._writer.write(block_hash, encode(record, self._sealer))
        self._next_arrival += 1
        self._entries[block_hash] = entry
        self._next_expiry = min(self._next_expiry, entry.expires_at or math.inf)
        failed = [(h, e) for h in self._writer.failed()
                  if (e := self._entries.pop(h, None)) is not None]
        return failed + self._drop_over_budget()

    def _drop_over_budget(self) -> list[tuple[BlockHash, DiskEntry]]:
        dropped = []
        while len(self._entries) > self.num_blocks:
            block_hash, entry = self._entries.popitem(last=False)
            self._unlink(block_hash)
            dropped.append((block_hash, entry))
        return dropped

    def holds(self, block_hash: BlockHash, scope: str, tokens: bytes) -> bool:
        """See ``DiskTier.holds``."""
        entry = self._entries.get(block_hash)
        return entry is not None and entry.scope == scope and entry.tokens == tokens

    def take(self, block_hash: BlockHash, device_block: BlockId) -> DiskEntry | None:
        """See ``DiskTier.take``: the file (or its bytes, while its write is queued) is
        read and opened again, and must still be the block the scan or ``put``
        recorded."""
        entry = self._entries.pop(block_hash, None)
        if entry is None:
            return None
        name, queued = file_name(block_hash), self._writer.pending(block_hash)
        record = (self._read(self.directory / name) if queued is None
                  else self._record(queued, name))
        data = None
        if record is not None and DiskEntry(
            record.scope, record.parent, record.tokens, record.expires_at
        ) == entry:
            data = self._sealer.open(entry.scope, block_hash, record.sealed_kv)
        self._unlink(block_hash)
        if data is None:
            self._num_failures += 1
            return None
        self._tensors.write_block(device_block, data)
        self._num_hits += 1
        return entry

    def discard(self, block_hash: BlockHash) -> DiskEntry | None:
        """See ``DiskTier.discard``."""
        entry = self._entries.pop(block_hash, None)
        if entry is not None:
            self._unlink(block_hash)
        return entry

    def expire(self, now: float) -> list[tuple[BlockHash, DiskEntry]]:
        """See ``DiskTier.expire``. Entries arrive in the host tier's drop order, not in
        expiry order, so a pass visits them all, but only once the earliest expiry
        has come."""
        if now < self._next_expiry:
            return []
        expired = [(h, e) for h, e in self._entries.items()
                   if e.expires_at is not None and e.expires_at <= now]
        for block_hash, _ in expired:
            del self._entries[block_hash]
            self._unlink(block_hash)
        self._next_expiry = min((e.expires_at for e in self._entries.values()
                                 if e.expires_at is not None), default=math.inf)
        return expired

    def _unlink(self, block_hash: BlockHash) -> None:
        self._writer.unlink(block_hash)

    def flush(self) -> None:
        """See ``DiskTier.flush``: every write and deletion queued so far is done."""
        self._writer.flush()

    def entries(self) -> list[tuple[BlockHash, DiskEntry]]:
        """See ``DiskTier.entries``."""
        return list(self._entries.items())

    def stats(self) -> DiskTierStats:
        """See ``DiskTier.stats``."""
        return DiskTierStats(
            num_disk_blocks_total=self.num_blocks,
            num_disk_blocks_used=len(self._entries),
            disk_hit_blocks_total=self._num_hits,
            disk_bytes_written_total=self._writer.num_bytes_written,
            disk_bytes_read_total=self._bytes_read,
            disk_auth_failures_total=self._num_failures,
        )

    def close(self) -> None:
        """See ``DiskTier.close``: queued writes finish, the directory is synced and
        unlocked."""
        if self._lock_fd is not None:
            self._writer.close()
            sync_directory(self.directory)
            os.close(self._lock_fd)
            self._lock_fd = None

