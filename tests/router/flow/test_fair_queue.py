"""``FairQueue`` against a brute-force model (hypothesis), and its fairness bound."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from router.flow.fair_queue import FairQueue

FLOWS = ("a", "b", "c")
WEIGHTS = {"a": 1.0, "b": 2.0, "c": 0.5}


@dataclass
class _Item:
    """The model's copy of one queued request."""

    ident: int
    band: int
    flow: str
    start: float
    finish: float
    enqueued_at: float


class _Model:
    """Start-time fair queueing per band with aging, by linear scans and sorts."""

    def __init__(self, num_bands: int, aging_s: float | None) -> None:
        self.virtual = [0.0] * num_bands
        self.finish: list[dict[str, float]] = [{} for _ in range(num_bands)]
        self.items: list[_Item] = []
        self.aging_s = aging_s
        self.elsewhere: dict[str, float] = {}

    def push(self, ident: int, band: int, flow: str, cost: float, now: float) -> None:
        start = max(self.virtual[band] + self.elsewhere.get(flow, 0.0),
                    self.finish[band].get(flow, 0.0))
        finish = start + cost / WEIGHTS[flow]
        self.finish[band][flow] = finish
        self.items.append(_Item(ident, band, flow, start, finish, now))

    def remove(self, item: _Item, dispatched: bool) -> None:
        self.items.remove(item)
        if dispatched:
            self.virtual[item.band] = max(self.virtual[item.band], item.start)
        elif self.finish[item.band].get(item.flow) == item.finish:
            self.finish[item.band][item.flow] = item.start
        if not any(i.band == item.band for i in self.items):
            v = self.virtual[item.band]
            self.finish[item.band] = {f: t for f, t in self.finish[item.band].items() if t > v}

    def band_rank(self, band: int, now: float) -> tuple:
        """A band's place: its level after aging (from its oldest request), promoted
        bands before native ones, the one whose oldest waited longest first."""
        oldest = min(i.enqueued_at for i in self.items if i.band == band)
        if self.aging_s is None or now - oldest < self.aging_s or band == 0:
            return (band, 1, 0.0, band)
        return (max(0, band - int((now - oldest) // self.aging_s)), 0, oldest, band)

    def order(self, now: float) -> list[_Item]:
        return sorted(self.items,
                      key=lambda i: (self.band_rank(i.band, now), i.start, i.ident))


operation = st.one_of(
    st.tuples(st.just("push"), st.integers(0, 2), st.sampled_from(FLOWS), st.integers(1, 50)),
    st.tuples(st.just("dispatch"), st.integers(0, 3)),
    st.tuples(st.just("cancel"), st.integers(0, 100)),
    st.tuples(st.just("wait"), st.floats(0.0, 4.0)),
    st.tuples(st.just("elsewhere"), st.dictionaries(st.sampled_from(FLOWS), st.integers(0, 80))),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(operation, max_size=80), st.sampled_from([None, 3.0]))
def test_the_queue_serves_in_the_models_order(operations, aging_s) -> None:
    queue: FairQueue[int] = FairQueue(3, aging_s)
    model = _Model(3, aging_s)
    entries = {}
    now, next_ident = 0.0, 0
    for op in operations:
        if op[0] == "push":
            _, band, flow, cost = op
            entries[next_ident] = queue.push(next_ident, band, flow, cost, WEIGHTS[flow], now,
                                             model.elsewhere)
            model.push(next_ident, band, flow, cost, now)
            next_ident += 1
        elif op[0] == "dispatch" and model.items:
            item = model.order(now)[min(op[1], len(model.items) - 1)]
            queue.remove(entries[item.ident], dispatched=True)
            model.remove(item, dispatched=True)
        elif op[0] == "cancel" and model.items:
            item = model.items[op[1] % len(model.items)]
            queue.remove(entries[item.ident], dispatched=False)
            model.remove(item, dispatched=False)
        elif op[0] == "wait":
            now += op[1]
        elif op[0] == "elsewhere":
            model.elsewhere = {flow: float(total) for flow, total in op[1].items()}
        assert [e.item for e in queue.in_order(now)] == [i.ident for i in model.order(now)]
        assert len(queue) == len(model.items)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(FLOWS), st.integers(1, 40)), min_size=30,
                max_size=120))
