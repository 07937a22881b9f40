"""Approximate index of one namespace: which worker was recently routed which prefix.

For workers that publish no KV events (OpenAI-compatible servers) this is all the
router knows; for every worker it also holds the short-lived speculative entry written
at decision time, which covers the moment between routing a request and the worker's
``stored`` event for it.

One ``RadixTree`` per scope, shared by all workers: ``RadixTree.insert`` reuses every
node visible to the scope, PUBLIC ones included, so in one tree a tenant's entry could
land on a public node and be seen by every tenant. A node's payload maps worker id -> ``_Entry``: the time that worker
was last routed a key through the node. Noting a key stamps its whole insert path, so
a worker on a node is on its parent, with a stamp at least as recent, and a lookup
credits each worker with its deepest node on the key's path in one walk per tree.

Per worker, its entries form an intrusive doubly linked list, oldest first. A note
moves the path's entries to the newest end leaf first, root last, so an ancestor
always sits after its descendants and the oldest entry is always a *worker-leaf* (no
child holds the worker): capacity eviction and expiry pop from the front in O(1) per
entry. When an insert cuts an edge, every worker on it gets a head entry with the same
stamp right after its tail entry, which keeps both orders exact.

Capacity: a worker holds the tokens of the nodes it is on, summed over the scopes'
trees (a prefix routed under two scopes counts twice); a key is cut to the capacity,
and after a note the worker's oldest entries go until it fits. Eviction is per node,
and nodes are cut by every worker's keys, so it frees tokens in finer steps than the
worker's own keys alone would.

Confirmation: a note made as its request is sent (``confirmed`` False) leaves the
entries it creates unconfirmed until ``confirm`` of the same key says the worker has
computed it; a confirmed entry stays so until it goes, and its ancestors are
confirmed too. ``match`` gives, for the workers asked, the depth their confirmed
entries reach as well: what the router knows a worker computed, apart from what it
only sent there.

Expiry: each note queues (time, worker) on the deque of the worker's TTL. A call at
``now`` pops the items older than the TTL and, for each, that worker's entries stamped
at or before ``now - ttl_s``; every entry's own stamp is queued, so none outlives its
TTL and no call scans workers that have nothing due.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterator, Mapping
from collections.abc import Set as AbstractSet
from typing import NamedTuple, TypeVar

from radix.keys import TOKEN_BYTES
from radix.tree import PUBLIC, MatchResult, Node, RadixTree, Scope
from router.routing.index.ids import WorkerId

Counts = dict[WorkerId, int]
H = TypeVar("H", bound=Mapping[WorkerId, object])


class Limits(NamedTuple):
    """How long a worker's entries live and how many tokens it may hold."""

    ttl_s: float
    capacity_tokens: int


class _Entry:
    """One worker on one node, a link of that worker's list (``_Lru``'s sentinel has
    ``holders`` None); ``confirmed`` once a note or ``confirm`` of a key through the
    node said the worker computed it."""

    __slots__ = ("holders", "stamp", "confirmed", "prev", "next")

    def __init__(self, holders: _Holders | None, stamp: float, confirmed: bool) -> None:
        self.holders = holders
        self.stamp = stamp
        self.confirmed = confirmed
        self.prev: _Entry = self
        self.next: _Entry = self


class _Holders(dict[WorkerId, _Entry]):
    """A node's payload: worker -> entry, and the node itself (None only between a
    split and the end of the insert that made it)."""

    __slots__ = ("node",)

    def __init__(self, node: Node[_Holders] | None) -> None:
        super().__init__()
        self.node = node


class _Lru:
    """One worker's entries, oldest first (a ring closed by a sentinel), its limits
    and the tokens of the nodes it is on."""

    __slots__ = ("limits", "num_tokens", "ring")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.num_tokens = 0
        self.ring = _Entry(None, 0.0, False)

    def oldest(self) -> _Entry | None:
        entry = self.ring.next
        return None if entry is self.ring else entry

    def link_after(self, anchor: _Entry, entry: _Entry) -> None:
        entry.prev, entry.next = anchor, anchor.next
        anchor.next.prev = entry
        anchor.next = entry

    def unlink(self, entry: _Entry) -> None:
        entry.prev.next, entry.next.prev = entry.next, entry.prev

    def __iter__(self) -> Iterator[_Entry]:
        entry = self.ring.next
        while entry is not self.ring:
            yield entry
            entry = entry.next


