"""Routing policies: which worker wins in constructed situations."""

from __future__ import annotations

from dataclasses import asdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radix.keys import to_key
from router.routing.load_cost import PolicyWeights, prefill_units, rendezvous_order
from router.routing.policy import (
    POLICIES,
    NoWorkerError,
    RandomPolicy,
    RouteRequest,
    WorkerView,
    make_policy,
)

NS = "ab" * 32
CONTEXT = PolicyWeights().prefill_context_cost
FLAT = {"prefill_context_cost": 0.0}  # every prompt token costs 1.0, wherever it is


def request(tokens: list[int] | None = None, num_prompt_tokens: int = 1000) -> RouteRequest:
    tokens = tokens if tokens is not None else list(range(num_prompt_tokens))
    return RouteRequest(NS, to_key(tokens), len(tokens), "tenant-a")


def views(*specs: dict) -> list[WorkerView]:
    return [WorkerView(f"w{i}", **spec) for i, spec in enumerate(specs)]


def test_cost_is_uncached_prefill_plus_load_with_default_weights():
    view = WorkerView("w0", num_matched_tokens=200, num_in_flight_requests=3, num_in_flight_prompt_tokens=50,
                      num_requests_running=2, num_waiting_tokens=100, kv_cache_usage_ratio=0.5)
    decision = make_policy("cache_aware").choose(request(), [view])
    score = decision.scores[0]
    # 800 uncached tokens at positions 200-1000, each 1 + CONTEXT * its position: on
    # average 1 + CONTEXT * 600
    assert (score.num_matched_tokens, score.load_cost) == (200, 422.0)
    assert score.cost == pytest.approx(800 * (1 + CONTEXT * 600) + 422.0)
    assert decision.chosen == "w0" and decision.num_matched_tokens == 200 and not decision.cold


def test_longest_match_wins_at_equal_load():
    decision = make_policy().choose(request(), views(
        {"num_matched_tokens": 100}, {"num_matched_tokens": 500}, {"num_matched_tokens": 0}))
    assert decision.ranked == ("w1", "w0", "w2")
    assert [s.cost for s in decision.scores] == [prefill_units(m, 1000, CONTEXT)
                                                  for m in (500, 100, 0)]


def test_load_outweighs_a_small_match():
    workers = views({"num_matched_tokens": 64, "num_waiting_tokens": 2000}, {"num_matched_tokens": 16})
    assert make_policy().choose(request(), workers).ranked == ("w1", "w0")


def test_a_long_match_outweighs_moderate_load():
    workers = views({"num_matched_tokens": 3000, "num_waiting_tokens": 500, "num_requests_running": 4},
                    {"num_matched_tokens": 16})
    assert make_policy().choose(request(num_prompt_tokens=4000), workers).chosen == "w0"


def test_equal_costs_go_to_the_least_loaded():
    # w0 holds 48 more tokens but runs one more request: equal cost, w1 less loaded.
    workers = views({"num_matched_tokens": 148, "num_requests_running": 2},
                    {"num_matched_tokens": 100, "num_requests_running": 1})
    decision = make_policy("cache_aware", FLAT).choose(request(), workers)
    assert decision.scores[0].cost == decision.scores[1].cost
    assert decision.ranked == ("w1", "w0")


def test_in_flight_counts_at_decision_time_steer_a_burst():
    policy = make_policy()
    workers = views({"num_matched_tokens": 900}, {"num_matched_tokens": 0})
    assert policy.choose(request(), workers).chosen == "w0"
    busy = views({"num_matched_tokens": 900, "num_in_flight_requests": 3, "num_in_flight_prompt_tokens": 300},
                 {"num_matched_tokens": 0})
    assert policy.choose(request(), busy).chosen == "w0"
    busier = views({"num_matched_tokens": 900, "num_in_flight_requests": 30, "num_in_flight_prompt_tokens": 3000},
                   {"num_matched_tokens": 0})
    assert policy.choose(request(), busier).chosen == "w1"


