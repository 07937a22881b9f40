"""The Redis shared state against a real ``redis-server``: slots and token windows are
atomic across routers, a dead router's slots expire with its lease, windows settle and
expire, and an outage falls back to local shares and resyncs when Redis returns."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from router.config import RedisConfig, TenantLimits
from router.front.auth import Tenant
from router.front.limits import TenantLimiter
from router.state.redis_state.limits import RedisSharedState
from router.state.redis_state.link import RedisLink
from router.up.launcher import RedisServer, redis_answers
from tests.support.aio import eventually

pytestmark = pytest.mark.slow

FAST = RedisConfig(heartbeat_interval_s=0.2, lease_ttl_s=1.0, command_timeout_s=1.0,
                   connect_timeout_s=0.5, key_prefix="test")


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(main())


@asynccontextmanager
async def routers(server: RedisServer, count: int, window_s: float = 60.0
                  ) -> AsyncIterator[list[tuple[RedisLink, RedisSharedState]]]:
    """``count`` routers' links (started: heartbeat running) and their limit states."""
    config = dataclasses.replace(FAST, url=server.url)
    pairs = []
    for i in range(count):
        link = RedisLink(config, router_id=f"r{i}")
        pairs.append((link, RedisSharedState(link, window_s)))
    for link, _ in pairs:
        await link.start()
    try:
        yield pairs
    finally:
        for link, _ in pairs:
            await link.close()


def test_slots_are_exact_under_concurrency_across_routers(redis_server) -> None:
    async def main() -> None:
        async with routers(redis_server, 3) as pairs:
            states = [state for _, state in pairs]
            taken = await asyncio.gather(*(states[i % 3].acquire_slot("alice", 7)
                                           for i in range(60)))
            assert all(link.up for link, _ in pairs)
            assert sum(taken) == 7
            await states[0].release_slot("alice")
            assert await states[1].acquire_slot("alice", 7)
            assert not await states[2].acquire_slot("alice", 7)
            assert await states[2].acquire_slot("bob", 1)

    run(main)


def test_a_burst_of_calls_shares_the_links_pooled_connections(redis_server) -> None:
    async def main() -> None:
        async with routers(redis_server, 1) as [(link, state)]:
            assert all(await asyncio.gather(*(state.acquire_slot(f"t{i}", 1)
                                              for i in range(60))))
            assert link.up
            clients = await link.client.client_list()
            assert len(clients) <= FAST.max_connections  # the asking one among them

    run(main)


def test_token_reservations_are_exact_under_concurrency(redis_server) -> None:
    async def main() -> None:
        async with routers(redis_server, 2) as pairs:
            states = [state for _, state in pairs]
            waits = await asyncio.gather(*(states[i % 2].reserve_tokens(
                "alice", uuid.uuid4().hex, 10, 95) for i in range(40)))
            assert sum(w is None for w in waits) == 9
            assert all(0 < w <= 60 for w in waits if w is not None)
            assert await states[0].tokens_in_window("alice") == 90

    run(main)


def test_a_dead_routers_slots_expire_with_its_lease(redis_server) -> None:
    async def main() -> None:
        config = dataclasses.replace(FAST, url=redis_server.url)
        dead_link = RedisLink(config, router_id="dead")
        dead = RedisSharedState(dead_link)
        await dead_link.beat()  # one lease, and no heartbeat after it: the router "dies"
        assert await dead.acquire_slot("alice", 2) and await dead.acquire_slot("alice", 2)
        async with routers(redis_server, 1) as [(link, alive)]:
            assert not await alive.acquire_slot("alice", 2)
            assert link.num_routers_alive == 2
            await eventually(lambda: alive.acquire_slot("alice", 2), timeout_s=2 * FAST.lease_ttl_s)
            await eventually(lambda: link.num_routers_alive == 1, timeout_s=1.0)
        await dead_link.client.aclose()

    run(main)


def test_window_settles_and_expires(redis_server) -> None:
    async def main() -> None:
        async with routers(redis_server, 2, window_s=0.6) as [(_, a), (_, b)]:
            assert await a.reserve_tokens("alice", "r1", 60, 100) is None
            wait_s = await b.reserve_tokens("alice", "r2", 50, 100)
            assert wait_s is not None and 0 < wait_s <= 0.6
            await a.settle_tokens("alice", "r1", 60, 20, 0)  # the stream ended early
            assert await b.tokens_in_window("alice") == 20
            assert await b.reserve_tokens("alice", "r2", 50, 100) is None
            await b.settle_tokens("alice", "r2", 50, 50, 20)
            assert await a.tokens_in_window("alice") == 90
            await asyncio.sleep(0.7)
            assert await a.tokens_in_window("alice") == 0
            await a.settle_tokens("alice", "r1", 60, 30, 20)  # gone, within its reservation
            assert await a.tokens_in_window("alice") == 0
            await b.settle_tokens("alice", "r2", 50, 50, 450)  # gone: the rest is charged now
            assert await a.tokens_in_window("alice") == 450

    run(main)


