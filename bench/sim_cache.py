"""A worker's prefix cache, simulated, speaking the KV event protocol.

``SimCache`` is what the routing benchmark's workers hold and what the router's
property and follower tests generate events with: a real ``RadixTree`` under a token
capacity whose inserts, evictions and snapshots come out as the KV events
docs/protocol.md specifies for a worker.
"""

from __future__ import annotations

from radix.events import EventBlock, KVEvent
from radix.hashing import BlockHasher
from radix.keys import TOKEN_BYTES
from radix.tree import PUBLIC, Node, RadixTree, Scope
from workers.kv.block_events import ROOT_STATE, BlockChainer, ChainState


def _keep_tail_state(state: ChainState | None, num_head_tokens: int) -> tuple[None, ChainState | None]:
    """A split keeps the end state on the tail (same end); the new head computes its own."""
    return None, state


class SimCache:
    """A worker's prefix cache, simulated: a real ``RadixTree`` that evicts least
    recently used leaves past ``capacity_tokens`` and describes every change as KV
    events exactly as docs/protocol.md specifies (stored blocks cut at absolute block
    starts, removed blocks ending in an evicted leaf's span, chained hashes with each
    block's scope). The block model is the worker's own (``workers.kv.block_events``);
    events are returned to the caller, who delivers them."""

    def __init__(self, worker: str, namespace: str, capacity_tokens: int, block_size: int = 16):
        self.worker = worker
        self.namespace = namespace
        self.capacity_tokens = capacity_tokens
        self.block_size = block_size
        self.tree: RadixTree[ChainState | None] = RadixTree(_keep_tail_state)
        self._chainer = BlockChainer(BlockHasher(bytes.fromhex(namespace), "xxh3_128"), block_size)
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
        self.tree = RadixTree(_keep_tail_state)
        self._num_epochs += 1
        self.epoch, self._seq = f"{self.worker}-{self._num_epochs}", 0
        return self._event("cleared", PUBLIC, ())

    def snapshot(self) -> list[KVEvent]:
        """What a worker sends a consumer that must resync: ``cleared`` with the current
        seq H, then one ``stored`` event (seq H) per cached node, parents first."""
        head = self._seq
        events = [KVEvent(self.worker, self.epoch, head, "cleared", self.namespace, PUBLIC)]
        states: dict[Node[ChainState | None], ChainState] = {self.tree.root: ROOT_STATE}
        for node in self.tree.iter_nodes():
            blocks, states[node] = self._chainer.node_blocks(states[node.parent], node, True)
            events.append(KVEvent(self.worker, self.epoch, head, "stored", self.namespace,
                                  node.scope, tuple(blocks)))
        return events

    def _insert(self, key: bytes, scope: Scope) -> list[KVEvent]:
        result = self.tree.insert(key, scope)
        return [self._event("stored", leaf.scope, self._blocks(leaf, with_tokens=True))
                for leaf in result.new_nodes]

    def _removed(self, leaf: Node[ChainState | None]) -> KVEvent:
        return self._event("removed", leaf.scope, self._blocks(leaf, with_tokens=False))

    def _blocks(self, node: Node[ChainState | None], with_tokens: bool) -> tuple[EventBlock, ...]:
        """The blocks belonging to ``node`` (works on evicted nodes: they keep ``parent``)."""
        blocks, node.payload = self._chainer.node_blocks(self._end_state(node.parent), node, with_tokens)
        return tuple(blocks)

    def _end_state(self, node: Node[ChainState | None] | None) -> ChainState:
        """The chain state at ``node``'s end, computed once per node and kept as its
        payload (a node's end never moves: a split gives the head a new node)."""
        path = []
        while node is not None and node.parent is not None and node.payload is None:
            path.append(node)
            node = node.parent
        state = ROOT_STATE if node is None or node.parent is None else node.payload
        for missing in reversed(path):
            state = missing.payload = self._chainer.state_after((missing,), state)
        return state

    def _event(self, kind: str, scope: str, blocks: tuple[EventBlock, ...]) -> KVEvent:
        if kind != "cleared":
            self._seq += 1
        return KVEvent(self.worker, self.epoch, self._seq, kind, self.namespace, scope, blocks)  # type: ignore[arg-type]
