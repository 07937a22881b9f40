"""An idle worker drops expired host-tier entries: the server's expiry task runs on
the engine thread every quarter of the TTL, with no request arriving."""

from __future__ import annotations

import asyncio

from tests.workers.engine.engine_support import make_engine, prompt, request, run
from workers.engine.async_engine import AsyncEngine
from workers.engine.kv_feed import KVEventFeed
from workers.server.serve import expire_host_entries

TTL_S = 0.2


def test_expired_entries_leave_an_idle_worker():
    engine = make_engine(num_blocks=4, num_host_blocks=16, host_ttl_s=TTL_S)
    run(engine, {1: request(prompt(40), max_tokens=1)})
    run(engine, {2: request(prompt(40, salt=1), max_tokens=1)})  # request 1's blocks go to host
    assert engine.manager.stats().host.num_host_blocks_used == 2
    bridge = AsyncEngine(engine, KVEventFeed(engine.manager), max_in_flight=4)

    async def idle() -> None:
        bridge.start(asyncio.get_running_loop())
        task = asyncio.create_task(expire_host_entries(bridge, TTL_S))
        try:
            await asyncio.sleep(4 * TTL_S)
        finally:
            task.cancel()
            bridge.stop()

    asyncio.run(idle())
    host = engine.manager.stats().host
    assert (host.num_host_blocks_used, host.host_expired_blocks_total) == (0, 2)
