"""``KVTransfer``: a worker's roles in prefill/decode disaggregation, built from
``[kv_transfer]``: the producer (with its transfer port), the consumer, or both."""

from __future__ import annotations

from dataclasses import dataclass

from radix.hashing import BlockHasher
from workers.build import BuiltWorker
from workers.config import KVTransferConfig
from workers.kv_transfer.consumer import Consumer
from workers.kv_transfer.identity import TransferIdentity
from workers.kv_transfer.metrics import TransferMetrics
from workers.kv_transfer.producer import Producer


@dataclass
class KVTransfer:
    """The roles this worker plays (None where it does not) and the config they came
    from; ``fallback`` says whether a failed pull recomputes."""

    config: KVTransferConfig
    identity: TransferIdentity
    metrics: TransferMetrics
    producer: Producer | None
    consumer: Consumer | None

    @classmethod
    async def start(cls, config: KVTransferConfig, worker: BuiltWorker, hash_algorithm: str,
                    api_key: str | None, bind_host: str, link_s_per_block: float = 0.0
                    ) -> KVTransfer:
        """Build the roles of ``config`` for ``worker`` (its engine thread running) and
        open the producer's transfer port; the transfer is signed with ``api_key``. A
        timed worker's consumer waits ``link_s_per_block`` per pulled block."""
        engine = worker.engine
        block_bytes = await engine.call(lambda e: len(e.manager.tensors.read_block(0)))
        ident = worker.identity
        identity = TransferIdentity(
            ident.worker_id, ident.namespace_digest, ident.namespace.block_size,
            ident.kv_plan.spec.dtype, block_bytes,
            BlockHasher(bytes.fromhex(ident.namespace_digest), hash_algorithm),
            -(-ident.max_model_len // ident.namespace.block_size))
        key = (api_key or "").encode()
        producer = (Producer(engine, identity, key, config.timeout_s) if config.produces
                    else None)
        metrics = TransferMetrics(worker.registry, producer.held_stats if producer else
                                  lambda: (0, 0.0))
        consumer = (Consumer(engine, identity, key, config.pull_timeout_s, metrics,
                             link_s_per_block) if config.consumes else None)
        if producer is not None:
            producer.metrics = metrics
            await producer.start(bind_host, config.kv_port, config.kv_host or bind_host)
        return cls(config, identity, metrics, producer, consumer)

    async def close(self) -> None:
        """Close the transfer port and release every hold."""
        if self.producer is not None:
            await self.producer.close()
