"""Shared fixtures. Process helpers live in bench/procs.py (a plain module,
importable as ``support.procs`` because this directory is on sys.path)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from bench.procs import ManagedProcess, RedisServer, start_worker


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
