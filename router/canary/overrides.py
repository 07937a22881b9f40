"""Canary weights set for a while: an admin change with ``ttl_s`` goes back by itself.

``POST /admin/canary`` with ``ttl_s`` records, for each pool it names, the weight it
set, the weight to go back to, the deadline and who set it (``SetBy``: the admin
key's name and the request id). At the deadline each such pool whose weight is still
the one the override set goes back; a pool changed since (a guard's trip, another
router's change) keeps its weight: the later change wins. A new override of a pool
whose earlier override is still in force keeps the earlier weight to go back to, so
a chain of overrides ends where it began; a change without ``ttl_s`` makes the pools
it names permanent. ``PendingOverrides`` is the bookkeeping of one model, with the
times given; ``router.canary.controller`` sleeps until the deadlines and applies them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import NamedTuple

# The admin log (``router.server.admin``): an override's end is logged beside its start.
audit = logging.getLogger("router.admin")

# At most a week: an override is a temporary change; a lasting one has no ttl_s.
MAX_TTL_S = 7 * 24 * 3600.0


class SetBy(NamedTuple):
    """Who made an admin change: the admin key's name and the request id."""

    key_name: str
    request_id: str


class PoolOverride(NamedTuple):
    """One pool's weight set for ``ttl_s``: back to ``revert_to`` at ``deadline``
    (``time.monotonic()`` seconds) unless changed since."""

    weight: float
    revert_to: float
    deadline: float
    ttl_s: float
    set_by: SetBy


class Expiry(NamedTuple):
    """What the overrides due at one time do: ``weights``, those of the pools that go
    back (empty when none); ``reverted``, their overrides; ``kept``, the overrides
    whose pool was changed since and keeps its weight."""

    weights: dict[str, float]
    reverted: dict[str, PoolOverride]
    kept: dict[str, PoolOverride]


class PendingOverrides:
    """One model's overrides still to go back, by pool (see the module docstring)."""

    def __init__(self) -> None:
        self._pending: dict[str, PoolOverride] = {}

    def record(self, before: Mapping[str, float], weights: Mapping[str, float],
               ttl_s: float | None, now: float, set_by: SetBy) -> None:
        """``weights`` (pool -> weight now in force) were just set over ``before`` (every
        pool's weight before the change), for ``ttl_s`` seconds or (None) for good."""
        for pool, weight in weights.items():
            if ttl_s is None:
                self._pending.pop(pool, None)
                continue
            earlier = self._pending.get(pool)
            revert_to = (earlier.revert_to if earlier is not None
                         and earlier.weight == before[pool] else before[pool])
            self._pending[pool] = PoolOverride(weight, revert_to, now + ttl_s, ttl_s, set_by)

    def expire(self, now: float, weights: Mapping[str, float]) -> Expiry:
        """Take out the overrides due at ``now``, given the ``weights`` in force."""
        due = {pool: o for pool, o in self._pending.items() if o.deadline <= now}
        for pool in due:
            del self._pending[pool]
        reverted = {pool: o for pool, o in due.items() if weights[pool] == o.weight}
        kept = {pool: o for pool, o in due.items() if pool not in reverted}
        return Expiry({pool: o.revert_to for pool, o in reverted.items()}, reverted, kept)

    def next_deadline(self) -> float | None:
        """The earliest deadline pending (None: nothing pending)."""
        return min((o.deadline for o in self._pending.values()), default=None)

    def to_dict(self, pool: str, now: float) -> dict[str, object] | None:
        """JSON view of ``pool``'s pending override for ``GET /admin/canary`` (None: no
        override pending)."""
        override = self._pending.get(pool)
        if override is None:
            return None
        return {"weight": override.weight, "revert_to": override.revert_to,
                "ttl_s": override.ttl_s,
                "expires_in_s": round(max(0.0, override.deadline - now), 3),
                "set_by": override.set_by.key_name, "request_id": override.set_by.request_id}


def log_expiry(model: str, expiry: Expiry, weights: Mapping[str, float],
               refused: str | None = None) -> None:
    """Log on the admin log, per pool of ``expiry``, what its override's end did to
    ``model``: the weight it went back to, or the weight it kept (in ``weights``, now
    in force) and why (changed since, or ``refused``: going back was refused), with
    who set the override and for how long."""
    for pool, override in (*expiry.reverted.items(), *expiry.kept.items()):
        if pool in expiry.reverted and refused is None:
            what = f"weight {override.weight:g} -> {override.revert_to:g}"
        elif refused is None:
            what = (f"kept weight {weights[pool]:g}, set since (the override set "
                    f"{override.weight:g})")
        else:
            what = f"kept weight {weights[pool]:g}: {refused}"
        audit.info("admin override expired: model %s pool %s: %s (set by key %s, request "
                   "%s, for %g s)", model, pool, what, override.set_by.key_name,
                   override.set_by.request_id, override.ttl_s)
