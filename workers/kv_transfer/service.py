"""``KVTransfer``: a worker's roles in prefill/decode disaggregation and peer pulls,
built from ``[kv_transfer]``: the producer (with its transfer port), the consumer,
both or neither, the retained sessions (``[retention]``, every worker), and their
housekeeping: every ``HOUSEKEEPING_INTERVAL_S`` the producer's expired holds and the
expired retentions are released and the engine's orphan pins freed
(``PinLedger.sweep``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from radix.hashing import BlockHasher
from workers.build import BuiltWorker
from workers.config import KVTransferConfig, RetentionConfig
from workers.kv_transfer.consumer import Consumer
from workers.kv_transfer.identity import TransferIdentity
from workers.kv_transfer.metrics import TransferMetrics
from workers.kv_transfer.pins import PinLedger
from workers.kv_transfer.producer import HoldLimits, Producer, TimedLink
from workers.kv_transfer.retention import Retainer, RetentionLimits

log = logging.getLogger(__name__)
HOUSEKEEPING_INTERVAL_S = 1.0


@dataclass
class KVTransfer:
    """The roles this worker plays (None where it does not) and the config they came
    from; ``fallback`` says whether a failed pull recomputes. ``retainer`` keeps
    returning sessions' blocks; ``costs`` is what it reports a router of its KV costs
    (``radix.kv_sources.SourceCosts.to_dict``)."""

    config: KVTransferConfig
    identity: TransferIdentity
    metrics: TransferMetrics
    producer: Producer | None
    consumer: Consumer | None
    ledger: PinLedger
    retainer: Retainer
    costs: dict[str, Any] = field(default_factory=dict)
    _housekeeper: asyncio.Task[None] | None = field(default=None, repr=False)

    @classmethod
    async def start(cls, config: KVTransferConfig, worker: BuiltWorker, hash_algorithm: str,
                    api_key: str | None, bind_host: str, link_s_per_block: float = 0.0,
                    costs: dict[str, Any] | None = None,
                    retention: RetentionConfig | None = None) -> KVTransfer:
        """Build the roles of ``config`` for ``worker`` (its engine thread running) and
        open the producer's transfer port; the transfer is signed with ``api_key``. A
        timed worker's producer sends each block ``link_s_per_block`` apart
        (``TimedLink``)."""
        engine = worker.engine
        block_bytes = await engine.call(lambda e: len(e.manager.tensors.read_block(0)))
        ident = worker.identity
        identity = TransferIdentity(
            ident.worker_id, ident.namespace_digest, ident.namespace.block_size,
            ident.kv_plan.spec.dtype, block_bytes,
            BlockHasher(bytes.fromhex(ident.namespace_digest), hash_algorithm),
            -(-ident.max_model_len // ident.namespace.block_size))
        key = (api_key or "").encode()
        metrics = TransferMetrics(worker.registry, lambda: producer.held_stats()
                                  if producer is not None else (0, 0.0))
        ledger = PinLedger(engine, identity, metrics)
        num_blocks = await engine.call(lambda e: e.manager.pool.num_total_blocks)
        tensors = await engine.call(lambda e: e.manager.tensors)
        producer = (Producer(tensors, identity, key, hold_limits(config, num_blocks),
                             ledger, metrics, TimedLink(link_s_per_block))
                    if config.produces else None)
        consumer = (Consumer(engine, identity, key, config.pull_timeout_s,
                             config.ack_timeout_s, ledger, metrics)
                    if config.consumes else None)
        if producer is not None:
            await producer.start(bind_host, config.kv_port, config.kv_host or bind_host)
        retainer = Retainer(ledger, retention_limits(retention or RetentionConfig(), num_blocks),
                            identity.block_size, worker.registry)
        transfer = cls(config, identity, metrics, producer, consumer, ledger, retainer,
                       costs or {})
        transfer._housekeeper = asyncio.create_task(transfer._housekeep())
        return transfer

    async def _housekeep(self) -> None:
        while True:
            await asyncio.sleep(HOUSEKEEPING_INTERVAL_S)
            try:
                if self.producer is not None:
                    await self.producer.expire()
                await self.retainer.expire()
                if num_freed := await self.ledger.sweep():
                    log.warning("freed %d KV transfer pins that no hold or import owned",
                                num_freed)
            except Exception:  # the engine failed: the worker is going down anyway
                log.exception("KV transfer housekeeping failed")

    async def close(self) -> None:
        """Stop the housekeeping, close the transfer port and release every hold."""
        if self._housekeeper is not None:
            self._housekeeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._housekeeper
        await self.retainer.close()
        if self.consumer is not None:
            await self.consumer.close()
        if self.producer is not None:
            await self.producer.close()

    def info(self) -> dict[str, Any] | None:
        """``/info``'s ``kv_transfer``: the producer's endpoint (``host`` and ``port``
        null on a worker that only consumes), whether it pulls, and its costs."""
        producer = self.producer
        return {"engine_id": self.identity.engine_id,
                "host": producer.host if producer is not None else None,
                "port": producer.port if producer is not None else None,
                "consumer": self.consumer is not None, "costs": self.costs}

    def load(self) -> dict[str, int]:
        """The held-blocks fields of ``/info``'s ``load``: blocks held for consumers
        now and the producer's cap (0 and 0 on a worker that produces nothing)."""
        if self.producer is None:
            return {"num_held_blocks": 0, "max_held_blocks": 0}
        return {"num_held_blocks": self.producer.num_held_blocks(),
                "max_held_blocks": self.producer.limits.max_held_blocks}


def hold_limits(config: KVTransferConfig, num_total_blocks: int) -> HoldLimits:
    """A producer's ``HoldLimits`` from ``config`` for a pool of ``num_total_blocks``."""
    return HoldLimits(config.timeout_s, *pool_caps(
        config.max_held_pool_fraction, config.max_scope_held_pool_fraction, num_total_blocks))


def retention_limits(config: RetentionConfig, num_total_blocks: int) -> RetentionLimits:
    """A worker's ``RetentionLimits`` from ``config`` for a pool of ``num_total_blocks``."""
    return RetentionLimits(config.max_retention_s, *pool_caps(
        config.max_retained_pool_fraction, config.max_scope_retained_pool_fraction,
        num_total_blocks))


def pool_caps(fraction: float, scope_fraction: float, num_total_blocks: int
              ) -> tuple[int, int]:
    """The most blocks of a pool of ``num_total_blocks`` all pins of a kind, and one
    tenant scope's, may take under those fractions (each at least one block)."""
    return (max(1, int(fraction * num_total_blocks)),
            max(1, int(scope_fraction * num_total_blocks)))
