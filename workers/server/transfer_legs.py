"""The two legs of a disaggregated request on ``/generate`` (docs/pd.md).

``prefill_for_remote``: a ``kv_producer`` given ``{"do_remote_decode": true}`` runs the
request (not streamed, base model only), then holds the prompt's blocks and answers
with the ``kv_transfer_params`` where they wait. ``pull_remote_prefill``: a
``kv_consumer`` given those params pulls the blocks it lacks before the request runs;
a failed pull is a 503 ``kv_transfer_failed`` (with ``Retry-After``), or, with
``fallback = "recompute"``, a counted, logged recompute. A worker without the role
answers 400.
"""

from __future__ import annotations

import logging

from radix.generate import GenerateRequest
from radix.kv_transfer import RemotePrefill
from workers.kv_transfer.consumer import Consumer, Pulled
from workers.kv_transfer.producer import Producer
from workers.kv_transfer.service import KVTransfer
from workers.kv_transfer.wire import TransferError
from workers.server.errors import ApiError, bad_request

log = logging.getLogger(__name__)


def producer_of(transfer: KVTransfer | None, call: GenerateRequest) -> Producer:
    """This worker's producer for ``call``; 400 when it has none or ``call`` cannot be
    a prefill leg (streamed, or for an adapter)."""
    if transfer is None or transfer.producer is None:
        raise bad_request("do_remote_decode: this worker is not a kv_producer "
                          "(--kv-transfer-config)", "kv_transfer_params")
    if call.stream or call.adapter is not None:
        raise bad_request("a prefill leg is not streamed and runs the base model",
                          "kv_transfer_params")
    return transfer.producer


async def pull_remote_prefill(transfer: KVTransfer | None, call: GenerateRequest
                              ) -> tuple[Consumer, Pulled] | None:
    """Pull the blocks ``call``'s params name; (consumer, what it holds) to release
    after the request, or None when the pull failed and the worker recomputes."""
    if transfer is None or transfer.consumer is None:
        raise bad_request("do_remote_prefill: this worker is not a kv_consumer "
                          "(--kv-transfer-config)", "kv_transfer_params")
    if call.adapter is not None:
        raise bad_request("disaggregated requests run the base model", "kv_transfer_params")
    try:
        remote = RemotePrefill.parse(call.kv_transfer_params or {})
    except ValueError as exc:
        raise bad_request(str(exc), "kv_transfer_params") from exc
    consumer = transfer.consumer
    try:
        return consumer, await consumer.pull(remote, call.prompt_key, call.scope,
                                             call.num_public_tokens)
    except TransferError as exc:
        if transfer.config.fallback != "recompute":
            raise ApiError(503, f"the KV transfer from {remote.engine_id} failed "
                                f"({exc.reason}): {exc}", code="kv_transfer_failed",
                           headers={"Retry-After": "1"}) from exc
        transfer.metrics.recomputes.inc()
        log.warning("KV transfer %s from %s failed (%s: %s): recomputing the prompt",
                    remote.transfer_id, remote.engine_id, exc.reason, exc)
        return None
