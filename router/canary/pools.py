"""A model's pools: which pool a conversation goes to, and the weights behind it.

Each conversation is sticky to one pool, so its cache is never split between two
KV formats. The pool is chosen by weighted rendezvous hashing of (tenant, the
prompt's first KV block): one keyed BLAKE2b digest gives each pool a uniform draw
``u`` in (0, 1), and the pool with the least ``-ln(u) / weight`` wins. So each pool
gets its weight's share of conversations; a conversation's later turns start with
the same block and stay while the weights do; raising one pool's weight moves
conversations only to it, lowering it only away from it, and a pool at weight 0
gets none. The key keeps the split unpredictable to clients.

A pool is ``tripped`` when a guard set its weight to 0 (``trip``); ``set_weights``
(the admin API) sets weights and clears the trip of every pool it gives a weight
above 0; ``adopt`` takes the weights and trips another router shared. The baseline
pool is never tripped: it is where the others' traffic goes.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from typing import NamedTuple, TypeVar

from radix.keys import TOKEN_BYTES
from router.config import MAX_POOL_WEIGHT, MAX_POOLS, PoolConfig
from router.routing.views import HasWorkerId

_DRAW_BYTES = 8
_DRAW_SCALE = float(2 ** (8 * _DRAW_BYTES) + 1)
assert _DRAW_BYTES * MAX_POOLS <= hashlib.blake2b.MAX_DIGEST_SIZE  # one digest, every draw


W = TypeVar("W", bound=HasWorkerId)


class Trip(NamedTuple):
    """Why a guard took a pool's traffic away: the guard (``reason``: ``error_rate``,
    ``ttft_p99`` or ``probe``) and what it saw (``detail``)."""

    reason: str
    detail: str


class ModelPools:
    """The pools of one model. Not thread-safe; lives on the router's event loop."""

    def __init__(self, model: str, pools: Mapping[str, PoolConfig], baseline: str,
                 block_size: int, secret: bytes) -> None:
        self.model = model
        self.baseline = baseline
        self.names = tuple(pools)
        self.trips: dict[str, Trip] = {}
        self._pool_of = {w: name for name, pool in pools.items() for w in pool.workers}
        self._prefix_bytes = block_size * TOKEN_BYTES
        key = hashlib.blake2b(secret, person=b"radix-canary").digest()
        self._hasher = hashlib.blake2b(key=key, digest_size=_DRAW_BYTES * len(self.names))
        self._unpack = struct.Struct(f"<{len(self.names)}Q").unpack
        self._weights: dict[str, float] = {}
        self._weighted: list[tuple[int, str, float]] = []
        self._split_cache: tuple[object, dict[str, list]] = (None, {})
        self._apply({name: pool.weight for name, pool in pools.items()})

    @property
    def weights(self) -> Mapping[str, float]:
        """Each pool's weight now (0 while tripped)."""
        return dict(self._weights)

    def pool_of(self, worker_id: str) -> str:
        """The pool of ``worker_id``; a worker no pool names (added at run time) is the
        baseline's."""
        return self._pool_of.get(worker_id, self.baseline)

    def pick(self, tenant_id: str, prompt_key: bytes) -> str:
        """The pool of the conversation of ``tenant_id`` whose prompt (``radix.keys``
        encoding) is ``prompt_key``, by its first block (see the module docstring)."""
        hasher = self._hasher.copy()  # cheaper than keying a new one
        hasher.update(tenant_id.encode())
        hasher.update(b"\0")
        hasher.update(prompt_key[: self._prefix_bytes])
        draws = self._unpack(hasher.digest())
        best, best_score = self.baseline, math.inf
        for i, name, inverse_weight in self._weighted:
            score = -math.log((draws[i] + 1) / _DRAW_SCALE) * inverse_weight
            if score < best_score:
                best, best_score = name, score
        return best

    def split(self, workers: Sequence[W], tenant_id: str, prompt_key: bytes
              ) -> tuple[str, list[W], list[W]]:
        """(pool, its workers among ``workers``, the baseline's workers to fall back
        on; do not mutate the lists). A pool with none of ``workers`` gives way to
        the baseline, so a pool that lost its workers fails no request; the fallback
        list is empty on the baseline."""
        pool = self.pick(tenant_id, prompt_key)
        by_pool = self._by_pool(workers)
        chosen, baseline = by_pool.get(pool, []), by_pool.get(self.baseline, [])
        if pool == self.baseline or not chosen:
            return self.baseline, baseline, []
        return pool, chosen, baseline

    def _by_pool(self, workers: Sequence[W]) -> dict[str, list[W]]:
        """``workers`` by pool, kept while the caller passes the same list (the
        registry builds a new one whenever readiness changes)."""
        cached_for, by_pool = self._split_cache
        if cached_for is not workers:
            by_pool = {}
            for worker in workers:
                by_pool.setdefault(self.pool_of(worker.worker_id), []).append(worker)
            self._split_cache = (workers, by_pool)
        return by_pool  # type: ignore[return-value]

    def trip(self, pool: str, trip: Trip) -> bool:
        """Take ``pool``'s traffic away (weight 0) because of ``trip``; False (nothing
        changed) for the baseline or a pool already at 0."""
        if pool == self.baseline or not self._weights.get(pool):
            return False
        self.trips[pool] = trip
        self._apply({**self._weights, pool: 0.0})
        return True

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Set the weights of the pools named (the others keep theirs); a pool given a
        weight above 0 is no longer tripped. ValueError naming the pool for an unknown
        pool, a weight that is not a number in [0, ``MAX_POOL_WEIGHT``], or no weight left
        above 0."""
        for pool in weights:
            if pool not in self._weights:
                raise ValueError(f"weights.{pool}: no such pool (pools: {', '.join(self.names)})")
        merged = {**self._weights, **{p: _weight(p, w) for p, w in weights.items()}}
        if not sum(merged.values()):
            raise ValueError("weights: at least one pool needs a weight above 0")
        for pool, weight in weights.items():
            if weight:
                self.trips.pop(pool, None)
        self._apply(merged)

    def adopt(self, weights: Mapping[str, float], trips: Mapping[str, Trip]) -> None:
        """Take another router's weights and trips of the pools named (``set_weights``'
        checks; the others keep theirs): its trips replace this router's, kept only for
        pools now at weight 0."""
        for pool in trips:
            if pool not in self._weights:
                raise ValueError(f"trips.{pool}: no such pool (pools: {', '.join(self.names)})")
        self.set_weights(weights)
        self.trips = {pool: Trip(*trip) for pool, trip in trips.items()
                      if not self._weights[pool] and pool != self.baseline}

    def _apply(self, weights: dict[str, float]) -> None:
        self._weights = weights
        self._weighted = [(i, name, 1 / weights[name]) for i, name in enumerate(self.names)
                          if weights[name]]


def _weight(pool: str, weight: object) -> float:
    """``weight`` as a float in [0, ``MAX_POOL_WEIGHT``]; ValueError naming the pool
    otherwise (a JSON integer too large for a float included)."""
    value = float("nan")
    if type(weight) in (int, float):
        try:
            value = float(weight)  # type: ignore[arg-type]
        except OverflowError:
            value = float("inf")
    if not 0 <= value <= MAX_POOL_WEIGHT:
        raise ValueError(f"weights.{pool}: must be a number in [0, {MAX_POOL_WEIGHT:g}]")
    return value
