"""Test and benchmark conveniences over ``router.up.launcher``: demo workers and routers
on free loopback ports, with a fixed test secret, and small HTTP helpers.

``router.up.launcher`` starts the processes, waits for their ``READY <url>`` line and
stops them by PID; this module adds what only tests and benchmarks want: the repo
as working directory, a child environment with a known deployment secret and no
inherited worker key, an ``api_key`` a worker gets in ``$RADIX_WORKER_API_KEY``
(never on its command line) and ``get_json``/``post_json`` send, and the demo-model
command lines. Plain module (no pytest imports): fixtures in tests/conftest.py wrap
it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from router.up.launcher import WORKER_KEY_ENV, ChildProcess

REPO_ROOT = Path(__file__).resolve().parents[1]
TEST_SECRET = "radix-router-test-secret"


class ManagedProcess(ChildProcess):
    """A child started by ``start_process`` in the repo root; ``url`` is set once READY
    (and ``metrics_url`` if it announced one). ``api_key``: the key its HTTP helpers
    send."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str],
                 api_key: str | None = None) -> None:
        super().__init__(args, env, cwd=REPO_ROOT)
        self.api_key = api_key

    def cpu_s(self) -> float:
        """User + system CPU seconds of the process and its direct children so far
        (a router with ``--processes`` forks its extra processes), from /proc."""
        return process_cpu_s(self.proc.pid)

    @property
    def auth(self) -> dict[str, str]:
        """The ``Authorization`` header for ``api_key`` (empty without one)."""
        return {} if self.api_key is None else {"Authorization": f"Bearer {self.api_key}"}

    def get_json(self, path: str, headers: Mapping[str, str] | None = None) -> tuple[int, object]:
        """``GET url+path`` (with ``auth``); returns (status, parsed JSON body)."""
        return http_json("GET", f"{self.url}{path}", None, {**self.auth, **(headers or {})})

    def post_json(
        self, path: str, body: object, headers: Mapping[str, str] | None = None
    ) -> tuple[int, object]:
        """``POST url+path`` with a JSON body (and ``auth``); returns (status, body)."""
        return http_json("POST", f"{self.url}{path}", body, {**self.auth, **(headers or {})})


def http_json(
    method: str, url: str, body: object = None, headers: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
) -> tuple[int, object]:
    """One HTTP request with the standard library; (status, JSON body or raw text)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for children: this one without a worker API key, a fixed
    deployment secret, the repo on PYTHONPATH, and ``extra``."""
    env = dict(os.environ)
    env.pop(WORKER_KEY_ENV, None)
    env["RADIX_ROUTER_SECRET"] = TEST_SECRET
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def start_process(
    args: Sequence[str], env: Mapping[str, str] | None = None, timeout_s: float = 120.0,
    wait: bool = True, api_key: str | None = None,
) -> ManagedProcess:
    """Start ``args`` and (with ``wait``) block until it prints ``READY <url>``;
    ``api_key`` goes to its environment as ``$RADIX_WORKER_API_KEY``."""
    extra = dict(env or {})
    if api_key is not None:
        extra[WORKER_KEY_ENV] = api_key
    process = ManagedProcess(args, child_env(extra), api_key)
    if wait:
        process.wait_ready(timeout_s)
    return process


def wait_routable(router: ManagedProcess, num_workers: int, timeout_s: float) -> None:
    """Wait until ``router``'s ``/health`` counts ``num_workers`` ready workers;
    RuntimeError with the last health body after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while (health := router.get_json("/health")[1])["num_ready_workers"] < num_workers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"router: workers not ready after {timeout_s} s: {health}")
        time.sleep(0.1)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its direct children, from /proc."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat.parent.name == str(pid) or fields[1] == str(pid):
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def worker_args(*flags: str, kv_cache_bytes: str = "4MiB") -> list[str]:
    """``python -m workers --model demo --port 0 --kv-cache-bytes B --num-threads 1
    FLAGS...`` (one torch thread: test machines run several processes at once)."""
    return [sys.executable, "-m", "workers", "--model", "demo", "--port", "0",
            "--kv-cache-bytes", kv_cache_bytes, "--num-threads", "1", "--log-level", "WARNING",
            *flags]


def start_worker(
    *flags: str, kv_cache_bytes: str = "4MiB", env: Mapping[str, str] | None = None,
    timeout_s: float = 120.0, wait: bool = True, api_key: str | None = None,
) -> ManagedProcess:
    """A demo-model worker on a free loopback port (see ``worker_args``); with
    ``api_key`` every route but ``/health`` requires it, else the worker runs keyless
    (loopback only)."""
    return start_process(worker_args(*flags, kv_cache_bytes=kv_cache_bytes), env, timeout_s,
                         wait, api_key)


@contextlib.contextmanager
def started_workers(flags: Mapping[str, tuple[Sequence[str], str | None]],
                    kv_cache_bytes: str = "4MiB") -> Iterator[dict[str, ManagedProcess]]:
    """Demo-model workers by name, each with its flags and API key (``flags``: name ->
    (flags, key)), started together and ready; all stopped when the block ends."""
    workers = {name: start_worker(*f, api_key=key, wait=False, kv_cache_bytes=kv_cache_bytes)
               for name, (f, key) in flags.items()}
    try:
        for worker in workers.values():
            worker.wait_ready(120)
        yield workers
    finally:
        for worker in workers.values():
            worker.stop()


def router_args(config_path: str | Path, *flags: str) -> list[str]:
    """``python -m router router --config PATH --port 0 FLAGS...`` (prints READY)."""
    return [sys.executable, "-m", "router", "router", "--config", str(config_path),
            "--port", "0", "--log-level", "WARNING", *flags]


def start_router(
    config_path: str | Path, *flags: str, env: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
) -> ManagedProcess:
    """A router process for ``config_path`` on a free loopback port."""
    return start_process(router_args(config_path, *flags), env, timeout_s)


def stream_lines(url: str, quiet_s: float = 1.0, headers: Mapping[str, str] | None = None
                 ) -> list[str]:
    """The lines a streaming GET sends until it is silent for ``quiet_s`` (for reading
    a worker's ``/kv/events`` snapshot)."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    lines: list[str] = []
    with urllib.request.urlopen(request, timeout=quiet_s) as response:
        try:
            for raw in response:
                lines.append(raw.decode().rstrip("\n"))
        except TimeoutError:
            pass
    return lines
