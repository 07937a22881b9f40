"""Shared fixtures. Processes are started by ``router.launcher`` (the launcher
``radix-router up`` uses) through the test conveniences in ``bench.procs``."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from bench.procs import ManagedProcess, start_worker
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