class ApproxIndex:
    """Prefixes routed to each worker of one namespace within its TTL, at most its
    capacity in tokens, per scope (a lookup by T sees what was routed under T or
    PUBLIC). Times are the caller's clock; calls must not go back in time.

    Guarantee: ``match`` gives each worker the longest common prefix of the key with
    any key noted to it within its TTL under the key's scope or PUBLIC, less what its
    capacity evicted (its least recently routed nodes first); ``match_confirmed`` also
    the same over the keys noted ``confirmed`` or ``confirm``-ed since (under the same
    TTL and eviction: confirming stamps nothing).
    """

    def __init__(self) -> None:
        self._trees: dict[Scope, RadixTree[_Holders]] = {}
        self._num_entries: dict[Scope, dict[WorkerId, int]] = {}
        self._workers: dict[WorkerId, _Lru] = {}
        self._expiry: dict[float, deque[tuple[float, WorkerId]]] = {}

    def note(self, worker_id: WorkerId, key: bytes, scope: Scope, now: float,
             limits: Limits, confirmed: bool = True) -> None:
        """Stamp ``key``'s path (cut to the capacity) for ``worker_id`` at ``now``, then
        evict its oldest entries past its capacity. ``limits`` apply from a worker's
        first note until ``reset_worker``. ``confirmed`` False: the worker has yet to
        compute ``key`` (its request is in flight; ``confirm`` it later): new entries
        stay unconfirmed, confirmed ones stay confirmed. O(path + evicted)."""
        self._expire(now)
        lru = self._workers.get(worker_id)
        if lru is None:
            lru = self._workers[worker_id] = _Lru(limits)
        if not key:
            return
        tree = self._trees.get(scope)
        if tree is None:
            tree = self._trees[scope] = RadixTree(self._split)
            self._num_entries[scope] = {}
        num_entries = self._num_entries[scope]
        path = tree.insert(key[: lru.limits.capacity_tokens * TOKEN_BYTES], scope).nodes
        for node in reversed(path):  # leaf first: each ancestor ends up newer
            holders = node.payload
            if holders is None:
                holders = node.payload = _Holders(node)
            elif holders.node is None:
                holders.node = node
            entry = holders.get(worker_id)
            if entry is None:
                entry = holders[worker_id] = _Entry(holders, now, confirmed)
                lru.num_tokens += node.num_tokens
                num_entries[worker_id] = num_entries.get(worker_id, 0) + 1
            else:
                lru.unlink(entry)
                entry.confirmed = entry.confirmed or confirmed
            entry.stamp = now
            lru.link_after(lru.ring.prev, entry)
        self._expiry.setdefault(lru.limits.ttl_s, deque()).append((now, worker_id))
        while lru.num_tokens > lru.limits.capacity_tokens:
            self._drop(worker_id, lru, lru.ring.next)

    def _split(self, tail: _Holders, num_head_tokens: int) -> tuple[_Holders, _Holders]:
        head = _Holders(None)
        num_entries = self._num_entries[tail.node.scope]
        for worker_id, entry in tail.items():
            head[worker_id] = _Entry(head, entry.stamp, entry.confirmed)
            self._workers[worker_id].link_after(entry, head[worker_id])
            num_entries[worker_id] += 1
        return head, tail

    def _drop(self, worker_id: WorkerId, lru: _Lru, entry: _Entry) -> None:
        """Remove a worker-leaf entry; its node goes when no worker is left on it (then
        it is a leaf: its children's workers would be on it)."""
        holders = entry.holders
        node = holders.node
        lru.unlink(entry)
        lru.num_tokens -= node.num_tokens
        del holders[worker_id]
        num_entries = self._num_entries[node.scope]
        num_entries[worker_id] -= 1
        if not num_entries[worker_id]:
            del num_entries[worker_id]
        if not holders:
            tree = self._trees[node.scope]
            tree.remove_leaf(node)
            if not tree.num_nodes:
                del self._trees[node.scope], self._num_entries[node.scope]

    def _expire(self, now: float) -> None:
        """Drop every entry stamped at or before ``now`` minus its worker's TTL;
        O(queued notes that fall due + entries dropped)."""
        for ttl_s, queue in self._expiry.items():
            cutoff = now - ttl_s
            while queue and queue[0][0] <= cutoff:
                worker_id = queue.popleft()[1]
                lru = self._workers.get(worker_id)
                if lru is None:
                    continue
                worker_cutoff = now - lru.limits.ttl_s
                while (entry := lru.oldest()) is not None and entry.stamp <= worker_cutoff:
                    self._drop(worker_id, lru, entry)

    def match(self, key: bytes, scope: Scope, now: float,
              confirming: Collection[WorkerId] = ()) -> tuple[Counts, Counts]:
        """Matched tokens per worker, and for the workers of ``confirming`` the part of
        it their confirmed entries cover (workers with none are left out of each),
        expired entries dropped first. Costs one walk of the scope's tree and one of
        the PUBLIC tree, plus set operations over the workers on the nodes walked; each
        worker of ``confirming`` matched adds a look at its nodes from the deepest up
        to its deepest confirmed one."""
        self._expire(now)
        found: Counts = {}
        confirmed: Counts = {}
        for tree_scope in (scope, PUBLIC) if scope != PUBLIC else (PUBLIC,):
            tree = self._trees.get(tree_scope)
            if tree is not None:
                result = tree.match(key, tree_scope, touch=False)
                deepest = deepest_holders(result, len(self._num_entries[tree_scope]))
                raise_to(found, deepest)
                if confirming:
                    credit_confirmed(result, deepest.keys() & confirming, confirmed)
        return found, confirmed

    def confirm(self, worker_id: WorkerId, key: bytes, scope: Scope) -> None:
        """Mark ``worker_id``'s entries on the nodes ``key`` (cut to its capacity) covers
        whole under ``scope`` confirmed: the worker has computed ``key``. Stamps
        nothing (an entry lives as long as its notes say); entries already gone stay
        gone. O(path)."""
        lru = self._workers.get(worker_id)
        tree = self._trees.get(scope)
        if lru is None or tree is None:
            return
        result = tree.match(key[: lru.limits.capacity_tokens * TOKEN_BYTES], scope, touch=False)
        for node in result.nodes:
            entry = node.payload.get(worker_id)
            if entry is None or node.end > result.num_matched_tokens:
                return
            entry.confirmed = True

    def reset_worker(self, worker_id: WorkerId) -> None:
        """Forget every entry of ``worker_id`` and its limits; O(its entries)."""
        lru = self._workers.pop(worker_id, None)
        while lru is not None and (entry := lru.oldest()) is not None:
            self._drop(worker_id, lru, entry)

    def num_tokens(self) -> dict[WorkerId, int]:
        """Tokens per worker noted since its last reset (0 once all expired; expired
        entries count until the next call drops them)."""
        return {worker_id: lru.num_tokens for worker_id, lru in self._workers.items()}

    def check_invariants(self) -> None:
        """Raise AssertionError unless every node holds a worker, a worker on a node is
        on its parent with a stamp at least as recent (confirmed if it is), each worker's list runs oldest
        first with every descendant before its ancestors, holds exactly its entries,
        their tokens (at most its capacity) and their stamps on its expiry queue.
        O(entries): for tests."""
        entries: dict[WorkerId, set[_Entry]] = {}
        for scope, tree in self._trees.items():
            tree.check_invariants()
            assert tree.num_nodes, f"empty tree {scope} kept"
            counts: dict[WorkerId, int] = {}
            for node in tree.iter_nodes():
                holders = node.payload
                assert node.scope == scope and holders and holders.node is node, node
                for worker_id, entry in holders.items():
                    assert entry.holders is holders, node
                    if node.parent is not tree.root:
                        parent_entry = node.parent.payload.get(worker_id)
                        assert parent_entry is not None, f"{worker_id} on {node}, not its parent"
                        assert parent_entry.stamp >= entry.stamp, node
                        assert parent_entry.confirmed or not entry.confirmed, node
                    entries.setdefault(worker_id, set()).add(entry)
                    counts[worker_id] = counts.get(worker_id, 0) + 1
            assert counts == self._num_entries[scope], f"entry counts of {scope}"
        assert self._num_entries.keys() == self._trees.keys()
        for worker_id, lru in self._workers.items():
            listed = list(lru)
            assert set(listed) == entries.pop(worker_id, set()), f"list of {worker_id}"
            position = {entry: i for i, entry in enumerate(listed)}
            queued = {t for t, w in self._expiry.get(lru.limits.ttl_s, ()) if w == worker_id}
            for i, entry in enumerate(listed):
                assert entry.next.prev is entry and entry.stamp in queued, entry
                assert i == 0 or listed[i - 1].stamp <= entry.stamp, f"{worker_id} out of order"
                parent = entry.holders.node.parent.payload
                if parent is not None:  # the root's payload is None
                    assert position[parent[worker_id]] > i, f"{worker_id} ancestor before descendant"
            assert lru.num_tokens == sum(e.holders.node.num_tokens for e in listed)
            assert lru.num_tokens <= lru.limits.capacity_tokens, f"{worker_id} over capacity"
        assert not entries, f"entries of unknown workers {set(entries)}"


