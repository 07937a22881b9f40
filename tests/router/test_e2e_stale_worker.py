"""End to end: a worker whose KV events are withheld while it serves is routed stale,
and its pushed load is unknown until they flow again; a load change reaches the router
in a load frame, not a probe.

A demo worker behind a loopback proxy (``tests.support.events_proxy``) that passes
its HTTP but can hold back the answers of ``GET /kv/events``, and a router process
with a short ``kv_events.read_timeout_s``. The worker holds a document, then has its
events withheld: within the deadline ``GET /admin/workers`` says it is stale and
``router_worker_index_stale`` is 1, its exact entries are kept but no longer predicted
(the next request for the document is predicted to match nothing), and once its
events flow again it resumes from its position and is exact again. The router probes
the worker only every minute (``registry.probe_interval_s``) but when its stream opens
or ends, so what it knows of the worker's load between those came in load frames. One
worker: what the decision predicts for it is the point, and a module adds its
start-up time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.procs import ManagedProcess, http_json, start_router, started_workers
from tests.support.events_proxy import EventsProxy
from tests.support.load_frames import FrameStream
from tests.support.metric_samples import router_metric
from tests.support.polling import wait_until
from tests.support.router_calls import admin, openai_complete
from tests.support.router_configs import (
    FAST_REGISTRY,
    auth_section,
    model_table,
    to_toml,
    worker_list,
)

pytestmark = pytest.mark.slow
READ_TIMEOUT_S = 2.0  # ten of the worker's heartbeats: no false alarm on a loaded machine
DOCUMENT = "".join(f"Clause {i}: the tenant shall keep the premises tidy. " for i in range(6))
# How long anything the router does on its own (a probe, a reconnect) may take here.
SLACK_S = 10.0
PROBE_INTERVAL_S = 60.0  # longer than the module: load comes in frames


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[ManagedProcess, EventsProxy]]:
    tmp = tmp_path_factory.mktemp("stale")
    worker_config = tmp / "worker.toml"
    worker_config.write_text("[server]\nkv_events_heartbeat_s = 0.2\n")
    with started_workers({"w0": (("--config", str(worker_config)), None)}) as workers:
        proxy = EventsProxy(int(workers["w0"].url.rsplit(":", 1)[1]))
        path = tmp / "router.toml"
        path.write_text(to_toml({
            "models": {"demo": model_table()},
            "registry": {**FAST_REGISTRY, "probe_interval_s": PROBE_INTERVAL_S},
            "kv_events": {"read_timeout_s": READ_TIMEOUT_S, "max_backoff_s": 0.2},
            "auth": auth_section({"alice": {}}),
            "workers": worker_list({"w0": proxy.url})}))
        router = start_router(path)
        try:
            wait_until(lambda: worker(router)["index_mode"] == "exact", SLACK_S,
                       lambda: worker(router))
            yield router, proxy
        finally:
            router.stop()
            proxy.close()


def worker(router: ManagedProcess) -> dict[str, Any]:
    """Worker w0 as ``GET /admin/workers`` shows it."""
    return admin(router, "/admin/workers")["workers"][0]


def ask(router: ManagedProcess, question: str) -> int:
    """Ask about DOCUMENT; the tokens the router predicted w0 held."""
    before = worker(router)["stats"]
    openai_complete(router, DOCUMENT + question)
    after = wait_until(lambda: (stats := worker(router)["stats"])["num_requests"]
                       > before["num_requests"] and stats)
    return after["num_matched_tokens"] - before["num_matched_tokens"]


def stale_gauge(router: ManagedProcess) -> float:
    """w0's router_worker_index_stale."""
    return router_metric(router, "router_worker_index_stale", {"worker": "w0"})


