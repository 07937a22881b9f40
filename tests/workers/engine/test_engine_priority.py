"""Priority scheduling, exactly: admission by (priority, arrival), first come first
served when priorities are equal, the lowest-priority latest sequence preempted first,
and a waiting request never preempting a running one."""

from __future__ import annotations

from tests.workers.engine.engine_support import (
    Result,
    collect,
    make_engine,
    prompt,
    request,
    run,
)
from workers.engine.engine import Engine


def order_of_first_runs(engine: Engine) -> list[int]:
    """Step ``engine`` until it is idle; the request ids in the order each first ran."""
    order: list[int] = []
    for _ in range(1_000):
        if not engine.has_work():
            return order
        engine.step()
        engine.manager.check_invariants()
        for seq in engine.scheduler.running:
            if seq.request.request_id not in order:
                order.append(seq.request.request_id)
    raise AssertionError("requests did not finish")


def one_at_a_time(priorities: list[int], arrivals: list[float] | None = None) -> list[int]:
    """Admission order of requests with ``priorities`` (and ``arrivals``, default the
    order they are added in) on an engine that runs one sequence at a time."""
    engine = make_engine(max_num_seqs=1)
    for request_id, priority in enumerate(priorities):
        arrival = None if arrivals is None else arrivals[request_id]
        engine.add_request(request_id, request(prompt(20, salt=request_id), max_tokens=2,
                                               priority=priority), arrival)
    return order_of_first_runs(engine)


def test_equal_priorities_are_admitted_first_come_first_served():
    assert one_at_a_time([0, 0, 0, 0, 0]) == [0, 1, 2, 3, 4]
    assert one_at_a_time([7, 7, 7]) == [0, 1, 2]


def test_lower_priority_values_are_admitted_first_then_by_arrival():
    assert one_at_a_time([0, -1, 1, -1, 0]) == [1, 3, 0, 4, 2]


def test_arrival_time_not_queueing_order_breaks_a_priority_tie():
    assert one_at_a_time([0, 0, 0], arrivals=[3.0, 1.0, 2.0]) == [1, 2, 0]
    assert one_at_a_time([1, 0, 0], arrivals=[1.0, 3.0, 2.0]) == [2, 1, 0]


def test_a_waiting_higher_priority_request_never_preempts_a_running_one():
    engine = make_engine(max_num_seqs=1)
    engine.add_request(0, request(prompt(20), max_tokens=6, priority=5))
    engine.step()
    engine.add_request(1, request(prompt(20, salt=1), max_tokens=2, priority=5))
    engine.add_request(2, request(prompt(20, salt=2), max_tokens=2, priority=-5))
    assert order_of_first_runs(engine) == [0, 2, 1]
    assert engine.scheduler.num_preemptions == 0


def test_a_waiting_request_that_does_not_fit_waits_whatever_its_priority():
    engine = make_engine(num_blocks=6)
    results: dict[int, Result] = {}
    engine.add_request(0, request(prompt(60), max_tokens=8, priority=9))  # 4 blocks, then 5
    collect(engine.step(), results)
    engine.add_request(1, request(prompt(40, salt=1), max_tokens=2, priority=-9))  # 3 blocks
    collect(engine.step(), results)
    assert [s.request.request_id for s in engine.scheduler.running] == [0]
    assert [s.request.request_id for s in engine.scheduler.waiting] == [1]
    results = run(engine, {}, results)
    assert engine.scheduler.num_preemptions == 0
    assert [len(results[i].token_ids[0]) for i in (0, 1)] == [8, 2]


def two_growing(priorities: tuple[int, int]) -> tuple[Engine, dict[int, Result]]:
    """Requests 0 (a 30-token prompt) and 1 (20 tokens) with ``priorities`` on a
    5-block pool, stepped until the first preemption: both hold 2 blocks, 0 takes
    the last free one at position 32 first, 1 needs one at 32 ten steps later."""
    engine = make_engine(num_blocks=5)
    engine.add_request(0, request(prompt(30), max_tokens=40, priority=priorities[0]))
    engine.add_request(1, request(prompt(20, salt=1), max_tokens=40, priority=priorities[1]))
    results: dict[int, Result] = {}
    while engine.scheduler.num_preemptions == 0:
        collect(engine.step(), results)
        engine.manager.check_invariants()
    return engine, results


def test_the_lower_priority_sequence_is_preempted_even_when_it_is_older():
    engine, results = two_growing((1, 0))
    assert [s.request.request_id for s in engine.scheduler.waiting] == [0]
    assert [s.request.request_id for s in engine.scheduler.running] == [1]
    reference = run(make_engine(), {0: request(prompt(30), max_tokens=40),
                                    1: request(prompt(20, salt=1), max_tokens=40)})
    results = run(engine, {}, results)
    assert {i: results[i].token_ids for i in (0, 1)} == {i: reference[i].token_ids for i in (0, 1)}


def test_with_equal_priorities_the_latest_arrival_is_preempted():
    engine, _ = two_growing((0, 0))
    assert [s.request.request_id for s in engine.scheduler.waiting] == [1]
    assert [s.request.request_id for s in engine.scheduler.running] == [0]


def test_a_preempted_sequence_waits_at_its_place_in_the_order():
    engine, _ = two_growing((1, 0))  # request 0 (priority 1) is waiting again
    engine.add_request(2, request(prompt(8, salt=2), max_tokens=1, priority=0), 0.0)
    engine.add_request(3, request(prompt(8, salt=3), max_tokens=1, priority=2), 0.0)
    assert [s.request.request_id for s in engine.scheduler.waiting] == [2, 0, 3]
