"""RouterIndex: the router's view of which worker caches which prefix.

matched(w) = max(exact(w), approximate(w)). Exact comes from the radix workers' KV
events (``ExactIndex``); approximate from what the router itself routed
(``ApproxIndex``, one per namespace, its trees shared by all workers): for workers
marked approximate (OpenAI-compatible servers that publish no events) with a long TTL
and a capacity like the worker's KV cache, for every other worker a speculative entry
with a short TTL that the real ``stored`` event supersedes. Either part answers for
all workers in one walk of the key's scope tree and one of the PUBLIC tree.

Host tier: a worker's events with medium ``host`` (blocks it moved to host memory)
feed a second ``ExactIndex`` whose blocks chain from the device index's. A worker
matched ``d`` tokens on its device and ``h > d`` counting its host blocks is
credited ``d + host_hit_weight * (h - d)``: a host hit saves the prefill but costs
a copy back, so it is worth less than a device hit and more than a miss.

Disk tier: medium ``disk`` feeds a third ``ExactIndex`` whose blocks chain from
either of the others. Tokens found only on a worker's disk, past ``max(d, h)``,
count ``disk_hit_weight`` each (a read from disk costs more than a copy from host
memory, so it is weighed lower still).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from radix.events import KVEvent
from radix.keys import TOKEN_BYTES
from radix.tree import Scope
from router.config import IndexConfig
from router.routing.index.approx import ApproxIndex, Limits
from router.routing.index.exact import ExactIndex, raise_to
from router.routing.index.ids import NamespaceDigest, WorkerId


@dataclass(frozen=True)
class IndexStats:
    """Index size for ``/admin/index`` and metrics (``num_nodes`` counts exact trees)."""

    num_trees: int
    num_nodes: int
    num_tokens: int
    num_orphan_blocks: int
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
        self._exact = ExactIndex()
        self._host = ExactIndex(parents=(self._exact,))
        self._disk = ExactIndex(parents=(self._exact, self._host))
        self._approx: dict[NamespaceDigest, ApproxIndex] = {}
        self._approximate_capacity: dict[WorkerId, int] = {}

    def apply_event(self, worker_id: WorkerId, event: KVEvent) -> None:
        """Apply one KV event of ``worker_id`` (``cleared`` drops its exact entries).
        The event's ``namespace`` must be the router's digest for this worker; host
        and disk events go to their tier's index (``cleared`` drops all three)."""
        if event.type == "cleared":
            self._host.reset_worker(worker_id)
            self._disk.reset_worker(worker_id)
        tiers = {"host": self._host, "disk": self._disk}
        tiers.get(event.medium, self._exact).apply(worker_id, event)

    def reset_worker(self, worker_id: WorkerId) -> None:
        """Drop everything the index holds for ``worker_id``, exact and approximate
        (snapshot, new epoch, worker removed or unhealthy). Its mode is kept."""
        self._exact.reset_worker(worker_id)
        self._host.reset_worker(worker_id)
        self._disk.reset_worker(worker_id)
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

    def set_exact(self, worker_id: WorkerId) -> None:
        """Undo ``set_approximate``: ``worker_id``'s KV events are followed again, and
        what is routed to it is kept only as short speculative entries."""
        if self._approximate_capacity.pop(worker_id, None) is not None:
            for approx in self._approx.values():
                approx.reset_worker(worker_id)

    def note_routed(self, namespace: NamespaceDigest, worker_id: WorkerId, key: bytes,
                    scope: str) -> None:
        """Record that ``key`` was just routed to ``worker_id`` under ``scope``: an
        approximate entry for approximate workers, a speculative one for the others."""
        approx = self._approx.get(namespace)
        if approx is None:
            approx = self._approx[namespace] = ApproxIndex()
        approx.note(worker_id, key, Scope(scope), self._clock(), self._limits(worker_id))

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
        found = self._exact.match(namespace, key, Scope(scope))
        host = self._host.match(namespace, key, Scope(scope))
        disk = self._disk.match(namespace, key, Scope(scope))
        host_weight = self.config.host_hit_weight
        disk_weight = min(self.config.disk_hit_weight, host_weight)
        for worker_id in host.keys() | disk.keys():
            num_device = found.get(worker_id, 0)
            num_host = max(num_device, host.get(worker_id, 0))
            num_disk = max(num_host, disk.get(worker_id, 0))
            credit = (num_device + host_weight * (num_host - num_device)
                      + disk_weight * (num_disk - num_host))
            if num_disk > num_device:
                found[worker_id] = int(credit)
        approx = self._approx.get(namespace)
        if approx is not None:
            raise_to(found, approx.match(key, Scope(scope), self._clock()))
        return found

    def fingerprint(self) -> str:
        """``ExactIndex.fingerprint`` of the exact part (what the KV events built)."""
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
            num_blocks=exact.num_blocks,
            num_approx_tokens=num_approx,
        )

    def check_invariants(self) -> None:
        """Raise AssertionError if the exact, host, disk or an approximate index is
        inconsistent."""
        self._exact.check_invariants()
        self._host.check_invariants()
        self._disk.check_invariants()
        for approx in self._approx.values():
            approx.check_invariants()
