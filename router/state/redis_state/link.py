"""One router's link to the shared Redis: bounded calls, a lease, up/down, resync.

``RedisLink.call`` runs one command (or script, or pipeline) under
``command_timeout_s``; any failure, a timeout included, marks the link down and
raises ``RedisUnavailable``, which every user turns into its local fallback. While
the link is down ``call`` fails at once (no request waits on a dead server).

A heartbeat task renews this router's lease every ``heartbeat_interval_s`` (and
learns how many routers are alive, which sizes the fallback shares). The heartbeat
is also how the link comes back: when it succeeds after a failure, or finds that
Redis lost its state (the ``epoch`` key changed: a restart without persistence) or
that this router's lease had lapsed, it runs the registered resync hooks (each
re-publishes what this router holds and reloads what the others published) and
only then marks the link up. Only the hooks reach Redis meanwhile (a context
variable marks the heartbeat task); requests keep their local fallback until the
link is up. Each transition is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from router.config import RedisConfig
from router.state.redis_state import scripts
from router.state.redis_state.keys import Keys
from router.tasks import cancel_and_wait

log = logging.getLogger(__name__)
T = TypeVar("T")
ResyncHook = Callable[[], Awaitable[None]]
_RESYNCING: contextvars.ContextVar[bool] = contextvars.ContextVar("resyncing", default=False)


class RedisUnavailable(Exception):
    """Redis did not answer in time or failed, or the link is down: use local state."""


def new_router_id() -> str:
    """An id unique to this router process: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class RedisLink:
    """The client, the lease and the up/down state of one router process.

    ``up`` is True only after a heartbeat and every resync hook succeeded since the
    last failure. ``num_routers_alive`` (at least 1) is the live router count at the
    last successful heartbeat: it is kept through an outage ("last seen alive").
    """

    def __init__(self, config: RedisConfig, router_id: str | None = None) -> None:
        if config.url is None:
            raise ValueError("redis.url: required to connect")
        self.config = config
        self.keys = Keys(config.key_prefix)
        self.router_id = router_id or new_router_id()
        # One immediate retry on a new connection for a closed one (a pooled connection
        # from before a Redis restart), none for a timeout. The asyncio Retry: the sync
        # one would return the coroutine unawaited and retry nothing. At most
        # ``max_connections``: a burst of calls queues for a pooled connection (within the
        # call's bound) instead of opening one connection each, whose connects on a busy
        # machine would miss ``connect_timeout_s`` and take the link down.
        pool = BlockingConnectionPool.from_url(
            config.url, max_connections=config.max_connections, timeout=None,
            socket_timeout=config.command_timeout_s,
            socket_connect_timeout=config.connect_timeout_s,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            health_check_interval=0)
        self.client: Redis = Redis(connection_pool=pool)
        self.up = False
        self.num_routers_alive = 1
        self._epoch: bytes | None = None
        self._down_logged = False
        self._hooks: list[ResyncHook] = []
        self._final_hooks: list[ResyncHook] = []
        self._heartbeat = self.client.register_script(scripts.HEARTBEAT)
        self._task: asyncio.Task[None] | None = None

    def on_resync(self, hook: ResyncHook, final: bool = False) -> None:
        """Run ``hook`` each time the link (re)joins, in registration order; ``final``
        hooks run after the others, and nothing awaits between the end of the last
        one and the link being marked up."""
        (self._final_hooks if final else self._hooks).append(hook)

    def script(self, source: str) -> Any:
        """A registered Lua script (``await s(keys=..., args=...)``; run it in ``call``)."""
        return self.client.register_script(source)

    async def call(self, command: Callable[[Redis], Awaitable[T]]) -> T:
        """``await command(client)`` within the timeout; RedisUnavailable (link marked
        down) on any failure, or at once while the link is down."""
        if not (self.up or _RESYNCING.get()):
            raise RedisUnavailable("shared state is down")
        try:
            return await self._bounded(command(self.client))
        except RedisUnavailable as exc:
            self._mark_down(str(exc))
            raise

    async def _bounded(self, awaitable: Awaitable[T]) -> T:
        """``await awaitable`` within the timeout. ``asyncio.timeout``, not ``wait_for``:
        Python 3.11's ``wait_for`` drops a cancel that lands as the command completes, and
        a task that lost its cancel (the routed-stream follower) keeps a router's close,
        or an event loop's shutdown, waiting forever."""
        try:
            async with asyncio.timeout(self.config.connect_timeout_s + self.config.command_timeout_s):
                return await awaitable
        except (RedisError, OSError, TimeoutError) as exc:
            raise RedisUnavailable(f"{type(exc).__name__}: {exc}") from exc

    async def start(self) -> None:
        """One heartbeat now (so a router that can reach Redis starts with the shared
        state loaded), then one every ``heartbeat_interval_s`` in a task."""
        await self.beat()
        self._task = asyncio.create_task(self._run(), name="shared state heartbeat")

    async def close(self) -> None:
        """Stop the heartbeat, drop this router's lease (its slots stop counting at
        once) and close the connections."""
        if self._task is not None:
            await cancel_and_wait(self._task)
        if self.up:
            with contextlib.suppress(RedisUnavailable):
                await self._bounded(self.client.zrem(self.keys.routers, self.router_id))
        await self.client.aclose()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_interval_s)
            try:
                await self.beat()
            except Exception:  # a bug must not end the heartbeat
                log.exception("shared state heartbeat failed")

    async def beat(self) -> None:
        """Renew the lease; resync first when joining, after a failure, after a lapsed
        lease or when Redis lost its state."""
        keys = self.keys
        try:
            epoch, num_alive, lapsed = await self._bounded(self._heartbeat(
                keys=[keys.routers, keys.slots(self.router_id), *keys.long_lived()],
                args=[self.router_id, int(self.config.lease_ttl_s * 1000),
                      int(self.config.state_ttl_s * 1000), secrets.token_hex(8)]))
        except RedisUnavailable as exc:
            self._mark_down(str(exc))
            return
        self.num_routers_alive = max(1, int(num_alive))
        if self.up and epoch == self._epoch and not lapsed:
            return
        if self.up:
            log.warning("shared state: %s; resyncing",
                        "Redis lost its state" if epoch != self._epoch else "lease lapsed")
        token = _RESYNCING.set(True)
        try:
            for hook in [*self._hooks, *self._final_hooks]:
                await hook()
        except RedisUnavailable:
            return
        finally:
            _RESYNCING.reset(token)
        self._epoch = epoch
        if not self.up:
            log.info("shared state up: %s, %d router(s) alive", self._where(),
                        self.num_routers_alive)
        self.up = True

    def _mark_down(self, reason: str) -> None:
        if self.up or not self._down_logged:
            log.warning("shared state down (%s): %s; routing on local state, limits cut to "
                        "1/%d", self._where(), reason, self.num_routers_alive)
            self._down_logged = True
        self.up = False

    def _where(self) -> str:
        pool = self.client.connection_pool.connection_kwargs
        return f"redis {pool.get('host', pool.get('path', '?'))}:{pool.get('port', '')}"
