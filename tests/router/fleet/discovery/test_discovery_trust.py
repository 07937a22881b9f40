"""What a router with ``[discovery]`` trusts: a pod with the labels but another owner
or service account, or a role the config does not allow, gets no key and no request
(upstreams that record every request's Authorization header say so); and a pod that
accepts and never answers holds up no other pod's join or deletion."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import generate_latest

from tests.router.fleet.discovery.test_discovery_router import (
    LABELS,
    api_server,
    complete,
    discovery_config,
    registered,
    routed,
    upstream,
)
from tests.support.aio import ADMIN, call, eventually, running_router

pytestmark = pytest.mark.anyio
OWNER = ("StatefulSet", "radix-worker")
IDENTITY = {"owner_kind": "StatefulSet", "owner_name": "radix-worker",
            "service_account": "radix-worker", "api_key_env": "RADIX_WORKER_KEY"}
BOUND_S = 2.0  # 20 registry polls (0.1 s); a lookup's timeout is request_timeout_s, 10 s


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[tuple[int, list[asyncio.StreamWriter]]]:
    """A TCP server on 127.0.0.1 that accepts every connection and never sends a byte;
    yields (its port, the connections accepted so far)."""
    accepted: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], accepted
    finally:
        server.close()
        for writer in accepted:
            writer.close()
        await server.wait_closed()


def refused_metric(router, reason: str) -> str:
    """The ``router_discovery_refused_pods_total`` sample line for ``reason``."""
    text = generate_latest(router.metrics.registry).decode()
    prefix = f'router_discovery_refused_pods_total{{reason="{reason}"}}'
    return next(line for line in text.splitlines() if line.startswith(prefix))


async def test_a_pod_with_the_labels_but_another_owner_or_account_gets_no_key(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setenv("RADIX_WORKER_KEY", "fleet-key")
    trusted: list[tuple[str, str | None]] = []
    impostors: list[tuple[str, str | None]] = []
    async with api_server() as server, upstream(seen=trusted) as p0, \
            upstream(seen=impostors) as p1:
        server.add_pod("radix-worker-0", "127.0.0.1", p0, LABELS, owner=OWNER,
                       service_account="radix-worker")
        server.add_pod("impostor", "127.0.0.1", p1, LABELS, owner=("StatefulSet", "other"),
                       service_account="radix-worker")
        server.add_pod("orphan", "127.0.0.1", p1, LABELS, service_account="radix-worker")
        server.add_pod("stranger", "127.0.0.1", p1, LABELS, owner=OWNER)  # account default
        async with running_router(discovery_config(server, tmp_path, **IDENTITY)) as (
                url, router):
            await eventually(lambda: set(routed(router)) == {"radix-worker-0"})
            assert [await complete(url) for _ in range(4)] == [200] * 4
            server.set_ready("impostor", False)
            server.set_ready("impostor", True)  # judged again: still counted once
            await asyncio.sleep(0.5)  # several probe polls and passes
            status = router.discovery.status
            assert status.num_refused == {"owner": 2, "service_account": 1, "role": 0}
            assert refused_metric(router, "owner").endswith(" 2.0")
            async with aiohttp.ClientSession() as session:
                _, body, _ = await call(session, "GET", f"{url}/admin/discovery",
                                        headers=ADMIN)
            assert set(body["refused"]) == {"impostor", "orphan", "stranger"}
            assert body["refused"]["stranger"].startswith("service_account: ")
            assert set(registered(router)) == {"radix-worker-0"}
    assert impostors == []  # no model lookup, no probe, no request: no key
    assert ("/v1/models", "Bearer fleet-key") in trusted


async def test_a_role_label_the_config_does_not_allow_is_not_honoured(tmp_path):
    seen: list[tuple[str, str | None]] = []
    async with api_server() as server, upstream() as p0, upstream(seen=seen) as p1:
        server.add_pod("w0", "127.0.0.1", p0, LABELS)
        server.add_pod("grabby", "127.0.0.1", p1, {**LABELS, "radix-router/role": "prefill"})
        async with running_router(discovery_config(server, tmp_path)) as (url, router):
            await eventually(lambda: set(routed(router)) == {"w0"})
            assert await complete(url) == 200
            await eventually(lambda: router.discovery.status.num_refused["role"] == 1)
            assert router.discovery.status.refused["grabby"].startswith("role: ")
            assert refused_metric(router, "role").endswith(" 1.0")
            assert set(registered(router)) == {"w0"}
    assert seen == []


async def test_a_pod_that_never_answers_delays_no_join_nor_deletion(tmp_path):
    async with api_server() as server, silent_server() as (hung, accepted), \
            upstream() as p0, upstream() as p1:
        server.add_pod("hung", "127.0.0.1", hung, LABELS)  # its model lookup never ends
        config = discovery_config(server, tmp_path, request_timeout_s=10.0)
        async with running_router(config) as (url, router):
            await eventually(lambda: accepted)
            server.add_pod("w0", "127.0.0.1", p0, LABELS)
            await eventually(lambda: set(routed(router)) == {"w0"}, timeout_s=BOUND_S)
            server.delete("w0")
            server.add_pod("w1", "127.0.0.1", p1, LABELS)
            await eventually(lambda: set(routed(router)) == {"w1"}, timeout_s=BOUND_S,
                             describe=lambda: registered(router))
            assert await complete(url) == 200
            assert "hung" not in registered(router)
            assert router.discovery.status.num_skipped == 1