def test_a_worker_whose_events_are_withheld_is_routed_stale_until_they_flow_again(fleet):
    router, proxy = fleet
    ask(router, "Question 0?")
    assert ask(router, "Question 1?") >= len(DOCUMENT) // 2
    assert stale_gauge(router) == 0

    withheld_at = time.time()
    proxy.withhold()
    state = wait_until(lambda: (w := worker(router))["index_mode"] == "stale" and w,
                       READ_TIMEOUT_S + SLACK_S)
    assert state["index_reason"] == ("KV event stream: no event or heartbeat for "
                                     f"{READ_TIMEOUT_S:g} s")
    assert state["index_since"] >= withheld_at
    assert stale_gauge(router) == 1
    assert router_metric(router, "router_worker_event_stream_age_seconds",
                         {"worker": "w0"}) >= READ_TIMEOUT_S
    assert admin(router, "/admin/index")["workers"]["w0"]["num_blocks"] > 0  # kept
    assert ask(router, "Question 2?") == 0, "a stale worker's exact entries are not predicted"

    proxy.release()
    wait_until(lambda: worker(router)["index_mode"] == "exact", SLACK_S)
    assert stale_gauge(router) == 0
    assert ask(router, "Question 3?") >= len(DOCUMENT) // 2


def load_unknown_gauge(router: ManagedProcess) -> float:
    """w0's router_worker_load_unknown."""
    return router_metric(router, "router_worker_load_unknown", {"worker": "w0"})


def test_a_load_change_reaches_the_router_in_a_frame(fleet, record_property):
    """A request sent to the worker behind the router's back (the router counts nothing
    in flight there) shows in the router's view of the worker as soon as the worker's
    load frame does on a stream of the test's own: the lag between the two is recorded
    (``load_frame_lag_s``), the mechanism asserted (no probe comes within the module)."""
    router, proxy = fleet
    wait_until(lambda: worker(router)["load_source"] == "pushed", SLACK_S, lambda: worker(router))
    frames = FrameStream(proxy.url, ask_load=True)
    try:
        _, idle = frames.wait_for_load(lambda r: True)
        sent_at = time.monotonic()
        request = threading.Thread(target=lambda: proxy_generate(proxy, 48))
        request.start()
        arrived_at, busy = frames.wait_for_load(
            lambda r: r.seq > idle.seq and r.num_requests_running + r.num_requests_waiting > 0)
        seen = wait_until(lambda: (w := worker(router))["load_seq"] >= busy.seq and w,
                          SLACK_S, interval_s=0.002)
        seen_at = time.monotonic()
        request.join()
    finally:
        frames.close()
    record_property("load_frame_after_send_s", arrived_at - sent_at)
    record_property("load_frame_lag_s", seen_at - arrived_at)
    assert seen["load_source"] == "pushed"
    assert seen["num_in_flight_requests"] == 0, "the router sent nothing: the load is the frame's"
    assert load_unknown_gauge(router) == 0


def proxy_generate(proxy: EventsProxy, max_tokens: int) -> None:
    """One request straight to the worker (through the proxy, not the router)."""
    status, body = http_json("POST", f"{proxy.url}/generate", {
        "token_ids": list(range(5, 60)), "scope": "anonymous",
        "sampling": {"max_tokens": max_tokens, "ignore_eos": True}})
    assert status == 200, body


def test_a_silent_stream_makes_the_load_unknown_until_frames_flow_again(fleet):
    router, proxy = fleet
    wait_until(lambda: worker(router)["load_source"] == "pushed", SLACK_S, lambda: worker(router))
    proxy.withhold()
    try:
        wait_until(lambda: worker(router)["load_source"] == "unknown", READ_TIMEOUT_S + SLACK_S,
                   lambda: worker(router))
        assert load_unknown_gauge(router) == 1
        assert worker(router)["ready"], "unknown load is no reason to stop routing there"
    finally:
        proxy.release()
    wait_until(lambda: worker(router)["load_source"] == "pushed", SLACK_S, lambda: worker(router))
    assert load_unknown_gauge(router) == 0
