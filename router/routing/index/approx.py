"""Approximate cache of one worker in one namespace: what was routed to it, recently.

For workers that publish no KV events (OpenAI-compatible servers) this is all the
router knows; for every worker it also holds the short-lived speculative entry written
at decision time, which covers the moment between routing a request and the worker's
``stored`` event for it.

A ``RadixTree`` whose payload is the time each node was last routed. Noting a route
inserts the key and stamps its whole path, so an ancestor is always at least as
fresh as its descendants and the tree's LRU order is the routing order. Two limits
age entries out: ``capacity_tokens`` (LRU leaves evicted past it) and ``ttl_s``
(a queue of (time, deepest node) per note; a node not routed again within ``ttl_s``
is removed, with each parent it leaves as an expired leaf). Removed nodes get the
payload None, which tells a later expiry entry that its node is already gone (the
root's payload is None too, so a cascade stops there).
"""

from __future__ import annotations

from collections import deque

from radix.keys import TOKEN_BYTES
from radix.tree import Node, RadixTree, Scope

Stamp = float | None


class ApproxCache:
    """Prefixes routed to one worker within the last ``ttl_s`` seconds, at most
    ``capacity_tokens`` tokens. Times are the caller's clock; calls must not go back
    in time. Scope visibility is the tree's: a lookup by T sees T's and PUBLIC nodes."""

    def __init__(self, ttl_s: float, capacity_tokens: int):
        if ttl_s <= 0 or capacity_tokens <= 0:
            raise ValueError("ttl_s and capacity_tokens must be positive")
        self.ttl_s = ttl_s
        self.capacity_tokens = capacity_tokens
        self.tree: RadixTree[Stamp] = RadixTree()
        self._expiry: deque[tuple[float, Node[Stamp]]] = deque()

    def note(self, key: bytes, scope: Scope, now: float) -> None:
        """Remember that ``key`` was routed here at ``now`` (refreshes its whole path)."""
        self.expire(now)
        if not key:
            return
        nodes = self.tree.insert(key[: self.capacity_tokens * TOKEN_BYTES], scope).nodes
        for node in nodes:
            node.payload = now
        self._expiry.append((now, nodes[-1]))
        excess = self.tree.num_tokens() - self.capacity_tokens
        if excess > 0:
            for node in self.tree.evict(excess):
                node.payload = None

    def match(self, key: bytes, scope: Scope, now: float) -> int:
        """Tokens of ``key`` routed here within the TTL, visible to ``scope``."""
        self.expire(now)
        return self.tree.match(key, scope, touch=False).num_matched_tokens

    def expire(self, now: float) -> None:
        """Remove what was last routed at or before ``now - ttl_s``."""
        cutoff = now - self.ttl_s
        expiry = self._expiry
        while expiry and expiry[0][0] <= cutoff:
            node = expiry.popleft()[1]
            while node.payload is not None and node.payload <= cutoff and node.is_leaf():
                parent = node.parent
                self.tree.remove_leaf(node)
                node.payload = None
                node = parent

    @property
    def num_tokens(self) -> int:
        """Tokens currently held (expired entries are dropped at the next call)."""
        return self.tree.num_tokens()
