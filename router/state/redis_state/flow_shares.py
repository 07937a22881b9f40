"""``RedisFlowShares``: flow control's shares across every router sharing a Redis.

Each router keeps its weighted tokens per fairness id (over flow control's window) in
its own hash, whose TTL is its lease; one script replaces that hash and returns the
totals of every other live router, so a router that died stops counting when its
lease ends. A router publishes at most ``MAX_FLOWS`` flows (its largest): with a
fairness header, ids beyond those are fair within each router only. While the link is
down nothing is served elsewhere: every router falls back to its own shares.
"""

from __future__ import annotations

from collections.abc import Mapping

from router.state.redis_state import scripts
from router.state.redis_state.link import RedisLink, RedisUnavailable

MAX_FLOWS = 512
_NOWHERE: Mapping[str, float] = {}


class RedisFlowShares:
    """``router.flow.shares.FlowShares`` on Redis (see the module docstring)."""

    def __init__(self, link: RedisLink, interval_s: float) -> None:
        self.interval_s = interval_s
        self.served_elsewhere: Mapping[str, float] = _NOWHERE
        self._link = link
        self._sync = link.script(scripts.SYNC_FLOW_SHARES)

    async def sync(self, served_here: Mapping[str, float]) -> None:
        """Publish ``served_here`` (its ``MAX_FLOWS`` largest) and refresh
        ``served_elsewhere``; on any Redis failure it becomes empty."""
        keys, router_id = self._link.keys, self._link.router_id
        largest = sorted(served_here.items(), key=lambda kv: kv[1], reverse=True)[:MAX_FLOWS]
        args: list[str | int] = [keys.flow_served_prefix, router_id,
                                 int(self._link.config.lease_ttl_s * 1000)]
        for flow, total in largest:
            args += [flow, repr(float(total))]
        try:
            pairs = await self._link.call(lambda _: self._sync(
                keys=[keys.routers, keys.flow_served(router_id)], args=args))
        except RedisUnavailable:
            self.served_elsewhere = _NOWHERE
            return
        elsewhere: dict[str, float] = {}
        for flow, total in zip(pairs[::2], pairs[1::2], strict=True):
            name = flow.decode() if isinstance(flow, bytes) else str(flow)
            elsewhere[name] = elsewhere.get(name, 0.0) + float(total)
        self.served_elsewhere = elsewhere
