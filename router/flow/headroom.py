"""When a worker has headroom: the bound flow control holds each worker to.

A worker has headroom while its outstanding requests (this router's in flight on
it, or its polled running plus waiting when that is higher: the same count as
``router.routing.load_cost.is_saturated``) stay below ``request_limit``. The limit
is the configured ``max_requests_per_worker``, else the worker's batch slots plus
``queue_per_worker`` (a request beyond its slots only queues there, where nobody
chooses who goes first), else ``fallback_requests_per_worker`` for a worker that
reports no slots (vLLM, OpenAI-compatible servers). A band's requests may fill only
its ``max_slot_fraction`` of that bound (at least one request): the default batch
band leaves a quarter of each worker free for the bands above it, so an interactive
request finds headroom at once beside a batch flood, and the worker's batches (and
so its steps) stay smaller. A band with ``max_pending_prefill_tokens`` has no room
(limit 0) on a worker while the uncached prompt tokens this router sent it and that
have no first token yet reach that bound: the default batch band keeps at most about
one long prompt's prefill pending per worker, so a worker's chunked-prefill steps
stay short for the interactive requests beside it.
"""

from __future__ import annotations

from collections.abc import Callable

from router.config import FlowConfig
from router.fleet.worker_state import WorkerState
from router.routing.load_cost import is_saturated

RequestLimit = Callable[[WorkerState, int], "int | None"]


def request_limit(config: FlowConfig) -> RequestLimit:
    """The headroom bound of ``config`` per worker and band (see the module docstring)."""
    fractions = [band.max_slot_fraction for band in config.bands]
    prefill_bounds = [band.max_pending_prefill_tokens for band in config.bands]

    def limit(worker: WorkerState, band: int) -> int:
        prefill_bound = prefill_bounds[band]
        if prefill_bound is not None and worker.num_in_flight_prompt_tokens >= prefill_bound:
            return 0
        if config.max_requests_per_worker is not None:
            bound = config.max_requests_per_worker
        elif worker.load.max_num_running is None:
            bound = config.fallback_requests_per_worker
        else:
            bound = worker.load.max_num_running + config.queue_per_worker
        return max(1, int(bound * fractions[band]))

    return limit


def no_request_limit(worker: WorkerState, band: int) -> int | None:
    """Without flow control no bound but the worker's own (its admission queue)."""
    return None


def has_headroom(worker: WorkerState, limit: RequestLimit, band: int) -> bool:
    """Whether ``worker`` may take one more request of ``band`` now under ``limit``."""
    return not is_saturated(worker.view(0, 0, None, 0.0, limit(worker, band)))
