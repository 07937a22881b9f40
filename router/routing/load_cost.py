"""How loaded a worker is, and how to spread requests by hash without overloading one.

Costs are in prefill-token equivalents: 1.0 is the time a worker takes to prefill one
token with no context before it. A token at position ``p`` attends over ``p`` tokens
and costs ``1 + prefill_context_cost * p`` (``prefill_units``). A request's cost on a
worker (``router.routing.policy``) is the prefill of its uncached tokens plus
``load_cost``: the prompt tokens queued ahead of it (this router's weighted by their
positions too), the running requests it will share steps with, and the pressure on
the worker's KV cache.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TypeVar

import xxhash

from radix.keys import TOKEN_BYTES
from router.routing.views import HasWorkerId, WorkerView


@dataclass(frozen=True)
class PolicyWeights:
    """Weights and parameters of the routing policies (``[policy.weights]`` in TOML).

    - ``prefill_cost_per_token``: cost of one uncached prompt token of this request.
    - ``prefill_context_cost``: what one token of context adds to a prompt token's
      prefill, as a share of a token without context: a token at position ``p`` costs
      ``1 + prefill_context_cost * p`` (attention reads every token before it). The
      default, 3.4e-5, is the timed llama3-8b-h100 profile's ``c / b``, which is also
      an 8B model's attention FLOPs per context token against its weights' FLOPs per
      token: a token 30k deep costs twice a shallow one. 0: every token alike.
    - ``queued_token_cost``: cost per prompt token queued ahead of it on the worker
      (the worker's ``num_waiting_tokens`` not sent by this router + this router's
      in-flight prompt tokens).
    - ``running_request_cost``: cost per request running on the worker (its decode
      steps share the batch with this request's prefill and decode).
    - ``kv_usage_cost``: cost of a full KV cache (scaled by ``kv_cache_usage_ratio``):
      inserting there evicts cached prefixes and risks preemption.
    - ``load_cap_factor``: bounded-load hashing skips a worker with at least
      ``ceil(factor * (active requests of all workers + 1) / number of workers)``
      active requests.
    - ``hash_prefix_tokens``: how many leading prompt tokens consistent hashing reads.
    - ``owner_load_cap_factor``: owner stickiness: a request whose longest match
      covers at least ``owner_min_share`` of its prompt stays on the workers holding
      that match (its owners) while one of them is under the bounded-load cap of this
      factor (0: no such cap) and under ``owner_wait_share``; with every owner over
      either the cost decides, which may copy the prefix to another worker
      (replication). Both 0 turns stickiness off.
    - ``owner_wait_share``: an owner keeps a sticky request only while the prefill
      queued on it (``num_queued_prefill_tokens``) exceeds the least-queued worker's
      by at most this share of the tokens it would save (its match); 0: no such bound.
    - ``owner_min_share``: the share of the prompt a match must cover for stickiness.
    - ``adapter_load_cost_per_ms``: cost of one millisecond a request waits for its
      LoRA adapter to be loaded on a worker that does not hold it (prefill tokens per
      millisecond of the worker); 0 makes routing adapter-blind.
    - ``default_adapter_load_ms``: the load time assumed for a worker that has not
      measured one yet (``router.routing.adapters``).
    - ``adapter_swap_cost``: cost of a load that evicts another adapter (the worker's
      slots are full) on a worker with at least as many active requests as slots:
      those pin their adapters' slots, so the load may wait for one to free, and the
      evicted adapter's next request there pays a load again; scaled down on a less
      busy worker (``router.routing.adapters``); 0 with ``adapter_load_cost_per_ms`` 0
      makes routing adapter-blind.
    """

    prefill_cost_per_token: float = 1.0
    prefill_context_cost: float = 3.4e-5
    queued_token_cost: float = 1.0
    running_request_cost: float = 48.0
    kv_usage_cost: float = 256.0
    load_cap_factor: float = 1.25
    hash_prefix_tokens: int = 64
    owner_load_cap_factor: float = 1.5
    owner_wait_share: float = 2.0
    owner_min_share: float = 0.5
    adapter_load_cost_per_ms: float = 32.0
    default_adapter_load_ms: float = 25.0
    adapter_swap_cost: float = 1024.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"policy.weights.{f.name}: must be a non-negative number, got {value!r}")
        if self.load_cap_factor < 1.0:
            raise ValueError(f"policy.weights.load_cap_factor: must be >= 1, got {self.load_cap_factor}")
        if self.owner_load_cap_factor and self.owner_load_cap_factor < 1.0:
            raise ValueError("policy.weights.owner_load_cap_factor: must be 0 (off) or >= 1, "
                             f"got {self.owner_load_cap_factor}")
        if not isinstance(self.hash_prefix_tokens, int) or self.hash_prefix_tokens < 1:
            raise ValueError("policy.weights.hash_prefix_tokens: must be a positive integer, "
                             f"got {self.hash_prefix_tokens!r}")

    @classmethod
    def from_mapping(cls, weights: Mapping[str, float]) -> PolicyWeights:
        """Defaults overridden by ``weights``; ValueError naming an unknown or bad weight."""
        known = {f.name for f in fields(cls)}
        for name in weights:
            if name not in known:
                raise ValueError(f"policy.weights.{name}: unknown weight; known: {', '.join(sorted(known))}")
        values = dict(weights)
        prefix = values.get("hash_prefix_tokens")
        if isinstance(prefix, float) and prefix.is_integer():
            values["hash_prefix_tokens"] = int(prefix)
        return cls(**values)  # type: ignore[arg-type]


def prefill_units(start: int, end: int, context_cost: float) -> float:
    """Prefill-token equivalents of the prompt's tokens ``[start, end)`` (module
    docstring): each costs ``1 + context_cost * position``; 0 when ``end <= start``."""
    if end <= start:
        return 0.0
    return (end - start) * (1.0 + context_cost * 0.5 * (start + end))


def num_active_requests(view: WorkerView) -> int:
    """Requests on the worker: the polled running count, or this router's in-flight
    count when that is higher (the poll is up to a second old). Queued requests weigh
    in through their prompt tokens (``queued_token_cost``)."""
    running, in_flight = view.num_requests_running, view.num_in_flight_requests
    return running if running > in_flight else in_flight


def num_queued_prefill_tokens(view: WorkerView) -> int:
    """Prompt tokens this router sent the worker that still wait for prefill ahead of
    this request: each request's uncached part (prompt minus its match at decision)
    until its first token, less ``num_shared_prefill_tokens``. Requests past their
    first token (decoding) are not counted: they share steps with a new prefill but do
    not delay it by their prompts. The polled ``num_waiting_tokens`` is not used here:
    an engine matches a prefix only at admission, so it counts waiting prompts whole,
    cached prefix included, and a sticky owner's queue of cached turns would look like
    recomputation."""
    return view.num_in_flight_prompt_tokens - num_shared_prefill_tokens(view)


def num_shared_prefill_tokens(view: WorkerView) -> int:
    """Tokens of the worker's in-flight prefill that compute this request's own
    prefix: the part of its match that is routed but not yet stored, up to what is in
    flight. They are no queue in front of the request: it waits for the rest of that
    prefill, which it would otherwise compute in full somewhere else, then computes
    only its suffix (its match already counts them as cached)."""
    routed, in_flight = view.num_matched_routed_tokens, view.num_in_flight_prompt_tokens
    return routed if routed < in_flight else in_flight


def is_saturated(view: WorkerView) -> bool:
    """The worker's queue is at its bound: it admits ``max_num_requests`` running plus
    queued requests and has that many (polled, or this router's in-flight count when
    higher), so it would answer 429 and the router sends it nothing more."""
    if view.max_num_requests is None:
        return False
    num_requests = max(view.num_requests_running + view.num_requests_waiting,
                       view.num_in_flight_requests)
    return num_requests >= view.max_num_requests


def is_held_up(view: WorkerView) -> bool:
    """A prefill worker at its cap on blocks held for consumers (polled): it would
    refuse a prefill leg (429), so the router runs none there until its holds end."""
    return 0 < view.max_held_blocks <= view.num_held_blocks


def load_cost(view: WorkerView, weights: PolicyWeights) -> float:
    """Cost of the load already on a worker, in prefill-token equivalents."""
    return load_costs((view,), weights)[0]


def load_costs(views: Sequence[WorkerView], weights: PolicyWeights) -> list[float]:
    """``load_cost`` of each of ``views``, in order: queued prompt tokens (reported,
    less this router's, plus this router's in flight weighted by their positions, less
    the prefill of the request's own prefix: ``num_shared_prefill_tokens`` at the end
    of its match), active requests (``num_active_requests``) and KV usage, weighted.
    One pass with the weights read once: the policies call it for every worker per
    request."""
    queued, running, kv = weights.queued_token_cost, weights.running_request_cost, weights.kv_usage_cost
    context = weights.prefill_context_cost
    return [
        queued * (v.num_waiting_tokens + v.num_in_flight_prompt_tokens
                  + context * v.num_in_flight_context_tokens - _shared_units(v, context))
        + running * (v.num_requests_running if v.num_requests_running > v.num_in_flight_requests
                     else v.num_in_flight_requests)
        + kv * v.kv_cache_usage_ratio
        for v in views
    ]


def _shared_units(view: WorkerView, context_cost: float) -> float:
    """``num_shared_prefill_tokens`` in prefill units: the last of the match's tokens."""
    shared = num_shared_prefill_tokens(view)
    if not shared:
        return 0.0
    matched = view.num_matched_tokens
    return prefill_units(matched - shared, matched, context_cost)


