"""Attach a ready vLLM worker to the router index: token parity, then its events.

``follow_vllm`` is the body of the worker's follower task (``WorkerRegistry`` starts
it when the worker becomes ready and cancels it when it leaves). A worker whose
tokenization differs from the router's is routed approximately for as long as it stays
ready, with the reason in ``GET /admin/workers``; one that agrees is routed exactly
from its ZMQ KV events. An SGLang worker takes the same path (its events are vLLM's
format, ``router.fleet.events.vllm.sglang``), its entries filed under its own kind's
namespace.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import aiohttp
import zmq.asyncio

from radix.openai.salt import CacheSalts
from router.config import KVEventsConfig
from router.fleet.events.health import StreamHealth
from router.fleet.events.metrics import KVEventMetrics
from router.fleet.events.vllm.follower import Endpoints, VllmEventFollower
from router.fleet.events.vllm.parity import token_parity_problem
from router.fleet.events.vllm.translate import VllmTranslator
from router.fleet.index_modes import route_approximately, route_exactly
from router.fleet.probes import openai_namespace
from router.fleet.registry import WorkerState
from router.models import ModelTokenizer
from router.routing.index import RouterIndex


class VllmAttacher:
    """What every vLLM worker's follower shares: the index, the HTTP session, the
    salts the router issues (mapped back to tenant scopes), the metrics and the ZMQ
    context. ``tenants`` are every tenant id a request can run as; ``config`` bounds
    how long an event connection may stay silent to a ping."""

    def __init__(self, index: RouterIndex, session: aiohttp.ClientSession, secret: bytes,
                 salts: CacheSalts, tenants: Iterable[str], metrics: KVEventMetrics,
                 probe_timeout_s: float, config: KVEventsConfig) -> None:
        self._index = index
        self._session = session
        self._secret = secret
        self._scopes = {salts.salt(tenant): tenant for tenant in tenants}
        self._metrics = metrics
        self._probe_timeout_s = probe_timeout_s
        self._read_timeout_s = config.read_timeout_s
        self._context = zmq.asyncio.Context()

    async def follow(self, worker: WorkerState, model: ModelTokenizer) -> None:
        """Check token parity, then follow the worker's events until cancelled."""
        assert worker.config.kv_events is not None and worker.served_model is not None
        problem = await token_parity_problem(self._session, worker.url, worker.headers,
                                             worker.served_model, model.tokenizer,
                                             self._probe_timeout_s)
        if problem is not None:
            route_approximately(worker, self._index, problem)
            return
        route_exactly(worker, self._index)
        translator = VllmTranslator(worker.worker_id, self._scopes.get,
                                    functools.lru_cache(maxsize=256)(
                                        functools.partial(self._namespace, model,
                                                          worker.kind)))
        endpoints = Endpoints(worker.config.kv_events, worker.config.kv_events_replay,
                              replay_batches=worker.config.kv_events_replay_batches,
                              read_timeout_s=self._read_timeout_s)
        await VllmEventFollower(self._index, translator, endpoints, self._metrics,
                                self._context, StreamHealth(worker, self._index)).run()

    def _namespace(self, model: ModelTokenizer, kind: str, lora_name: str | None) -> str:
        return openai_namespace(model, self._secret, kind, lora_name or "")

    def close(self) -> None:
        """Close the ZMQ context (after every follower task ended)."""
        self._context.destroy(linger=0)
