"""Radix tree of token prefixes with per-scope visibility, locking and LRU eviction.

Keys are token runs stored as little-endian uint32 ``bytes`` (see ``radix.keys``), so
edge comparisons are ``memcmp`` calls, never a Python loop over tokens. Children are
keyed by ``(scope, first token bytes)``: two tenants inserting the same text get
separate siblings, and a lookup by tenant ``T`` only walks nodes whose scope is ``T``
or ``PUBLIC``.

Eviction order. ``_unlocked`` is an ``OrderedDict`` of every unlocked node, oldest
use first. A use (match, insert, unlock) moves the path's nodes to the end, leaf
first and root last, so an ancestor always sits after all its descendants. A locked
node has locked ancestors, so an unlocked node has only unlocked descendants, and
they sit before it. Hence the first entry is always an unlocked *leaf*, the least
recently used one: eviction pops from the front in O(1) per node, with no heap to
rebuild and no scan past locked nodes.

Payloads are opaque to the tree. The owner passes ``split_payload`` (how a node's
payload divides when its edge is split) and reads or sets ``node.payload`` itself;
evicted nodes come back to the owner, who frees what they hold.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, NewType, TypeVar

from radix.keys import TOKEN_BYTES, common_prefix_tokens

Scope = NewType("Scope", str)
PUBLIC = Scope("public")
ANONYMOUS = Scope("anonymous")
"""The scope of a router's keyless clients (``auth.allow_anonymous``)."""
DIRECT = Scope("direct")
"""The scope of a worker's direct callers (its own OpenAI routes, ``/generate``
without a scope): never a router client's, so cache timing does not cross."""
RESERVED_SCOPES = (PUBLIC, ANONYMOUS, DIRECT)
"""Scopes no tenant may take (tenant ids are validated against them)."""

P = TypeVar("P")
SplitPayload = Callable[[P, int], tuple[P, P]]


class Node(Generic[P]):
    """One compressed edge: ``key`` holds the tokens at depths [start, start + num_tokens).

    ``payload`` belongs to the owner. ``lock_ref`` counts the locked paths through
    this node; a node with ``lock_ref > 0`` is never evicted.
    """

    __slots__ = ("key", "start", "scope", "parent", "children", "payload", "lock_ref")

    def __init__(self, key: bytes, start: int, scope: Scope, parent: Node[P] | None, payload):
        self.key = key
        self.start = start
        self.scope = scope
        self.parent = parent
        self.children: dict[tuple[Scope, bytes], Node[P]] | None = None
        self.payload: P = payload
        self.lock_ref = 0

    @property
    def num_tokens(self) -> int:
        """Number of tokens on this node's edge."""
        return len(self.key) // TOKEN_BYTES

    @property
    def end(self) -> int:
        """Depth just past this node's last token."""
        return self.start + len(self.key) // TOKEN_BYTES

    def is_leaf(self) -> bool:
        """True when the node has no children."""
        return not self.children

    def __repr__(self) -> str:
        return f"Node(scope={self.scope!r}, span=[{self.start},{self.end}), lock={self.lock_ref})"


@dataclass(frozen=True)
class MatchResult(Generic[P]):
    """Longest visible prefix: ``nodes`` run from the root's child down; the last one
    may be matched only partly (``num_matched_tokens`` can end inside it)."""

    num_matched_tokens: int
    nodes: tuple[Node[P], ...]

    @property
    def last_node(self) -> Node[P] | None:
        """Deepest node touched by the match, or None for an empty match."""
        return self.nodes[-1] if self.nodes else None


@dataclass(frozen=True)
class InsertResult(Generic[P]):
    """``nodes`` cover exactly [0, len(key)); ``new_nodes`` (a suffix of ``nodes``) were
    created by this insert with ``payload=None`` and await the owner's payload."""

    num_existing_tokens: int
    nodes: tuple[Node[P], ...]
    new_nodes: tuple[Node[P], ...]


def _no_payload_split(payload, num_head_tokens: int):
    return payload, payload