def test_backlogged_flows_get_their_weighted_share_within_one_request(requests) -> None:
    """Start-time fair queueing's bound: while two flows stay backlogged, the weighted
    tokens each was served differ by at most one request of each (its cost / weight)."""
    queue: FairQueue[tuple[str, int]] = FairQueue(1, None)
    for flow, cost in requests:
        queue.push((flow, cost), 0, flow, cost, WEIGHTS[flow], 0.0)
    left = {f: sum(c for g, c in requests if g == f) for f in FLOWS}
    biggest = {f: max([c for g, c in requests if g == f], default=0) / WEIGHTS[f]
               for f in FLOWS}
    served = dict.fromkeys(FLOWS, 0.0)
    while len(queue):
        entry = next(queue.in_order(0.0))
        queue.remove(entry, dispatched=True)
        flow, cost = entry.item
        served[flow] += cost / WEIGHTS[flow]
        left[flow] -= cost
        busy = [f for f in FLOWS if left[f] > 0]
        for f in busy:
            for g in busy:
                assert served[f] - served[g] <= biggest[f] + biggest[g] + 1e-9


def test_a_flow_served_by_other_routers_waits_here_behind_one_that_was_not() -> None:
    """Served elsewhere 100 weighted tokens, flow a goes after b has been served about
    as much here; alone, it goes at once."""
    queue: FairQueue[str] = FairQueue(1, None)
    elsewhere = {"a": 100.0}
    for i in range(20):
        queue.push(f"a{i}", 0, "a", 10, 1.0, 0.0, elsewhere)
        queue.push(f"b{i}", 0, "b", 10, 1.0, 0.0, elsewhere)
    order = []
    while len(queue):
        entry = next(queue.in_order(0.0))
        queue.remove(entry, dispatched=True)
        order.append(entry.item)
    assert order[:10] == [f"b{i}" for i in range(10)]
    assert sorted(order[10:12]) == ["a0", "b10"]
    alone: FairQueue[str] = FairQueue(1, None)
    alone.push("a", 0, "a", 10, 1.0, 0.0, elsewhere)
    assert next(alone.in_order(0.0)).item == "a"


def test_bands_go_in_order_and_aging_lifts_a_band_whose_oldest_waited() -> None:
    queue: FairQueue[str] = FairQueue(3, aging_s=10.0)
    queue.push("batch", 2, "a", 1, 1.0, now=0.0)
    queue.push("standard", 1, "a", 1, 1.0, now=5.0)
    queue.push("interactive", 0, "b", 1, 1.0, now=6.0)
    assert [e.item for e in queue.in_order(6.0)] == ["interactive", "standard", "batch"]
    assert [e.item for e in queue.in_order(10.0)] == ["interactive", "batch", "standard"]
    assert [e.item for e in queue.in_order(20.0)] == ["batch", "standard", "interactive"]


def test_aging_keeps_a_bands_fair_order_so_a_floods_old_requests_pass_no_one() -> None:
    """Under overload every queued request is old. A flood queued 20 s ago and one
    request of another flow queued since: once the band is promoted, the newcomer still
    goes second (its start tag is the band's virtual time), not after the flood."""
    queue: FairQueue[str] = FairQueue(3, aging_s=10.0)
    for i in range(6):
        queue.push(f"flood{i}", 1, "a", 10, 1.0, now=0.0)
    queue.push("victim", 1, "b", 10, 1.0, now=1.0)
    queue.push("interactive", 0, "c", 10, 1.0, now=19.0)
    order = [e.item for e in queue.in_order(20.0)]
    assert order[:3] == ["flood0", "victim", "flood1"]
    assert order[-1] == "interactive"
