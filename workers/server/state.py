"""What the handlers share: the built worker, its limits, and readiness."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import Counter

from radix.openai.fields import Fields
from radix.openai.json_body import decode_json_object
from workers.build import BuiltWorker, WorkerIdentity
from workers.config import ServerConfig
from workers.engine.async_engine import AsyncEngine
from workers.kv_transfer.service import KVTransfer
from workers.server.load_push import LoadPush
from workers.server.sampling import RequestLimits


@dataclass(frozen=True)
class ServerState:
    """Per-process server state (one per app). ``api_key`` is required on every route
    but ``/health`` and ``/openapi.json`` (None: no key, loopback only). ``ready`` is set while the last
    self-test passed and no batched step has failed since; ``unhandled_errors``
    counts exceptions that reached the error middleware (a bug, never a client's
    fault). ``transfer``: this worker's prefill/decode roles (None: neither).
    ``load_push``: the load frames of its KV event streams (its task is started by
    ``workers.server.serve``)."""

    config: ServerConfig
    worker: BuiltWorker
    api_key: str | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    transfer: KVTransfer | None = None
    unhandled_errors: Counter = field(init=False)
    load_push: LoadPush = field(init=False)

    def __post_init__(self) -> None:
        counter = Counter(
            "http_unhandled_exceptions",
            "Exceptions that reached the error middleware (answered 500).",
            registry=self.worker.registry,
        )
        object.__setattr__(self, "unhandled_errors", counter)
        engine = self.worker.engine_config
        object.__setattr__(self, "load_push", LoadPush(
            self.engine, self.config.load_push_interval_s, engine.max_num_seqs,
            engine.max_num_seqs + engine.max_waiting_requests, self.held_blocks,
            self.ready_view))

    def is_ready(self) -> bool:
        """The last self-test passed, no batched step failed since, the engine runs and
        admits requests (not draining): ``/ready`` answers 200."""
        engine = self.engine
        return self.ready.is_set() and not engine.failed and engine.admitting

    def ready_view(self) -> Hashable:
        """What ``/ready`` says beyond the free blocks, for telling a change: readiness
        and each adapter's name and residency (``LoadReport.ready_seq`` counts changes)."""
        return self.is_ready(), tuple((a.name, a.resident) for a in self.worker.lora.slots.published)

    def held_blocks(self) -> dict[str, int]:
        """The load's held-block fields: blocks held for consumers and the cap on them
        (zeros on a worker that does not produce)."""
        if self.transfer is None:
            return {"num_held_blocks": 0, "max_held_blocks": 0}
        return self.transfer.load()

    @property
    def identity(self) -> WorkerIdentity:
        """What this worker serves."""
        return self.worker.identity

    @property
    def engine(self) -> AsyncEngine:
        """The engine bridge."""
        return self.worker.engine

    @property
    def limits(self) -> RequestLimits:
        """Bounds for request validation."""
        identity = self.identity
        return RequestLimits(
            max_model_len=identity.max_model_len,
            vocab_size=identity.vocab_size,
            block_size=identity.namespace.block_size,
            max_n=self.config.max_n,
            default_max_tokens=self.config.default_max_tokens,
        )


STATE = web.AppKey("state", ServerState)


async def read_fields(request: web.Request) -> Fields:
    """The JSON object body of ``request`` (400 if malformed, 413 if too large)."""
    return Fields(decode_json_object(await request.read()))
