"""``PinLedger``: every pin this worker's transfer roles hold on the engine (a
producer's holds, a consumer's imports), owned by the engine side so none outlives
its owner.

A pin id is recorded here, on the loop thread, *before* the command that pins is
queued for the engine thread; if the caller is cancelled (its client hung up) or the
command fails while the engine is busy, the free is queued after it (the engine's
inbox is first in, first out), so the blocks are released however the caller ended.
``sweep`` is the backstop: it frees every pin the engine holds that the ledger does
not know. Because recording precedes queuing and forgetting precedes the queued
free, a pin the engine holds at a sweep and the ledger lacks at the sweep's queuing
has no owner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from workers.engine.async_engine import AsyncEngine
from workers.engine.engine import Engine
from workers.kv.ids import SeqId
from workers.kv_transfer.identity import TransferIdentity
from workers.kv_transfer.metrics import TransferMetrics

T = TypeVar("T")


class PinLedger:
    """The live transfer pins of one worker (loop thread only)."""

    def __init__(self, engine: AsyncEngine, identity: TransferIdentity,
                 metrics: TransferMetrics) -> None:
        self._engine = engine
        self._identity = identity
        self._metrics = metrics
        self._live: set[SeqId] = set()

    async def pin(self, fn: Callable[[Engine, SeqId], T]) -> tuple[SeqId, T]:
        """Run ``fn(engine, pin_id)`` on the engine thread under a fresh pin id,
        recorded first; (the id, its result). If the caller is cancelled or ``fn``
        raises, the pin's free is queued behind it and the exception goes on: the
        caller then holds nothing. On return the caller owns the pin (``free`` it)."""
        pin_id = self._identity.next_pin_id()
        self._live.add(pin_id)
        try:
            return pin_id, await self._engine.call(lambda e: fn(e, pin_id))
        except BaseException:
            self._metrics.cancelled_pins.inc()
            self.free_later(pin_id)
            raise

    def free_later(self, pin_id: SeqId) -> None:
        """Forget ``pin_id`` and queue its free on the engine thread, waiting for
        nothing (safe while being cancelled; a free of an unknown id is a no-op)."""
        self._live.discard(pin_id)
        self._engine.post(lambda e: e.manager.free(pin_id))

    async def free(self, pin_id: SeqId) -> None:
        """Forget ``pin_id`` and free it on the engine thread; cancelling the wait
        does not cancel the free."""
        self.free_later(pin_id)
        await self._engine.call(lambda e: None)

    async def sweep(self) -> int:
        """Free every pin the engine holds that no owner recorded here (counted in
        ``kv_transfer_orphan_pins_freed_total``); the number freed."""
        live = frozenset(self._live)

        def sweep(engine: Engine) -> int:
            orphans = [p for p in engine.manager.pin_ids() if p not in live]
            for pin_id in orphans:
                engine.manager.free(pin_id)
            return len(orphans)

        num_freed = await self._engine.call(sweep)
        self._metrics.orphan_pins.inc(num_freed)
        return num_freed
