"""How the router knows a worker's load (``router.fleet.load_state``): polled, pushed
plus what it sent since the frame, or unknown, which routes as a full batch and never
as idle. The rules against a brute-force model over random sequences of what can
happen to a worker, a cost-aware choice between an unknown and a busy worker, and a
worker that sends no load frames, polled as before."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from harness import instant_upstream
from radix.events import LoadReport
from radix.keys import to_key
from router.config import WorkerSpec
from router.fleet.load_state import POLLED, PUSHED, UNKNOWN, LoadState
from router.fleet.probes import WorkerLoad
from router.fleet.registry import WorkerRegistry
from router.fleet.worker_state import InFlight, WorkerState
from router.routing.load_cost import PolicyWeights, load_cost, prefill_units
from router.routing.policy import RouteRequest, make_policy
from tests.support.aio import eventually, running_router, serving
from tests.support.router_configs import make_config

MAX_RUNNING = 8


def worker(worker_id: str = "w0") -> WorkerState:
    url = f"http://{worker_id}"
    return WorkerState(WorkerSpec(worker_id, "demo", url=url), url, {})


def report(seq: int, running: int = 0, waiting: int = 0, tokens: int = 0, usage: float = 0.0
           ) -> LoadReport:
    return LoadReport(seq, running, waiting, tokens, usage, 4 * MAX_RUNNING, MAX_RUNNING)


@dataclass
class Model:
    """What routing should see, kept the simplest way."""

    pushes: bool = False
    known: bool = True  # False: pushing, and no frame since its stream opened or ended
    load: tuple[int, int, int, float] = (0, 0, 0, 0.0)
    bound: int = 0  # the last load's max_num_running (frames carry it, these polls not)
    seq: int | None = None
    sent: tuple[int, int] = (0, 0)

    def expected(self, in_flight: int) -> tuple[int, int, int, float]:
        running, waiting, tokens, usage = self.load
        if not self.pushes:
            return self.load
        waiting, tokens = waiting + self.sent[0], tokens + self.sent[1]
        if self.known:
            return running, waiting, tokens, usage
        return max(self.bound, running, in_flight), waiting, tokens, 1.0

    def source(self) -> str:
        return POLLED if not self.pushes else PUSHED if self.known else UNKNOWN


loads = st.tuples(st.integers(0, 20), st.integers(0, 20), st.integers(0, 5000),
                  st.floats(0.0, 1.0))
steps = st.one_of(
    st.tuples(st.just("poll"), loads),
    st.tuples(st.just("open"), st.booleans()),
    st.tuples(st.just("frame"), st.tuples(st.integers(0, 30), loads)),
    st.tuples(st.just("lost"), st.none()),
    st.tuples(st.just("stopped"), st.none()),
    st.tuples(st.just("send"), st.integers(0, 3000)),
)


def apply(state: LoadState, model: Model, kind: str, arg) -> None:
    """One thing happening to the worker, to both."""
    if kind == "poll":
        state.polled(WorkerLoad(*arg))
        if not model.pushes:
            model.load, model.bound, model.sent = arg, 0, (0, 0)
    elif kind == "open":
        state.stream_opened(arg)
        model.pushes, model.known, model.seq = arg, not arg, None
    elif kind == "frame":
        seq, load = arg
        state.pushed(report(seq, *load))
        if model.seq is None or seq >= model.seq:
            model.load, model.bound, model.seq = load, MAX_RUNNING, seq
            model.sent, model.known, model.pushes = (0, 0), True, True
    elif kind == "lost":
        state.lost()
        model.known = not model.pushes
    elif kind == "stopped":
        state.stopped()
        model.pushes, model.known = False, True
    else:
        state.sent(arg)
        model.sent = (model.sent[0] + 1, model.sent[1] + arg)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(steps, st.integers(0, 40)), max_size=40))
def test_routing_sees_the_load_the_rules_say(script) -> None:
    state, model = LoadState(), Model()
    for (kind, arg), in_flight in script:
        apply(state, model, kind, arg)
        assert state.measures(in_flight) == model.expected(in_flight)
        assert state.source == model.source()


def test_a_pushed_view_adds_what_was_sent_since_the_frame_and_the_next_frame_replaces_it() -> None:
    w = worker()
    w.load_state.stream_opened(pushes=True)
    w.load_state.pushed(report(1, running=2, waiting=1, tokens=300))
    WorkerRegistry.begin(w, 500, 500)
    WorkerRegistry.begin(w, 100, 100)
    view = w.view(0, 0, None, 0.0)
    assert (view.num_requests_running, view.num_requests_waiting, view.num_waiting_tokens,
            view.num_in_flight_prompt_tokens) == (2, 3, 300, 600)
    placeholder = InFlight(w, 700, 700)  # a request still being decided is not sent yet
    view = w.view(0, 0, None, 0.0)
    assert (view.num_requests_waiting, view.num_waiting_tokens,
            view.num_in_flight_prompt_tokens) == (3, 300, 1300)
    placeholder.end()
    w.load_state.pushed(report(2, running=4, waiting=0, tokens=0))
    view = w.view(0, 0, None, 0.0)
    assert (view.num_requests_running, view.num_requests_waiting, view.num_waiting_tokens) == (4, 0, 0)
    w.load_state.pushed(report(1, running=9))  # an older frame changes nothing
    assert w.view(0, 0, None, 0.0).num_requests_running == 4
    w.load = WorkerLoad(num_requests_running=30)  # a probe's load, while the worker pushes
    assert w.view(0, 0, None, 0.0).num_requests_running == 4


def test_the_routers_own_requests_in_a_frame_are_not_queued_twice() -> None:
    """A worker prefilling a 3,000-token document this router sent, with a second
    request for it waiting whole: its frame counts both prompts (the engine matches a
    prefix only at admission); the router counts their uncached parts in flight, and
    the view's waiting tokens are only what other routers queued there."""
    w = worker()
    w.load_state.stream_opened(pushes=True)
    first, second = WorkerRegistry.begin(w, 3000, 3000), WorkerRegistry.begin(w, 10, 3010)
    w.load_state.pushed(report(1, running=1, waiting=1, tokens=3000 + 3010))
    view = w.view(3000, 3000, None, 0.0)
    assert (view.num_waiting_tokens, view.num_in_flight_prompt_tokens) == (0, 3010)
    # the second's 10 uncached tokens, at positions 3,000-3,009
    assert load_cost(view, PolicyWeights(running_request_cost=0)) == pytest.approx(
        prefill_units(3000, 3010, PolicyWeights().prefill_context_cost))
    w.load_state.pushed(report(2, running=1, waiting=2, tokens=3000 + 3010 + 700))
    assert w.view(0, 0, None, 0.0).num_waiting_tokens == 700  # another router's
    first.end()
    second.end()
    assert w.view(0, 0, None, 0.0).num_waiting_tokens == 3000 + 3010 + 700


