"""RouterIndex: the router's view of which worker caches which prefix.

matched(w) = max(exact(w), approximate(w)). Exact comes from the workers' KV events
(``BlockIndex``: one trie of blocks per namespace, tiers and scopes as holders of each
block); approximate from what the router itself routed (``ApproxIndex``, one per
namespace, its trees shared by all workers): for workers marked approximate
(OpenAI-compatible servers that publish no events) with a long TTL and a capacity like
the worker's KV cache, for every other worker a speculative entry with a short TTL
that the real ``stored`` event supersedes.

What only requests in flight vouch for (``match_routed``): for a
worker whose events are followed, its speculative entries beyond what it reported
stored; for an approximate one, its entries this router noted as it sent a request
(``note_routed(confirmed=False)``) and has not yet confirmed (``confirm_routed``, at
the request's first token or end). The learn step counts a shortfall within that part
as ``in_flight``, not as a silent miss (``router.fleet.cache_prediction``).

Stale workers (``set_stale``: a worker whose event stream went silent, jumped or is
being rebuilt) keep their exact entries, on which a resumed stream builds, but
``match`` leaves them out: such a worker is matched by what was routed to it since it
went stale, kept as approximate entries, until ``set_exact``.

Tiers: a worker's events with medium ``host`` (blocks it moved to host memory) or
``disk`` file those blocks as held there. A worker whose chain of blocks reaches ``d``
tokens on its device, ``h >= d`` counting its host blocks and ``k >= h`` counting its
disk blocks is credited ``d + host_hit_weight * (h - d) + disk_hit_weight * (k - h)``:
a host hit saves the prefill but costs a copy back, so it is worth less than a device
hit and more than a miss, and a read from disk less still.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from radix.events import KVEvent
from radix.keys import TOKEN_BYTES
from radix.tree import Scope
from router.config import IndexConfig
from router.routing.index.approx import ApproxIndex, Counts, Limits
from router.routing.index.blocks import BlockIndex
from router.routing.index.ids import NamespaceDigest, WorkerId


@dataclass(frozen=True)
class IndexStats:
    """Index size for ``/admin/index`` and metrics (``num_nodes`` counts exact trees)."""

    num_trees: int
    num_nodes: int
    num_tokens: int
    num_orphan_blocks: int
    num_evicted_blocks: int
    num_blocks: dict[WorkerId, int]
    num_approx_tokens: dict[WorkerId, int]

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-able fields."""
        return asdict(self)


