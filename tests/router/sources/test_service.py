"""``KVSources.credit`` on hand-set worker states and a real index: what a worker is
credited for the blocks it lacks follows the plan the planner would send (a pull on
its way to it is joined, not pulled again; of peers with equal chains, the one whose
link is free first serves). No process, no network: ``credit`` sends nothing."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from radix.events import EventBlock, KVEvent
from radix.keys import TOKEN_BYTES
from radix.openai.requests import COMPLETIONS, parse_openai_request
from router.config import KVSourcesConfig
from router.context import Router
from router.fleet.probes import WorkerLoad
from router.fleet.worker_state import WorkerState
from router.forward.proxy import Call
from router.sources.planned import Pending
from router.sources.service import KVSources
from router.state.shared_state import InProcessSharedState
from tests.support.aio import TEST_SECRET
from tests.support.router_configs import make_config

B = 16
NS = "ab" * 32
COSTS = {"kv_bytes_per_token": 1024, "max_batched_tokens": 512}
CONFIG = KVSourcesConfig(enabled=True, min_pull_tokens=32, max_peers=1)
PROMPT = "a sub-agent's task over its parent's long context " * 8


pytestmark = pytest.mark.anyio


@pytest.fixture
async def router() -> AsyncIterator[Router]:
    """A router over four workers (none runs: ``credit`` sends nothing)."""
    urls = [f"http://127.0.0.1:{9 + i}" for i in range(4)]
    router = Router.build(make_config(urls), TEST_SECRET, InProcessSharedState())
    try:
        yield router
    finally:
        await router.close()


def workers(router: Router) -> list[WorkerState]:
    """Four ready idle workers of one namespace that hold blocks for others and pull."""
    states = []
    for i, spec in enumerate(router.config.workers):
        worker = WorkerState(spec, f"http://127.0.0.1:{9 + i}", {})
        worker.ready, worker.namespace, worker.load = True, NS, WorkerLoad()
        worker.transfer_endpoint = ("127.0.0.1", 100 + i)
        worker.transfer_info = {"consumer": True, "costs": COSTS}
        states.append(worker)
    return states


def call(router: Router) -> Call:
    model = router.models.get("demo")
    request = parse_openai_request({"model": "demo", "prompt": PROMPT, "max_tokens": 4},
                                   COMPLETIONS, model.bounds)
    return Call(request, "demo", model.prompt(request, "alice"), "alice", 4, "salt")


def store_prefix(sources: KVSources, worker_id: str, c: Call) -> int:
    """Report the prompt's whole blocks but the last stored on ``worker_id``; tokens."""
    key = c.prompt.key
    num_blocks = (len(key) // TOKEN_BYTES - 1) // B
    blocks, parent = [], None
    for i in range(num_blocks):
        blocks.append(EventBlock(f"h{i}", parent, key[i * B * TOKEN_BYTES:(i + 1) * B * TOKEN_BYTES]))
        parent = f"h{i}"
    sources._index.apply_event(worker_id, KVEvent(worker_id, "e", 1, "stored", NS, "alice",
                                                  tuple(blocks)))
    return num_blocks * B


def expected_credit(span: int, pull_s: float) -> int:
    recompute_s = span * CONFIG.prefill_s_per_token
    return int(span * (1 - pull_s / recompute_s))


async def test_a_request_for_a_worker_a_pull_is_on_its_way_to_joins_it_without_link_time(router):
    sources = KVSources(router.index, CONFIG, router.pool, CollectorRegistry())
    fleet, c = workers(router), call(router)
    span = store_prefix(sources, "u0", c)
    transfer_s = span * COSTS["kv_bytes_per_token"] / CONFIG.link_bytes_per_s
    sources.links.reserve("u0", 0.05)  # a pull planned into u1 is crossing u0's link
    sources.pending.add(Pending("u1", NS, "alice", c.prompt.key[: span * TOKEN_BYTES],
                                time.monotonic() + 0.05, "u0"))
    credit = sources.credit(fleet, {}, c)
    credited = credit.tokens
    # once the pull lands the whole span is cached: its wait is time, not engine work
    assert credit.cached["u1"] == credit.cached["u2"] == span
    joining = CONFIG.pull_overhead_s + 0.05
    assert credited["u1"] == pytest.approx(expected_credit(span, joining), abs=2)
    # u1 relays the blocks as they come: a pull from it ends with their arrival or
    # its own link time, sooner than one queued behind the planned pull on u0's link
    relayed = CONFIG.pull_overhead_s + max(0.05, transfer_s)
    assert credited["u2"] == pytest.approx(expected_credit(span, relayed), abs=2)
    behind = CONFIG.pull_overhead_s + 0.05 + transfer_s
    assert credited["u2"] > expected_credit(span, behind)
    assert credited["u1"] >= credited["u2"] and "u0" not in credited


async def test_of_peers_holding_the_same_chain_the_one_whose_link_is_free_first_serves(router):
    sources = KVSources(router.index, CONFIG, router.pool, CollectorRegistry())
    fleet, c = workers(router), call(router)
    span = store_prefix(sources, "u0", c)
    store_prefix(sources, "u1", c)
    transfer_s = span * COSTS["kv_bytes_per_token"] / CONFIG.link_bytes_per_s
    for busy, free in (("u0", "u1"), ("u1", "u0")):
        links = sources.links
        links.reserve(busy, 0.1 + links.wait_s(free) - links.wait_s(busy))
        credited = sources.credit(fleet, {}, c).tokens  # one peer considered (max_peers 1)
        free_s = CONFIG.pull_overhead_s + links.wait_s(free) + transfer_s
        assert credited["u2"] == pytest.approx(expected_credit(span, free_s), abs=2), free