def test_a_long_stream_is_charged_when_its_output_is_produced(redis_server) -> None:
    async def main() -> None:
        async with routers(redis_server, 1, window_s=0.6) as [(_, a)]:
            assert await a.reserve_tokens("alice", "r1", 1_000, 50_000) is None
            await asyncio.sleep(0.45)  # a stream almost as long as the window
            await a.settle_tokens("alice", "r1", 1_000, 100, 40_000)
            await asyncio.sleep(0.25)  # the reservation has left the window, its output not
            assert await a.tokens_in_window("alice") == 40_000
            assert await a.reserve_tokens("alice", "r2", 20_000, 50_000) is not None

    run(main)


def test_outage_falls_back_to_local_shares_and_resyncs(redis_server) -> None:
    async def main() -> None:
        async with routers(redis_server, 2) as [(link, a), (other, b)]:
            await eventually(lambda: link.num_routers_alive == 2, timeout_s=1.0)
            assert await a.acquire_slot("alice", 4)
            redis_server.stop()
            # Down: each router may hold 4 // 2 = 2, counting what it already holds.
            assert [await a.acquire_slot("alice", 4) for _ in range(2)] == [True, False]
            assert not link.up
            await eventually(lambda: not other.up, timeout_s=2.0)
            assert await a.reserve_tokens("alice", "local", 50, 100) is None
            assert await a.reserve_tokens("alice", "local2", 10, 100) is not None
            await a.release_slot("alice")
            redis_server.start()
            await eventually(lambda: link.up and other.up, timeout_s=3.0)
            # Back: router a's held slot was written back, so the limit is shared again.
            assert await link.client.hgetall("test:slots:r0") == {b"alice": b"1"}
            assert [await b.acquire_slot("alice", 4) for _ in range(4)] == [True] * 3 + [False]

    run(main)


def test_connections_from_before_a_redis_restart_reconnect_without_a_fallback(
        redis_server) -> None:
    async def main() -> None:
        async with routers(redis_server, 1) as [(link, state)]:
            # Eight calls at once leave eight pooled connections; a restart kills them all.
            assert all(await asyncio.gather(*(state.acquire_slot(f"a{i}", 9) for i in range(8))))
            redis_server.stop()
            redis_server.start()
            await asyncio.sleep(1.0)  # heartbeats: Redis lost its state, resynced
            assert all(await asyncio.gather(*(state.acquire_slot(f"b{i}", 9) for i in range(8))))
            assert link.up
            held = await link.client.hgetall("test:slots:r0")
            assert {f"b{i}".encode() for i in range(8)} <= held.keys()

    run(main)


class Gated:
    """A shared state whose ``method`` waits for ``gate`` (after setting ``entered``),
    from its call number ``from_call`` (counting from 1) on."""

    def __init__(self, state: RedisSharedState, method: str, from_call: int = 1) -> None:
        self._state = state
        self._method = method
        self._calls_left = from_call - 1
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._state, name)
        if name != self._method:
            return attr
        if self._calls_left:
            self._calls_left -= 1
            return attr

        async def gated(*args: Any) -> Any:
            self.entered.set()
            await self.gate.wait()
            return await attr(*args)

        return gated


@pytest.mark.parametrize("method", ["reserve_tokens", "release_slot"])
def test_a_client_gone_mid_admission_or_mid_release_leaks_no_slot(redis_server, method) -> None:
    alice = Tenant("alice", TenantLimits(max_concurrent_requests=1, tokens_per_minute=1000))

    async def main() -> None:
        async with routers(redis_server, 1) as [(link, state)]:
            gated = Gated(state, method)
            limiter = TenantLimiter(gated)  # type: ignore[arg-type]

            async def request() -> None:
                admission = await limiter.admit(alice, 10, 0)
                await limiter.release(admission, 0)

            async def no_slot_held() -> bool:
                return await link.client.hgetall("test:slots:r0") == {}

            task = asyncio.create_task(request())
            await gated.entered.wait()
            task.cancel()  # the client disconnects
            with pytest.raises(asyncio.CancelledError):
                await task
            gated.gate.set()
            await eventually(no_slot_held, timeout_s=2.0)
            await limiter.release(await limiter.admit(alice, 10, 0), 0)

    run(main)


def test_a_client_gone_mid_reservation_leaves_nothing_in_the_window(redis_server) -> None:
    """Cancelled while its reservation (the second ``reserve_tokens``) is on its way to
    Redis: the reservation lands after the client left and is settled to nothing,
    the hold is given back."""
    alice = Tenant("alice", TenantLimits(max_concurrent_requests=1, tokens_per_minute=1000))

    async def main() -> None:
        async with routers(redis_server, 1) as [(link, state)]:
            gated = Gated(state, "reserve_tokens", from_call=2)
            limiter = TenantLimiter(gated)  # type: ignore[arg-type]
            task = asyncio.create_task(limiter.admit(alice, 10, 500))
            await gated.entered.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            gated.gate.set()

            async def window_empty() -> bool:
                return (await limiter.tokens_in_window("alice") == 0
                        and await link.client.hgetall("test:slots:r0") == {})
            await eventually(window_empty, timeout_s=2.0)

    run(main)


def test_a_second_start_of_a_running_server_is_refused_and_stop_leaves_none(redis_server) -> None:
    """A second ``start`` could not bind the port, and would hide the first server
    from ``stop`` (a leaked redis-server): it is refused instead."""
    first = redis_server.child
    with pytest.raises(RuntimeError, match="already running"):
        redis_server.start()
    assert redis_server.child is first
    redis_server.stop()
    assert first.poll() is not None and not redis_answers(redis_server.port)