class RouterIndex:
    """Per namespace digest, which workers hold which prefixes, per scope.

    ``match`` is read-only apart from dropping expired approximate entries; it costs
    one walk of the key's scope tree and of the PUBLIC tree in the exact, host and
    approximate parts each, plus the workers on the nodes walked. ``clock`` (seconds,
    monotonic) times approximate entries; the default is ``time.monotonic``.
    """

    def __init__(self, config: IndexConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or IndexConfig()
        self._clock = clock
        self._exact = BlockIndex(self.config.host_hit_weight, self.config.disk_hit_weight,
                                 self.config.max_blocks)
        self._approx: dict[NamespaceDigest, ApproxIndex] = {}
        self._approximate_capacity: dict[WorkerId, int] = {}
        self._stale: set[WorkerId] = set()

    def apply_event(self, worker_id: WorkerId, event: KVEvent) -> None:
        """Apply one KV event of ``worker_id`` (``cleared`` drops its exact entries, in
        every tier). The event's ``namespace`` must be the router's digest for this
        worker."""
        self._exact.apply(worker_id, event)

    def reset_worker(self, worker_id: WorkerId) -> None:
        """Drop everything the index holds for ``worker_id``, exact and approximate
        (snapshot, new epoch, worker removed or unhealthy). Its mode is kept."""
        self._exact.reset_worker(worker_id)
        for approx in self._approx.values():
            approx.reset_worker(worker_id)

    def set_approximate(self, worker_id: WorkerId, capacity_tokens: int | None = None) -> None:
        """Mark ``worker_id`` as publishing no KV events: from now on ``note_routed``
        keeps its prefixes ``approximate_ttl_s`` under ``capacity_tokens`` (default
        ``approximate_capacity_tokens``). Drops what was noted for it before."""
        capacity = (self.config.approximate_capacity_tokens if capacity_tokens is None
                    else capacity_tokens)
        if capacity <= 0:
            raise ValueError(f"capacity_tokens must be positive, got {capacity_tokens!r}")
        self._approximate_capacity[worker_id] = capacity
        for approx in self._approx.values():
            approx.reset_worker(worker_id)

    def set_stale(self, worker_id: WorkerId) -> None:
        """Stop trusting ``worker_id``'s exact entries until ``set_exact``: they are
        kept and still follow its events, but ``match`` ignores them, and what is routed
        to it from now on is kept as approximate entries (``set_approximate``)."""
        if worker_id not in self._stale:
            self.set_approximate(worker_id)
            self._stale.add(worker_id)

    def set_exact(self, worker_id: WorkerId) -> None:
        """Undo ``set_approximate`` and ``set_stale``: ``worker_id``'s KV events are
        followed and trusted, and what is routed to it is kept only as short
        speculative entries."""
        self._stale.discard(worker_id)
        if self._approximate_capacity.pop(worker_id, None) is not None:
            for approx in self._approx.values():
                approx.reset_worker(worker_id)

    def note_routed(self, namespace: NamespaceDigest, worker_id: WorkerId, key: bytes,
                    scope: str, confirmed: bool = True) -> None:
        """Record that ``key`` was just routed to ``worker_id`` under ``scope``: an
        approximate entry for approximate workers, a speculative one for the others.
        ``confirmed`` False: the request is on its way (this router's own decision),
        and an approximate worker's new entries count as in flight until
        ``confirm_routed``; True (a sibling router's decision, which this router
        cannot see end) counts them as computed at once."""
        approx = self._approx.get(namespace)
        if approx is None:
            approx = self._approx[namespace] = ApproxIndex()
        approx.note(worker_id, key, Scope(scope), self._clock(), self._limits(worker_id),
                    confirmed)

    def is_approximate(self, worker_id: WorkerId) -> bool:
        """Whether ``worker_id`` is matched by what was routed to it (approximate or
        stale), so ``confirm_routed`` has something to confirm."""
        return worker_id in self._approximate_capacity

    def confirm_routed(self, namespace: NamespaceDigest, worker_id: WorkerId, key: bytes,
                       scope: str) -> None:
        """An approximate worker has computed ``key``, noted ``confirmed=False`` under
        ``scope`` (its request's first token came, or the request ended): its entries
        on that path count as confirmed from now on (``match_routed``'s
        ``unconfirmed`` no longer holds them). Nothing for other workers. O(path)."""
        approx = self._approx.get(namespace)
        if approx is not None and worker_id in self._approximate_capacity:
            approx.confirm(worker_id, key, Scope(scope))

    def kept_key(self, worker_id: WorkerId, key: bytes) -> bytes:
        """The part of ``key`` that ``note_routed`` keeps for ``worker_id``: its first
        capacity tokens (the rest would be cut on insert)."""
        return key[: self._limits(worker_id).capacity_tokens * TOKEN_BYTES]

    def _limits(self, worker_id: WorkerId) -> Limits:
        capacity = self._approximate_capacity.get(worker_id)
        if capacity is None:
            return Limits(self.config.speculative_ttl_s, self.config.speculative_capacity_tokens)
        return Limits(self.config.approximate_ttl_s, capacity)

    def match(self, namespace: NamespaceDigest, key: bytes, scope: str) -> dict[WorkerId, int]:
        """Tokens of ``key`` each worker holds, visible to ``scope`` (its own and PUBLIC
        entries only): max of exact (host- and disk-tier tokens weighted) and
        approximate. Workers with none are left out."""
        return self.match_routed(namespace, key, scope)[0]

    def match_routed(self, namespace: NamespaceDigest, key: bytes, scope: str
                     ) -> tuple[Counts, Counts, Counts]:
        """(``match``, routed, unconfirmed): of each worker's match, for a worker whose
        KV events are followed, *routed* is the part only a speculative entry vouches
        for (a prefix just routed there whose blocks it has not reported stored: it is
        still computing it, or it was never sent); for an approximate (or stale) worker,
        *unconfirmed* is the part only this router's requests not yet confirmed
        (``confirm_routed``) vouch for. Workers with none are left out of each; the
        match less both is what the index holds confirmed. A plain tuple, no more
        than ``match`` costs while no worker is approximate."""
        found = self._exact.match(namespace, key, scope)
        for worker_id in self._stale:
            found.pop(worker_id, None)
        routed: Counts = {}
        unconfirmed: Counts = {}
        approx = self._approx.get(namespace)
        if approx is None:
            return found, routed, unconfirmed
        approximate = self._approximate_capacity
        by_routes, confirmed = approx.match(key, Scope(scope), self._clock(), approximate)
        for worker_id, num_tokens in by_routes.items():
            num_stored = found.get(worker_id, 0)
            if num_tokens > num_stored:
                found[worker_id] = num_tokens
                if worker_id not in approximate:
                    routed[worker_id] = num_tokens - num_stored
                elif (num_known := max(confirmed.get(worker_id, 0), num_stored)) < num_tokens:
                    unconfirmed[worker_id] = num_tokens - num_known
        return found, routed, unconfirmed

    def match_tiers(self, namespace: NamespaceDigest, key: bytes, scope: str
                    ) -> dict[WorkerId, tuple[int, int]]:
        """Per worker whose KV events are followed and trusted (not stale), the tokens
        of ``key`` it has reported stored visibly to ``scope``: (on its device, in any
        of its tiers), unweighted; nothing speculative or approximate. Workers with
        none are left out."""
        found = self._exact.match_tiers(namespace, key, scope)
        for worker_id in self._stale:
            found.pop(worker_id, None)
        return found

    def fingerprint(self) -> str:
        """``BlockIndex.fingerprint`` of the exact part (what the KV events built)."""
        return self._exact.fingerprint()

    def stats(self) -> IndexStats:
        """Current sizes (approximate tokens include entries expired since last use)."""
        exact = self._exact.stats()
        num_approx: dict[WorkerId, int] = {}
        for approx in self._approx.values():
            for worker_id, num_tokens in approx.num_tokens().items():
                num_approx[worker_id] = num_approx.get(worker_id, 0) + num_tokens
        return IndexStats(
            num_trees=exact.num_trees,
            num_nodes=exact.num_nodes,
            num_tokens=exact.num_tokens,
            num_orphan_blocks=exact.num_orphan_blocks,
            num_evicted_blocks=exact.num_evicted_blocks,
            num_blocks=exact.num_blocks,
            num_approx_tokens=num_approx,
        )

    def check_invariants(self) -> None:
        """Raise AssertionError if the exact or an approximate index is inconsistent."""
        self._exact.check_invariants()
        for approx in self._approx.values():
            approx.check_invariants()