def test_cold_prefixes_spread_deterministically_by_hash():
    policy = make_policy()
    workers = views({}, {}, {}, {})
    chosen = [policy.choose(request([doc] * 64), workers).chosen for doc in range(64)]
    assert set(chosen) == {"w0", "w1", "w2", "w3"}
    assert max(chosen.count(w) for w in set(chosen)) <= 28
    again = [policy.choose(request([doc] * 64), workers).chosen for doc in range(64)]
    assert again == chosen
    assert policy.choose(request([5] * 64), workers).cold


def test_cold_prefix_skips_a_worker_over_the_load_cap():
    req = request([7] * 64)
    idle = views({}, {}, {}, {})
    order = [v.worker_id for v in rendezvous_order(req.key, idle, 64)]
    assert make_policy().choose(req, idle).ranked[0] == order[0]
    # 3 active requests in all: cap = ceil(1.25 * 4 / 4) = 2; the hash's first pick has 3.
    loaded = [WorkerView(w, num_in_flight_requests=3 if w == order[0] else 0) for w in ("w0", "w1", "w2", "w3")]
    decision = make_policy().choose(req, loaded)
    assert decision.chosen == order[1] and decision.cold
    assert decision.ranked[-1] == order[0]


def test_round_robin_cycles_through_the_workers_in_order():
    policy = make_policy("round_robin")
    workers = views({}, {}, {})
    chosen = [policy.choose(request(), workers).chosen for _ in range(5)]
    assert chosen == ["w0", "w1", "w2", "w0", "w1"]
    assert policy.choose(request(), workers).ranked == ("w2", "w0", "w1")


def test_least_load_ignores_matches():
    workers = views({"num_matched_tokens": 900, "num_requests_running": 3}, {"num_requests_running": 1},
                    {"num_requests_running": 2})
    assert make_policy("least_load").choose(request(), workers).ranked == ("w1", "w2", "w0")


def test_consistent_hash_sticks_to_the_prefix_and_respects_the_cap():
    policy = make_policy("consistent_hash", {"hash_prefix_tokens": 16})
    workers = views({}, {}, {})
    first = policy.choose(request([3] * 16 + [1] * 50), workers).chosen
    assert policy.choose(request([3] * 16 + [2] * 80), workers).chosen == first
    loaded = [WorkerView(v.worker_id, num_requests_running=5 if v.worker_id == first else 0) for v in workers]
    assert policy.choose(request([3] * 16), loaded).chosen != first


def test_random_is_a_permutation_and_repeatable_with_a_seed():
    workers = views({}, {}, {}, {})
    a = [RandomPolicy(seed=3).choose(request(), workers).ranked for _ in range(3)]
    b = [RandomPolicy(seed=3).choose(request(), workers).ranked for _ in range(3)]
    assert a == b and all(sorted(r) == ["w0", "w1", "w2", "w3"] for r in a)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_ranks_each_worker_once_and_refuses_none(name):
    policy = make_policy(name)
    workers = views({"num_matched_tokens": 10}, {"num_waiting_tokens": 7}, {})
    decision = policy.choose(request(), workers)
    assert sorted(decision.ranked) == ["w0", "w1", "w2"] and decision.policy == name
    assert [s.worker_id for s in decision.scores] == list(decision.ranked)
    with pytest.raises(NoWorkerError):
        policy.choose(request(), [])


def test_registry_errors_name_the_unknown_policy_or_weight():
    assert set(POLICIES) == {"cache_aware", "round_robin", "least_load", "consistent_hash", "random"}
    with pytest.raises(ValueError, match="'fastest'.*known: cache_aware"):
        make_policy("fastest")
    with pytest.raises(ValueError, match="policy.weights.speed: unknown"):
        make_policy("cache_aware", {"speed": 1.0})
    with pytest.raises(ValueError, match="policy.weights.load_cap_factor"):
        make_policy("cache_aware", {"load_cap_factor": 0.5})
    with pytest.raises(ValueError, match="policy.weights.kv_usage_cost"):
        PolicyWeights(kv_usage_cost=-1)
    assert make_policy("cache_aware", {"running_request_cost": 8}).weights.running_request_cost == 8


