"""Prefill/decode disaggregation between real worker processes (docs/pd.md), driven as
a router drives it: the prefill leg to a ``kv_producer`` with ``do_remote_decode``,
then the same request with the producer's ``kv_transfer_params`` to a
``kv_consumer``. Output equality alone proves nothing (a consumer that recomputed
would answer the same), so each case also reads the transfer counters and the
consumer's cached tokens: it received exactly the blocks it lacked and computed only
the prompt's partial last block. Faults and refusals end in a clear 503, hold no
block on either side, and recompute only where the worker was told to."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from harness.procs import ManagedProcess, started_workers
from tests.support.metric_samples import worker_metric as metric
from tests.support.polling import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("pd_transfer")]
KEY = "pd-test-key"
B = 16
PRODUCER = '{"kv_role": "kv_producer"}'
CONSUMER = '{"kv_role": "kv_consumer"}'


def prompt(seed: int, num_tokens: int = 5 * B + 7) -> list[int]:
    """A prompt of ``num_tokens`` demo-vocabulary token ids (5 whole blocks + 7)."""
    return [(seed * 31 + i * 7) % 200 + 20 for i in range(num_tokens)]


def generate(worker: ManagedProcess, token_ids: list[int], max_tokens: int,
             params: dict | None = None) -> tuple[int, dict]:
    """POST ``/generate`` greedily in scope t1."""
    body = {"token_ids": token_ids, "scope": "t1",
            "sampling": {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}
    if params is not None:
        body["kv_transfer_params"] = params
    return worker.post_json("/generate", body)


def used_blocks(worker: ManagedProcess) -> int:
    """Blocks some request or hold references (0 on an idle worker that leaked none)."""
    return worker.get_json("/info")[1]["kv"]["num_used_blocks"]


def holds(worker: ManagedProcess, num_blocks: int) -> bool:
    """Wait until ``worker`` references exactly ``num_blocks`` blocks (its ``/info``
    counts are published by the engine thread just after each command it runs, so a
    hold or release answered a moment ago may not show yet); True, or AssertionError."""
    return wait_until(lambda: used_blocks(worker) == num_blocks, 10,
                      lambda: f"{num_blocks} blocks in use (now {used_blocks(worker)})")


def tokens_of(answer: dict) -> list[int]:
    return answer["choices"][0]["token_ids"]


@pytest.fixture(scope="module")
def fleet() -> Iterator[dict[str, ManagedProcess]]:
    """Two producers (the second holds blocks 1 s only, and a later test kills it) and
    four consumers (the main one, one with another key, one whose namespace differs
    (FP8 KV), one that recomputes on a failed pull), all on the demo model. The main
    producer also gives the aggregated answers: without params a request runs whole."""
    flags = {
        "producer": (("--kv-transfer-config", PRODUCER), KEY),
        "short_producer": (("--kv-transfer-config", PRODUCER, "--kv-transfer-timeout-s", "1"),
                           KEY),
        "consumer": (("--kv-transfer-config", CONSUMER), KEY),
        "wrong_key": (("--kv-transfer-config", CONSUMER), "another-key"),
        "fp8": (("--kv-transfer-config", CONSUMER, "--kv-cache-dtype", "fp8_e4m3",
                 "--allow-unit-kv-scales"), KEY),
        "recompute": (("--kv-transfer-config", CONSUMER, "--kv-transfer-fallback",
                       "recompute"), KEY),
    }
    with started_workers(flags) as workers:
        yield workers


def prefill(fleet: dict[str, ManagedProcess], token_ids: list[int],
            producer: str = "producer") -> dict:
    status, answer = generate(fleet[producer], token_ids, 1, {"do_remote_decode": True})
    assert status == 200, answer
    return answer["kv_transfer_params"]


def test_decode_after_a_remote_prefill_equals_the_aggregated_run(fleet):
    token_ids = prompt(1)
    _, expected = generate(fleet["producer"], token_ids, 8)
    received = metric(fleet["consumer"], "kv_transfer_blocks_received_total")
    params = prefill(fleet, token_ids)
    assert params["do_remote_prefill"] is True and len(params["remote_block_ids"]) == 5
    assert holds(fleet["producer"], 5)  # held for the consumer
    status, answer = generate(fleet["consumer"], token_ids, 8, params)
    assert status == 200, answer
    assert tokens_of(answer) == tokens_of(expected)
    assert metric(fleet["consumer"], "kv_transfer_blocks_received_total") - received == 5
    assert answer["usage"]["cached_tokens"] == 5 * B  # only the last 7 tokens computed
    assert holds(fleet["producer"], 0) and holds(fleet["consumer"], 0)


def test_a_consumer_holding_part_of_the_prefix_pulls_only_the_rest(fleet):
    token_ids = prompt(2)
    _, expected = generate(fleet["producer"], token_ids, 6)
    assert generate(fleet["consumer"], token_ids[: 2 * B + 3], 1)[0] == 200  # caches 2 blocks
    received = metric(fleet["consumer"], "kv_transfer_blocks_received_total")
    sent = metric(fleet["producer"], "kv_transfer_blocks_sent_total")
    status, answer = generate(fleet["consumer"], token_ids, 6, prefill(fleet, token_ids))
    assert status == 200 and tokens_of(answer) == tokens_of(expected)
    assert metric(fleet["consumer"], "kv_transfer_blocks_received_total") - received == 3
    assert metric(fleet["producer"], "kv_transfer_blocks_sent_total") - sent == 3
    assert answer["usage"]["cached_tokens"] == 5 * B
    assert holds(fleet["producer"], 0)


def test_an_expired_hold_is_a_clear_503_and_holds_nothing(fleet):
    token_ids = prompt(3)
    params = prefill(fleet, token_ids, "short_producer")
    assert holds(fleet["short_producer"], 5)
    time.sleep(2.5)  # past the 1 s hold: the producer released the blocks
    assert holds(fleet["short_producer"], 0)
    assert metric(fleet["short_producer"], "kv_transfer_expired_holds_total") >= 1
    failed = metric(fleet["consumer"], "kv_transfer_failures_total", {"reason": "refused"})
    status, answer = generate(fleet["consumer"], token_ids, 4, params)
    assert status == 503 and answer["error"]["code"] == "kv_transfer_failed"
    assert "unknown_transfer" in answer["error"]["message"]
    assert metric(fleet["consumer"], "kv_transfer_failures_total",
                  {"reason": "refused"}) - failed == 1
    assert holds(fleet["consumer"], 0)


def test_a_producer_that_is_gone_fails_the_request_unless_recompute_was_asked(fleet):
    token_ids = prompt(4)
    _, expected = generate(fleet["producer"], token_ids, 5)
    params = prefill(fleet, token_ids, "short_producer")
    fleet["short_producer"].stop()  # killed before anyone pulled (no later test uses it)
    status, answer = generate(fleet["consumer"], token_ids, 5, params)
    assert status == 503 and answer["error"]["code"] == "kv_transfer_failed"
    assert "unreachable" in answer["error"]["message"]
    recomputes = metric(fleet["recompute"], "kv_transfer_recomputes_total")
    status, answer = generate(fleet["recompute"], token_ids, 5, params)
    assert status == 200 and tokens_of(answer) == tokens_of(expected)
    assert metric(fleet["recompute"], "kv_transfer_recomputes_total") - recomputes == 1
    assert answer["usage"]["cached_tokens"] == 0
    assert holds(fleet["consumer"], 0) and holds(fleet["recompute"], 0)


def test_refusals_come_before_any_block_moves(fleet):
    token_ids = prompt(5)
    params = prefill(fleet, token_ids)
    sent = metric(fleet["producer"], "kv_transfer_blocks_sent_total")
    forged = {**params, "remote_block_hashes": ["00" * 16] + params["remote_block_hashes"][1:]}
    status, answer = generate(fleet["consumer"], token_ids, 2, forged)
    assert status == 503 and "do not name this prompt's blocks" in answer["error"]["message"]
    other_prompt = prompt(6)
    status, answer = generate(fleet["consumer"], other_prompt, 2, params)
    assert status == 503 and "mismatch" in answer["error"]["message"]
    status, answer = generate(fleet["fp8"], token_ids, 2, params)
    assert status == 503 and "namespace" in answer["error"]["message"]
    refused = metric(fleet["producer"], "kv_transfer_port_refusals_total",
                     {"reason": "unauthenticated"})
    status, answer = generate(fleet["wrong_key"], token_ids, 2, params)
    assert status == 503 and "unauthenticated" in answer["error"]["message"]
    assert metric(fleet["producer"], "kv_transfer_port_refusals_total",
                  {"reason": "unauthenticated"}) - refused == 1
    assert metric(fleet["producer"], "kv_transfer_blocks_sent_total") == sent
    status, answer = generate(fleet["producer"], token_ids, 2, params)
    assert status == 400 and "not a kv_consumer" in answer["error"]["message"]
    status, answer = generate(fleet["consumer"], token_ids, 2, {"do_remote_decode": True})
    assert status == 400 and "not a kv_producer" in answer["error"]["message"]
    status, answer = generate(fleet["consumer"], token_ids, 2, {"do_remote_prefill": True})
    assert status == 400 and answer["error"]["param"] == "kv_transfer_params"
    status, answer = generate(fleet["consumer"], token_ids, 2, {"a": 1})  # neither leg
    assert status == 400 and answer["error"]["param"] == "kv_transfer_params"
    status, answer = generate(fleet["consumer"], token_ids, 3, params)  # the real one works
    assert status == 200 and answer["usage"]["cached_tokens"] == 5 * B
    for name in ("producer", "consumer", "fp8", "wrong_key"):
        assert holds(fleet[name], 0), name


def test_the_openai_routes_take_the_same_params_as_vllms_proxy_sends_them(fleet):
    prompt_text = "Disaggregated prefill through the OpenAI route, as vLLM's proxy does. " * 2
    body = {"model": "demo", "prompt": prompt_text, "max_tokens": 6, "temperature": 0,
            "ignore_eos": True}
    _, expected = fleet["producer"].post_json("/v1/completions", body)
    status, prefilled = fleet["producer"].post_json("/v1/completions", {
        **body, "max_tokens": 1, "stream": False, "kv_transfer_params": {
            "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
            "remote_block_ids": None, "remote_host": None, "remote_port": None}})
    assert status == 200, prefilled
    params = prefilled["kv_transfer_params"]
    received = metric(fleet["consumer"], "kv_transfer_blocks_received_total")
    status, answer = fleet["consumer"].post_json("/v1/completions",
                                                 {**body, "kv_transfer_params": params})
    assert status == 200, answer
    assert answer["choices"][0]["text"] == expected["choices"][0]["text"]
    num_blocks = len(params["remote_block_ids"])
    assert num_blocks > 3
    assert metric(fleet["consumer"], "kv_transfer_blocks_received_total") - received == num_blocks
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == num_blocks * B
    status, answer = fleet["consumer"].post_json("/v1/completions",
                                                 {**body, "kv_transfer_params": "yes"})
    assert status == 400 and answer["error"]["param"] == "kv_transfer_params"
    assert holds(fleet["producer"], 0) and holds(fleet["consumer"], 0)
