"""The worker's prefix cache: its RadixTree over KV slots, with KV events.

Slot-payload model. A node's payload is an ``array('i')`` with one slot id per token
of its edge: ``slot = block_id * B + position % B``, taken from the block table of
the sequence that inserted the token. A split slices the array, so splits never
touch counts. Per block the pool counts the slot references the tree holds
(``num_tree_slots``); inserting a leaf adds its slots, evicting one drops them, and a
block with no sequence and no tree slot goes back to the free list.

Within a node, the positions of one logical block (``[k*B, (k+1)*B)``) always name
one physical block: they were inserted together from one block table. Matching
``m`` tokens maps logical block ``k`` to the block of the slot at position
``min(m, (k+1)*B) - 1``: the sequence that inserted that token held, in that same
block, valid KV for every earlier position of the logical block (it computed them,
shared them or copied them on write), and a block with tree slots is never written
in place, so they are still there.

Event hashes chain from the root, so the cache memoizes each node's chain state at
its end (``_chain_at_end``): a node's path and end never change while it lives (a
split shortens it at the front and gives the front to a new head node), so an entry
stays valid until the node is evicted. Inserting or evicting a leaf then hashes only
that leaf's blocks, not its whole path.

Tiers (``workers.kv.tiers``; ``NoTiers`` when off). Evicting a leaf demotes every
full block whose last token it holds into the tiers (the ancestors, still in the
tree, hold the block's earlier positions); inserting blocks the tiers hold drops
their copies there. ``path_end`` gives the chain a device hit ends at, from which
the KV manager finds the tiers' blocks that continue it, takes them back and
inserts them like a commit, so the following match counts them as cached.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import cast

from radix.events import EventBlock, KVEvent
from radix.hashing import BlockHasher
from radix.tree import PUBLIC, Node, RadixTree, Scope
from workers.kv.block_events import ROOT_STATE, BlockChainer, ChainState, PathEnd
from workers.kv.block_pool import BlockPool
from workers.kv.event_log import KVEventLog
from workers.kv.ids import BlockId
from workers.kv.prefix_cache import EMPTY_HIT, PrefixCache, PrefixHit
from workers.kv.tiers.base import NoTiers, Tiers

Slots = array  # array('i') of slot ids, one per token of a node's edge


def _split_slots(payload: Slots, num_head_tokens: int) -> tuple[Slots, Slots]:
    return payload[:num_head_tokens], payload[num_head_tokens:]


class RadixPrefixCache(PrefixCache):
    """Prefix cache over a ``RadixTree`` whose payloads are slot arrays (see module doc).

    Every insert that adds tokens emits one ``stored`` event (the new leaf's blocks);
    every eviction call emits one ``removed`` event per scope of the leaves it evicted.
    """

    def __init__(
        self,
        pool: BlockPool,
        hasher: BlockHasher,
        event_log: KVEventLog,
        tiers: Tiers | None = None,
    ):
        self._pool = pool
        self.tiers = tiers or NoTiers()
        self._block_size = pool.block_size
        self._chainer = BlockChainer(hasher, pool.block_size)
        self.tree: RadixTree[Slots] = RadixTree(_split_slots)
        self.event_log = event_log
        self.num_evicted_blocks_total = 0
        self._chain_at_end: dict[Node, tuple[int, ChainState]] = {}
        self._quotas: dict[Scope, int] = {}

    def match(self, key: bytes, scope: Scope) -> PrefixHit:
        """Longest visible prefix; logical block ``k`` maps to the block of the slot at
        position ``min(m, (k+1)*B) - 1`` (see the module docstring). The handle ends
        at the hit's last whole block, splitting an edge there if needed (a block
        boundary, so events stay exact): the unmatched rest stays an evictable leaf."""
        result = self.tree.match(key, scope)
        num_matched = result.num_matched_tokens
        if num_matched == 0:
            return EMPTY_HIT
        block_size = self._block_size
        blocks: list[int] = []
        for node in result.nodes:  # the last position of each full block, node by node
            start, end = node.start, min(node.end, num_matched)
            first = start + (block_size - 1 - start % block_size)
            if first < end:
                step = node.payload[first - start : end - start : block_size]
                blocks.extend([slot // block_size for slot in step])
        if num_matched % block_size:  # the partial last block, through its last token
            last = result.nodes[-1]
            blocks.append(last.payload[num_matched - 1 - last.start] // block_size)
        num_whole = num_matched - num_matched % block_size
        handle = None
        if num_whole:
            node = next(node for node in result.nodes if node.end >= num_whole)
            handle = self.tree.split(node, num_whole)
        return PrefixHit(num_matched, cast(tuple[BlockId, ...], tuple(blocks)), handle)

    def lock(self, node: Node | None) -> None:
        """Lock ``node``'s path in the tree."""
        if node is not None:
            self.tree.lock(node)

    def unlock(self, node: Node | None) -> None:
        """Unlock ``node``'s path (counts as a use for LRU)."""
        if node is not None:
            self.tree.unlock(node)

    def blocks_beyond(self, node: Node | None, block_table: Sequence[BlockId]) -> list[BlockId]:
        """Blocks named on the path to ``node`` that ``block_table`` does not hold at their
        logical block: where an edge ends inside a block that a later sequence copied
        on write, or where another sequence cached the same tokens first."""
        beyond = self.blocks_beyond_since(node, block_table, None)
        assert beyond is not None  # the walk always reaches the root
        return beyond

    def blocks_beyond_since(
        self, node: Node | None, block_table: Sequence[BlockId], since: Node | None
    ) -> list[BlockId] | None:
        """``blocks_beyond`` over the path's nodes below ``since`` (None: all); None
        when the walk reaches the root without meeting ``since``."""
        beyond: set[BlockId] = set()
        num_table_blocks = len(block_table)
        root = self.tree.root
        node = root if node is None else node
        stop = root if since is None else since
        while node is not stop:
            if node is root:
                return None
            at = node.start
            for block, count in self._runs(node):
                k = at // self._block_size
                if k >= num_table_blocks or block_table[k] != block:
                    beyond.add(block)
                at += count
            node = node.parent
        return sorted(beyond)

    def insert(self, key: bytes, scope: Scope, block_table: Sequence[BlockId]) -> Node | None:
        """Insert ``key``; the new leaf (if any) takes its slots from ``block_table``,
        references them in the pool and is announced in a ``stored`` event."""
        result = self.tree.insert(key, scope)
        for leaf in result.new_nodes:
            leaf.payload = self._slots(block_table, leaf.start, leaf.end)
            for block, count in self._runs(leaf):
                self._pool.ref_tree_slots(block, count)
            state = self._chain_state_at_end(leaf.parent)
            blocks, end_state = self._chainer.node_blocks(state, leaf, with_tokens=True)
            self._chain_at_end[leaf] = (leaf.end, end_state)
            self.event_log.append("stored", leaf.scope, blocks)
            self.tiers.forget(leaf.scope, blocks)  # the device holds these again
        return result.nodes[-1] if result.nodes else None

    def set_quota(self, scope: Scope, max_cached_tokens: int | None) -> None:
        """Record ``scope``'s quota (None removes it); enforced by ``evict``."""
        if max_cached_tokens is None:
            self._quotas.pop(scope, None)
        elif max_cached_tokens < 0:
            raise ValueError(f"max_cached_tokens must be >= 0, got {max_cached_tokens}")
        else:
            self._quotas[scope] = max_cached_tokens

    def evict(self, num_blocks: int) -> int:
        """Evict unlocked leaves one by one (parents after their children) until
        ``num_blocks`` blocks are freed or none is left; emits ``removed`` events.
        First the LRU leaves of the scope furthest over its quota, while one is over
        and has an unlocked leaf; then LRU leaves of any scope."""
        num_freed = 0
        removed: dict[Scope, list[EventBlock]] = {}
        while num_freed < num_blocks:
            node = self._evict_over_quota()
            if node is None:
                evicted = self.tree.evict(1)
                if not evicted:
                    break
                node = evicted[0]
            num_freed += self._drop(node, removed)
        return self._finish_eviction(num_freed, removed)

    def evict_path(self, key: bytes, scope: Scope) -> int:
        """Evict the unlocked leaves of ``scope`` at the end of ``key``'s cached path,
        deepest first (a preempted sequence swapped out to the tiers); returns the
        blocks freed."""
        result = self.tree.match(key, scope, touch=False)
        node = result.nodes[-1] if result.nodes else None
        num_freed = 0
        removed: dict[Scope, list[EventBlock]] = {}
        while node is not None and node.scope == scope and not node.children and not node.lock_ref:
            parent = node.parent
            self.tree.remove_leaf(node)
            num_freed += self._drop(node, removed)
            node = parent if parent is not self.tree.root else None
        return self._finish_eviction(num_freed, removed)

    def _drop(self, node: Node, removed: dict[Scope, list[EventBlock]]) -> int:
        """Release an evicted node's slots (its full blocks are demoted into the tiers
        first); returns the blocks freed."""
        state = self._chain_state_at_end(node.parent)
        self._chain_at_end.pop(node, None)
        blocks, _ = self._chainer.node_blocks(state, node, with_tokens=True)
        removed.setdefault(node.scope, []).extend(
            EventBlock(b.hash, b.parent) for b in blocks
        )
        self.tiers.demote(node.scope, lambda: self._full_blocks(node, blocks))
        num_freed = 0
        for block, count in self._runs(node):
            num_freed += self._pool.unref_tree_slots(block, count)
        return num_freed

    def _full_blocks(
        self, node: Node, blocks: Sequence[EventBlock]
    ) -> list[tuple[EventBlock, list[int]]]:
        """``node``'s full blocks (the first of its ``blocks``) with their slots."""
        block_size = self._block_size
        ends = range((node.start // block_size + 1) * block_size, node.end + 1, block_size)
        return [
            (block, self._path_slots(node, end - block_size, end))
            for end, block in zip(ends, blocks, strict=False)  # the full blocks come first
        ]

    def _path_slots(self, node: Node, start: int, end: int) -> list[int]:
        """The slots of positions ``[start, end)`` on the path ending at ``node``."""
        slots: list[int] = []
        while end > start:
            if node.start < end:
                first = max(start, node.start)
                slots[:0] = node.payload[first - node.start : end - node.start]
                end = first
            node = node.parent
        return slots

    def path_end(self, node: Node | None) -> PathEnd:
        """See ``PrefixCache.path_end`` (the chain state is memoized per node)."""
        state = ROOT_STATE if node is None else self._chain_state_at_end(node)
        return PathEnd(state.parent, all(n.scope == PUBLIC for n in self._path(node)))

    def _path(self, node: Node | None) -> Iterator[Node]:
        while node is not None and node is not self.tree.root:
            yield node
            node = node.parent

    def _finish_eviction(self, num_freed: int, removed: dict[Scope, list[EventBlock]]) -> int:
        for scope, blocks in removed.items():
            self.event_log.append("removed", scope, blocks)
        self.num_evicted_blocks_total += num_freed
        return num_freed

    def _evict_over_quota(self) -> Node | None:
        """Remove one LRU unlocked leaf of the scope most tokens over its quota."""
        over = sorted(
            ((self.tree.num_tokens(scope) - quota, scope) for scope, quota in self._quotas.items()),
            reverse=True,
        )
        for excess, scope in over:
            if excess <= 0:
                break
            node = self.tree.evict_scope_leaf(scope)
            if node is not None:
                return node
        return None

    def snapshot(self) -> tuple[int, list[KVEvent]]:
        """Every node's blocks as ``stored`` events at ``head_seq``, parents first."""
        log = self.event_log
        events = [log.at_head("cleared", PUBLIC, ())]
        states: dict[Node, ChainState] = {self.tree.root: ROOT_STATE}
        for node in self.tree.iter_nodes():
            blocks, states[node] = self._chainer.node_blocks(states[node.parent], node, True)
            events.append(log.at_head("stored", node.scope, blocks))
        return log.head_seq, events + self.tiers.snapshot()

    @property
    def num_cached_tokens(self) -> int:
        """Tokens in the tree, all scopes."""
        return self.tree.num_tokens()

    def check_invariants(self, lock_handles: Sequence[Node | None]) -> list[int]:
        """The tree's own invariants; each node locked exactly by the handles at or below
        it; payload lengths; one block per logical-block run; every block a locked node
        names is held by a sequence, so evicting every unlocked leaf would free every
        block that no sequence holds. Returns the tree's slot references per block."""
        self.tree.check_invariants()
        direct = Counter(handle for handle in lock_handles if handle is not None)
        for node in self.tree.iter_nodes():
            below = sum(child.lock_ref for child in (node.children or {}).values())
            assert node.lock_ref == direct.pop(node, 0) + below, f"{node}: stray lock"
        assert not direct, f"locks held on nodes outside the tree: {list(direct)}"
        block_size = self._block_size
        counts = [0] * self._pool.num_total_blocks
        for node in self.tree.iter_nodes():
            payload = node.payload
            assert isinstance(payload, array) and len(payload) == node.num_tokens, node
            at = 0
            for block, count in self._runs(node):
                run = {slot // block_size for slot in payload[at : at + count]}
                assert run == {block}, f"{node}: logical block split over blocks {run}"
                offsets = [slot % block_size for slot in payload[at : at + count]]
                first = (node.start + at) % block_size
                assert offsets == list(range(first, first + count)), f"{node}: slot offsets"
                counts[block] += count
                at += count
        for node in self.tree.iter_nodes():  # liveness: no lock keeps an unreferenced block
            if node.lock_ref:
                for block, _ in self._runs(node):
                    assert self._pool.refcount(block), f"{node} pins unreferenced block {block}"
        live = set(self.tree.iter_nodes())
        assert all(node in live for node in self._chain_at_end), "chain memo holds an evicted node"
        return counts

    def _chain_state_at_end(self, node: Node) -> ChainState:
        """The hash chain state at ``node.end`` (memoized; see the module docstring)."""
        pending: list[Node] = []
        state = ROOT_STATE
        while node is not self.tree.root:
            entry = self._chain_at_end.get(node)
            if entry is not None and entry[0] == node.end:
                state = entry[1]
                break
            pending.append(node)
            node = node.parent
        for node in reversed(pending):
            state = self._chainer.state_after((node,), state)
            self._chain_at_end[node] = (node.end, state)
        return state

    def _slots(self, block_table: Sequence[BlockId], start: int, end: int) -> Slots:
        block_size = self._block_size
        slots = array("i")
        for k in range(start // block_size, (end - 1) // block_size + 1):
            base = block_table[k] * block_size - k * block_size
            slots.extend(
                range(base + max(start, k * block_size), base + min(end, (k + 1) * block_size))
            )
        return slots

    def _runs(self, node: Node) -> Iterator[tuple[BlockId, int]]:
        """(block, number of slots) per logical block the node's edge touches."""
        payload, block_size = node.payload, self._block_size
        at, position, size = 0, node.start, len(payload)
        while at < size:
            count = min(block_size - position % block_size, size - at)
            yield BlockId(payload[at] // block_size), count
            at += count
            position += count