def test_a_long_match_stays_on_its_owner_under_the_cap_even_when_the_cost_says_move():
    # w0 holds 800 of 1000 tokens but has 4,000 tokens queued: cost 200 + 1000 vs 1000.
    workers = views({"num_matched_tokens": 800, "num_waiting_tokens": 4000, "num_in_flight_requests": 2},
                    {"num_matched_tokens": 100, "num_in_flight_requests": 2})
    assert make_policy("cache_aware", {"owner_load_cap_factor": 0, "owner_wait_share": 0}
                       ).choose(request(), workers).chosen == "w1"
    assert make_policy("cache_aware", {"owner_wait_share": 0}).choose(request(), workers).ranked == ("w0", "w1")


def test_owners_at_the_cap_go_by_cost_which_may_replicate():
    # 12 active + 1 over 3 workers at factor 1.1: cap ceil(4.77) = 5, and w0 runs 5;
    # at the default 1.5 the cap is ceil(6.5) = 7 and w0 keeps it.
    workers = views({"num_matched_tokens": 900, "num_in_flight_requests": 5, "num_waiting_tokens": 4000},
                    {"num_matched_tokens": 100, "num_in_flight_requests": 4},
                    {"num_matched_tokens": 100, "num_in_flight_requests": 3})
    tight = make_policy("cache_aware", {"owner_load_cap_factor": 1.1, "owner_wait_share": 0})
    assert tight.choose(request(), workers).ranked == ("w2", "w1", "w0")
    assert make_policy("cache_aware", {"owner_wait_share": 0}).choose(request(), workers).chosen == "w0"


def test_a_short_match_is_not_sticky():
    workers = views({"num_matched_tokens": 400, "num_waiting_tokens": 4000}, {"num_matched_tokens": 100})
    assert make_policy().choose(request(), workers).chosen == "w1"


def test_owner_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="policy.weights.owner_load_cap_factor"):
        make_policy("cache_aware", {"owner_load_cap_factor": 0.5})


def test_an_owner_whose_prefill_queue_outweighs_its_match_loses_stickiness():
    # w0 holds 800 tokens and is under the count cap. This router sent it 1,800 tokens
    # still to prefill, more than the least queued worker's (w1: 100) + 2 x the 800 it
    # saves, so the cost decides (w1: 900 + 100 < w0: 200 + 1800); without the wait
    # bound (share 0) the count cap alone keeps it on w0.
    workers = views({"num_matched_tokens": 800, "num_in_flight_prompt_tokens": 1800, "num_in_flight_requests": 2},
                    {"num_matched_tokens": 100, "num_in_flight_prompt_tokens": 100, "num_in_flight_requests": 2})
    assert make_policy("cache_aware", {"owner_wait_share": 0}).choose(request(), workers).chosen == "w0"
    assert make_policy().choose(request(), workers).chosen == "w1"
    # 1,700 queued is within the default bound, not within share 1's (900).
    within = [workers[0]._replace(num_in_flight_prompt_tokens=1700), workers[1]]
    assert make_policy().choose(request(), within).chosen == "w0"
    assert make_policy("cache_aware", {"owner_wait_share": 1}).choose(request(), within).chosen == "w1"
    # The polled waiting tokens (whole prompts, cached prefix included) do not count.
    polled = [within[0]._replace(num_waiting_tokens=50_000), workers[1]]
    assert make_policy().choose(request(), polled).chosen == "w0"
    # The bound alone (no count cap) keeps stickiness on.
    alone = make_policy("cache_aware", {"owner_load_cap_factor": 0})
    assert alone.choose(request(), within).chosen == "w0"


def test_an_owner_computing_the_prefix_keeps_the_request_at_low_load():
    # The cold case: 16 workers, one request active (w0 prefilling a 3,200-token
    # document), so the owner cap is 1 and w0 is over it. The next request shares the
    # document: w0's match is the routed, not yet stored document, and its 3,200
    # in-flight tokens are that same prefill, no queue in front. Charged as a queue,
    # w0 cost 64 + 3,200 + 48 against 3,264 on an idle worker and lost the document.
    computing = {"num_matched_tokens": 3200, "num_matched_routed_tokens": 3200,
                 "num_in_flight_prompt_tokens": 3200, "num_in_flight_requests": 1,
                 "num_in_flight_context_tokens": 3200 * 1600}
    workers = views(computing, *({} for _ in range(15)))
    assert make_policy().choose(request(num_prompt_tokens=3264), workers).chosen == "w0"
    # A stored match with another prefill in flight is a queue: 3,200 tokens ahead.
    stored = [workers[0]._replace(num_matched_routed_tokens=0), *workers[1:]]
    assert make_policy().choose(request(num_prompt_tokens=3264), stored).chosen != "w0"


