"""A router process started with ``[discovery] kind = "kubernetes"`` (a kubeconfig
pointing at the test API server, which runs in this process) in front of real demo
worker processes: pods become routed workers, greedy answers flow through them, an
evicted pod (``MODIFIED``, ``podIP: null``) leaves at once, a pod replaced under its
name moves the worker, a watch resumed after compaction re-lists, and a pod with the
labels but another service account is refused and counted."""

from __future__ import annotations

import asyncio
import urllib.parse
import urllib.request

import pytest

from harness.procs import ManagedProcess, start_router
from tests.support.aio import eventually
from tests.support.kube_api import KubeApiServer
from tests.support.router_calls import complete
from tests.support.router_configs import ADMIN, auth_section, model_table, to_toml

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
LABELS = {"app": "radix-worker"}
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN}"}
TRUSTED = {"owner": ("StatefulSet", "radix-worker"), "service_account": "radix-worker"}


def port_of(worker: ManagedProcess) -> int:
    """The port a worker process listens on."""
    return urllib.parse.urlsplit(worker.url).port


async def workers_seen(router: ManagedProcess) -> dict[str, tuple[str, bool]]:
    """Worker id -> (URL, ready) as ``GET /admin/workers`` of the router says."""
    _, body = await asyncio.to_thread(router.get_json, "/admin/workers", ADMIN_HEADERS)
    return {w["id"]: (w["url"], w["ready"]) for w in body["workers"]}


async def test_a_router_process_follows_pods_to_real_workers(tmp_path, worker_factory):
    server = KubeApiServer()
    await server.start()
    workers = await asyncio.gather(*(asyncio.to_thread(worker_factory) for _ in range(3)))
    w0, w1, w2 = (port_of(w) for w in workers)
    server.add_pod("radix-worker-0", "127.0.0.1", w0, LABELS, **TRUSTED)
    server.add_pod("radix-worker-1", "127.0.0.1", w1, LABELS, **TRUSTED)
    server.add_pod("impostor", "127.0.0.1", w2, LABELS, owner=TRUSTED["owner"])
    config = tmp_path / "router.toml"
    config.write_text(to_toml({
        "models": {"demo": model_table()},
        "registry": {"poll_interval_s": 0.2, "probe_timeout_s": 1.0},
        "auth": auth_section({"alice": {}}),
        "discovery": {"kind": "kubernetes", "selector": LABELS, "port_name": "http",
                      "kubeconfig": server.kubeconfig(str(tmp_path / "kubeconfig")),
                      "retry_initial_s": 0.1, "retry_max_s": 1.0,
                      "owner_kind": "StatefulSet", "owner_name": "radix-worker",
                      "service_account": "radix-worker"},
    }))
    router = await asyncio.to_thread(start_router, config)
    try:
        def both_ready(seen):
            return {k: ready for k, (_, ready) in seen.items()} == {
                "radix-worker-0": True, "radix-worker-1": True}

        await eventually(lambda: _check(router, both_ready), timeout_s=30)
        answers = [await asyncio.to_thread(complete, router, f"pod test {i}")
                   for i in range(4)]
        assert all(status == 200 for status, _ in answers)

        server.evict("radix-worker-1")
        await eventually(lambda: _check(router, lambda s: set(s) == {"radix-worker-0"}))

        server.delete("radix-worker-0")
        server.add_pod("radix-worker-0", "127.0.0.1", w2, LABELS, **TRUSTED)
        moved = {"radix-worker-0": (f"http://127.0.0.1:{w2}", True)}
        await eventually(lambda: _check(router, lambda s: s == moved), timeout_s=30,
                         describe=lambda: router.log_text()[-4000:])
        status, _ = await asyncio.to_thread(complete, router, "after the move")
        assert status == 200

        server.watches_refused = True
        server.close_watches()
        server.add_pod("radix-worker-1", "127.0.0.1", w1, LABELS, **TRUSTED)
        server.compact()
        server.watches_refused = False
        await eventually(lambda: _check(router, lambda s: len(s) == 2 and all(
            ready for _, ready in s.values())), timeout_s=30)
        _, metrics = await asyncio.to_thread(_metrics, router)
        assert 'router_discovery_errors_total{reason="closed"}' in metrics
        assert "router_discovery_up 1.0" in metrics
        assert 'router_discovery_refused_pods_total{reason="service_account"} 1.0' in metrics
    finally:
        await asyncio.to_thread(router.stop)
        await server.stop()


async def _check(router: ManagedProcess, predicate) -> bool:
    return predicate(await workers_seen(router))


def _metrics(router: ManagedProcess) -> tuple[int, str]:
    with urllib.request.urlopen(f"{router.metrics_url}/metrics", timeout=5) as response:
        return response.status, response.read().decode()
