"""RadixTree against a brute-force model: an uncompressed per-token trie.

The model's children are keyed by (scope, token), one node per token. Matching is
an exhaustive search over visible children; eviction order is checked against
use timestamps kept by the test, independent of the tree's OrderedDict.
"""

from __future__ import annotations

import itertools

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radix.keys import from_key, to_key
from radix.tree import PUBLIC, Node, RadixTree

SCOPES = [PUBLIC, "tenant-a", "tenant-b"]
tokens = st.lists(st.integers(0, 3), min_size=1, max_size=12)
scopes = st.sampled_from(SCOPES)


class TokenTrie:
    """Brute-force model: one dict entry per cached token, keyed by (scope, token)."""

    def __init__(self):
        self.root: dict = {}

    def longest_visible(self, seq: list[int], scope: str) -> int:
        def search(children: dict, depth: int) -> int:
            if depth == len(seq):
                return depth
            best = depth
            for owner in {scope, PUBLIC}:
                child = children.get((owner, seq[depth]))
                if child is not None:
                    best = max(best, search(child, depth + 1))
            return best

        return search(self.root, 0)

    def add(self, path: list[tuple[str, int]]) -> None:
        children = self.root
        for step in path:
            children = children.setdefault(step, {})

    def remove(self, path: list[tuple[str, int]], num_tokens: int) -> None:
        """Drop the last ``num_tokens`` steps of ``path``; they must be a bare chain."""
        chain = [self.root]
        for step in path:
            chain.append(chain[-1][step])
        assert not chain[-1], "evicted a node that still has children in the model"
        for depth in range(len(path) - 1, len(path) - 1 - num_tokens, -1):
            del chain[depth][path[depth]]

    def count_by_scope(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        stack = [self.root]
        while stack:
            children = stack.pop()
            for (scope, _), child in children.items():
                counts[scope] = counts.get(scope, 0) + 1
                stack.append(child)
        return counts


def scoped_path(tree: RadixTree, node: Node) -> list[tuple[str, int]]:
    """The (scope, token) steps from the root to the end of ``node``."""
    segments = []
    while node is not None and node is not tree.root:
        segments.append([(node.scope, t) for t in from_key(node.key)])
        node = node.parent
    return list(itertools.chain.from_iterable(reversed(segments)))


class RadixTreeMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self):
        self.tree: RadixTree = RadixTree()
        self.model = TokenTrie()
        self.clock = itertools.count()
        self.last_use: dict[Node, int] = {}
        self.locks: list[tuple[Node, list[int], str, int]] = []

    def _use(self, node: Node | None) -> None:
        now = next(self.clock)
        while node is not None and node is not self.tree.root:
            if node.lock_ref == 0:
                self.last_use[node] = now
            node = node.parent

    @rule(seq=tokens, scope=scopes)
    def insert(self, seq, scope):
        expected_existing = self.model.longest_visible(seq, scope)
        result = self.tree.insert(to_key(seq), scope)
        assert result.num_existing_tokens == expected_existing
        assert result.nodes and result.nodes[-1].end == len(seq)
        path = scoped_path(self.tree, result.nodes[-1])
        assert [t for _, t in path] == seq
        assert all(s in (scope, PUBLIC) for s, _ in path[:expected_existing])
        assert all(s == scope for s, _ in path[expected_existing:])
        self.model.add(path)
        self._use(result.nodes[-1])

    @rule(seq=tokens, scope=scopes)
    def match(self, seq, scope):
        result = self.tree.match(to_key(seq), scope)
        assert result.num_matched_tokens == self.model.longest_visible(seq, scope)
        for node in result.nodes:
            assert node.scope in (scope, PUBLIC), "matched another tenant's node"
        self._use(result.last_node)

    @rule(seq=tokens, scope=scopes)
    def lock(self, seq, scope):
        result = self.tree.match(to_key(seq), scope)
        self._use(result.last_node)
        if result.last_node is not None:
            self.tree.lock(result.last_node)
            self.locks.append((result.last_node, seq, scope, result.num_matched_tokens))

    @precondition(lambda self: self.locks)
    @rule(index=st.integers(0, 100))
    def unlock(self, index):
        node, *_ = self.locks.pop(index % len(self.locks))
        self.tree.unlock(node)
        now = next(self.clock)
        while node is not self.tree.root:
            if node.lock_ref == 0:
                self.last_use[node] = now
            node = node.parent

    @rule(num_tokens=st.integers(1, 30))
    def evict(self, num_tokens):
        leaves = {n for n in self.tree.iter_nodes() if n.is_leaf() and n.lock_ref == 0}
        paths = {n: scoped_path(self.tree, n) for n in self.tree.iter_nodes()}
        num_children = {n: len(n.children or ()) for n in self.tree.iter_nodes()}
        evicted = self.tree.evict(num_tokens)
        freed = 0
        for node in evicted:
            assert node in leaves, f"{node} was not an unlocked leaf"
            oldest = min(leaves, key=self.last_use.__getitem__)
            assert node is oldest, "eviction skipped an older unlocked leaf"
            leaves.remove(node)
            parent = node.parent
            if parent is not self.tree.root:
                num_children[parent] -= 1
                if num_children[parent] == 0 and parent.lock_ref == 0:
                    leaves.add(parent)
            self.model.remove(paths[node], node.num_tokens)
            del self.last_use[node]
            freed += node.num_tokens
        assert freed >= num_tokens or not leaves
        for _, seq, scope, num_matched in self.locks:
            assert self.tree.match(to_key(seq), scope, touch=False).num_matched_tokens >= num_matched

    @invariant()
    def consistent(self):
        self.tree.check_invariants()
        counts = self.model.count_by_scope()
        for scope in SCOPES:
            assert self.tree.num_tokens(scope) == counts.get(scope, 0)


TestRadixTree = RadixTreeMachine.TestCase
TestRadixTree.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
