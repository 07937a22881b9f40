"""Exact index: which worker holds which prefix, mirrored from the workers' KV events.

One ``RadixTree`` per (namespace, scope). A node's payload maps worker id -> number of
that worker's stored blocks covering the node; a split copies the map to both halves,
so every node with a worker in its payload is wholly covered by that worker's blocks.

Why one tree per scope, not one tree with scoped children: ``RadixTree.insert`` reuses
every node visible to the scope, PUBLIC ones included, and ``match`` follows only the
deepest of a (tenant, PUBLIC) sibling pair. A tenant block whose tokens equal a public
node's would be counted on the public node (and leak to other tenants), and a worker
holding only the shallower sibling would be missed. With one scope per tree both
walks are plain trie walks: a lookup by tenant T walks T's tree and the PUBLIC tree.

Per worker, ``hash -> _Block`` mirrors the worker's stored blocks. A block links to its
parent *object*, so its full path (the parent chain's tokens, then its own) can be
rebuilt even after the parent's entry is gone. A run of chained blocks from one event
is applied as one token range: ``insert(path[:start])`` puts a node boundary at the
range start, ``insert(path)`` one at its end, and the nodes in between gain (or lose)
one count. Leaves whose payload empties are removed, cascading upward.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass

from radix.events import KVEvent
from radix.keys import TOKEN_BYTES, to_key
from radix.tree import PUBLIC, Node, RadixTree, Scope
from router.routing.index.approx import credit_deepest
from router.routing.index.ids import NamespaceDigest, WorkerId

Counts = dict[WorkerId, int]
TreeId = tuple[NamespaceDigest, Scope]


def _split_counts(counts: Counts, num_head_tokens: int) -> tuple[Counts, Counts]:
    return dict(counts), counts


class _Block:
    """One stored block of one worker: its tokens, its tree and its parent block."""

    __slots__ = ("parent", "key", "tree_id")

    def __init__(self, parent: _Block | None, key: bytes, tree_id: TreeId):
        self.parent = parent
        self.key = key
        self.tree_id = tree_id

    def path(self) -> bytes:
        """The block's full path: the parent chain's tokens, then its own."""
        parts = []
        block: _Block | None = self
        while block is not None:
            parts.append(block.key)
            block = block.parent
        return b"".join(reversed(parts))


@dataclass(frozen=True)
class ExactStats:
    """Size of the exact index."""

    num_trees: int
    num_nodes: int
    num_tokens: int
    num_blocks: dict[WorkerId, int]
    num_orphan_blocks: int
    num_evicted_blocks: int = 0


class ExactIndex:
    """Union of the radix workers' prefix caches, per namespace and scope.

    Guarantee: after any sequence of events, ``match`` gives for each worker the
    longest prefix of the key covered by that worker's stored, not yet removed blocks
    of the key's scope or PUBLIC (``check_invariants`` verifies the counts).
    """

    def __init__(self, parents: tuple[ExactIndex, ...] = ()) -> None:
        """``parents``: other indexes whose blocks this one's may chain from (the host
        tier's blocks continue device blocks; the disk tier's continue either)."""
        self._parents = parents
        self._trees: dict[TreeId, RadixTree[Counts]] = {}
        self._num_blocks: dict[TreeId, Counts] = {}
        self._blocks: dict[WorkerId, dict[str, _Block]] = {}
        self.num_orphan_blocks = 0

    def apply(self, worker_id: WorkerId, event: KVEvent) -> None:
        """Apply one event of ``worker_id``. ``stored`` blocks already known are ignored,
        as are blocks whose parent is unknown (counted in ``num_orphan_blocks``);
        ``removed`` ignores unknown hashes; ``cleared`` drops the worker."""
        if event.type == "cleared":
            self.reset_worker(worker_id)
        elif event.type == "stored":
            self._store(worker_id, event)
        else:
            self._remove(worker_id, event)

    def _store(self, worker_id: WorkerId, event: KVEvent) -> None:
        blocks = self._blocks.setdefault(worker_id, {})
        tree_id = (NamespaceDigest(event.namespace), Scope(event.scope))
        run: list[_Block] = []
        tokens: list[int] = []
        ends: list[int] = []
        for item in event.blocks:
            if item.hash in blocks:
                continue
            parent = None if item.parent is None else self._parent(worker_id, item.parent)
            if item.parent is not None and parent is None:
                self.num_orphan_blocks += 1
                continue
            if run and run[-1] is not parent:
                self._add_run(worker_id, run, tokens, ends)
                run, tokens, ends = [], [], []
            block = blocks[item.hash] = _Block(parent, b"", tree_id)
            run.append(block)
            tokens += item.tokens or ()
            ends.append(len(tokens) * TOKEN_BYTES)
        if run:
            self._add_run(worker_id, run, tokens, ends)

    def _parent(self, worker_id: WorkerId, block_hash: str) -> _Block | None:
        parent = self._blocks.get(worker_id, {}).get(block_hash)
        for index in self._parents:
            if parent is not None:
                break
            parent = index._blocks.get(worker_id, {}).get(block_hash)
        return parent

    def _add_run(self, worker_id: WorkerId, run: list[_Block], tokens: list[int],
                 ends: list[int]) -> None:
        """Key the run's blocks (one encoding for the whole run, ``ends`` in bytes) and
        count them."""
        key = to_key(tokens)
        start = 0
        for block, end in zip(run, ends, strict=True):
            block.key, start = key[start:end], end
        prefix = b"" if run[0].parent is None else run[0].parent.path()
        self._change(worker_id, run[0].tree_id, prefix + key, len(prefix) // TOKEN_BYTES, len(run))

    def _remove(self, worker_id: WorkerId, event: KVEvent) -> None:
        blocks = self._blocks.get(worker_id, {})
        run: list[_Block] = []
        for item in event.blocks:
            block = blocks.pop(item.hash, None)
            if block is None:
                continue
            if run and (block.parent is not run[-1] or block.tree_id != run[-1].tree_id):
                self._remove_run(worker_id, run)
                run = []
            run.append(block)
        if run:
            self._remove_run(worker_id, run)

    def _remove_run(self, worker_id: WorkerId, run: list[_Block]) -> None:
        path = run[-1].path()
        start = (len(path) - sum(len(block.key) for block in run)) // TOKEN_BYTES
        self._change(worker_id, run[0].tree_id, path, start, -len(run))

    def _change(self, worker_id: WorkerId, tree_id: TreeId, path: bytes, start: int,
                num_blocks: int) -> None:
        """Add ``num_blocks`` (< 0: remove) chained blocks of ``worker_id`` covering tokens
        [start, len(path)) of ``path``: one count more (or less) on each covering node."""
        scope, delta = tree_id[1], (1 if num_blocks > 0 else -1)
        tree = self._trees.get(tree_id)
        if tree is None:
            tree = self._trees[tree_id] = RadixTree(_split_counts)
            self._num_blocks[tree_id] = {}
        if start:
            _init_new(tree.insert(path[: start * TOKEN_BYTES], scope).new_nodes)
        result = tree.insert(path, scope)
        _init_new(result.new_nodes)
        for node in reversed(result.nodes):
            if node.start < start:
                break
            count = node.payload.get(worker_id, 0) + delta
            if count:
                node.payload[worker_id] = count
            else:
                del node.payload[worker_id]
        per_worker = self._num_blocks[tree_id]
        per_worker[worker_id] = per_worker.get(worker_id, 0) + num_blocks
        if delta < 0:
            if not per_worker[worker_id]:
                del per_worker[worker_id]
            _prune(tree, result.nodes[-1])
            self._drop_if_empty(tree_id)

    def reset_worker(self, worker_id: WorkerId) -> None:
        """Forget every block of ``worker_id``; O(nodes of the trees it appears in)."""
        self._blocks.pop(worker_id, None)
        for tree_id, num_blocks in list(self._num_blocks.items()):
            if num_blocks.pop(worker_id, None) is None:
                continue
            tree = self._trees[tree_id]
            for node in reversed(list(tree.iter_nodes())):
                node.payload.pop(worker_id, None)
                if node.is_leaf() and not node.payload:
                    tree.remove_leaf(node)
            self._drop_if_empty(tree_id)

    def _drop_if_empty(self, tree_id: TreeId) -> None:
        if not self._trees[tree_id].num_nodes:
            del self._trees[tree_id], self._num_blocks[tree_id]

    def match(self, namespace: NamespaceDigest, key: bytes, scope: Scope) -> Counts:
        """Matched tokens per worker (workers with none are left out): one walk of the
        scope's tree and one of the PUBLIC tree; the deepest node holding a worker
        gives its depth, counted only up to the matched part of the last node."""
        found: Counts = {}
        for tree_scope in (scope, PUBLIC) if scope != PUBLIC else (PUBLIC,):
            tree = self._trees.get((namespace, tree_scope))
            if tree is not None:
                result = tree.match(key, tree_scope, touch=False)
                credit_deepest(result, len(self._num_blocks[(namespace, tree_scope)]), found)
        return found

    def fingerprint(self) -> str:
        """A digest of which worker holds which block (namespace, scope, hash): equal
        for two indexes holding the same blocks, whatever the order the events came in
        or the shape of the trees. O(blocks log blocks): for tests and benchmarks."""
        digest = hashlib.sha256()
        for worker_id in sorted(self._blocks):
            for block_hash, block in sorted(self._blocks[worker_id].items()):
                namespace, scope = block.tree_id
                digest.update(f"{worker_id}\0{namespace}\0{scope}\0{block_hash}\n".encode())
        return digest.hexdigest()

    def stats(self) -> ExactStats:
        """Tree and block counts (O(number of trees and workers))."""
        num_blocks = {worker_id: len(blocks) for worker_id, blocks in self._blocks.items() if blocks}
        return ExactStats(
            num_trees=len(self._trees),
            num_nodes=sum(tree.num_nodes for tree in self._trees.values()),
            num_tokens=sum(tree.num_tokens() for tree in self._trees.values()),
            num_blocks=num_blocks,
            num_orphan_blocks=self.num_orphan_blocks,
        )

    def check_invariants(self) -> None:
        """Raise AssertionError unless, at every token of every node, a worker's count in
        the payload equals the number of that worker's blocks covering the token (so it
        is uniform over the node), no leaf is empty, and the trees are consistent.
        Costs O(tokens of all blocks): for tests."""
        coverage: dict[tuple[Node[Counts], WorkerId], list[int]] = {}
        num_blocks: dict[TreeId, Counts] = {}
        for worker_id, block in self._iter_blocks():
            path = block.path()
            start, end = (len(path) - len(block.key)) // TOKEN_BYTES, len(path) // TOKEN_BYTES
            result = self._trees[block.tree_id].match(path, block.tree_id[1], touch=False)
            assert result.num_matched_tokens == end, f"block path missing from {block.tree_id}"
            for node in result.nodes:
                per_token = coverage.setdefault((node, worker_id), [0] * node.num_tokens)
                for depth in range(max(start, node.start), min(end, node.end)):
                    per_token[depth - node.start] += 1
            per_tree = num_blocks.setdefault(block.tree_id, {})
            per_tree[worker_id] = per_tree.get(worker_id, 0) + 1
        assert num_blocks == self._num_blocks, "per-tree block counts"
        for tree_id, tree in self._trees.items():
            tree.check_invariants()
            assert tree.num_nodes, f"empty tree {tree_id} kept"
            for node in tree.iter_nodes():
                assert node.scope == tree_id[1], node
                assert node.payload or not node.is_leaf(), f"empty leaf {node}"
                for worker_id, count in node.payload.items():
                    assert count > 0 and coverage.pop((node, worker_id)) == [count] * node.num_tokens, node
        assert not any(any(c) for c in coverage.values()), "blocks counted on no node"

    def _iter_blocks(self) -> Iterator[tuple[WorkerId, _Block]]:
        for worker_id, blocks in self._blocks.items():
            for block in blocks.values():
                yield worker_id, block


def _init_new(nodes: tuple[Node[Counts], ...]) -> None:
    for node in nodes:
        node.payload = {}


def _prune(tree: RadixTree[Counts], node: Node[Counts]) -> None:
    """Remove ``node`` if it is an empty leaf, then each parent that becomes one."""
    while node is not tree.root and node.is_leaf() and not node.payload:
        parent = node.parent
        tree.remove_leaf(node)
        node = parent


class TreeIndex:
    """The tree-walking exact index with its host and disk tiers, behind
    ``BlockIndex``'s interface, kept only to check the block-keyed index against it
    (``RouterIndex(exact="tree")``)."""

    def __init__(self, host_weight: float = 1.0, disk_weight: float = 1.0,
                 max_blocks: int = 0) -> None:
        self.host_weight, self.disk_weight = host_weight, min(disk_weight, host_weight)

        self._device = ExactIndex()
        self._host = ExactIndex(parents=(self._device,))
        self._disk = ExactIndex(parents=(self._device, self._host))

    def apply(self, worker_id: WorkerId, event: KVEvent) -> None:
        """Apply one event: host and disk events to their tier's index."""
        if event.type == "cleared":
            self._host.reset_worker(worker_id)
            self._disk.reset_worker(worker_id)
        tiers = {"host": self._host, "disk": self._disk}
        tiers.get(event.medium, self._device).apply(worker_id, event)

    def reset_worker(self, worker_id: WorkerId) -> None:
        """Forget ``worker_id`` in every tier."""
        for tier in (self._device, self._host, self._disk):
            tier.reset_worker(worker_id)

    def match(self, namespace: NamespaceDigest, key: bytes, scope: str) -> Counts:
        """Device tokens per worker, host and disk tokens past them weighted."""
        found = self._device.match(namespace, key, Scope(scope))
        host = self._host.match(namespace, key, Scope(scope))
        disk = self._disk.match(namespace, key, Scope(scope))
        for worker_id in host.keys() | disk.keys():
            num_device = found.get(worker_id, 0)
            num_host = max(num_device, host.get(worker_id, 0))
            num_disk = max(num_host, disk.get(worker_id, 0))
            credit = (num_device + self.host_weight * (num_host - num_device)
                      + self.disk_weight * (num_disk - num_host))
            if num_disk > num_device:
                found[worker_id] = int(credit)
        return found

    def fingerprint(self) -> str:
        """The device tier's fingerprint."""
        return self._device.fingerprint()

    def stats(self) -> ExactStats:
        """The device tier's sizes (it has no bound: nothing is evicted)."""
        return self._device.stats()

    def check_invariants(self) -> None:
        """Every tier's invariants."""
        for tier in (self._device, self._host, self._disk):
            tier.check_invariants()