def deepest_holders(result: MatchResult[H], num_workers: int) -> Counts:
    """Per worker, the depth of the deepest node of ``result`` whose payload holds it,
    counted only up to the matched part of the last node. The walk goes deepest first
    and stops once all ``num_workers`` workers of the tree were seen; each node costs
    set operations over its payload's keys, not a Python loop."""
    deepest: Counts = {}
    for node in reversed(result.nodes):
        depth = min(node.end, result.num_matched_tokens)
        deepest.update(dict.fromkeys(node.payload.keys() - deepest.keys(), depth))
        if len(deepest) == num_workers:
            break
    return deepest


def credit_confirmed(result: MatchResult[_Holders], workers: AbstractSet[WorkerId],
                     confirmed: Counts) -> None:
    """Raise ``confirmed[w]`` for each of ``workers`` to the depth of the deepest node
    of ``result`` holding a confirmed entry of ``w`` (up to the matched part of the
    last node), looking from the deepest node up until it finds one."""
    for worker_id in workers:
        for node in reversed(result.nodes):
            entry = node.payload.get(worker_id)
            if entry is not None and entry.confirmed:
                depth = min(node.end, result.num_matched_tokens)
                if confirmed.get(worker_id, 0) < depth:
                    confirmed[worker_id] = depth
                break


def raise_to(found: Counts, other: Counts) -> None:
    """``found[w] = max(found[w], other[w])`` for every worker of ``other``."""
    if not found:
        found.update(other)
        return
    for worker_id, num_tokens in other.items():
        if found.get(worker_id, 0) < num_tokens:
            found[worker_id] = num_tokens
