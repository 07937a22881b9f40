"""What a policy reads: the request (``RouteRequest``) and a snapshot of each routable
worker at decision time (``WorkerView``). Both the policies and the load cost read
them; the pipeline builds them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from router.routing.index import NamespaceDigest, WorkerId


class HasWorkerId(Protocol):
    """Anything naming a worker (a ``WorkerView``, a ``WorkerScore``, the registry's
    ``WorkerState``)."""

    @property
    def worker_id(self) -> str:
        """The router-side worker id."""


@dataclass(frozen=True)
class RouteRequest:
    """What a policy knows of a request: its namespace, prompt key (``radix.keys``
    encoding), number of prompt tokens, and the tenant scope."""

    namespace: NamespaceDigest
    key: bytes
    num_prompt_tokens: int
    scope: str


class WorkerView(NamedTuple):
    """A routable worker at decision time. ``num_in_flight_*`` are this router's own
    counts, updated the moment it decides: requests sent and not finished, and prompt
    tokens still to prefill: the uncached part (prompt - matched at decision) until the
    first token arrives (whole prompts held to the end overstate a hot worker's queue),
    and ``num_in_flight_context_tokens``, the sum over those tokens of the context each
    attends over (``n * (start + end) / 2`` for a request's uncached ``[start, end)``:
    ``router.routing.load_cost.prefill_units``).
    The worker's load fields (running, waiting, waiting tokens, KV usage) are as the
    router knows them (``router.fleet.load_state``: polled; pushed, plus what this
    router sent since the frame; or unknown, seen as a full batch), waiting tokens
    less the whole prompts of this router's requests there before their first token
    (those are counted in flight; never below 0);
    ``num_matched_tokens`` comes from ``RouterIndex.match``, and
    ``num_matched_routed_tokens`` is the part of it only a speculative entry vouches
    for (``RouterIndex.match_routed``: a prefix this router just sent there, still
    being prefilled); ``adapter_load_ms`` is
    how long the request's adapter takes to load there (0: resident, or the base
    model) and ``adapter_swap_share`` the share of a swap it costs (0: nothing is
    evicted; ``WorkerLora.swap_share``); ``num_held_blocks`` and ``max_held_blocks``
    are a prefill worker's polled blocks held for consumers and its cap (0: none). A
    NamedTuple, as is
    ``WorkerScore``: policies build one per worker per request, and a tuple is
    cheaper to build than a frozen dataclass."""

    worker_id: WorkerId
    num_matched_tokens: int = 0
    num_in_flight_requests: int = 0
    num_in_flight_prompt_tokens: int = 0
    num_in_flight_context_tokens: float = 0.0
    num_requests_running: int = 0
    num_requests_waiting: int = 0
    num_waiting_tokens: int = 0
    kv_cache_usage_ratio: float = 0.0
    max_num_requests: int | None = None
    adapter_load_ms: float = 0.0
    adapter_swap_share: float = 0.0
    num_matched_routed_tokens: int = 0
    num_held_blocks: int = 0
    max_held_blocks: int = 0
