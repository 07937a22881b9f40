"""Block-keyed exact index: which worker holds which block, mirrored from KV events.

One trie of blocks per namespace. A node is one block: its tokens (``radix.keys``
bytes: a full block of the namespace's block size, or a shorter partial block ending a
cached path) under its parent block, so a node stands for the whole token path from
the root to it, and workers holding the same path share the node. A node records who
holds it as worker bitmasks per (tier, scope): tenant T's blocks on a worker's device,
PUBLIC blocks in its host tier, and so on. Children are keyed by their tokens, so a
lookup compares real tokens at every step (hashes never decide a match alone).

Per worker, namespace and tier, a table maps the engine's block hash to the node, so
``stored`` finds its parent and ``removed`` its node in O(1), with no walk from the
root. A stored block whose parent the worker does not hold (in any tier) is an orphan
and is skipped, as is a block already held. A removal clears the worker's bit in the
event's scope, or, should the worker have filed the block under another scope, there.
A node that nobody holds and that has no children is removed, cascading upward.

``match`` walks the prompt's full blocks from the root once, one dictionary lookup per
block, keeping the workers still matching as bitmasks: on the device, on the device
or the host tier, on any tier (an engine reuses a contiguous chain of blocks from the
first, so a worker drops out at its first missing block). The walk ends where no
worker is left or no cached block follows; there the partial blocks that the prompt
continues with are tried (each shorter than a block). A worker's credit is its device
tokens, plus ``host_weight`` per token its host tier adds and ``disk_weight`` per token
its disk tier adds. Where a prompt diverges inside a cached block, the worker is
credited up to the last whole block it matched (docs/router-index.md says why).

Bound: past ``max_blocks`` distinct blocks, the least recently used leaves go first
(CLOCK: new blocks join the back of the queue, and a leaf that ended a match since the
hand last passed it gets a second chance), so the coldest subtrees shrink from their
tips;
``num_evicted_blocks`` counts them. An evicted block's table entries are left dead and
swept in one pass once they are many; a later event about one is taken as unknown.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from radix.events import KVEvent, Medium
from radix.keys import TOKEN_BYTES
from radix.tree import PUBLIC
from router.routing.index.ids import NamespaceDigest, WorkerId

TableKey = tuple[NamespaceDigest, Medium]
Ends = list[tuple[int, int]]
_LEVELS: tuple[Medium, ...] = ("device", "host", "disk")
_SCAN_CHILDREN = 8  # up to this many children, scanning beats probing each partial size
_MIN_SWEEP = 4096  # dead entries worth a sweep of the tables, at the least


class _Node:
    """One block. ``device``: the workers holding it on their device in ``scope``;
    ``more``: every other (tier, scope) -> workers (never ("device", ``scope``)), or
    None. ``children``: None, the only child, or a dict from tokens to child.
    ``parent`` is None for a root and for a block no longer in its tree. ``used``: the
    CLOCK bit."""

    __slots__ = ("parent", "key", "children", "scope", "device", "more", "used")

    def __init__(self, parent: _Node | None, key: bytes, scope: str) -> None:
        self.parent = parent
        self.key = key
        self.children: _Node | dict[bytes, _Node] | None = None
        self.scope = scope
        self.device = 0
        self.more: dict[tuple[Medium, str], int] | None = None
        self.used = False

    def child(self, key: bytes) -> _Node | None:
        """The child whose tokens are ``key``."""
        children = self.children
        if type(children) is dict:
            return children.get(key)
        return children if children is not None and children.key == key else None

    def iter_children(self) -> Iterator[_Node]:
        """Every child."""
        children = self.children
        if type(children) is dict:
            return iter(children.values())
        return iter(() if children is None else (children,))

    def holders(self, scope: str) -> tuple[int, int, int]:
        """The workers holding this block visibly to ``scope`` (its own or PUBLIC): on
        the device, on the device or host tier, on any tier."""
        device = self.device if (self.scope == scope or self.scope == PUBLIC) else 0
        if self.more is None:
            return device, device, device
        host = disk = 0
        for (tier, held_scope), mask in self.more.items():
            if held_scope in (scope, PUBLIC):
                if tier == "device":
                    device |= mask
                elif tier == "host":
                    host |= mask
                else:
                    disk |= mask
        return device, device | host, device | host | disk


class _Tree:
    """One namespace's trie, kept once made (it remembers the block size). ``block_bytes``:
    a full block's size, learnt from the events (the parent of any block is a full one);
    0 until then. ``num_tiered``: the
    (node, tier, scope) holder sets off the device, so a namespace without any takes
    the one-mask walk. ``leaves``: the CLOCK's queue, every leaf at least once (and
    blocks that were leaves once, compacted when they are many)."""

    __slots__ = ("root", "block_bytes", "num_nodes", "num_tokens", "num_tiered", "leaves")

    def __init__(self) -> None:
        self.root = _Node(None, b"", PUBLIC)
        self.block_bytes = 0
        self.num_nodes = 0
        self.num_tokens = 0
        self.num_tiered = 0
        self.leaves: deque[_Node] = deque()


@dataclass(frozen=True)
class BlockStats:
    """Size of the index: trees, nodes, tokens, each worker's device blocks, orphans,
    blocks evicted by the bound."""

    num_trees: int
    num_nodes: int
    num_tokens: int
    num_blocks: dict[WorkerId, int]
    num_orphan_blocks: int
    num_evicted_blocks: int


class BlockIndex:
    """The union of the workers' block caches, per namespace (module docstring).

    Guarantee: after any sequence of events, ``match`` credits each worker with the
    longest chain of its held blocks (stored and not since removed or cleared, in the
    lookup's scope or PUBLIC) that the prompt starts with, a partial block only at the
    end of the deepest chain any worker holds; ``check_invariants`` verifies the
    structure against the tables.
    """

    def __init__(self, host_weight: float = 1.0, disk_weight: float = 1.0,
                 max_blocks: int = 10_000_000) -> None:
        self.host_weight = host_weight
        self.disk_weight = min(disk_weight, host_weight)
        self.max_blocks = max_blocks
        self._trees: dict[NamespaceDigest, _Tree] = {}
        self._tables: dict[WorkerId, dict[TableKey, dict[str, _Node]]] = {}
        self._bits: dict[WorkerId, int] = {}
        self._worker_ids: list[WorkerId] = []
        self._num_dead = 0
        self.num_orphan_blocks = 0
        self.num_evicted_blocks = 0

    # ---- events --------------------------------------------------------------------

    def apply(self, worker_id: WorkerId, event: KVEvent) -> None:
        """Apply one event of ``worker_id``: O(1) per block."""
        if event.type == "stored":
            self._store(worker_id, event)
        elif event.type == "removed":
            self._remove(worker_id, event)
        else:
            self.reset_worker(worker_id)

    def _store(self, worker_id: WorkerId, event: KVEvent) -> None:
        """Apply a ``stored`` event: link its blocks, then drop the table if it is left
        empty and bound the tree."""
        namespace, medium = NamespaceDigest(event.namespace), event.medium
        tree = self._trees.get(namespace) or self._trees.setdefault(namespace, _Tree())
        tables = self._tables.setdefault(worker_id, {})
        table = tables.setdefault((namespace, medium), {})
        self._link(tree, tables, table, namespace, event,
                   self._bits.get(worker_id) or self._new_bit(worker_id))
        if not table:
            del tables[(namespace, medium)]
        if tree.num_nodes > self.max_blocks // max(len(self._trees), 1) or (
                len(tree.leaves) > 2 * tree.num_nodes + _MIN_SWEEP):
            self._bound(tree)

    def _link(self, tree: _Tree, tables: dict[TableKey, dict[str, _Node]],
              table: dict[str, _Node], namespace: NamespaceDigest, event: KVEvent,
              bit: int) -> None:
        """File ``event``'s blocks as held by worker ``bit``: new nodes, leaves, orphans."""
        medium, scope, root = event.medium, event.scope, tree.root
        on_device = medium == "device"
        prev_hash: str | None = None
        prev = leaf = None
        num_new = num_new_bytes = 0
        for block in event.blocks:
            block_hash = block.hash
            node = table.get(block_hash)
            if node is not None and node.parent is None:
                del table[block_hash]
                node, self._num_dead = None, self._num_dead - 1
            if node is None:
                parent_hash, key = block.parent, block.key
                parent = (root if parent_hash is None else prev if parent_hash == prev_hash
                          else _find(tables, namespace, parent_hash))
                if parent is None or not key or len(key) % TOKEN_BYTES:
                    self.num_orphan_blocks += 1
                else:
                    if parent is not root and not tree.block_bytes:
                        tree.block_bytes = len(parent.key)
                    children = parent.children
                    if type(children) is dict:
                        node = children.get(key)
                    elif children is not None and children.key == key:
                        node = children
                    if node is None:  # a new block: a new leaf, unless its child follows
                        node = _Node(parent, key, scope)
                        if children is None:
                            parent.children = node
                        elif type(children) is dict:
                            children[key] = node
                        else:
                            parent.children = {children.key: children, key: node}
                        if leaf is not None and leaf is not parent:
                            tree.leaves.append(leaf)
                        leaf, num_new, num_new_bytes = node, num_new + 1, num_new_bytes + len(key)
                    if on_device and scope == node.scope:
                        node.device |= bit
                    else:
                        _hold(tree, node, bit, medium, scope)
                    table[block_hash] = node
            prev_hash, prev = block_hash, node
        if leaf is not None:
            tree.leaves.append(leaf)
            tree.num_nodes += num_new
            tree.num_tokens += num_new_bytes // TOKEN_BYTES

    def _remove(self, worker_id: WorkerId, event: KVEvent) -> None:
        namespace, medium, scope = NamespaceDigest(event.namespace), event.medium, event.scope
        tables = self._tables.get(worker_id, {})
        table = tables.get((namespace, medium))
        if table is None:
            return
        tree, bit = self._trees[namespace], self._bits[worker_id]
        pop, on_device = table.pop, medium == "device"
        for block in event.blocks:
            node = pop(block.hash, None)
            if node is None:
                continue
            if node.parent is None:
                self._num_dead -= 1
            elif on_device and scope == node.scope and node.device & bit:
                node.device &= ~bit
                if not node.device and node.more is None and node.children is None:
                    _prune(tree, node)
            else:
                _release(tree, node, bit, medium, scope)
        if not table:
            del tables[(namespace, medium)]

    def reset_worker(self, worker_id: WorkerId) -> None:
        """Forget every block of ``worker_id``: O(its blocks)."""
        tables = self._tables.pop(worker_id, None)
        if not tables:
            return
        bit = self._bits[worker_id]
        for (namespace, medium), table in tables.items():
            tree = self._trees[namespace]
            for node in table.values():
                if node.parent is None:
                    self._num_dead -= 1
                else:
                    _release(tree, node, bit, medium, None)

    def _bound(self, tree: _Tree) -> None:
        """Evict ``tree``'s least recently used leaves (CLOCK) down to its share of
        ``max_blocks``; compact its queue when it holds mostly blocks that are no
        longer leaves; sweep dead entries from the tables when they are many."""
        share, leaves = self.max_blocks // max(len(self._trees), 1), tree.leaves
        while tree.num_nodes > share and leaves:
            node = leaves.popleft()
            if node.parent is None or node.children is not None:
                continue
            if node.used:
                node.used = False
                leaves.append(node)
                continue
            self._num_dead += node.device.bit_count() + sum(
                mask.bit_count() for mask in (node.more or {}).values())
            tree.num_tiered -= sum(tier != "device" for tier, _ in (node.more or {}))
            node.device, node.more = 0, None
            self.num_evicted_blocks += 1
            _prune(tree, node)
        if len(leaves) > 2 * tree.num_nodes + _MIN_SWEEP:
            tree.leaves = deque(n for n in leaves if n.parent is not None and n.children is None)
        if self._num_dead > max(_MIN_SWEEP, self.max_blocks // 8):
            for tables in self._tables.values():
                for place, table in list(tables.items()):
                    for block_hash in [h for h, n in table.items() if n.parent is None]:
                        del table[block_hash]
                    if not table:
                        del tables[place]
            self._num_dead = 0

    def _new_bit(self, worker_id: WorkerId) -> int:
        bit = self._bits[worker_id] = 1 << len(self._worker_ids)
        self._worker_ids.append(worker_id)
        return bit

    # ---- lookups -------------------------------------------------------------------

    def match(self, namespace: NamespaceDigest, key: bytes, scope: str) -> dict[WorkerId, int]:
        """Tokens of ``key`` each worker holds visibly to ``scope`` as a chain of blocks,
        host and disk tokens weighted (module docstring); workers with none are left
        out. O(blocks walked + workers)."""
        tree = self._trees.get(namespace)
        if tree is None:
            return {}
        if tree.num_tiered:
            return self._match_tiered(tree, key, scope)
        node, alive, depth, ends = tree.root, -1, 0, []
        step = tree.block_bytes
        last = len(key) - step if step else -1
        while depth <= last:
            children = node.children
            if type(children) is dict:
                child = children.get(key[depth: depth + step])
                if child is None:
                    break
            elif children is not None and len(children.key) == step and key.startswith(
                    children.key, depth):
                child = children
            else:
                break
            if child.more is None:
                held = child.device if (child.scope == scope or child.scope == PUBLIC) else 0
            else:
                held = child.holders(scope)[0]
            still = alive & held
            if still != alive:
                if not still:
                    break
                if alive != -1:
                    ends.append((alive & ~still, depth))
                alive = still
            node, depth = child, depth + step
        node.used = True
        _end_walk(node, key, depth, step, scope, 0, alive, ends)
        return self._tokens(ends)

    def match_tiers(self, namespace: NamespaceDigest, key: bytes, scope: str
                    ) -> dict[WorkerId, tuple[int, int]]:
        """Per worker, the tokens of ``key`` it holds visibly to ``scope`` as a chain of
        blocks on its device, and as a chain in any tier (device, host or disk), not
        weighted; workers with none are left out. O(blocks walked + workers)."""
        tree = self._trees.get(namespace)
        if tree is None:
            return {}
        if not tree.num_tiered:
            return {w: (n, n) for w, n in self.match(namespace, key, scope).items()}
        device, _, any_tier = self._tier_tokens(tree, key, scope)
        return {w: (device.get(w, 0), n) for w, n in any_tier.items()}

    def _match_tiered(self, tree: _Tree, key: bytes, scope: str) -> dict[WorkerId, int]:
        """``match`` in a namespace with blocks off the device: a mask per level."""
        tokens = self._tier_tokens(tree, key, scope)
        credits: dict[WorkerId, int] = {}
        for worker_id, num_any in tokens[2].items():
            num_device = tokens[0].get(worker_id, 0)
            num_host = max(tokens[1].get(worker_id, 0), num_device)
            credits[worker_id] = int(num_device + self.host_weight * (num_host - num_device)
                                     + self.disk_weight * (num_any - num_host))
        return credits

    def _tier_tokens(self, tree: _Tree, key: bytes, scope: str) -> list[dict[WorkerId, int]]:
        """Tokens per worker of its chain on the device, on the device or host, and in
        any tier: one walk with a mask per level."""
        node, depth, step = tree.root, 0, tree.block_bytes
        alive = [-1, -1, -1]
        ends: tuple[Ends, Ends, Ends] = ([], [], [])
        while step and depth + step <= len(key):
            child = node.child(key[depth: depth + step])
            held = (0, 0, 0) if child is None else child.holders(scope)
            if not alive[2] & held[2]:
                break
            for level in range(3):
                still = alive[level] & held[level]
                if still != alive[level] and alive[level] != -1:
                    ends[level].append((alive[level] & ~still, depth))
                alive[level] = still
            node, depth = child, depth + step
        node.used = True
        for level in range(3):
            _end_walk(node, key, depth, step, scope, level, alive[level], ends[level])
        return [self._tokens(level_ends) for level_ends in ends]

    def _tokens(self, ends: Ends) -> dict[WorkerId, int]:
        """Tokens per worker from (workers, bytes matched) pairs that name each worker
        at most once."""
        found: dict[WorkerId, int] = {}
        ids = self._worker_ids
        for mask, num_bytes in ends:
            num_tokens = num_bytes // TOKEN_BYTES
            while mask:
                low = mask & -mask
                found[ids[low.bit_length() - 1]] = num_tokens
                mask ^= low
        return found

    # ---- views ---------------------------------------------------------------------

    def fingerprint(self) -> str:
        """A digest of which worker holds which device block (namespace, hash): equal
        for two indexes fed the same blocks in any order. For tests."""
        digest = hashlib.sha256()
        for worker_id in sorted(self._tables):
            for (namespace, medium), table in sorted(self._tables[worker_id].items()):
                if medium == "device":
                    for block_hash in sorted(table):
                        digest.update(f"{worker_id}\0{namespace}\0{block_hash}\n".encode())
        return digest.hexdigest()

    def stats(self) -> BlockStats:
        """Sizes, in O(trees + tables)."""
        num_blocks: dict[WorkerId, int] = {}
        for worker_id, tables in self._tables.items():
            count = sum(len(t) for (_, medium), t in tables.items() if medium == "device")
            if count:
                num_blocks[worker_id] = count
        trees = [tree for tree in self._trees.values() if tree.num_nodes]
        return BlockStats(len(trees), sum(t.num_nodes for t in trees),
                          sum(t.num_tokens for t in trees), num_blocks, self.num_orphan_blocks,
                          self.num_evicted_blocks)

    def check_invariants(self) -> None:
        """Raise AssertionError unless every node's holders are exactly the table entries
        naming it, every node hangs under its parent by its tokens, no empty node or
        table is kept, and each tree's counts are right. O(nodes + entries): tests."""
        expected: dict[tuple[int, Medium, int], int] = {}
        num_dead = 0
        for worker_id, tables in self._tables.items():
            bit = self._bits[worker_id]
            for (namespace, medium), table in tables.items():
                assert table, f"empty table kept for {worker_id}"
                root = self._trees[namespace].root
                for node in table.values():
                    if node.parent is None:
                        num_dead += 1
                        continue
                    assert _root_of(node) is root, "a table names a node outside its tree"
                    place = (id(node), medium, bit)
                    expected[place] = expected.get(place, 0) + 1
        for tree in self._trees.values():
            counts = [0, 0, 0]
            stack = list(tree.root.iter_children())
            while stack:
                node = stack.pop()
                _check_node(node, expected, counts)
                stack.extend(node.iter_children())
            assert counts == [tree.num_nodes, tree.num_tokens, tree.num_tiered], "tree counts"
        assert not any(expected.values()), "entries naming nodes outside the trees"
        assert num_dead == self._num_dead, "dead entries"


def _end_walk(node: _Node, key: bytes, depth: int, step: int, scope: str, level: int,
              alive: int, ends: Ends) -> None:
    """Close a walk that stopped at ``node`` (``depth`` bytes in) with ``alive`` the
    workers that held every block down to it at ``level`` (-1: no block matched): each
    gets the longest partial block it holds that the key continues with, the rest
    ``depth``."""
    rest = alive
    for child in sorted(_partials(node, key, depth, step), key=lambda c: -len(c.key)):
        held = child.holders(scope)[level] & rest
        if held:
            ends.append((held, depth + len(child.key)))
            rest &= ~held
    if alive != -1 and rest:
        ends.append((rest, depth))


def _partials(node: _Node, key: bytes, depth: int, step: int) -> Iterator[_Node]:
    """The children of ``node`` that ``key`` continues with from ``depth`` and that are
    shorter than a block (any length while the block size is not known yet)."""
    children = node.children
    if type(children) is dict and step and len(children) > _SCAN_CHILDREN:
        for size in range(min(step - TOKEN_BYTES, len(key) - depth), 0, -TOKEN_BYTES):
            child = children.get(key[depth: depth + size])
            if child is not None:
                yield child
        return
    for child in node.iter_children():
        if (not step or len(child.key) < step) and key.startswith(child.key, depth):
            yield child


def _find(tables: dict[TableKey, dict[str, _Node]], namespace: NamespaceDigest,
          block_hash: str) -> _Node | None:
    """The worker's node for ``block_hash`` in any tier."""
    for medium in _LEVELS:
        node = tables.get((namespace, medium), {}).get(block_hash)
        if node is not None and node.parent is not None:
            return node
    return None


def _hold(tree: _Tree, node: _Node, bit: int, medium: Medium, scope: str) -> None:
    """Record that worker ``bit`` holds ``node`` in (``medium``, ``scope``)."""
    if medium == "device":
        if scope == node.scope:
            node.device |= bit
            return
        if not node.device and (node.more is None or ("device", scope) not in node.more):
            node.scope, node.device = scope, bit
            return
    more = node.more if node.more is not None else {}
    node.more = more
    if (medium, scope) not in more:
        tree.num_tiered += medium != "device"
    more[(medium, scope)] = more.get((medium, scope), 0) | bit


def _release(tree: _Tree, node: _Node, bit: int, medium: Medium, scope: str | None) -> None:
    """Undo ``_hold`` in ``scope``, or where the worker holds ``node`` in ``medium`` if not
    there (``scope`` None: anywhere); then prune the node if it is left empty."""
    if (medium == "device" and node.device & bit
            and (scope is None or scope == node.scope or not _held(node, bit, medium, scope))):
        node.device &= ~bit
    else:
        more = node.more
        assert more is not None, "released a block nobody held there"
        place = ((medium, scope) if scope is not None and _held(node, bit, medium, scope) else
                 next(p for p, mask in more.items() if p[0] == medium and mask & bit))
        mask = more[place] & ~bit
        if mask:
            more[place] = mask
        else:
            del more[place]
            tree.num_tiered -= medium != "device"
            if not more:
                node.more = None
    if not node.device and node.more is None and node.children is None:
        _prune(tree, node)


def _held(node: _Node, bit: int, medium: Medium, scope: str) -> bool:
    """Whether worker ``bit`` holds ``node`` in (``medium``, ``scope``) in ``more``."""
    return node.more is not None and bool(node.more.get((medium, scope), 0) & bit)


def _prune(tree: _Tree, node: _Node) -> None:
    """Remove ``node``, which nobody holds and has no children, then each parent that
    this leaves so."""
    while True:
        parent = node.parent
        assert parent is not None
        children = parent.children
        if type(children) is dict:
            del children[node.key]
            if len(children) == 1:
                parent.children = next(iter(children.values()))
        else:
            parent.children = None
        node.parent = None
        tree.num_nodes -= 1
        tree.num_tokens -= len(node.key) // TOKEN_BYTES
        if parent.parent is None or parent.children is not None:
            return
        if parent.device or parent.more is not None:
            tree.leaves.append(parent)
            return
        node = parent


def _root_of(node: _Node) -> _Node:
    while node.parent is not None:
        node = node.parent
    return node


def _check_node(node: _Node, expected: dict[tuple[int, Medium, int], int],
                counts: list[int]) -> None:
    """Check one node against the table entries (popping those it accounts for): a
    worker holds it in as many scopes of a tier as it has entries naming it there."""
    assert node.key and len(node.key) % TOKEN_BYTES == 0, "a block of partial tokens"
    assert node.parent is not None and node.parent.child(node.key) is node, "misplaced node"
    assert node.device or node.more or node.children is not None, "empty node kept"
    assert not (type(node.children) is dict and len(node.children) < 2), "dict of one child"
    assert node.more is None or node.more, "empty holder dict kept"
    held = dict(node.more or {})
    assert ("device", node.scope) not in held, "device holders of one scope in two places"
    held[("device", node.scope)] = node.device
    found: dict[tuple[int, Medium, int], int] = {}
    for (medium, _), mask in held.items():
        assert mask >= 0, "negative mask"
        counts[2] += medium != "device" and mask > 0
        while mask:
            low = mask & -mask
            found[(id(node), medium, low)] = found.get((id(node), medium, low), 0) + 1
            mask ^= low
    for place, num in found.items():
        assert expected.pop(place, 0) == num, ("holders and tables differ", place)
    counts[0] += 1
    counts[1] += len(node.key) // TOKEN_BYTES
