"""Flow control's shares across routers, through a real ``redis-server``: what one
router dispatched per fairness id reaches the others, a dead router's totals go with
its lease, and a router's queue lets a flow the others already serve go last."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from router.config import RedisConfig
from router.decision import Candidates
from router.fleet.worker_state import InFlight
from router.state.redis_state.flow_shares import RedisFlowShares
from router.state.redis_state.link import RedisLink
from router.up.launcher import RedisServer
from tests.support.aio import eventually
from tests.support.flow_control import ALICE, BOB, flow_call, flow_router, flow_worker, queued_turn

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

FAST = RedisConfig(heartbeat_interval_s=0.2, lease_ttl_s=1.0, command_timeout_s=1.0,
                   connect_timeout_s=0.5, key_prefix="flow-test")


@asynccontextmanager
async def links(server: RedisServer, count: int) -> AsyncIterator[list[RedisLink]]:
    """``count`` started router links to ``server``."""
    config = dataclasses.replace(FAST, url=server.url)
    started = [RedisLink(config, router_id=f"r{i}") for i in range(count)]
    for link in started:
        await link.start()
    try:
        yield started
    finally:
        for link in started:
            await link.close()


async def test_each_router_learns_what_the_others_served_and_a_dead_ones_totals_go(
        redis_server) -> None:
    async with links(redis_server, 3) as (l0, l1, l2):
        s0, s1, s2 = (RedisFlowShares(link, 0.05) for link in (l0, l1, l2))
        await s0.sync({"alice": 100.0})
        await s1.sync({"alice": 10.0, "bob": 5.0})
        await s2.sync({})
        assert s2.served_elsewhere == {"alice": 110.0, "bob": 5.0}
        await s0.sync({"alice": 100.0})
        assert s0.served_elsewhere == {"alice": 10.0, "bob": 5.0}
        await l1.close()  # its lease ends at once: its totals stop counting
        await s2.sync({})
        assert s2.served_elsewhere == {"alice": 100.0}
        redis_server.stop()
        await s0.sync({"alice": 1.0})
        assert s0.served_elsewhere == {}


async def test_a_flow_another_router_serves_goes_last_here(redis_server) -> None:
    """Alice is served through router 2; router 1 sees alice and bob waiting for one
    slot: bob's requests go first there."""
    async with links(redis_server, 2) as (l1, l2):
        shares = [RedisFlowShares(link, 0.05) for link in (l1, l2)]
        here, there = (flow_router(flow_shares=s) for s in shares)
        try:
            busy_there = flow_worker(there)
            for i in range(5):
                turn = await there.flow.turn(Candidates([busy_there], [], None),
                                             flow_call(there, f"alice there {i}"), ALICE, None)
                turn.release()
            worker = flow_worker(here)
            (await here.flow.turn(Candidates([worker], [], None), flow_call(here, "first"),
                                  BOB, None)).release()
            await eventually(lambda: shares[0].served_elsewhere.get("alice", 0) > 0)
            busy = InFlight(worker, 0, 0)
            granted: list[str] = []
            waiting = []
            for i in range(3):
                for tenant in (ALICE, BOB):
                    text = f"{tenant.tenant_id} {i}"
                    waiting.append(asyncio.create_task(queued_turn(here, worker, text, tenant,
                                                               granted)))
                    await asyncio.sleep(0.005)
            busy.end()
            here.flow.wake()
            await asyncio.wait_for(asyncio.gather(*waiting), 5)
            assert granted[:3] == ["bob 0", "bob 1", "bob 2"], granted
        finally:
            await here.close()
            await there.close()
