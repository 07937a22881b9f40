"""What the handlers share: the built worker, its limits, and readiness."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import Counter

from radix.openai.fields import Fields
from radix.openai.json_body import decode_json_object
from workers.build import BuiltWorker, WorkerIdentity
from workers.config import ServerConfig
from workers.engine.async_engine import AsyncEngine
from workers.kv_transfer.service import KVTransfer
from workers.server.sampling import RequestLimits


@dataclass(frozen=True)
class ServerState:
    """Per-process server state (one per app). ``api_key`` is required on every route
    but ``/health`` and ``/openapi.json`` (None: no key, loopback only). ``ready`` is set while the last
    self-test passed and no batched step has failed since; ``unhandled_errors``
    counts exceptions that reached the error middleware (a bug, never a client's
    fault). ``transfer``: this worker's prefill/decode roles (None: neither)."""

    config: ServerConfig
    worker: BuiltWorker
    api_key: str | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    transfer: KVTransfer | None = None
    unhandled_errors: Counter = field(init=False)

    def __post_init__(self) -> None:
        counter = Counter(
            "http_unhandled_exceptions",
            "Exceptions that reached the error middleware (answered 500).",
            registry=self.worker.registry,
        )
        object.__setattr__(self, "unhandled_errors", counter)

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
