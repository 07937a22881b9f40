"""Shared fixtures. Processes are started by ``router.up.launcher`` (the launcher
``radix-router up`` uses) through the test conveniences in ``harness.procs``."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from harness.procs import ManagedProcess, start_worker
from harness.vllm_servers import VllmServer, available
from router.up.launcher import RedisServer


@pytest.fixture
def anyio_backend() -> str:
    """``pytest.mark.anyio`` tests run on asyncio, the router's event loop."""
    return "asyncio"


@pytest.fixture
def worker_factory() -> Iterator[Callable[..., ManagedProcess]]:
    """``factory(*flags, kv_cache_bytes=..., wait=True)`` starts demo workers on free
    loopback ports; all are stopped at teardown."""
    started: list[ManagedProcess] = []

    def factory(*flags: str, **kwargs: object) -> ManagedProcess:
        process = start_worker(*flags, **kwargs)  # type: ignore[arg-type]
        started.append(process)
        return process

    yield factory
    for process in started:
        process.stop()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh ``redis-server`` on a free loopback port, stopped at teardown."""
    server = RedisServer()
    yield server
    server.stop()


_VLLM_FLEET = pytest.StashKey[list[VllmServer]]()
VLLM_FLEET_SIZE = 2


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the vLLM servers (by process group) whatever happened to the run."""
    for server in config.stash.get(_VLLM_FLEET, []):
        server.stop()


@pytest.fixture(scope="session")
def vllm_fleet(request: pytest.FixtureRequest) -> list[VllmServer]:
    """Two real vLLM CPU servers (SmolLM2, KV events on), started together the first
    time a test asks and shared by the rest of the run (under xdist, the tests that use
    them share one ``xdist_group``, so one worker starts them); skipped where ``make
    vllm`` has not built their environment."""
    problem = available()
    if problem is not None:
        pytest.skip(problem)
    servers = request.config.stash.get(_VLLM_FLEET, None)
    if servers is None:
        servers = request.config.stash[_VLLM_FLEET] = [VllmServer().start()
                                                        for _ in range(VLLM_FLEET_SIZE)]
    for server in servers:
        server.wait_ready(600)
    return servers
