"""``RedisSharedState``: tenant limits exact across every router sharing a Redis.

Concurrency: each router keeps the slots it holds in its own hash (tenant -> count)
whose TTL is its lease; the acquire script sums the hashes of live routers only, so
the slots of a router that died stop counting when its lease ends and a crashed
router never locks a tenant out. Token windows: one sorted set of reservations per
tenant, with their amounts and running total in a hash, expired by the script that
reads them; both keys expire with the window.

When the link is down every operation runs on a local ``InProcessSharedState`` with
the limit cut to ``local_share(limit, routers last seen alive)``, counting the slots
this router already holds. This router's own slot count is kept locally at all times
and written back to Redis by the resync hook, so slots taken or given back during an
outage are right again once the link returns.
"""

from __future__ import annotations

import contextlib

from router.config import local_share
from router.state.redis_state import scripts
from router.state.redis_state.link import RedisLink, RedisUnavailable
from router.state.shared_state import InProcessSharedState

_WINDOW_S = 60.0


class RedisSharedState:
    """``SharedState`` on Redis, falling back to conservative local shares."""

    def __init__(self, link: RedisLink, window_s: float = _WINDOW_S) -> None:
        self._link = link
        self._window_ms = int(window_s * 1000)
        self._local = InProcessSharedState(window_s)
        self._held: dict[str, int] = {}
        self._num_held_changes = 0
        self._local_reservations: set[str] = set()
        self._acquire = link.script(scripts.ACQUIRE_SLOT)
        self._release = link.script(scripts.RELEASE_SLOT)
        self._reserve = link.script(scripts.RESERVE_TOKENS)
        self._settle = link.script(scripts.SETTLE_TOKENS)
        self._in_window = link.script(scripts.TOKENS_IN_WINDOW)
        link.on_resync(self._write_held_slots, final=True)

    async def acquire_slot(self, key: str, limit: int) -> bool:
        """See ``SharedState.acquire_slot``: exact over live routers, or this router's
        share while Redis is down."""
        keys = self._link.keys
        try:
            taken = bool(await self._link.call(lambda _: self._acquire(
                keys=[keys.routers, keys.slots(self._link.router_id)],
                args=[keys.slots_prefix, self._link.router_id, key, limit,
                      int(self._link.config.lease_ttl_s * 1000)])))
        except RedisUnavailable:
            taken = self._held.get(key, 0) < local_share(limit, self._link.num_routers_alive)
        if taken:
            self._held[key] = self._held.get(key, 0) + 1
            self._num_held_changes += 1
        return taken

    async def release_slot(self, key: str) -> None:
        """See ``SharedState.release_slot``; an extra release is ignored."""
        held = self._held.get(key, 0)
        if held == 0:
            return
        if held == 1:
            del self._held[key]
        else:
            self._held[key] = held - 1
        self._num_held_changes += 1
        with contextlib.suppress(RedisUnavailable):  # the resync hook writes it back
            await self._link.call(lambda _: self._release(
                keys=[self._link.keys.slots(self._link.router_id)], args=[key]))

    async def reserve_tokens(self, key: str, reservation_id: str, num_tokens: int,
                             limit: int) -> float | None:
        """See ``SharedState.reserve_tokens``."""
        try:
            wait_ms = await self._link.call(lambda _: self._reserve(
                keys=self._window_keys(key),
                args=[self._window_ms, reservation_id, num_tokens, limit]))
        except RedisUnavailable:
            share = local_share(limit, self._link.num_routers_alive)
            assert share is not None
            wait_s = await self._local.reserve_tokens(key, reservation_id, num_tokens, share)
            if wait_s is None:
                self._local_reservations.add(reservation_id)
            return wait_s
        return None if int(wait_ms) < 0 else int(wait_ms) / 1000

    async def settle_tokens(self, key: str, reservation_id: str, num_reserved: int,
                            num_admitted: int, num_produced: int) -> None:
        """See ``SharedState.settle_tokens``; a reservation recorded in Redis whose
        settle cannot reach it keeps its reserved amount, and the tokens above it are
        recorded in this router's local window."""
        if reservation_id in self._local_reservations:
            self._local_reservations.discard(reservation_id)
            await self._local.settle_tokens(key, reservation_id, num_reserved, num_admitted,
                                            num_produced)
            return
        try:
            await self._link.call(lambda _: self._settle(
                keys=self._window_keys(key),
                args=[self._window_ms, reservation_id, num_admitted, num_reserved,
                      num_produced]))
        except RedisUnavailable:
            await self._local.settle_tokens(key, reservation_id, num_reserved, num_admitted,
                                            num_produced)

    async def tokens_in_window(self, key: str) -> int:
        """See ``SharedState.tokens_in_window``: Redis's total plus what this router
        recorded locally during an outage (the local total alone while down)."""
        local = await self._local.tokens_in_window(key)
        try:
            shared = await self._link.call(lambda _: self._in_window(
                keys=self._window_keys(key), args=[self._window_ms]))
        except RedisUnavailable:
            return local
        return int(shared) + local

    def _window_keys(self, key: str) -> list[str]:
        return [self._link.keys.token_window(key), self._link.keys.token_amounts(key)]

    async def _write_held_slots(self) -> None:
        """Final resync hook: this router's slot hash := the slots it holds now,
        written again if requests took or gave back slots (locally) meanwhile."""
        slots_key = self._link.keys.slots(self._link.router_id)
        lease_ms = int(self._link.config.lease_ttl_s * 1000)

        async def write(client, held: dict[str, int]) -> None:
            async with client.pipeline(transaction=True) as pipe:
                pipe.delete(slots_key)
                if held:
                    pipe.hset(slots_key, mapping=held)
                    pipe.pexpire(slots_key, lease_ms)
                await pipe.execute()

        written = None
        while written != self._num_held_changes:
            written = self._num_held_changes
            await self._link.call(lambda client, held=dict(self._held): write(client, held))
