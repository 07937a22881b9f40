"""Moving full KV blocks between the prefix cache and the host tier, with their events.

The prefix cache decides what moves (which blocks an evicted leaf holds, which
blocks of a prompt continue a device hit); this link does the moving and logs it:
``stored``/``host`` for blocks demoted, ``removed``/``host`` for blocks the tier
dropped, expired, gave back to the device, or refused (failed authentication). Engine thread
only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from radix.events import EventBlock, EventType, KVEvent
from radix.hashing import BlockHash
from radix.keys import TOKEN_BYTES, from_key, to_key
from radix.tree import PUBLIC, Scope
from workers.kv.block_events import BlockChainer
from workers.kv.block_pool import BlockPool
from workers.kv.event_log import KVEventLog
from workers.kv.host_tier import HostBlock, HostTier
from workers.kv.ids import BlockId


class HostHit(NamedTuple):
    """A full block of a prompt that the host tier holds: its hash, scope and tokens
    (key bytes)."""

    block_hash: BlockHash
    scope: Scope
    tokens: bytes


class HostLink:
    """The prefix cache's side of a host tier (a null tier makes every call a no-op)."""

    def __init__(
        self, host: HostTier, pool: BlockPool, chainer: BlockChainer, event_log: KVEventLog
    ) -> None:
        self.host = host
        self._pool = pool
        self._chainer = chainer
        self._log = event_log

    @property
    def enabled(self) -> bool:
        """False for the null tier."""
        return self.host.enabled

    def demote(self, scope: str, blocks: Sequence[tuple[EventBlock, Sequence[int]]]) -> None:
        """Copy each full block (its event block, with tokens, and its device slots)
        into the tier and log what it stored and dropped."""
        dropped: list[tuple[str, EventBlock]] = []
        for block, slots in blocks:
            parent = None if block.parent is None else BlockHash(bytes.fromhex(block.parent))
            for gone_hash, gone in self.host.put(
                BlockHash(bytes.fromhex(block.hash)), scope, parent, to_key(block.tokens or ()),
                slots,
            ):  # fmt: skip
                dropped.append((gone.scope, _event_block(gone_hash, gone)))
        self._emit("stored", [(scope, block) for block, _ in blocks])
        self._emit("removed", dropped)

    def expire(self, now: float) -> int:
        """Drop the tier's entries expired at ``now`` and log them ``removed``, as for
        an eviction; returns how many."""
        expired = self.host.expire(now)
        self._emit("removed", [(entry.scope, _event_block(block_hash, entry))
                               for block_hash, entry in expired])
        return len(expired)

    def forget(self, scope: str, blocks: Sequence[EventBlock]) -> None:
        """The device caches ``blocks`` again: drop any host copy of them."""
        gone = [b for b in blocks if self.host.discard(BlockHash(bytes.fromhex(b.hash)))]
        self._emit("removed", [(scope, block) for block in gone])

    def find(
        self, parent: BlockHash | None, key: bytes, start: int, scope: Scope, public_ok: bool
    ) -> list[HostHit]:
        """The consecutive full blocks of ``key`` from token ``start`` (a block
        boundary, chained under ``parent``) that the tier holds with the same scope
        and tokens (``HostTier.holds``): each hashed under ``scope``, or under PUBLIC
        while ``public_ok`` and every block found before it is public."""
        step = self._chainer.block_size * TOKEN_BYTES
        found: list[HostHit] = []
        for at in range(start * TOKEN_BYTES + step, len(key) + 1, step):
            block_key = key[at - step : at]
            for block_scope in (scope, PUBLIC) if public_ok else (scope,):
                block_hash = self._chainer.block_hash(parent, block_scope, block_key)
                if self.host.holds(block_hash, block_scope, block_key):
                    break
            else:
                break
            public_ok = public_ok and block_scope == PUBLIC
            found.append(HostHit(block_hash, block_scope, block_key))
            parent = block_hash
        return found

    def take(self, found: Sequence[HostHit]) -> tuple[list[BlockId], int]:
        """Copy ``found`` into freshly allocated device blocks (held once by the
        caller), stopping at the first block gone, no longer the same scope and tokens,
        or failing authentication (dropped and logged). Returns the blocks and how
        many of the first are public."""
        restored: list[BlockId] = []
        num_public = 0
        for block_hash, block_scope, block_key in found:
            if not self.host.holds(block_hash, block_scope, block_key):
                break
            device_block = self._pool.allocate()
            entry = self.host.take(block_hash, device_block)
            if entry is None:
                self._pool.decref([device_block])
                self._emit("removed", [(block_scope, EventBlock(block_hash.hex()))])
                break
            self._emit("removed", [(block_scope, _event_block(block_hash, entry))])
            restored.append(device_block)
            num_public += block_scope == PUBLIC
        return restored, num_public

    def snapshot(self) -> list[KVEvent]:
        """The tier's blocks as ``stored``/``host`` lines at the log's head, newest
        first (a block is demoted after its descendants, so parents come first)."""
        return [
            self._log.at_head("stored", entry.scope, [_event_block(block_hash, entry)], "host")
            for block_hash, entry in reversed(self.host.entries())
        ]

    def _emit(self, kind: EventType, blocks: Sequence[tuple[str, EventBlock]]) -> None:
        by_scope: dict[str, list[EventBlock]] = {}
        for scope, block in blocks:
            by_scope.setdefault(scope, []).append(block)
        for scope, scope_blocks in by_scope.items():
            self._log.append(kind, scope, scope_blocks, "host")


def _event_block(block_hash: BlockHash, entry: HostBlock) -> EventBlock:
    return EventBlock(
        hash=block_hash.hex(),
        parent=None if entry.parent is None else entry.parent.hex(),
        tokens=tuple(from_key(entry.tokens)),
    )