@settings(max_examples=300, deadline=None)
@given(prefix=st.integers(16, 8000), suffix=st.integers(1, 500),
       ahead=st.integers(0, 20_000), owner_running=st.integers(0, 8),
       other_queued=st.integers(0, 20_000), other_running=st.integers(0, 8),
       num_others=st.integers(1, 6), sticky=st.booleans())
def test_the_cost_never_recomputes_a_prefix_its_owner_is_computing_unless_its_queue_is_longer(
        prefix, suffix, ahead, owner_running, other_queued, other_running, num_others, sticky):
    """Brute force over the owner's load ahead of its in-flight prefill of the request's
    prefix and the others' loads: whenever what waits on the owner ahead of that
    prefill (queued tokens and running requests, weighted) is less than what a recompute
    costs elsewhere (the prefix plus that worker's own load), the owner ranks first."""
    weights = PolicyWeights() if sticky else PolicyWeights(owner_load_cap_factor=0,
                                                           owner_wait_share=0)
    owner = WorkerView("owner", num_matched_tokens=prefix, num_matched_routed_tokens=prefix,
                       num_in_flight_prompt_tokens=ahead + prefix,
                       num_in_flight_requests=owner_running + 1)
    others = [WorkerView(f"w{i}", num_in_flight_prompt_tokens=other_queued,
                         num_in_flight_requests=other_running) for i in range(num_others)]
    owner_ahead = weights.queued_token_cost * ahead + weights.running_request_cost * (owner_running + 1)
    recompute = (weights.prefill_cost_per_token * prefix + weights.queued_token_cost * other_queued
                 + weights.running_request_cost * other_running)
    decision = make_policy("cache_aware", asdict(weights)).choose(
        request(num_prompt_tokens=prefix + suffix), [*others, owner])
    if owner_ahead < recompute:
        assert decision.chosen == "owner"


def test_a_queued_suffix_deep_in_a_long_context_weighs_more_than_a_shallow_one():
    """Two workers, each with 600 of this router's tokens waiting for prefill: on w0
    the tail of a 25,000-token prompt (a fork's branch after a long parent), on w1 the
    tail of a 1,000-token one. The deep tokens attend over 25x more context, so w0's
    queue is the longer (prefill_units), and a new request (sharing a system prompt
    with both, so not cold) goes to w1."""
    deep = {"num_matched_tokens": 16, "num_in_flight_requests": 1, "num_in_flight_prompt_tokens": 600,
            "num_in_flight_context_tokens": 600 * (25_000 - 300)}
    shallow = {"num_matched_tokens": 16, "num_in_flight_requests": 1, "num_in_flight_prompt_tokens": 600,
               "num_in_flight_context_tokens": 600 * (1_000 - 300)}
    decision = make_policy().choose(request(), views(deep, shallow))
    assert decision.chosen == "w1"
    assert decision.scores[1].load_cost - decision.scores[0].load_cost == pytest.approx(
        prefill_units(24_400, 25_000, CONTEXT) - prefill_units(400, 1_000, CONTEXT))


@settings(max_examples=200, deadline=None)
@given(start=st.integers(0, 100_000), num_tokens=st.integers(0, 20_000),
       context_cost=st.sampled_from([0.0, 1e-6, 3.4e-5, 1e-3]))
def test_prefill_units_sum_each_tokens_cost_at_its_position(start, num_tokens, context_cost):
    """Brute force: the tokens [start, end) cost 1 + context_cost * p each, p the
    middle of the token's position interval [p, p + 1)."""
    end = start + num_tokens
    expected = sum(1 + context_cost * (p + 0.5) for p in range(start, end))
    assert prefill_units(start, end, context_cost) == pytest.approx(expected, rel=1e-9, abs=1e-9)
