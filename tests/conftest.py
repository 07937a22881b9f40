"""Shared fixtures. Processes are started by ``router.launcher`` (the launcher
``radix-router up`` uses) through the test conveniences in ``bench.procs``."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from bench.procs import ManagedProcess, start_worker
from bench.vllm_servers import VllmServer, available
from router.launcher import RedisServer


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


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the real vLLM servers as soon as the run is known to need them: they take
    most of a minute to start, and start in parallel with the tests before theirs."""
    if available() is None and any("vllm_fleet" in getattr(item, "fixturenames", ())
                                   for item in session.items):
        session.config.stash[_VLLM_FLEET] = [VllmServer().start()
                                             for _ in range(VLLM_FLEET_SIZE)]


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the vLLM servers (by process group) whatever happened to the run."""
    for server in config.stash.get(_VLLM_FLEET, []):
        server.stop()


@pytest.fixture(scope="session")
def vllm_fleet(request: pytest.FixtureRequest) -> list[VllmServer]:
    """Two real vLLM CPU servers (SmolLM2, KV events on), shared by the whole run;
    skipped where ``make vllm`` has not built their environment."""
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
