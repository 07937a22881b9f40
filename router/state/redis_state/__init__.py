"""Shared state on Redis for several routers: limits, worker registry, public prefixes
and approximate routing decisions (keys: ``keys``; scripts: ``scripts``).

``shared_backends`` picks the implementations for a config: the in-process null
objects without Redis, the Redis ones (sharing one ``RedisLink``) with it.
"""

from __future__ import annotations

from router.config import RouterConfig
from router.state.peers import NoPeers, Peers
from router.state.redis_state.limits import RedisSharedState
from router.state.redis_state.link import RedisLink, RedisUnavailable
from router.state.redis_state.peers import RedisPeers
from router.state.shared_state import InProcessSharedState, SharedState

__all__ = ["RedisLink", "RedisPeers", "RedisSharedState", "RedisUnavailable",
           "shared_backends"]


def shared_backends(config: RouterConfig) -> tuple[SharedState, Peers]:
    """(limits, peers) for ``config``: in process when ``redis.url`` is None, else on
    Redis. Build inside the event loop; ``peers.start`` connects."""
    if config.redis.url is None:
        return InProcessSharedState(), NoPeers()
    link = RedisLink(config.redis)
    return RedisSharedState(link), RedisPeers(link, config.admin.worker_key_env_prefix,
                                               config.workers)
