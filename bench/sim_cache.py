"""A worker's prefix cache, simulated, speaking the KV event protocol.

``SimCache`` is what the routing benchmark's workers hold and what the router's
property and follower tests generate events with: a real ``RadixTree`` under a token
capacity whose inserts, evictions and snapshots come out as the KV events
docs/protocol.md specifies for a worker.
"""

from __future__ import annotations

from collections.abc import Sequence

from radix.events import EventBlock, KVEvent
from radix.hashing import BlockHash, BlockHasher
from radix.keys import TOKEN_BYTES, from_key
from radix.tree import PUBLIC, Node, RadixTree, Scope


class SimCache:
    """A worker's prefix cache, simulated: a real ``RadixTree`` that evicts least
    recently used leaves past ``capacity_tokens`` and describes every change as KV
    events exactly as docs/protocol.md specifies (stored blocks cut at absolute block
    starts, removed blocks ending in an evicted leaf's span, chained hashes with each
    block's scope). Events are returned to the caller, who delivers them."""

    def __init__(self, worker: str, namespace: str, capacity_tokens: int, block_size: int = 16):
        self.worker = worker
        self.namespace = namespace
        self.capacity_tokens = capacity_tokens
        self.block_size = block_size
        self.tree: RadixTree[None] = RadixTree()
        self._hasher = BlockHasher(bytes.fromhex(namespace), "xxh3_128")
        self._num_epochs = 0
        self.epoch = f"{worker}-0"
        self._seq = 0

    def match(self, key: bytes, scope: str) -> int:
        """Cached tokens of ``key`` visible to ``scope`` (counts as a use)."""
        return self.tree.match(key, Scope(scope)).num_matched_tokens

    def insert(self, key: bytes, scope: str, num_public_tokens: int = 0) -> list[KVEvent]:
        """Cache ``key``: its first ``num_public_tokens`` (a multiple of the block size)
        as PUBLIC, the rest under ``scope``; then evict down to the capacity."""
        events = []
        if num_public_tokens:
            events += self._insert(key[: num_public_tokens * TOKEN_BYTES], PUBLIC)
        events += self._insert(key, Scope(scope))
        excess = self.tree.num_tokens() - self.capacity_tokens
        if excess > 0:
            events += self.evict(excess)
        return events

    def evict(self, num_tokens: int) -> list[KVEvent]:
        """Evict at least ``num_tokens`` tokens (LRU leaves first): one event per leaf."""
        return [self._removed(node) for node in self.tree.evict(num_tokens)]

    def clear(self) -> KVEvent:
        """Drop everything, as a worker restart does: a new epoch starting at seq 0."""
        self.tree = RadixTree()
        self._num_epochs += 1
        self.epoch, self._seq = f"{self.worker}-{self._num_epochs}", 0
        return self._event("cleared", PUBLIC, ())

    def snapshot(self) -> list[KVEvent]:
        """What a worker sends a consumer that must resync: ``cleared`` with the current
        seq H, then one ``stored`` event (seq H) per cached node, parents first."""
        head = self._seq
        events = [KVEvent(self.worker, self.epoch, head, "cleared", self.namespace, PUBLIC)]
        for node in self.tree.iter_nodes():
            blocks = self._stored_blocks(self.tree.path_key(node), self._path(node), node.start, node.end)
            events.append(KVEvent(self.worker, self.epoch, head, "stored", self.namespace, node.scope, blocks))
        return events

    def _insert(self, key: bytes, scope: Scope) -> list[KVEvent]:
        result = self.tree.insert(key, scope)
        e0, e1 = result.num_existing_tokens, len(key) // TOKEN_BYTES
        if e0 == e1:
            return []
        return [self._event("stored", scope, self._stored_blocks(key, result.nodes, e0, e1))]

    def _stored_blocks(self, key: bytes, nodes: Sequence[Node[None]], e0: int, e1: int) -> tuple[EventBlock, ...]:
        """Blocks announcing tokens [e0, e1) of ``key``: each cut at its absolute start."""
        size = self.block_size
        hashes = self._hashes(key, nodes, e1)
        return tuple(
            EventBlock(hashes[k].hex(), hashes[k - 1].hex() if k else None,
                       tuple(from_key(key[k * size * TOKEN_BYTES : min((k + 1) * size, e1) * TOKEN_BYTES])))
            for k in range(e0 // size, (e1 - 1) // size + 1)
        )

    def _removed(self, leaf: Node[None]) -> KVEvent:
        size, start, end = self.block_size, leaf.start, leaf.end
        hashes = self._hashes(self.tree.path_key(leaf), self._path(leaf), end)
        ends = list(range((start // size + 1) * size, end + 1, size))
        if end % size:
            ends.append(end)
        blocks = tuple(
            EventBlock(hashes[(e - 1) // size].hex(), hashes[(e - 1) // size - 1].hex() if e > size else None)
            for e in ends
        )
        return self._event("removed", leaf.scope, blocks)

    @staticmethod
    def _path(node: Node[None]) -> list[Node[None]]:
        """Root-first nodes down to ``node`` (works on evicted nodes: they keep ``parent``)."""
        path = []
        while node.parent is not None:
            path.append(node)
            node = node.parent
        return path[::-1]

    def _hashes(self, key: bytes, nodes: Sequence[Node[None]], end: int) -> list[BlockHash]:
        """Chained hashes of the blocks of ``key[:end]``; ``nodes`` is its root-first path.
        A block's scope is that of the node holding its last token."""
        size, hashes, i = self.block_size, [], 0
        for k in range((end + size - 1) // size):
            last = min((k + 1) * size, end) - 1
            while nodes[i].end <= last:
                i += 1
            scope = nodes[i].scope
            parent = hashes[-1] if hashes else self._hasher.root_hash(scope)
            block_key = key[k * size * TOKEN_BYTES : (last + 1) * TOKEN_BYTES]
            hashes.append(self._hasher.block_hash(parent, scope, block_key))
        return hashes

    def _event(self, kind: str, scope: str, blocks: tuple[EventBlock, ...]) -> KVEvent:
        if kind != "cleared":
            self._seq += 1
        return KVEvent(self.worker, self.epoch, self._seq, kind, self.namespace, scope, blocks)  # type: ignore[arg-type]
