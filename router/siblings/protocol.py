"""What one router shares with the other routers of its deployment, beyond limits.

The worker registry (changes made through any router's admin API), the public-prefix
registry, the canary pools' weights and trips, and the routing decisions for
``openai`` workers (approximate mode: each router applies the others' to its own
index). ``Siblings`` is the seam; ``NoSiblings`` is the null object of a router that
shares nothing (no Redis configured), and ``router.state.redis_state.RedisSiblings``
the Redis implementation. Limits go through ``router.state.shared_state`` instead.
KV events are never shared: every router follows every radix worker itself.
"""

from __future__ import annotations

from typing import Any, Protocol

from router.canary.controller import Canary
from router.fleet.registry import WorkerRegistry, WorkerState
from router.models import Models
from router.routing.index import RouterIndex


class Siblings(Protocol):
    """A router's side of the shared registry. Every method returns promptly and
    never raises because the shared store is unreachable: changes then stay local
    until the store returns, when they are published again."""

    @property
    def up(self) -> bool:
        """Whether the shared state is reachable (``router_shared_state_up``)."""
        ...

    @property
    def num_refused_entries(self) -> int:
        """Shared entries this router could not use, each counted once
        (``router_shared_entries_refused_total``)."""
        ...

    async def start(self, registry: WorkerRegistry, models: Models, index: RouterIndex,
                    canary: Canary) -> None:
        """Join: publish what this router holds, load what the others published (workers
        into ``registry``, prefixes into ``models``, pool weights and trips into
        ``canary``, where shared ones win over this router's config), then keep
        following."""
        ...

    async def close(self) -> None:
        """Stop following and leave."""
        ...

    async def worker_added(self, worker: WorkerState) -> None:
        """``worker`` was just added to this router's registry: add it everywhere."""
        ...

    async def worker_removed(self, worker_id: str) -> None:
        """``worker_id`` was just removed here: remove it everywhere."""
        ...

    async def prefix_added(self, model: str, key: bytes) -> None:
        """A public prefix (``key``, token ids as ``radix.keys`` bytes) was registered
        here for ``model``: register it everywhere."""
        ...

    async def canary_changed(self, model: str, state: dict[str, Any]) -> None:
        """``model``'s pool weights or trips changed here (``Canary.shared_state``):
        set them everywhere."""
        ...

    def routed(self, worker: WorkerState, key: bytes, scope: str) -> None:
        """``key`` was just routed to ``worker`` under ``scope`` (called for every
        decision; implementations share those of approximate workers)."""
        ...


class NoSiblings:
    """``Siblings`` of a router alone: nothing to share, always up (its state is local)."""

    up = True
    num_refused_entries = 0

    async def start(self, registry: WorkerRegistry, models: Models, index: RouterIndex,
                    canary: Canary) -> None:
        """Nothing to join."""

    async def close(self) -> None:
        """Nothing to leave."""

    async def worker_added(self, worker: WorkerState) -> None:
        """Local only."""

    async def worker_removed(self, worker_id: str) -> None:
        """Local only."""

    async def prefix_added(self, model: str, key: bytes) -> None:
        """Local only."""

    async def canary_changed(self, model: str, state: dict[str, Any]) -> None:
        """Local only."""

    def routed(self, worker: WorkerState, key: bytes, scope: str) -> None:
        """Local only."""