class RadixTree(Generic[P]):
    """Compressed token trie with scope visibility, path locks and LRU leaf eviction.

    Cost of match and insert grows with the number of nodes on the path, never with
    the number of cached sequences. ``check_invariants()`` verifies the structure.
    """

    def __init__(self, split_payload: SplitPayload | None = None):
        self._split_payload = split_payload or _no_payload_split
        self.root: Node[P] = Node(b"", 0, PUBLIC, None, None)
        self.root.lock_ref = 1
        self._unlocked: OrderedDict[Node[P], None] = OrderedDict()
        self._num_tokens_by_scope: dict[Scope, int] = {}
        self.num_nodes = 0

    # ---- queries -------------------------------------------------------------------

    def match(self, key: bytes, scope: Scope, touch: bool = True) -> MatchResult[P]:
        """Longest prefix of ``key`` visible to ``scope`` (its own nodes and PUBLIC).

        With ``touch`` the matched path counts as used for LRU order. Nothing is split.
        """
        num_matched, nodes = self._best_path(self.root, key, 0, scope)
        if touch and nodes:
            self._touch(nodes[-1])
        return MatchResult(num_matched, tuple(nodes))

    def _best_path(
        self, node: Node[P], key: bytes, depth: int, scope: Scope
    ) -> tuple[int, list[Node[P]]]:
        """Deepest visible match below ``node``. At most two children share a first
        token (the scope's own and PUBLIC), so this only branches on such ties."""
        path: list[Node[P]] = []
        while True:
            children = node.children
            if not children or depth * TOKEN_BYTES >= len(key):
                return depth, path
            first = key[depth * TOKEN_BYTES : (depth + 1) * TOKEN_BYTES]
            own = children.get((scope, first))
            public = children.get((PUBLIC, first)) if scope != PUBLIC else None
            if own is not None and public is not None:
                best = max(
                    (self._best_path_via(child, key, depth, scope) for child in (own, public)),
                    key=lambda result: result[0],
                )
                return best[0], path + best[1]
            child = own if own is not None else public
            if child is None:
                return depth, path
            n = child.num_tokens
            if key.startswith(child.key, depth * TOKEN_BYTES):
                path.append(child)
                node, depth = child, depth + n
                continue
            path.append(child)
            return depth + common_prefix_tokens(key, depth, child.key), path

    def _best_path_via(
        self, child: Node[P], key: bytes, depth: int, scope: Scope
    ) -> tuple[int, list[Node[P]]]:
        if key.startswith(child.key, depth * TOKEN_BYTES):
            num_matched, below = self._best_path(child, key, depth + child.num_tokens, scope)
            return num_matched, [child, *below]
        return depth + common_prefix_tokens(key, depth, child.key), [child]

    def num_tokens(self, scope: Scope | None = None) -> int:
        """Cached tokens owned by ``scope`` (all scopes when None)."""
        if scope is None:
            return sum(self._num_tokens_by_scope.values())
        return self._num_tokens_by_scope.get(scope, 0)

    def num_evictable_tokens(self) -> int:
        """Tokens on unlocked nodes (what ``evict`` could free); O(unlocked nodes)."""
        return sum(node.num_tokens for node in self._unlocked)

    def path_key(self, node: Node[P]) -> bytes:
        """The full key from the root to the end of ``node`` (works on evicted nodes too)."""
        parts: list[bytes] = []
        while node is not None and node is not self.root:
            parts.append(node.key)
            node = node.parent
        return b"".join(reversed(parts))

    def iter_nodes(self) -> Iterator[Node[P]]:
        """Every node except the root, parents before children."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node is not self.root:
                yield node
            if node.children:
                stack.extend(node.children.values())

    # ---- updates -------------------------------------------------------------------

    def insert(self, key: bytes, scope: Scope) -> InsertResult[P]:
        """Make ``key`` present for ``scope``, reusing visible nodes; new nodes get ``scope``.

        Splits a node so that a node boundary falls at ``len(key)``. The whole path
        counts as used. Returns the covering path and which nodes are new.
        """
        if len(key) % TOKEN_BYTES:
            raise ValueError("key length must be a multiple of TOKEN_BYTES")
        num_existing, nodes = self._best_path(self.root, key, 0, scope)
        path = list(nodes)
        if path and path[-1].end > num_existing:
            path[-1] = self._split(path[-1], num_existing - path[-1].start)
        new_nodes: tuple[Node[P], ...] = ()
        if num_existing * TOKEN_BYTES < len(key):
            parent = path[-1] if path else self.root
            leaf = Node(key[num_existing * TOKEN_BYTES :], num_existing, scope, parent, None)
            self._attach(parent, leaf)
            path.append(leaf)
            new_nodes = (leaf,)
        if path:
            self._touch(path[-1])
        return InsertResult(num_existing, tuple(path), new_nodes)

    def split(self, node: Node[P], depth: int) -> Node[P]:
        """Make a node boundary fall at ``depth`` (``node.start < depth <= node.end``) and
        return the node that ends there: ``node`` itself when it already ends at
        ``depth``, else a new head holding ``node``'s first tokens (``node`` keeps the
        rest). Payloads divide with ``split_payload``; locks carry over to the head. The
        path through the returned node counts as used, so a caller can lock exactly a
        match that ended inside an edge and leave the unmatched rest evictable."""
        if not node.start < depth <= node.end:
            raise ValueError(f"depth {depth} is not inside {node!r}")
        if depth == node.end:
            return node
        head = self._split(node, depth - node.start)
        self._touch(head)
        return head

    def lock(self, node: Node[P]) -> None:
        """Lock ``node`` and its ancestors against eviction (counted; pair with ``unlock``)."""
        while node is not self.root:
            if node.lock_ref == 0:
                del self._unlocked[node]
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: Node[P]) -> None:
        """Release one ``lock`` of ``node``'s path; unlocking counts as a use for LRU."""
        while node is not self.root:
            if node.lock_ref <= 0:
                raise ValueError(f"unlock of an unlocked node {node!r}")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._unlocked[node] = None
            node = node.parent

    def evict(self, num_tokens: int) -> list[Node[P]]:
        """Remove unlocked leaves, least recently used first, until at least ``num_tokens``
        tokens are gone or nothing is evictable. A parent left childless becomes a
        leaf in its own LRU place. Returns the removed nodes (payloads intact,
        ``parent`` kept so ``path_key`` still works); the owner frees what they hold.
        """
        evicted: list[Node[P]] = []
        freed = 0
        while freed < num_tokens and self._unlocked:
            node = next(iter(self._unlocked))
            self.remove_leaf(node)
            evicted.append(node)
            freed += node.num_tokens
        return evicted

    def evict_scope_leaf(self, scope: Scope) -> Node[P] | None:
        """Remove the least recently used unlocked leaf owned by ``scope`` (quota
        enforcement) and return it, or None when ``scope`` has none. Scans the LRU
        order from the front, so the cost grows with the unlocked nodes before it."""
        for node in self._unlocked:
            if node.scope == scope and not node.children:
                self.remove_leaf(node)
                return node
        return None

    def remove_leaf(self, node: Node[P]) -> None:
        """Remove one unlocked leaf now (the router drops nodes no worker holds)."""
        if node.children or node.lock_ref or node is self.root:
            raise ValueError(f"only an unlocked leaf can be removed, got {node!r}")
        parent = node.parent
        del parent.children[(node.scope, node.key[:TOKEN_BYTES])]
        if not parent.children:
            parent.children = None
        del self._unlocked[node]
        self._count(node.scope, -node.num_tokens)
        self.num_nodes -= 1

    # ---- internals -----------------------------------------------------------------

    def _attach(self, parent: Node[P], child: Node[P]) -> None:
        if parent.children is None:
            parent.children = {}
        parent.children[(child.scope, child.key[:TOKEN_BYTES])] = child
        self._unlocked[child] = None
        self._count(child.scope, child.num_tokens)
        self.num_nodes += 1

    def _split(self, node: Node[P], num_head_tokens: int) -> Node[P]:
        """Split ``node`` after ``num_head_tokens``; returns the new head (the parent of
        the shortened ``node``). The head inherits the tail's locks; it enters the LRU
        order as most recent, which is exact because both callers (``insert`` and
        ``split``) then use the whole path through it."""
        cut = num_head_tokens * TOKEN_BYTES
        head_payload, tail_payload = self._split_payload(node.payload, num_head_tokens)
        parent = node.parent
        head = Node(node.key[:cut], node.start, node.scope, parent, head_payload)
        head.lock_ref = node.lock_ref
        parent.children[(node.scope, node.key[:TOKEN_BYTES])] = head
        node.key = node.key[cut:]
        node.start += num_head_tokens
        node.payload = tail_payload
        node.parent = head
        head.children = {(node.scope, node.key[:TOKEN_BYTES]): node}
        if head.lock_ref == 0:
            self._unlocked[head] = None
        self.num_nodes += 1
        return head

    def _touch(self, node: Node[P]) -> None:
        unlocked = self._unlocked
        while node is not self.root:
            if node.lock_ref == 0:
                unlocked.move_to_end(node)
            node = node.parent

    def _count(self, scope: Scope, delta: int) -> None:
        self._num_tokens_by_scope[scope] = self._num_tokens_by_scope.get(scope, 0) + delta

    def check_invariants(self) -> None:
        """Raise AssertionError if the structure is inconsistent (tests call this)."""
        counts: dict[Scope, int] = {}
        unlocked_seen = 0
        for node in self.iter_nodes():
            parent = node.parent
            assert node.key and len(node.key) % TOKEN_BYTES == 0, node
            assert parent.children[(node.scope, node.key[:TOKEN_BYTES])] is node, node
            assert node.start == (parent.end if parent is not self.root else 0), node
            child_locks = sum(c.lock_ref for c in (node.children or {}).values())
            assert node.lock_ref >= child_locks, f"{node} locked less than its children"
            assert (node.lock_ref == 0) == (node in self._unlocked), node
            unlocked_seen += node.lock_ref == 0
            counts[node.scope] = counts.get(node.scope, 0) + node.num_tokens
        assert unlocked_seen == len(self._unlocked), "stale entries in the LRU order"
        order = {node: i for i, node in enumerate(self._unlocked)}
        for node, i in order.items():
            if node.parent is not self.root and node.parent in order:
                assert order[node.parent] > i, f"{node} is not used before its parent"
        assert {s: c for s, c in self._num_tokens_by_scope.items() if c} == counts
        assert self.num_nodes == sum(1 for _ in self.iter_nodes())
