"""``ListWatch`` (with the real ``kubernetes_asyncio`` client) against the test API
server, through the three failures Python pod watchers had in production, each also
run on the naive watch loop (``naive_watcher``) to show that it breaks there."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client as k8s

from router.config import DiscoveryConfig
from router.fleet.discovery.list_watch import ListWatch
from router.fleet.discovery.pods import pod_endpoints
from router.fleet.discovery.status import DiscoveryStatus
from router.fleet.discovery.watcher import api_client
from tests.router.fleet.discovery.naive_watcher import NaiveWatcher
from tests.support.aio import eventually
from tests.support.kube_api import KubeApiServer

pytestmark = pytest.mark.anyio
LABELS = {"app": "worker"}
SELECTOR = "app=worker"


def discovery_config(**fields: object) -> DiscoveryConfig:
    """Pods labelled app=worker serving on their port named http; fast retries."""
    return DiscoveryConfig(**{"kind": "kubernetes", "selector": LABELS, "port_name": "http",
                              "retry_initial_s": 0.05, "retry_max_s": 0.5, "resync_s": 30.0,
                              **fields})


class Watchers:
    """Ours (``ListWatch`` of pods, seen as ``endpoints()``: worker id -> url) and one
    naive control, both running against ``server``."""

    def __init__(self, server: KubeApiServer, ours: ListWatch, naive: NaiveWatcher,
                 config: DiscoveryConfig, status: DiscoveryStatus) -> None:
        self.server, self.ours, self.naive = server, ours, naive
        self.config, self.status = config, status

    def endpoints(self) -> dict[str, str]:
        """What ours says serves now."""
        return {e.worker_id: e.url for pod in self.ours.objects.values()
                for e in pod_endpoints(pod, self.config)}


@contextlib.asynccontextmanager
async def watching(tmp_path, resume: bool, **fields: object) -> AsyncIterator[Watchers]:
    """The API server with pods w0 and w1, ours and a naive watcher (``resume``) on it."""
    server = KubeApiServer()
    await server.start()
    server.add_pod("w0", "10.0.0.10", 8000, LABELS)
    server.add_pod("w1", "10.0.0.11", 8000, LABELS)
    config = discovery_config(kubeconfig=server.kubeconfig(str(tmp_path / "kubeconfig")),
                              **fields)
    status = DiscoveryStatus("kubernetes", "default")
    api = await api_client(config)
    core = k8s.CoreV1Api(api)

    def list_pods(**query):
        return core.list_namespaced_pod("default", **query)

    ours = ListWatch("pods", list_pods, {"label_selector": SELECTOR}, config, status,
                     lambda: None)
    naive = NaiveWatcher(api, "default", SELECTOR, resume)
    tasks = [asyncio.create_task(ours.run()), asyncio.create_task(naive.run())]
    watchers = Watchers(server, ours, naive, config, status)
    try:
        await eventually(lambda: len(watchers.endpoints()) == 2 and len(naive.endpoints) == 2)
        yield watchers
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await api.close()
        await server.stop()


async def test_a_watch_from_a_compacted_version_relists_where_the_naive_one_loops(tmp_path):
    async with watching(tmp_path, resume=True) as w:
        w.server.watches_refused = True
        w.server.close_watches()
        w.server.add_pod("w2", "10.0.0.12", 8000, LABELS)
        w.server.compact()  # the change made while nobody watched is compacted away
        w.server.watches_refused = False
        await eventually(lambda: "w2" in w.endpoints(), describe=w.status.to_dict)
        await eventually(lambda: w.naive.statuses.count(410) >= 5)
        assert "w2" not in w.naive.endpoints  # stuck on 410 Gone, retrying the same version
        w.server.add_pod("w3", "10.0.0.13", 8000, LABELS)
        await eventually(lambda: "w3" in w.endpoints())
        await asyncio.sleep(0.3)
        assert "w3" not in w.naive.endpoints


async def test_a_delete_missed_in_a_reconnect_is_recovered_by_the_relist(tmp_path):
    async with watching(tmp_path, resume=False) as w:
        w.server.watches_refused = True
        w.server.close_watches()
        w.server.delete("w1")
        await asyncio.sleep(0.3)
        w.server.watches_refused = False
        # Generous bounds: the reconnect backs off, and a loaded machine stretches it.
        await eventually(lambda: set(w.endpoints()) == {"w0"}, 30, describe=w.status.to_dict)
        await eventually(lambda: w.naive.statuses.count(503) >= 1, 30)
        await asyncio.sleep(0.5)
        assert set(w.naive.endpoints) == {"w0", "w1"}  # w1 a ghost for good


async def test_a_missed_delete_is_recovered_by_the_periodic_relist_alone(tmp_path):
    """No error at all: the watch just never delivers the DELETED (events are dropped
    while the stream stays open); the resync re-list removes the pod."""
    async with watching(tmp_path, resume=True, resync_s=2.0) as w:
        await eventually(lambda: w.server.num_watchers() == 2)
        lists = w.status.num_lists
        w.server.events_lost = True
        w.server.delete("w1")
        w.server.events_lost = False
        await eventually(lambda: set(w.endpoints()) == {"w0"}, timeout_s=10)
        assert w.status.num_lists > lists
        assert sum(w.status.num_errors.values()) == 0
        assert set(w.naive.endpoints) == {"w0", "w1"}


async def test_an_evicted_pod_with_no_ip_is_no_endpoint(tmp_path):
    async with watching(tmp_path, resume=True) as w:
        w.server.evict("w1")
        await eventually(lambda: set(w.endpoints()) == {"w0"})
        await asyncio.sleep(0.3)
        assert w.naive.endpoints == {"w0": "10.0.0.10", "w1": "10.0.0.11"}


async def test_bookmarks_keep_the_version_and_change_nothing(tmp_path):
    async with watching(tmp_path, resume=True) as w:
        w.server.bookmark_interval_s = 0.05
        events = w.status.num_events
        await asyncio.sleep(0.5)
        assert w.status.num_events == events
        assert set(w.endpoints()) == {"w0", "w1"}
        assert any(q.get("allowWatchBookmarks", "").lower() == "true" for _, _, q in w.server.requests)


async def test_forbidden_is_a_counted_error_retried_with_backoff_not_a_crash_loop(tmp_path):
    async with watching(tmp_path, resume=True, retry_max_s=0.4) as w:
        w.server.forbidden = True
        w.server.close_watches()
        await eventually(lambda: w.status.num_errors["forbidden"] >= 3, timeout_s=10)
        assert not w.status.up
        assert "get, list and watch" in (w.status.last_error or "")
        def num_lists() -> int:  # ours only: the naive loop never lists
            return sum("watch" not in query for _, _, query in w.server.requests)

        start = num_lists()
        await asyncio.sleep(1.2)
        assert num_lists() - start <= 4  # backed off to retry_max_s
        assert set(w.endpoints()) == {"w0", "w1"}  # what was known stays
        w.server.forbidden = False
        w.server.add_pod("w2", "10.0.0.12", 8000, LABELS)
        await eventually(lambda: "w2" in w.endpoints() and w.status.up)
