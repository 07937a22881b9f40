"""LoRA adapters in the router: residency prediction, the adapter's load in the routing
cost, adapter namespaces from probes, and adapter names in requests. Pure: constructed
worker states, no process."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radix.api_errors import ApiError
from radix.keys import to_key
from radix.namespace import CacheNamespace
from radix.openai.requests import COMPLETIONS
from router.config import ModelSpec, TenantLimits
from router.fleet.probes import radix_adapters
from router.front.requests import parse_request
from router.models import Models
from router.routing.adapters import Residency, WorkerAdapter, WorkerLora
from router.routing.load_cost import PolicyWeights, prefill_units
from router.routing.policy import make_policy
from router.routing.views import RouteRequest, WorkerView

NS = "cd" * 32
SECRET = b"adapter-test-secret"


def request(num_prompt_tokens: int = 1000, first: int = 0) -> RouteRequest:
    return RouteRequest(NS, to_key(list(range(first, first + num_prompt_tokens))),
                        num_prompt_tokens, "tenant-a")


def lora(resident: list[str], max_loras: int = 2, registered: tuple[str, ...] = ("a", "b", "c"),
         measured_ms: float | None = None) -> WorkerLora:
    state = WorkerLora()
    state.observe([WorkerAdapter(n, f"router-{n}", f"worker-{n}", n in resident) for n in registered],
                  max_loras, measured_ms, probe_sent_at=0.0)
    return state


def test_routing_makes_an_adapter_resident_and_evicts_the_least_recently_routed():
    residency = Residency()
    residency.observe(["a", "b"], max_loras=2, probe_sent_at=0.0)
    residency.route("a", now=1.0)
    residency.route("c", now=2.0)
    assert residency.resident() == ["a", "c"]
    residency.route("b", now=3.0)
    assert residency.resident() == ["c", "b"]


def test_a_probe_resets_residency_but_keeps_adapters_routed_since_it_was_sent():
    residency = Residency()
    residency.observe([], max_loras=3, probe_sent_at=0.0)
    residency.route("a", now=1.0)
    residency.route("b", now=5.0)
    # Sent at 4: it saw "a" gone (the worker evicted it) and had not yet seen "b".
    residency.observe(["c"], max_loras=3, probe_sent_at=4.0)
    assert residency.resident() == ["c", "b"]
    assert not residency.is_resident("a")


@given(st.integers(1, 4), st.lists(st.sampled_from("abcdefg"), max_size=60))
def test_routing_alone_predicts_exactly_an_lru_cache_of_max_loras(max_loras, routed):
    residency = Residency()
    residency.observe([], max_loras, probe_sent_at=0.0)
    model: OrderedDict[str, None] = OrderedDict()
    for now, name in enumerate(routed, start=1):
        residency.route(name, float(now))
        model[name] = None
        model.move_to_end(name)
        while len(model) > max_loras:
            model.popitem(last=False)
        assert residency.resident() == list(model)


def test_load_ms_is_zero_for_the_base_and_resident_adapters_else_measured_or_default():
    state = lora(["a"], measured_ms=None)
    assert (state.load_ms(None, 25.0), state.load_ms("a", 25.0), state.load_ms("b", 25.0)) == (0.0, 0.0, 25.0)
    state.observe(state.adapters.values(), 2, 12.5, probe_sent_at=0.0)
    assert state.load_ms("b", 25.0) == 12.5


def test_a_swap_costs_a_share_growing_with_the_workers_requests_only_when_slots_are_full():
    state = lora(["a"], max_loras=2)
    assert state.swap_share("b", num_active_requests=5) == 0.0  # a free slot
    state.residency.route("b", now=1.0)
    assert [state.swap_share(name, 1) for name in (None, "a", "b")] == [0.0, 0.0, 0.0]
    assert [state.swap_share("c", n) for n in (0, 1, 2, 7)] == [0.0, 0.5, 1.0, 1.0]


def test_a_busy_worker_that_must_swap_loses_to_one_with_a_free_slot():
    weights = make_policy().weights
    full = WorkerView("w0", num_requests_running=4, adapter_load_ms=20.0, adapter_swap_share=1.0)
    free = WorkerView("w1", num_requests_running=4, adapter_load_ms=20.0)
    decision = make_policy().choose(request(), [full, free])
    assert decision.chosen == "w1"
    assert decision.scores[1].cost - decision.scores[0].cost == weights.adapter_swap_cost


def test_events_are_filed_under_the_routers_namespace_of_their_adapter():
    state = lora([])
    assert state.namespace("b", "base") == "router-b"
    assert state.namespace(None, "base") == "base"
    assert state.namespace("zzz", "base") is None
    assert state.event_namespace("worker-b", "base", "worker-base") == "router-b"
    assert state.event_namespace("worker-base", "base", "worker-base") == "base"
    # An adapter loaded since the last probe: kept apart, never filed under the base.
    assert state.event_namespace("worker-new", "base", "worker-base") == "worker-new"
    assert WorkerLora().event_namespace("anything", "base", None) == "base"


def test_a_resident_worker_wins_unless_its_load_outweighs_the_adapters_load():
    weights = make_policy().weights
    load_ms = 20.0
    resident = WorkerView("w0", num_requests_running=3)
    other = WorkerView("w1", adapter_load_ms=load_ms)
    decision = make_policy().choose(request(), [other, resident])
    assert decision.chosen == "w0"
    assert decision.scores[1].cost - decision.scores[0].cost == (
        weights.adapter_load_cost_per_ms * load_ms - 3 * weights.running_request_cost)
    busy = resident._replace(num_requests_running=20)
    assert make_policy().choose(request(), [other, busy]).chosen == "w1"


def test_a_cached_prefix_and_residency_are_weighed_in_one_cost():
    # w0 holds 900 of the prompt's tokens but not the adapter; w1 holds the adapter only.
    cached = WorkerView("w0", num_matched_tokens=900, adapter_load_ms=20.0)
    resident = WorkerView("w1")
    decision = make_policy().choose(request(), [cached, resident])
    assert decision.chosen == "w0"
    context = PolicyWeights().prefill_context_cost
    assert [s.cost for s in decision.scores] == [prefill_units(900, 1000, context) + 32.0 * 20.0,
                                                  prefill_units(0, 1000, context)]
    slow_load = cached._replace(adapter_load_ms=40.0)
    assert make_policy().choose(request(), [slow_load, resident]).chosen == "w1"


def test_a_cold_prompt_goes_to_a_worker_holding_its_adapter_not_to_the_hash():
    for first in range(20):
        workers = [WorkerView(f"w{i}", adapter_load_ms=20.0) for i in range(4)]
        workers[2] = workers[2]._replace(adapter_load_ms=0.0)
        decision = make_policy().choose(request(first=first * 1000), workers)
        assert decision.chosen == "w2" and not decision.cold


def test_owners_that_must_load_the_adapter_are_not_kept_first():
    # w0 holds the whole prompt without the adapter; w1 half of it with the adapter.
    workers = [WorkerView("w0", num_matched_tokens=1000, adapter_load_ms=40.0),
               WorkerView("w1", num_matched_tokens=500)]
    assert make_policy().choose(request(), workers).chosen == "w1"


def test_adapter_blind_weights_ignore_residency():
    blind = make_policy(weights={"adapter_load_cost_per_ms": 0})
    workers = [WorkerView("w0", adapter_load_ms=20.0, num_matched_tokens=10), WorkerView("w1")]
    assert blind.choose(request(), workers).chosen == "w0"


def simulated_loads(weights: dict, num_requests: int = 3000, seed: int = 0) -> int:
    """Adapter loads when Zipf-popular adapters are routed to workers with few slots,
    residency predicted from the decisions alone (the dispatcher's loop, no network)."""
    rng = random.Random(seed)
    names = [f"a{i}" for i in range(32)]
    popularity = [1.0 / (rank + 1) for rank in range(len(names))]
    policy = make_policy(weights=weights)
    workers = [Residency() for _ in range(4)]
    for residency in workers:
        residency.observe([], max_loras=4, probe_sent_at=0.0)
    loads = 0
    for now in range(num_requests):
        adapter = rng.choices(names, popularity)[0]
        views = [WorkerView(f"w{i}", adapter_load_ms=0.0 if r.is_resident(adapter) else 20.0)
                 for i, r in enumerate(workers)]
        chosen = workers[int(policy.choose(request(first=now * 1000), views).chosen[1:])]
        loads += not chosen.is_resident(adapter)
        chosen.route(adapter, float(now))
    return loads


def test_adapter_aware_routing_loads_far_less_than_adapter_blind_routing():
    aware, blind = simulated_loads({}), simulated_loads({"adapter_load_cost_per_ms": 0})
    assert aware * 2 <= blind


def test_probed_adapters_get_the_routers_digest_of_the_base_namespace_with_the_adapter():
    base = CacheNamespace("m", "w", "t")
    listed = [{"name": "sql", "digest": "d1", "namespace": "f1", "resident": True},
              {"name": "chat", "digest": "d2", "namespace": "f2", "resident": False}]
    adapters = radix_adapters(listed, base, SECRET)
    assert [(a.name, a.worker_namespace, a.resident) for a in adapters] == [
        ("sql", "f1", True), ("chat", "f2", False)]
    assert adapters[0].namespace == CacheNamespace(
        "m", "w", "t", adapter_name="sql", adapter_digest="d1").fingerprint(SECRET)
    assert adapters[0].namespace != adapters[1].namespace != base.fingerprint(SECRET)
    with pytest.raises((KeyError, TypeError, ValueError)):
        radix_adapters([{"name": "x", "digest": "", "namespace": "f", "resident": True}], base, SECRET)


def test_an_adapter_name_resolves_to_its_model_and_an_unknown_name_is_404():
    models = Models.from_config({"demo": ModelSpec("demo", "demo")})
    limits, adapters = TenantLimits(), {"sql": "demo"}
    body = b'{"model": "%s", "prompt": "hello", "max_tokens": 2}'
    model, adapter, parsed = parse_request(body % b"sql", COMPLETIONS, models, limits, adapters)
    assert (model.name, adapter, parsed.sampling.max_tokens) == ("demo", "sql", 2)
    assert parse_request(body % b"demo", COMPLETIONS, models, limits, adapters)[1] is None
    with pytest.raises(ApiError) as refused:
        parse_request(body % b"nope", COMPLETIONS, models, limits, adapters)
    assert (refused.value.status, refused.value.code) == (404, "model_not_found")