Named = TypeVar("Named", bound=HasWorkerId)


def rendezvous_order(key: bytes, workers: Sequence[Named], num_prefix_tokens: int) -> list[Named]:
    """Workers in highest-random-weight order for the first ``num_prefix_tokens`` of
    ``key`` (xxh3). Deterministic across routers; removing a worker moves only the
    prefixes that were on it. Any subset of ``workers`` comes out in the same relative
    order (each worker's weight depends on the key and its id alone)."""
    seed = xxhash.xxh3_64_intdigest(key[: num_prefix_tokens * TOKEN_BYTES])
    return sorted(workers, key=lambda v: xxhash.xxh3_64_intdigest(v.worker_id.encode(), seed=seed),
                  reverse=True)


def bounded_load_cap(workers: Sequence[WorkerView], load_cap_factor: float) -> int:
    """Active requests at which a worker counts as full: ``ceil(factor * (active
    requests of all workers + 1) / number of workers)``; some worker is always under it."""
    total = sum(map(num_active_requests, workers))
    return math.ceil(load_cap_factor * (total + 1) / len(workers))


def bounded_load_pick(order: Sequence[WorkerView], load_cap_factor: float) -> WorkerView:
    """The first worker in ``order`` below the bounded-load cap (consistent hashing with
    bounded loads); the cap always leaves at least one worker eligible."""
    cap = bounded_load_cap(order, load_cap_factor)
    return next(v for v in order if num_active_requests(v) < cap)
