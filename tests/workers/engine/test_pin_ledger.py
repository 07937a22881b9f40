"""``PinLedger`` over a running engine thread: a pin runs during a step's forward pass,
and the sweep frees a pin nobody owns but never one issued after it read the ledger
(such a pin may run before the sweep, which waits behind the step)."""

from __future__ import annotations

import asyncio
import threading

from prometheus_client import CollectorRegistry

from radix.cost_model import CostModel
from radix.hashing import BlockHasher
from radix.keys import to_key
from tests.workers.engine.engine_support import BLOCK_SIZE, make_engine, prompt, request
from workers.engine.async_engine import AsyncEngine
from workers.engine.kv_feed import KVEventFeed
from workers.kv_transfer.identity import TransferIdentity
from workers.kv_transfer.metrics import TransferMetrics
from workers.kv_transfer.pins import PinLedger

DOC = prompt(4 * BLOCK_SIZE + 1)
KEY = to_key(DOC[: 4 * BLOCK_SIZE])


def test_the_sweep_frees_an_unowned_pin_and_never_one_issued_after_it_read_the_ledger():
    hold_steps, in_forward, release = threading.Event(), threading.Event(), threading.Event()

    def sleep(_seconds: float) -> None:
        if hold_steps.is_set():
            in_forward.set()
            release.wait(10)

    engine = make_engine(timed=CostModel(1e-3, 0, 0, 1e-3, 0, 0), sleep=sleep)
    bridge = AsyncEngine(engine, KVEventFeed(engine.manager), 8)
    identity = TransferIdentity("w", "00", BLOCK_SIZE, "float32", 1, BlockHasher(b"k"),
                                64)
    metrics = TransferMetrics(CollectorRegistry(), lambda: (0, 0.0))
    ledger = PinLedger(bridge, identity, metrics)

    def pin(engine, pin_id):
        return engine.manager.pin(pin_id, KEY, "anonymous")

    async def main() -> None:
        bridge.start(asyncio.get_running_loop())
        try:
            await bridge.submit(request(DOC, max_tokens=1)).token_ids()  # caches DOC
            orphan, _ = await ledger.pin(pin)
            ledger._live.discard(orphan)  # its owner lost track of it without freeing it
            hold_steps.set()
            busy = bridge.submit(request(prompt(40, salt=1), max_tokens=3))
            assert await asyncio.to_thread(in_forward.wait, 10)
            sweeping = asyncio.ensure_future(ledger.sweep())  # waits behind the step
            await asyncio.sleep(0.05)
            owned, blocks = await asyncio.wait_for(ledger.pin(pin), 5)  # during the step
            assert len(blocks) == 4 and not sweeping.done()
            release.set()
            assert await sweeping == 1
            held = await bridge.call(lambda e: e.manager.pin_ids())
            assert held == [owned]
            await ledger.free(owned)
            await busy.token_ids()
        finally:
            release.set()
            bridge.stop()

    asyncio.run(main())
