"""When a worker has headroom: the bound flow control holds each worker to.

A worker has headroom while its outstanding requests (this router's in flight on
it, or its polled running plus waiting when that is higher: the same count as
``router.routing.load_cost.is_saturated``) stay below ``request_limit``. The limit
is the configured ``max_requests_per_worker``, else the worker's batch slots plus
``queue_per_worker`` (a request beyond its slots only queues there, where nobody
chooses who goes first), else ``fallback_requests_per_worker`` for a worker that
reports no slots (vLLM, OpenAI-compatible servers).
"""

from __future__ import annotations

from collections.abc import Callable

from router.config import FlowConfig
from router.fleet.worker_state import WorkerState
from router.routing.load_cost import is_saturated

RequestLimit = Callable[[WorkerState], "int | None"]


def request_limit(config: FlowConfig) -> RequestLimit:
    """The headroom bound of ``config`` per worker (see the module docstring)."""

    def limit(worker: WorkerState) -> int:
        if config.max_requests_per_worker is not None:
            return config.max_requests_per_worker
        num_slots = worker.load.max_num_running
        if num_slots is None:
            return config.fallback_requests_per_worker
        return num_slots + config.queue_per_worker

    return limit


def no_request_limit(worker: WorkerState) -> int | None:
    """Without flow control no bound but the worker's own (its admission queue)."""
    return None


def has_headroom(worker: WorkerState, limit: RequestLimit) -> bool:
    """Whether ``worker`` may take one more request now under ``limit``."""
    return not is_saturated(worker.view(0, 0, None, 0.0, limit(worker)))
