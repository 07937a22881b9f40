"""The two legs of a disaggregated request, on ``/generate`` and the OpenAI routes
(docs/pd.md).

``prefill_for_remote``: a ``kv_producer`` given ``{"do_remote_decode": true}`` runs the
request (not streamed, base model only), then holds the prompt's blocks and answers
with the ``kv_transfer_params`` where they wait. ``pull_remote_prefill``: a
``kv_consumer`` given those params pulls the blocks it lacks before the request runs;
a failed pull is a 503 ``kv_transfer_failed`` (with ``Retry-After``), or, with
``fallback = "recompute"``, a counted, logged recompute. A worker without the role
answers 400. ``leg_of`` wraps a route's run in the right one of these.

A prefill leg whose hold would pass the producer's caps (all holds, or its tenant
scope's) is refused with 429 ``kv_hold_refused`` before it computes anything, or,
when the caps filled meanwhile, after it ran (holding nothing): the router then
serves the request whole on its decode worker. ``POST /kv_transfer/release``
(``{"remote_request_id"}``: the router's) releases a hold whose params the router
abandoned (its decode attempt failed, or its client hung up).

``POST /kv_transfer/hold`` (a ``radix.kv_transfer.PeerHold``: the router's, naming a
peer of the worker it chose as the source of blocks that worker lacks) holds the
whole blocks this worker already caches of the prompt, visible to the hold's scope
(its own and public blocks only: never another tenant's), under the same caps,
deadline and release rules as a prefill leg's hold, without running anything, and
answers the same ``kv_transfer_params``; with ``wait_s`` it first waits, that long at
most, for the blocks a pull into this worker is still bringing, until they are cached
or start arriving (then it relays them: docs/pd.md, "Relays").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from radix.keys import TOKEN_BYTES
from radix.kv_transfer import (
    HOLD_PATH,
    RELEASE_PATH,
    PeerHold,
    RemotePrefill,
    wants_remote_decode,
    wants_remote_prefill,
)
from workers.engine.async_engine import AsyncEngine
from workers.kv_transfer.consumer import Consumer, Pulled
from workers.kv_transfer.incoming import Incoming
from workers.kv_transfer.producer import HoldRefused, Producer
from workers.kv_transfer.service import KVTransfer
from workers.kv_transfer.wire import TransferError
from workers.server.errors import ApiError, bad_request
from workers.server.state import STATE, read_fields

log = logging.getLogger(__name__)
HOLD_WAIT_POLL_S = 0.01


@dataclass(frozen=True)
class Leg:
    """What the legs need of a request, from ``/generate`` or an OpenAI route: its
    ``kv_transfer_params``, prompt key, scope, public tokens, adapter, and whether it
    streams."""

    params: dict[str, Any] | None
    prompt_key: bytes
    scope: str
    num_public_tokens: int = 0
    adapter: str | None = None
    stream: bool = False


@contextlib.asynccontextmanager
async def leg_of(transfer: KVTransfer | None, leg: Leg) -> AsyncIterator[Producer | None]:
    """Run the body as ``leg`` says: a prefill leg gets this worker's producer (hold
    its blocks with ``hold`` once it ran); a decode leg pulls first, and lets the
    pulled blocks go after; a request without params runs as it is (None); params that
    ask for neither leg are a 400."""
    if leg.params is not None and not (wants_remote_decode(leg.params)
                                       or wants_remote_prefill(leg.params)):
        raise bad_request("kv_transfer_params must ask for a leg: do_remote_decode or "
                          "do_remote_prefill true", "kv_transfer_params")
    if wants_remote_decode(leg.params):
        producer = producer_of(transfer, leg)
        assert transfer is not None
        num_blocks = len(leg.prompt_key) // TOKEN_BYTES // transfer.identity.block_size
        try:
            producer.check_room(leg.scope, num_blocks)
        except HoldRefused as exc:
            raise hold_refused(exc) from exc
        yield producer
        return
    pulled = await pull_remote_prefill(transfer, leg) if wants_remote_prefill(
        leg.params) else None
    try:
        yield None
    finally:
        if pulled is not None:
            await pulled[0].release(pulled[1])


def producer_of(transfer: KVTransfer | None, leg: Leg) -> Producer:
    """This worker's producer for ``leg``; 400 when it has none or the request cannot
    be a prefill leg (streamed, or for an adapter)."""
    if transfer is None or transfer.producer is None:
        raise bad_request("do_remote_decode: this worker is not a kv_producer "
                          "(--kv-transfer-config)", "kv_transfer_params")
    if leg.stream or leg.adapter is not None:
        raise bad_request("a prefill leg is not streamed and runs the base model",
                          "kv_transfer_params")
    return transfer.producer


async def hold(producer: Producer, leg: Leg) -> dict[str, Any]:
    """After the prefill leg ran: hold its blocks; the ``kv_transfer_params`` to answer.
    429 ``kv_hold_refused`` (holding nothing) when the hold would pass a cap."""
    try:
        remote = await producer.hold(leg.prompt_key, leg.scope, leg.num_public_tokens)
    except HoldRefused as exc:
        raise hold_refused(exc) from exc
    return remote.to_params()


def hold_refused(exc: HoldRefused) -> ApiError:
    """The 429 of a prefill leg whose hold would pass a cap: the router serves the
    request whole on its decode worker (it counts a fallback, never an error)."""
    return ApiError(429, f"this prefill worker holds too many blocks for consumers: {exc}",
                    code="kv_hold_refused", headers={"Retry-After": "1"})


async def release(request: web.Request) -> web.Response:
    """``POST /kv_transfer/release`` ``{"remote_request_id": ID}``: end the hold ``ID``
    at once (counted as abandoned); ``{"released": false}`` when it was not held
    (read, expired, or released already); 400 on a worker that produces nothing."""
    transfer = request.app[STATE].transfer
    if transfer is None or transfer.producer is None:
        raise bad_request("this worker is not a kv_producer", "remote_request_id")
    fields = await read_fields(request)
    transfer_id = fields.string("remote_request_id", None)
    if transfer_id is None:
        raise bad_request("remote_request_id is required", "remote_request_id")
    return web.json_response(
        {"released": await transfer.producer.release(transfer_id, "abandoned")})


async def hold_for_peer(request: web.Request) -> web.Response:
    """``POST /kv_transfer/hold`` (a ``PeerHold``): hold the whole blocks of the prompt
    this worker caches for the hold's scope, at most ``max_blocks``, for another
    worker's pull, running nothing; ``{"kv_transfer_params": ...}`` as a prefill leg
    answers (naming no block when it caches none). 429 ``kv_hold_refused`` past a cap,
    400 on a worker that produces nothing or a malformed hold."""
    state = request.app[STATE]
    transfer = state.transfer
    if transfer is None or transfer.producer is None:
        raise bad_request("this worker is not a kv_producer", "token_ids_b64")
    block_size = transfer.identity.block_size
    ask = PeerHold.parse(await read_fields(request), state.limits.bounds.vocab_size,
                         block_size)
    key = ask.held_key(block_size)
    producer = transfer.producer
    num_public_tokens = min(ask.num_public_tokens, len(key) // TOKEN_BYTES)
    relay = None
    if ask.wait_s:
        hashes = transfer.identity.block_hashes(key, ask.scope, num_public_tokens)
        relay = await _cached_within(state.engine, transfer.consumer, key, ask.scope,
                                     hashes, ask.wait_s)
    try:
        remote = await producer.hold(key, ask.scope, num_public_tokens, relay)
    except HoldRefused as exc:
        raise hold_refused(exc) from exc
    transfer.metrics.peer_holds.inc()
    transfer.metrics.peer_held_blocks.inc(len(remote.block_hashes))
    return web.json_response({"kv_transfer_params": remote.to_params()})


async def _cached_within(engine: AsyncEngine, consumer: Consumer | None, key: bytes,
                         scope: str, hashes: list[str], wait_s: float) -> Incoming | None:
    """Return once every token of ``key`` is cached for ``scope`` (a pull of them into
    this worker finished: None), once a pull bringing its blocks here receives them
    (its ``Incoming``, to relay from), or after ``wait_s`` (None). While this worker
    pulls the chain ``hashes`` it waits on that pull (``Consumer.wait_for_blocks``)
    instead of asking the engine thread, which a busy engine answers once per step."""
    deadline = time.monotonic() + wait_s
    num_tokens = len(key) // TOKEN_BYTES
    while (left := deadline - time.monotonic()) > 0:
        if consumer is not None and hashes:
            found = await consumer.wait_for_blocks(scope, hashes, left)
            if isinstance(found, Incoming):
                return found
            if found:
                return None
        if await engine.call(
                lambda e: e.manager.prefix_cache.match(key, scope).num_cached_tokens) >= num_tokens:
            return None
        await asyncio.sleep(HOLD_WAIT_POLL_S)
    return None


def add_routes(app: web.Application) -> None:
    """Register ``POST /kv_transfer/release`` and ``POST /kv_transfer/hold``."""
    app.router.add_post(RELEASE_PATH, release)
    app.router.add_post(HOLD_PATH, hold_for_peer)


async def pull_remote_prefill(transfer: KVTransfer | None, leg: Leg
                              ) -> tuple[Consumer, Pulled] | None:
    """Pull the blocks ``leg``'s params name; (consumer, what it holds) to release
    after the request, or None when the pull failed and the worker recomputes."""
    if transfer is None or transfer.consumer is None:
        raise bad_request("do_remote_prefill: this worker is not a kv_consumer "
                          "(--kv-transfer-config)", "kv_transfer_params")
    if leg.adapter is not None:
        raise bad_request("disaggregated requests run the base model", "kv_transfer_params")
    try:
        remote = RemotePrefill.parse(leg.params or {})
    except ValueError as exc:
        raise bad_request(str(exc), "kv_transfer_params") from exc
    consumer = transfer.consumer
    try:
        return consumer, await consumer.pull(remote, leg.prompt_key, leg.scope,
                                             leg.num_public_tokens)
    except TransferError as exc:
        if transfer.config.fallback != "recompute":
            raise ApiError(503, f"the KV transfer from {remote.engine_id} failed "
                                f"({exc.reason}): {exc}", code="kv_transfer_failed",
                           headers={"Retry-After": "1"}) from exc
        transfer.metrics.recomputes.inc()
        log.warning("KV transfer %s from %s failed (%s: %s): recomputing the prompt",
                    remote.transfer_id, remote.engine_id, exc.reason, exc)
        return None
