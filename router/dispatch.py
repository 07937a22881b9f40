"""The OpenAI routes: authenticate -> tokenize -> match -> choose -> forward -> learn.

``serve_openai`` is the whole request in one loop of those six steps; each step is a
small function below it. Every refusal is an ``ApiError`` (OpenAI-shaped 4xx/5xx).
The tenant's concurrency slot is taken before its body is read, and the body is read
only up to the largest a prompt within the tenant's limits can need (413 past it,
before it is buffered or decoded); what can be refused without the token count is
refused before tokenizing: the text size, the output cap and a full tokens-per-minute
window.

A request for a LoRA adapter (``"model": ADAPTER``) goes only to workers that
registered it, is matched in the adapter's namespace, pays the adapter's load on a
worker predicted not to hold it (``router.routing.adapters``), and makes the adapter
resident on the chosen worker at the moment of decision.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from operator import attrgetter
from typing import NamedTuple

from radix.api_errors import ApiError
from radix.keys import TOKEN_BYTES
from radix.openai.requests import CHAT, COMPLETIONS, INLINE_TOKENIZE_CHARS, OpenAIRequest
from router.client import Client
from router.context import Router
from router.fleet.registry import WorkerState
from router.forward.attempt import RETRY_AFTER_S, UpstreamUnavailable
from router.forward.pool import UpstreamError
from router.forward.proxy import Call
from router.forward.relay import CLIENT_CLOSED, Exchange
from router.front.auth import Tenant
from router.front.requests import check_text_size, parse_request
from router.front.tokenization import ModelTokenizer, Prompt
from router.routing.load_cost import is_saturated
from router.routing.views import RouteRequest, WorkerView

NO_WORKER = "none"
INLINE_DECODE_BYTES = 256 * 1024  # about 1 ms of decoding; larger bodies go to a thread
# One thread decodes the large bodies, one at a time: a decoded body can take several
# times its bytes (a list of token ids about 7x), so however many arrive at once, only
# one is ever expanded.
_LARGE_BODIES = ThreadPoolExecutor(1, thread_name_prefix="large-body")
access_log = logging.getLogger("router.access")
log = logging.getLogger(__name__)


ENDPOINTS = {"/v1/completions": COMPLETIONS, "/v1/chat/completions": CHAT}


async def serve_openai(router: Router, client: Client, endpoint: str) -> None:
    """Serve one OpenAI request (``endpoint``: ``ENDPOINTS``' values) to ``client``;
    counts every outcome in ``router_requests_total``, and every refusal in
    ``router_refused_requests_total``."""
    started = time.monotonic()
    tenant_id, worker_id, code = "unknown", NO_WORKER, 500
    exchange, route = Exchange(503), None
    try:
        tenant = router.auth.tenant(client.header("Authorization"))
        tenant_id = tenant.tenant_id
        admission = await router.limiter.hold(tenant)
        try:
            body = await client.read_body(router.config.listen.body_timeout_s,
                                          router.models.max_body_bytes(tenant.limits))
            model, adapter, parsed = await decode(router, body, endpoint, tenant)
            del body
            check_text_size(model, parsed, tenant.limits)
            max_tokens = router.limiter.output_cap(tenant, parsed.sampling.max_tokens,
                                                   parsed.sampling.max_tokens_param)
            prompt = await tokenize(model, parsed, tenant_id)
            router.limiter.check_prompt(tenant, len(prompt.token_ids))
            admission = await router.limiter.reserve(admission, len(prompt.token_ids),
                                                     (max_tokens or 0) * parsed.sampling.n)
            call = Call(parsed, adapter or model.name, prompt, tenant.tenant_id, max_tokens,
                        router.cache_salts.salt(tenant.tenant_id),
                        tenant.limits.max_cached_tokens, client.request_id, adapter)
            decision_started = time.monotonic()
            workers = router.registry.routable(model.name)
            if adapter is not None:
                workers = [w for w in workers if adapter in w.lora.adapters]
            route = router.canary.route(model.name, workers, tenant_id, prompt.key)
            if route is not None:
                workers = route.workers
            matches = match(router, workers, prompt, tenant, adapter)
            matched = matches.tokens
            fallback = route.fallback if route is not None else []
            split = split_roles(workers)
            if split is None:
                ranked = choose(router, workers, matches, prompt, tenant, fallback, adapter)
            else:
                ranked = choose(router, split[0], matches, prompt, tenant, fallback, adapter)
            router.metrics.decision_seconds.observe(time.monotonic() - decision_started)
            if split is not None:
                call = await disaggregate(router, call, ranked[0], split[1], matches, prompt,
                                          tenant)
                if call.kv_transfer_params is not None:  # a failed pull decodes whole there
                    ranked = [ranked[0], *ranked]
            worker = await forward(router, client, call, ranked, matched, exchange)
            worker_id = worker.worker_id
            learn(router, client, worker, prompt, matched, exchange, started)
        finally:
            await router.limiter.release(admission, exchange.num_completion_tokens)
        code = exchange.status
    except ApiError as exc:
        code = exc.status
        router.metrics.count_refusal(exc)
        raise
    except asyncio.CancelledError:
        code = CLIENT_CLOSED
        raise
    finally:
        router.metrics.count_request(worker_id, tenant_id, code)
        if route is not None:
            first_byte_at = exchange.first_byte_at
            route.window.record(time.monotonic(), code >= 500,
                                None if first_byte_at is None else first_byte_at - started)


async def decode(router: Router, body: bytes, endpoint: str, tenant: Tenant
                 ) -> tuple[ModelTokenizer, str | None, OpenAIRequest]:
    """``parse_request`` of ``body``; past ``INLINE_DECODE_BYTES`` on the one thread
    that decodes large bodies, in turn, so a large body (its JSON decoding and checks
    take milliseconds) does not hold the event loop that every other request shares,
    and many at once cannot multiply the memory a decoded body takes."""
    args = (body, endpoint, router.models, tenant.limits, router.registry.adapters())
    if len(body) <= INLINE_DECODE_BYTES:
        return parse_request(*args)
    return await asyncio.get_running_loop().run_in_executor(_LARGE_BODIES, parse_request,
                                                            *args)


async def tokenize(model: ModelTokenizer, parsed: OpenAIRequest, tenant_id: str) -> Prompt:
    """The router's own token ids for the prompt (chat rendered with the template),
    reusing the ids of text the tenant (or a public prefix) already sent. Long texts
    are tokenized on a worker thread (Hugging Face ``tokenizers`` release the GIL), so
    one request never holds the event loop for long."""
    if parsed.tokenize_cost() <= INLINE_TOKENIZE_CHARS:
        return model.prompt(parsed, tenant_id)
    return await asyncio.get_running_loop().run_in_executor(None, model.prompt, parsed,
                                                            tenant_id)


class Matches(NamedTuple):
    """What ``match`` found: tokens of the prompt each worker holds, and of those the
    ones only routed there, not yet reported stored (``RouterIndex.match_routed``)."""

    tokens: dict[str, int]
    routed: dict[str, int]


def match(router: Router, workers: list[WorkerState], prompt: Prompt,
          tenant: Tenant, adapter: str | None = None) -> Matches:
    """Tokens of the prompt each worker holds in the namespace of ``adapter`` (the base
    model's for None), by one walk per namespace in use; for an engine that reuses
    whole blocks only (vLLM: ``cache_block_size``), what it will reuse: whole blocks,
    and never the prompt's last token (it computes that one)."""
    matched: dict[str, int] = {}
    routed: dict[str, int] = {}
    by_namespace: dict[str, list[str]] = {}
    for w in workers:
        namespace = w.lora.namespace(adapter, w.namespace)
        if namespace is not None:
            by_namespace.setdefault(namespace, []).append(w.worker_id)
    for namespace, worker_ids in by_namespace.items():
        found, found_routed = router.index.match_routed(namespace, prompt.key, tenant.tenant_id)
        matched.update((i, found[i]) for i in worker_ids if i in found)
        routed.update((i, found_routed[i]) for i in worker_ids if i in found_routed)
    for worker in workers:
        block_size = worker.cache_block_size
        worker_id = worker.worker_id
        if block_size is not None and worker_id in matched:
            reusable = (len(prompt.token_ids) - 1) // block_size * block_size
            num_tokens = matched[worker_id]
            matched[worker_id] = min(num_tokens // block_size * block_size, reusable)
            if worker_id in routed:  # the routed part is the match's end: what of it is left
                num_stored = num_tokens - routed[worker_id]
                routed[worker_id] = max(matched[worker_id] - num_stored, 0)
    return Matches(matched, routed)


def choose(router: Router, workers: list[WorkerState], matches: Matches,
           prompt: Prompt, tenant: Tenant, fallback: list[WorkerState],
           adapter: str | None = None) -> list[WorkerState]:
    """The workers to try, best first, at most ``proxy.max_attempts`` of them, weighing
    the load of ``adapter`` where it is not resident. Workers whose queue is at its
    bound are left out; when that is every worker the request is
    refused at once (503 ``saturated`` with Retry-After) instead of queueing. A canary
    pool's request (``fallback``: the baseline's workers) keeps its last attempt for
    the least busy baseline worker, and goes to the baseline (ranked by the baseline's
    own matches) when its pool is saturated: a pool never fails a request the
    baseline could serve."""
    if not workers:
        raise ApiError(503, "no ready worker serves this model", code="no_worker",
                       headers={"Retry-After": RETRY_AFTER_S})
    default_load_ms = router.policy.weights.default_adapter_load_ms
    views = [
        WorkerView(
            worker_id=w.worker_id,
            num_in_flight_requests=w.num_in_flight_requests,
            num_in_flight_prompt_tokens=w.num_in_flight_prompt_tokens,
            num_requests_running=w.load.num_requests_running,
            num_requests_waiting=w.load.num_requests_waiting,
            num_waiting_tokens=w.load.num_waiting_tokens,
            kv_cache_usage_ratio=w.load.kv_cache_usage_ratio,
            max_num_requests=w.load.max_num_requests,
            num_matched_tokens=matches.tokens.get(w.worker_id, 0),
            num_matched_routed_tokens=matches.routed.get(w.worker_id, 0),
            adapter_load_ms=(0.0 if adapter is None
                             else w.lora.load_ms(adapter, default_load_ms)),
            adapter_swap_share=(0.0 if adapter is None else w.lora.swap_share(
                adapter, max(w.load.num_requests_running, w.num_in_flight_requests))),
        )
        for w in workers
    ]
    views = [v for v in views if not is_saturated(v)]
    if not views and fallback:
        return choose(router, fallback, match(router, fallback, prompt, tenant, adapter),
                      prompt, tenant, [], adapter)
    if not views:
        raise ApiError(503, "every worker is saturated; retry later", code="saturated",
                       headers={"Retry-After": RETRY_AFTER_S})
    decision = router.policy.choose(
        RouteRequest(namespace=workers[0].namespace, key=prompt.key,
                     num_prompt_tokens=len(prompt.token_ids), scope=tenant.tenant_id), views)
    by_id = {w.worker_id: w for w in workers}
    num_attempts = router.config.proxy.max_attempts
    if fallback and num_attempts > 1:
        spare = min(fallback, key=attrgetter("num_in_flight_requests"))
        return [by_id[i] for i in decision.ranked[: num_attempts - 1]] + [spare]
    return [by_id[i] for i in decision.ranked[:num_attempts]]


def split_roles(workers: list[WorkerState]) -> tuple[list[WorkerState], list[WorkerState]] | None:
    """(the workers that take whole requests and decode legs, those that prefill for
    others) when some worker has a prefill or decode role; None otherwise."""
    if all(w.role == "both" for w in workers):
        return None
    return ([w for w in workers if w.role != "prefill"],
            [w for w in workers if w.role != "decode"])


async def disaggregate(router: Router, call: Call, decode: WorkerState,
                       prefillers: list[WorkerState], matches: Matches, prompt: Prompt,
                       tenant: Tenant) -> Call:
    """``call`` for its decode worker ``decode`` (chosen first, by match and load): as
    it is when ``decode`` would compute fewer than ``pd.min_uncached_tokens`` of the
    prompt itself (or the request cannot be split: ``n`` > 1, an adapter, a worker
    that is not ``radix``), else with the ``kv_transfer_params`` of a prefill leg run
    on the best prefill worker (docs/pd.md). A failed prefill leg leaves ``call``
    whole: the decode worker computes the prompt, counted as a fallback."""
    counts = router.metrics.pd_requests
    num_uncached = len(prompt.token_ids) - matches.tokens.get(decode.worker_id, 0)
    candidates = [w for w in prefillers if w is not decode and w.kind == "radix"]
    if (num_uncached < router.config.pd.min_uncached_tokens or not candidates
            or decode.kind != "radix" or call.adapter is not None
            or call.request.sampling.n != 1):
        counts["aggregated"].inc()
        return call
    prefill = choose(router, candidates, matches, prompt, tenant, [])[0]
    num_tokens = max(len(prompt.token_ids) - matches.tokens.get(prefill.worker_id, 0), 0)
    in_flight = router.registry.begin(prefill, num_tokens)
    router.index.note_routed(prefill.namespace, prefill.worker_id, prompt.key, call.scope)
    try:
        params = await router.proxy.prefill(call, prefill)
    except (UpstreamUnavailable, UpstreamError, ApiError) as exc:
        log.warning("request %s: prefill leg on %s failed (%s): decoding whole on %s",
                    call.request_id, prefill.worker_id, exc, decode.worker_id)
        if isinstance(exc, UpstreamUnavailable) and exc.worker_down:
            await router.registry.mark_failed(prefill, str(exc))
        counts["fallback"].inc()
        return call
    finally:
        in_flight.end()
    counts["disaggregated"].inc()
    return replace(call, kv_transfer_params=params)


async def forward(router: Router, client: Client, call: Call, ranked: list[WorkerState],
                  matched: dict[str, int], exchange: Exchange) -> WorkerState:
    """Try the ranked workers in turn until the client is answered, filling in
    ``exchange`` (even when the client goes away mid-stream). A worker that fails
    before the client's first byte is replaced by the next; one that fails after it
    is replaced by the next ``radix`` worker, which resumes from the delivered tokens
    (``router.forward.relay``); with none left, a started stream ends with an error event.
    Each attempt is counted in flight and noted in the index (speculative entry) at
    decision time. In flight counts the tokens the worker must prefill (prompt minus
    its match) until the first token comes back: a request that hits the cache adds
    little queued work, so locality is not punished, and a request that is decoding
    no longer counts as prefill waiting."""
    relay = router.proxy.relay(client, call)
    failure: UpstreamUnavailable | None = None
    for worker in ranked:
        if not relay.prepare_attempt(worker.kind):
            continue
        if failure is not None:
            router.metrics.retries.inc()
        key, _ = relay.progress.resumed_prompt(call.prompt.key)
        num_tokens = max(len(key) // TOKEN_BYTES - matched.get(worker.worker_id, 0), 0)
        in_flight = router.registry.begin(worker, num_tokens)
        relay.on_first_token = in_flight.prefilled
        if call.adapter is None:
            router.index.note_routed(worker.namespace, worker.worker_id, key, call.scope)
            router.siblings.routed(worker, key, call.scope)
        else:
            worker.lora.residency.route(call.adapter, time.monotonic())
            router.index.note_routed(worker.lora.namespace(call.adapter, worker.namespace),
                                     worker.worker_id, key, call.scope)
        try:
            await router.proxy.send(client, call, relay, worker, exchange)
            return worker
        except UpstreamUnavailable as exc:
            failure = exc
            call = replace(call, kv_transfer_params=None)  # the blocks were for that worker
            if exc.worker_down:
                await router.registry.mark_failed(worker, str(exc))
        finally:
            in_flight.end()
        if relay.can_finish:
            await relay.finish(exchange)
            return worker
    if relay.started:
        await relay.fail(exchange)
        return worker
    assert failure is not None
    raise failure.error


def learn(router: Router, client: Client, worker: WorkerState, prompt: Prompt,
          matched: dict[str, int], exchange: Exchange, started: float) -> None:
    """Record what the request taught: the index's prediction for the chosen worker
    against what it reported as cached (also one access-log line at INFO), and the
    latencies."""
    num_matched = matched.get(worker.worker_id, 0)
    router.metrics.count_tokens(worker.worker_id, len(prompt.token_ids), num_matched)
    worker.stats.record(len(prompt.token_ids), num_matched, exchange.num_cached_tokens)
    if access_log.isEnabledFor(logging.INFO):
        access_log.info("request %s worker=%s status=%d prompt_tokens=%d predicted_cached=%d "
                        "cached=%s", client.request_id, worker.worker_id, exchange.status,
                        len(prompt.token_ids), num_matched, exchange.num_cached_tokens)
    now = time.monotonic()
    router.metrics.request_seconds.observe(now - started)
    if exchange.first_byte_at is not None:
        router.metrics.ttft_seconds.observe(exchange.first_byte_at - started)
