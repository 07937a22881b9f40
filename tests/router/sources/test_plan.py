"""The source planner against a brute-force model: for any holdings, peers and costs,
the plan picks the peer a full enumeration picks (the largest predicted saving among
pulls of at least the crossover that beat their recompute), its spans cover the prompt
exactly, and no plan ever breaks the planner's rules (``check_plan``). Plus the costs'
arithmetic on the timed profile and what a worker's report parses to."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radix.cost_model import get_profile
from radix.kv_sources import SourceCosts
from router.sources.plan import (
    JOIN,
    LOCAL,
    PULL,
    RECOMPUTE,
    RESTORE,
    Holding,
    Peer,
    PullRules,
    check_plan,
    plan_sources,
)
from router.sources.planned import PeerLinks, Pending, PendingPulls

B = 16
PROFILE = get_profile("llama3-8b-h100")
TIMED = SourceCosts(131072, 2048, PROFILE.cost.b, PROFILE.link_bytes_per_s,
                    PROFILE.h2d_bytes_per_s, PROFILE.cost, 1.0)
CPU = SourceCosts(1024, 512, 1e-4, 1e8, 1e9)


def brute_force(holding: Holding, peers: list[Peer], num_prompt: int, num_public: int,
                costs: SourceCosts, rules: PullRules) -> tuple[str | None, int]:
    """(the best peer, its span) by enumerating every peer; (None, 0) without one."""
    reusable = (num_prompt - 1) // B * B
    local = min(holding.device, reusable) // B * B
    own = max(local, min(holding.any_tier, reusable) // B * B)
    if local < num_public:
        return None, 0
    options = []
    for peer in peers:
        end = min(peer.num_tokens, reusable) // B * B
        span = end - own
        if span < rules.min_pull_tokens:
            continue
        if peer.joins:
            pull_s = rules.overhead_s + peer.wait_s
        else:  # the bytes leave the peer after its wait, and none before it has them
            last_sent_s = peer.wait_s + max(costs.transfer_s(span), peer.costs.transfer_s(span))
            pull_s = rules.overhead_s + max(peer.arrives_s, last_sent_s)
        saving = costs.recompute_s(own, end) - pull_s
        if saving > 0:
            options.append((saving, -peers.index(peer), peer.worker_id, span))
    if not options:
        return None, 0
    _, _, worker_id, span = max(options)
    return worker_id, span


@st.composite
def cases(draw):
    num_prompt = draw(st.integers(1, 6000))
    device = draw(st.integers(0, num_prompt))
    holding = Holding(device, draw(st.integers(device, num_prompt + 100)))
    costs = draw(st.sampled_from([TIMED, CPU]))
    peers = [Peer(f"p{i}", draw(st.integers(0, num_prompt + 100)),
                  draw(st.floats(0, 0.5)), draw(st.sampled_from([TIMED, CPU])),
                  joins=draw(st.booleans()), arrives_s=draw(st.floats(0, 0.5)))
             for i in range(draw(st.integers(0, 4)))]
    rules = PullRules(draw(st.integers(1, 1024)), draw(st.floats(0, 0.05)))
    num_public = draw(st.integers(0, num_prompt)) // B * B
    return holding, peers, num_prompt, num_public, costs, rules


@settings(max_examples=400, deadline=None)
@given(cases())
def test_the_plan_is_the_brute_force_choice_and_never_breaks_its_rules(case):
    holding, peers, num_prompt, num_public, costs, rules = case
    plan = plan_sources(holding, peers, num_prompt, num_public, B, costs, rules)
    assert (plan.peer, plan.num_pulled_tokens) == brute_force(*case)
    assert check_plan(plan, rules) is None
    assert (plan.num_local_tokens + plan.num_restored_tokens + plan.num_pulled_tokens
            + plan.num_recomputed_tokens) == num_prompt
    assert plan.num_recomputed_tokens >= 1  # the last token is always computed
    if plan.peer is not None:
        assert plan.source in (PULL, JOIN) and plan.num_pulled_tokens >= rules.min_pull_tokens
        assert plan.pull_s < plan.recompute_s
        assert plan.num_local_tokens >= num_public
        own = plan.num_local_tokens + plan.num_restored_tokens
        assert own < plan.credited_tokens() <= plan.num_cached_tokens  # equal: a join, no wait


def test_each_source_is_named_for_what_the_worker_must_do():
    rules = PullRules(256, 0.004)
    cases = {
        LOCAL: (Holding(4096, 4096), []),
        RESTORE: (Holding(1024, 4096), []),
        RECOMPUTE: (Holding(1024, 1024), [Peer("p", 1024 + 128, 0.0, TIMED)]),  # < 256
        PULL: (Holding(0, 0), [Peer("p", 4096, 0.0, TIMED)]),
        JOIN: (Holding(0, 0), [Peer("p", 4096, 0.0, TIMED), Peer("p", 4096, 0.0, TIMED,
                                                                  joins=True)]),
    }
    for source, (holding, peers) in cases.items():
        plan = plan_sources(holding, peers, 4100, 0, B, TIMED, rules)
        assert plan.source == source, (source, plan)
    busy = plan_sources(Holding(0, 0), [Peer("p", 4096, 10.0, TIMED)], 4100, 0, B, TIMED, rules)
    assert busy.source == RECOMPUTE  # a peer that long busy is slower than recomputing


def test_a_pull_that_would_be_slower_is_never_planned_however_long():
    slow_link = SourceCosts(131072, 2048, PROFILE.cost.b, 1e6, 1e9, PROFILE.cost, 1.0)
    plan = plan_sources(Holding(0, 0), [Peer("p", 8000, 0.0, slow_link)], 8001, 0, B, TIMED,
                        PullRules(16, 0.0))
    assert plan.peer is None


def test_timed_costs_follow_the_profile_in_chunks_and_scale():
    costs = TIMED
    expected = (PROFILE.cost.prefill_chunk_s(2048, 2048)
                + PROFILE.cost.prefill_chunk_s(952, 3000))
    assert costs.recompute_s(0, 3000) == pytest.approx(expected)
    assert costs.transfer_s(1000) == pytest.approx(1000 * 131072 / 50e9)
    scaled = SourceCosts(131072, 2048, 0.0, 50e9, 50e9, PROFILE.cost, 20.0)
    assert scaled.recompute_s(0, 3000) == pytest.approx(20 * expected)
    assert scaled.transfer_s(1000) == pytest.approx(20 * 1000 * 131072 / 50e9)
    assert CPU.recompute_s(100, 300) == pytest.approx(200 * 1e-4)
    assert costs.step_s(0, 0, 20000) == 0.0  # an idle worker's thread answers at once
    assert costs.step_s(0, 5000, 4000) == pytest.approx(PROFILE.cost.prefill_chunk_s(2048, 4000))
    assert costs.step_s(10, 0, 20000) == pytest.approx(PROFILE.cost.decode_step_s(10, 200000))
    assert CPU.step_s(3, 100, 999) == pytest.approx(103 * 1e-4)


def test_a_report_parses_with_the_routers_defaults_for_what_it_leaves_out():
    defaults = {"prefill_s_per_token": 3e-4, "link_bytes_per_s": 1e8,
                "restore_bytes_per_s": 2e9}
    real = SourceCosts.parse({"kv_bytes_per_token": 1024, "max_batched_tokens": 512}, defaults)
    assert real == SourceCosts(1024, 512, 3e-4, 1e8, 2e9)
    assert SourceCosts.parse(TIMED.to_dict(with_rates=True), defaults) == TIMED
    for bad in ({"kv_bytes_per_token": 0, "max_batched_tokens": 512},
                {"kv_bytes_per_token": 1024, "max_batched_tokens": 1.5},
                {"kv_bytes_per_token": 1024, "max_batched_tokens": 512, "prefill": [1]},
                {"kv_bytes_per_token": 1024, "max_batched_tokens": 512,
                 "prefill": {"a": -1, "b": 0, "c": 0, "d": 0, "e": 0, "f": 0}}):
        with pytest.raises(ValueError, match="kv_transfer.costs"):
            SourceCosts.parse(bad, defaults)


def test_peer_links_queue_planned_pulls_one_after_another():
    now = [100.0]
    links = PeerLinks(lambda: now[0])
    assert links.wait_s("a") == 0.0
    links.reserve("a", 0.3)
    links.reserve("a", 0.2)
    assert links.wait_s("a") == pytest.approx(0.5) and links.wait_s("b") == 0.0
    now[0] += 0.4
    assert links.wait_s("a") == pytest.approx(0.1)
    now[0] += 1.0
    links.reserve("a", 0.2)  # an idle link starts now, not where it last ended
    assert links.wait_s("a") == pytest.approx(0.2)


def test_pending_pulls_offer_a_prefix_on_its_way_until_their_grace_ends():
    now = [10.0]
    pending = PendingPulls(5.0, lambda: now[0])
    parent = b"p" * 64
    pending.add(Pending("w2", "ns", "alice", parent, 11.0, "w1"))
    assert [p.worker_id for p in pending.holders("ns", "alice", parent + b"task")] == ["w2"]
    assert pending.holders("ns", "bob", parent + b"task") == []  # another scope
    assert pending.holders("other", "alice", parent) == []
    assert pending.holders("ns", "alice", b"q" * 64) == []  # not a prefix of it
    now[0] = 16.5  # past ready_at + grace
    assert pending.holders("ns", "alice", parent) == []
    late = Pending("w3", "ns", "alice", parent, 17.0, "w1")
    pending.add(late)
    pending.discard(late)  # its hold failed: nothing is on its way
    pending.discard(late)
    assert pending.holders("ns", "alice", parent) == []


def test_joining_a_pull_on_its_way_costs_its_wait_and_no_link_time():
    rules = PullRules(256, 0.004)
    peer = Peer("p", 4096, 0.05, TIMED)
    joined = plan_sources(Holding(0, 0), [peer, replace(peer, joins=True)], 4100, 0, B,
                          TIMED, rules)
    pulled = plan_sources(Holding(0, 0), [peer], 4100, 0, B, TIMED, rules)
    assert (joined.source, joined.peer, joined.num_pulled_tokens) == (JOIN, "p", 4096)
    assert joined.pull_s == pytest.approx(0.054)
    assert pulled.pull_s == pytest.approx(0.054 + TIMED.transfer_s(4096))


def test_a_relayed_pull_ends_when_the_blocks_reach_the_peer_or_its_link_is_done():
    rules = PullRules(256, 0.004)
    transfer_s = TIMED.transfer_s(4096)
    for arrives_s, expected in ((0.0, 0.054 + transfer_s), (0.02, 0.054 + transfer_s),
                                (0.05 + 3 * transfer_s, 0.054 + 3 * transfer_s)):
        relaying = Peer("p", 4096, 0.05, TIMED, arrives_s=arrives_s)
        plan = plan_sources(Holding(0, 0), [relaying], 4100, 0, B, TIMED, rules)
        assert plan.pull_s == pytest.approx(expected)
