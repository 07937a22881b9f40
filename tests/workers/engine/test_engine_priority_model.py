"""Property test: random programs of requests with priorities, arrivals out of
queueing order, forks and aborts, on a tiny pool, checked after every step against a
brute-force model of the scheduling order.

The model knows each request's priority and arrival and sorts by brute force: a
sequence's place is (priority, arrival, sequence id). After every step:

- both queues are in that order (the structures never drift from a full sort);
- the sequences admitted this step are exactly the first ones of the waiting queue as
  it was before the step, sorted (no overtaking, FCFS when priorities are equal), and
  none is admitted in a step that preempted a running sequence;
- every running sequence preempted this step was the last of the running ones in
  that order, less those preempted before it (vLLM's priority victim), so a waiting
  request never preempts a running one;
- the KV manager's invariants hold (free + cached + in use = total) and nothing stalls.

At teardown every request not aborted finishes in bounded steps with all its tokens,
and no block is left in use.
"""

from __future__ import annotations

from dataclasses import dataclass

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radix.cost_model import CostModel
from tests.workers.engine.engine_support import Result, collect, make_engine, prompt, request
from workers.engine.sequence import Sequence, SequenceStatus

COST = CostModel(a=0.004, b=3e-5, c=1e-9, d=0.007, e=2e-5, f=5e-8)
NUM_BLOCKS = 10  # 160 tokens: one request of up to 2 x 80 fits alone, three rarely do
MAX_DRAIN_STEPS = 2_000


@dataclass(frozen=True)
class Spec:
    """What the model knows of one request."""

    priority: int
    arrival: float
    n: int
    max_tokens: int


class PriorityScheduling(RuleBasedStateMachine):
    """Requests, aborts and steps on a timed engine (no model compute)."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = make_engine(num_blocks=NUM_BLOCKS, max_batched_tokens=48, max_num_seqs=4,
                                  timed=COST, sleep=lambda _: None)
        self.specs: dict[int, Spec] = {}
        self.aborted: set[int] = set()
        self.results: dict[int, Result] = {}

    def place(self, seq: Sequence) -> tuple[int, float, int]:
        """The brute-force model's key of ``seq``."""
        spec = self.specs[seq.request.request_id]
        return spec.priority, spec.arrival, seq.seq_id

    @rule(priority=st.sampled_from((0, 0, -1, 2, 2**31 - 1)),
          arrival=st.integers(0, 40), salt=st.integers(0, 3), length=st.integers(1, 60),
          max_tokens=st.integers(1, 20), n=st.sampled_from((1, 1, 2)))
    def add(self, priority: int, arrival: int, salt: int, length: int, max_tokens: int,
            n: int) -> None:
        request_id = len(self.specs)
        self.specs[request_id] = Spec(priority, float(arrival), n, max_tokens)
        self.engine.add_request(request_id, request(prompt(length, salt=salt), max_tokens,
                                                    n=n, priority=priority), float(arrival))

    @precondition(lambda self: self.engine.has_work())
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        live = [request_id for request_id in self.specs if request_id not in self.aborted
                and (request_id not in self.results or self.results[request_id].usage is None)]
        request_id = data.draw(st.sampled_from(live))
        self.engine.abort_request(request_id)
        self.aborted.add(request_id)

    @precondition(lambda self: self.engine.has_work())
    @rule()
    def step(self) -> None:
        scheduler = self.engine.scheduler
        waiting, running = list(scheduler.waiting), list(scheduler.running)
        collect(self.engine.step(), self.results)
        waiting_after = set(scheduler.waiting)
        admitted = [seq for seq in waiting if seq not in waiting_after]
        assert admitted == sorted(waiting, key=self.place)[: len(admitted)]
        preempted = [seq for seq in running if seq.status is SequenceStatus.WAITING]
        assert not (preempted and admitted), "admission in a step that preempted"
        for victim in preempted:
            later = {seq for seq in running if self.place(seq) > self.place(victim)}
            assert later <= set(preempted), "a victim that was not the last in order"

    @invariant()
    def queues_are_in_order_and_the_cache_adds_up(self) -> None:
        scheduler = self.engine.scheduler
        for queue in (scheduler.waiting, scheduler.running):
            assert list(queue) == sorted(queue, key=self.place)
        self.engine.manager.check_invariants()
        assert scheduler.num_stalls == 0

    def teardown(self) -> None:
        for _ in range(MAX_DRAIN_STEPS):
            if not self.engine.has_work():
                break
            self.step()
            self.queues_are_in_order_and_the_cache_adds_up()
        assert not self.engine.has_work(), "requests did not finish in bounded steps"
        assert self.engine.manager.stats().num_used_blocks == 0
        for request_id, spec in self.specs.items():
            if request_id not in self.aborted:
                tokens = self.results[request_id].token_ids
                assert sorted(tokens) == list(range(spec.n))
                assert all(len(ids) == spec.max_tokens for ids in tokens.values())


PriorityScheduling.TestCase.settings = settings(
    max_examples=40, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_priority_scheduling_matches_the_brute_force_model = PriorityScheduling.TestCase
