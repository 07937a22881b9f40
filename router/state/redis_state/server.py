"""A throwaway local ``redis-server``: its command line and a readiness check.

Used by ``radix-router up`` (``[redis] launch = true``) and by the tests and
benchmarks (``bench.procs.RedisServer``). Loopback only, no persistence (``--save
""`` and no append-only file): the shared state is rebuilt by the routers.
"""

from __future__ import annotations

import socket

REDIS_SERVER = "redis-server"


def redis_server_args(port: int, host: str = "127.0.0.1") -> list[str]:
    """``redis-server`` on ``host:port`` in the foreground, persisting nothing."""
    return [REDIS_SERVER, "--port", str(port), "--bind", host, "--save", "",
            "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"]


def redis_answers(port: int, host: str = "127.0.0.1", timeout_s: float = 0.2) -> bool:
    """Whether a Redis server on ``host:port`` answers ``PING`` within ``timeout_s``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False