def test_an_unknown_worker_is_never_idle_and_loses_to_a_busy_one_it_would_have_beaten() -> None:
    weights = PolicyWeights()
    quiet, busy = worker("quiet"), worker("busy")
    for w, running in ((quiet, 0), (busy, 5)):
        w.load_state.stream_opened(pushes=True)
        w.load_state.pushed(report(1, running=running, usage=0.3))
    request = RouteRequest("ns", to_key(list(range(64))), 64, "t")
    policy = make_policy("cache_aware", {})

    def chosen() -> str:  # both hold the same part of the prompt: the cost decides
        return policy.choose(request, [w.view(16, 0, None, 0.0) for w in (quiet, busy)]).chosen

    assert chosen() == "quiet"
    quiet.load_state.lost()
    unknown = quiet.view(0, 0, None, 0.0)
    full_batch = worker().view(0, 0, None, 0.0)._replace(
        num_requests_running=MAX_RUNNING, kv_cache_usage_ratio=1.0)
    assert load_cost(unknown, weights) >= load_cost(full_batch, weights)
    assert chosen() == "busy"
    quiet.load_state.pushed(report(2, running=0, usage=0.3))  # frames flow again
    assert chosen() == "quiet"


@pytest.mark.anyio
async def test_a_worker_that_sends_no_load_frames_is_polled_as_before() -> None:
    """An older worker (here the instant stand-in, whose stream is NDJSON and knows no
    ``load=1``) sends no load frames: its load stays polled, every
    ``registry.poll_interval_s``, not every ``probe_interval_s``."""
    infos: list[float] = []

    @web.middleware
    async def count_infos(request: web.Request, handler):
        if request.path == "/info":
            infos.append(time.monotonic())
        return await handler(request)

    app = web.Application(middlewares=[count_infos])
    app.add_routes(instant_upstream.status_routes())
    async with serving(app) as url, running_router(make_config([url], poll_interval_s=0.05)) \
            as (_, router):
        (state,) = router.registry.workers()
        await eventually(lambda: state.events_heard_at is not None)  # its stream is followed
        num_before = len(infos)
        await asyncio.sleep(0.5)
        assert len(infos) - num_before >= 3
        assert state.load_state.source == POLLED and not state.load_state.pushes
