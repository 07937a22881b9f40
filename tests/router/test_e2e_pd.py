"""The router in PD mode in front of real worker processes (docs/pd.md): a prefill worker
(``kv_producer``) and a decode worker (``kv_consumer``). The router picks the decode
worker first; a prompt it would mostly compute itself is prefilled on the prefill
worker and its blocks pulled (counted on both workers, greedy output equal to an
aggregated worker's); a prompt the decode worker mostly holds runs there whole; a
prefill worker that is gone leaves the request whole on the decode worker."""

from __future__ import annotations

import pytest

from harness.procs import start_router, start_worker
from tests.support.metric_samples import router_metric
from tests.support.metric_samples import worker_metric as metric
from tests.support.polling import wait_until
from tests.support.router_calls import admin, complete, wait_until_ready
from tests.support.router_configs import (
    WORKER_KEY,
    WORKER_KEY_ENV,
    pd_config,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e_pd")]
PROMPT = "Disaggregated serving moves the prompt's cache from one worker to another. " * 3


@pytest.fixture(scope="module")
def pd_fleet(tmp_path_factory):
    """(router, prefill worker, decode worker, aggregated worker)."""
    prefill = start_worker("--kv-transfer-config", '{"kv_role": "kv_producer"}',
                           api_key=WORKER_KEY, wait=False)
    decode = start_worker("--kv-transfer-config", '{"kv_role": "kv_consumer"}',
                          api_key=WORKER_KEY, wait=False)
    whole = start_worker(api_key=WORKER_KEY, wait=False)
    router = None
    try:
        for worker in (prefill, decode, whole):
            worker.wait_ready(120)
        path = pd_config(tmp_path_factory.mktemp("pd"), prefill, "d0", decode, WORKER_KEY_ENV)
        router = start_router(path, env={WORKER_KEY_ENV: WORKER_KEY})
        wait_until_ready(router)
        yield router, prefill, decode, whole
    finally:
        if router is not None:
            router.stop()
        for worker in (prefill, decode, whole):
            worker.stop()


def test_a_long_uncached_prompt_is_prefilled_on_the_prefill_worker(pd_fleet):
    router, prefill, decode, whole = pd_fleet
    roles = {w["id"]: w["role"] for w in admin(router, "/admin/workers")["workers"]}
    assert roles == {"p0": "prefill", "d0": "decode"}
    _, expected = whole.post_json("/v1/completions", {
        "model": "demo", "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
        "ignore_eos": True})
    received = metric(decode, "kv_transfer_blocks_received_total")
    status, answer = complete(router, PROMPT, max_tokens=8, temperature=0)
    assert status == 200, answer
    assert answer["choices"][0]["text"] == expected["choices"][0]["text"]
    num_blocks = metric(decode, "kv_transfer_blocks_received_total") - received
    assert num_blocks > 5
    assert num_blocks == (answer["usage"]["prompt_tokens"] - 1) // 16  # every whole block
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == num_blocks * 16
    assert router_metric(router, "router_pd_requests_total", {"mode": "disaggregated"}) == 1


def test_a_prompt_the_decode_worker_holds_runs_there_whole(pd_fleet):
    router, prefill, decode, _ = pd_fleet
    wait_until(lambda: admin(router, "/admin/index")["workers"]["d0"]["num_blocks"] > 0,
               what="the decode worker's imported blocks in the router's index")
    sent = metric(prefill, "kv_transfer_blocks_sent_total")
    status, answer = complete(router, PROMPT + " Again.", max_tokens=4, temperature=0)
    assert status == 200, answer
    assert metric(prefill, "kv_transfer_blocks_sent_total") == sent
    assert router_metric(router, "router_pd_requests_total", {"mode": "aggregated"}) >= 1


def test_a_failed_pull_is_retried_whole_on_the_decode_worker(pd_fleet, tmp_path):
    _, prefill, _, _ = pd_fleet
    decode = start_worker("--kv-transfer-config", '{"kv_role": "kv_consumer"}',
                          api_key="another-key")  # cannot sign pulls for the producer
    path = pd_config(tmp_path, prefill, "d1", decode, "OTHER_KEY")
    router = start_router(path, env={WORKER_KEY_ENV: WORKER_KEY, "OTHER_KEY": "another-key"})
    try:
        wait_until_ready(router)
        status, answer = complete(router, "A third document to prefill elsewhere. " * 5,
                                  max_tokens=4, temperature=0)
        assert status == 200, answer
        assert metric(decode, "kv_transfer_failures_total", {"reason": "unauthenticated"}) == 1
        assert router_metric(router, "router_pd_requests_total", {"mode": "disaggregated"}) == 1
        assert router_metric(router, "router_retries_total", {}) == 1
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # whole, retried
    finally:
        router.stop()
        decode.stop()


def test_a_gone_prefill_worker_leaves_the_request_whole_on_the_decode_worker(pd_fleet):
    router, prefill, decode, whole = pd_fleet
    prefill.stop()
    other = "A different document, long enough to need its own prefill somewhere. " * 3
    status, answer = complete(router, other, max_tokens=4, temperature=0)
    assert status == 200, answer
    assert router_metric(router, "router_pd_requests_total", {"mode": "fallback"}) + \
        router_metric(router, "router_pd_requests_total", {"mode": "aggregated"}) >= 2
    assert metric(decode, "kv_transfer_recomputes_total") == 0
