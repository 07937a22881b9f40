"""The OpenAI routes, one request as a sequence of steps:
authenticate -> limit -> decode -> tokenize -> queue -> decide -> forward -> learn.

``serve_openai`` runs the sequence; each step is one call. *Authenticate* finds the
tenant from its key; *limit* takes the tenant's concurrency slot before its body is
read, reads the body only up to the largest a prompt within the tenant's limits can
need (413 past it, before it is buffered or decoded), and refuses what can be
refused without the token count before tokenizing (the text size, the output cap, a
full tokens-per-minute window); *decode* parses the body (``decode``); *tokenize*
gives the router's own token ids (``tokenize``), after which the prompt's tokens are
reserved (its agent session, ``x-session-id``, read with it:
``router.routing.sessions``); *queue* finds who may serve it (``Decider.candidates``) and, with flow
control on, waits in the router until one of them has headroom and fairness lets the
request go (``router.flow``); *decide* is ``router.decision``'s (which worker, and the
prefill leg in a prefill/decode fleet); *forward* tries the decided workers
in turn (``forward``); *learn* records what the answer taught (``learn``). Every
refusal is an ``ApiError`` (OpenAI-shaped 4xx/5xx).

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

from radix.api_errors import ApiError
from radix.keys import TOKEN_BYTES
from radix.openai.requests import CHAT, COMPLETIONS, INLINE_TOKENIZE_CHARS, OpenAIRequest
from router.client import Client
from router.context import Router
from router.decision import Candidates, Decision
from router.fleet.cache_prediction import prediction_outcome, reusable_tokens
from router.fleet.registry import WorkerState
from router.forward.attempt import UpstreamUnavailable
from router.forward.proxy import Call
from router.forward.relay import CLIENT_CLOSED, Exchange
from router.front.auth import Tenant
from router.front.limits import Admission
from router.front.requests import check_text_size, parse_request
from router.models import ModelTokenizer, Prompt
from router.routing.sessions import read_session

NO_WORKER = "none"
MAX_FAIRNESS_KEY_CHARS = 128
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
    exchange, candidates = Exchange(503), None
    try:
        tenant = router.auth.tenant(client.header("Authorization"))
        tenant_id = tenant.tenant_id
        admission = await router.limiter.hold(tenant)
        try:
            model, call, admission = await admit(router, client, endpoint, tenant, admission)
            candidates = router.decider.candidates(model, call)
            turn = await router.flow.turn(candidates, call, tenant, fairness_key(router, client))
            try:
                decision = await router.decider.decide(candidates, call, turn.ranking)
            finally:
                turn.release()
            worker = await forward(router, client, call, decision, exchange)
            worker_id = worker.worker_id
            router.decider.note_session(call, worker)
            learn(router, client, worker, call.prompt, decision, exchange, started)
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
        router.flow.wake()
        router.metrics.count_request(worker_id, tenant_id, code)
        if candidates is not None and candidates.window is not None:
            record_canary(candidates, exchange, code, started)


async def admit(router: Router, client: Client, endpoint: str, tenant: Tenant,
                admission: Admission) -> tuple[str, Call, Admission]:
    """(the base model's name, the call, the admission with the prompt's tokens
    reserved) for the request ``tenant`` holds ``admission`` for: the *limit*,
    *decode* and *tokenize* steps. The request's ``priority`` becomes its band's index
    (``FlowConfig.effective_band``): never above its tenant's band. ``ApiError`` on a
    refusal (the caller still releases ``admission``)."""
    body = await client.read_body(router.config.listen.body_timeout_s,
                                  router.models.max_body_bytes(tenant.limits))
    model, adapter, parsed = await decode(router, body, endpoint, tenant)
    del body
    band = router.config.flow.effective_band(tenant.band, parsed.priority)
    if band != parsed.priority:
        parsed = replace(parsed, priority=band)
    check_text_size(model, parsed, tenant.limits)
    max_tokens = router.limiter.output_cap(tenant, parsed.sampling.max_tokens,
                                           parsed.sampling.max_tokens_param)
    prompt = await tokenize(model, parsed, tenant.tenant_id)
    router.limiter.check_prompt(tenant, len(prompt.token_ids))
    admission = await router.limiter.reserve(admission, len(prompt.token_ids),
                                             (max_tokens or 0) * parsed.sampling.n)
    sessions = router.config.sessions
    session = read_session(client.header, sessions.max_retention_s) if sessions.enabled else None
    call = Call(parsed, adapter or model.name, prompt, tenant.tenant_id, max_tokens,
                router.cache_salts.salt(tenant.tenant_id), tenant.limits.max_cached_tokens,
                client.request_id, adapter, session_id=session and session.session_id,
                retention_s=session and session.retention_s)
    return model.name, call, admission


def fairness_key(router: Router, client: Client) -> str | None:
    """The value of the configured fairness header (splitting a tenant's share by
    session or agent), at most ``MAX_FAIRNESS_KEY_CHARS``; None without one."""
    header = router.config.flow.fairness_header
    if header is None:
        return None
    value = client.header(header)
    return None if not value else value[:MAX_FAIRNESS_KEY_CHARS]


def record_canary(candidates: Candidates, exchange: Exchange, code: int,
                  started: float) -> None:
    """Record the request's outcome in its canary pool's guard window: an error when
    ``code`` is 5xx, and its time to first byte when it got one."""
    assert candidates.window is not None
    first_byte_at = exchange.first_byte_at
    candidates.window.record(time.monotonic(), code >= 500,
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


async def forward(router: Router, client: Client, call: Call, decision: Decision,
                  exchange: Exchange) -> WorkerState:
    """Try the decision's attempts in turn until the client is answered, filling in
    ``exchange`` (even when the client goes away mid-stream). A worker that fails
    before the client's first byte is replaced by the next; one that fails after it
    is replaced by the next worker that resumes, going on from the delivered tokens
    (``router.forward.relay``); with none left, a started stream ends with an error
    event. Each attempt is committed (``Decider.commit``) the moment it is sent. In
    flight counts the tokens the worker must prefill (prompt minus its match) until
    the first token comes back: a request that hits the cache adds little queued
    work, so locality is not punished, and a request that is decoding no longer
    counts as prefill waiting. The attempt given the prefill leg's params owns their
    hold until it is answered: failed or cancelled, it releases the hold on the prefill
    worker at once (``Proxy.release_hold``)."""
    relay = router.proxy.relay(client, call)
    failure: UpstreamUnavailable | None = None
    matched = decision.matches.tokens
    for worker, params in decision.attempts():
        if not relay.prepare_attempt(worker.capabilities.resumable):
            continue
        if failure is not None:
            router.metrics.retries.inc()
        key, _ = relay.progress.resumed_prompt(call.prompt.key)
        num_tokens = max(len(key) // TOKEN_BYTES - matched.get(worker.worker_id, 0), 0)
        in_flight = router.decider.commit(worker, key, call.scope, call.adapter, num_tokens)
        relay.on_first_token = in_flight.prefilled
        attempt = call if params is None else replace(call, kv_transfer_params=params)
        answered = False
        try:
            await router.proxy.send(client, attempt, relay, worker, exchange)
            answered = True
            return worker
        except UpstreamUnavailable as exc:
            failure = exc
            if exc.worker_down:
                await router.registry.mark_failed(worker, str(exc))
        finally:
            in_flight.end()
            if params is not None and not answered:
                router.proxy.release_hold(decision.prefill, params)
        if relay.can_finish:
            await relay.finish(exchange)
            return worker
    if relay.started:
        await relay.fail(exchange)
        return worker
    assert failure is not None
    raise failure.error


def learn(router: Router, client: Client, worker: WorkerState, prompt: Prompt,
          decision: Decision, exchange: Exchange, started: float) -> None:
    """Record what the request taught: the index's prediction for the chosen worker
    against what it reported as cached, totalled and checked (``check_prediction``;
    also one access-log line at INFO), and the latencies."""
    num_prompt_tokens = len(prompt.token_ids)
    num_matched = decision.matches.tokens.get(worker.worker_id, 0)
    router.metrics.count_tokens(worker.worker_id, num_prompt_tokens, num_matched)
    worker.stats.record(num_prompt_tokens, num_matched, exchange.num_cached_tokens)
    outcome = check_prediction(router, worker, num_prompt_tokens, num_matched,
                               decision.matches.num_in_flight_tokens(worker.worker_id),
                               exchange.num_cached_tokens)
    if access_log.isEnabledFor(logging.INFO):
        access_log.info("request %s worker=%s status=%d prompt_tokens=%d predicted_cached=%d "
                        "cached=%s outcome=%s", client.request_id, worker.worker_id,
                        exchange.status, num_prompt_tokens, num_matched,
                        exchange.num_cached_tokens, outcome or "unchecked")
    now = time.monotonic()
    router.metrics.request_seconds.observe(now - started)
    if exchange.first_byte_at is not None:
        router.metrics.ttft_seconds.observe(exchange.first_byte_at - started)


def check_prediction(router: Router, worker: WorkerState, num_prompt_tokens: int,
                     num_matched_tokens: int, num_in_flight_tokens: int,
                     num_cached_tokens: int | None) -> str | None:
    """The outcome of the index's prediction (``num_matched_tokens`` of the prompt on
    ``worker``, ``num_in_flight_tokens`` of them vouched for only by requests in
    flight) against the ``num_cached_tokens`` the worker reported, all as it reuses
    them (``router.fleet.cache_prediction``: whole blocks of its ``cache_block_size``,
    else of its model's ``block_size``, which our workers' probe checks); counted in
    its stats and in ``router_cache_predictions_total`` and
    ``router_cache_prediction_tokens_total``. None, counted nowhere, when the worker
    reported no cached tokens."""
    if num_cached_tokens is None:
        return None
    block_size = worker.cache_block_size or router.models.get(worker.model).block_size
    num_predicted = reusable_tokens(num_matched_tokens, num_prompt_tokens, block_size)
    num_confirmed = reusable_tokens(num_matched_tokens - num_in_flight_tokens,
                                    num_prompt_tokens, block_size)
    num_served = reusable_tokens(num_cached_tokens, num_prompt_tokens, block_size)
    outcome = prediction_outcome(num_predicted, num_confirmed, num_served)
    worker.stats.record_prediction(outcome)
    router.metrics.count_prediction(worker.worker_id, worker.namespace or "", outcome,
                                    num_predicted, num_predicted - num_confirmed, num_served)
    return outcome
