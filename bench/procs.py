"""Start real server processes for integration tests and benchmarks; wait until ready.

A managed process prints one line ``READY <url>`` on stdout once it serves (the
worker does so after its self-test; any server following the same convention can
use ``start_process``); a router prints ``METRICS <url>`` just before it. A worker
started with ``api_key`` gets it in ``$RADIX_WORKER_API_KEY`` (never on its command
line), and ``get_json``/``post_json`` send it. stderr goes to a file, readable with ``log_text()``, so a
chatty process never blocks on a full pipe. ``stop()`` sends SIGTERM, then SIGKILL
after a grace period, and returns the exit status.

``RedisServer`` runs a ``redis-server`` on a free loopback port, stopped by PID and
startable again on the same port (an outage and its end).

Plain module (no pytest imports): fixtures in tests/conftest.py wrap it; tests and
benchmarks start workers (``start_worker``) and routers alike.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from router.state.redis_state.server import redis_answers, redis_server_args

REPO_ROOT = Path(__file__).resolve().parents[1]
READY_PREFIX = "READY "
METRICS_PREFIX = "METRICS "
TEST_SECRET = "radix-router-test-secret"
WORKER_KEY_ENV = "RADIX_WORKER_API_KEY"


class ProcessFailed(RuntimeError):
    """The process exited or timed out before announcing READY (message has its log)."""


class ManagedProcess:
    """A child process started by ``start_process``; ``url`` is set once READY (and
    ``metrics_url`` if it announced one). ``api_key``: the key its HTTP helpers send."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str],
                 api_key: str | None = None) -> None:
        self.args = list(args)
        self.api_key = api_key
        # Outlives this call: the child writes to it until stop() closes it.
        self._log = tempfile.NamedTemporaryFile(prefix="proc-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.args, cwd=REPO_ROOT, env=dict(env), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=self._log, text=True,
        )  # fmt: skip
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read_stdout, daemon=True).start()
        self.url: str | None = None
        self.metrics_url: str | None = None

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def wait_ready(self, timeout_s: float) -> str:
        """Block until the READY line; returns the url. ProcessFailed on exit or timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(left, 0.01))
            except queue.Empty:
                self.stop()
                raise ProcessFailed(f"no READY within {timeout_s} s: {self.args}\n{self.log_text()}") from None
            if line is None:
                code = self.proc.wait()
                raise ProcessFailed(f"exited with {code} before READY: {self.args}\n{self.log_text()}")
            if line.startswith(METRICS_PREFIX):
                self.metrics_url = line[len(METRICS_PREFIX) :].strip()
            if line.startswith(READY_PREFIX):
                self.url = line[len(READY_PREFIX) :].strip()
                return self.url

    def log_text(self) -> str:
        """Everything the process wrote to stderr so far."""
        return Path(self._log.name).read_text(errors="replace")

    def stop(self, grace_s: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``grace_s``; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

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
) -> tuple[int, object]:  # fmt: skip
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


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for tests that must know it before READY)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


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
) -> ManagedProcess:  # fmt: skip
    """Start ``args`` and (with ``wait``) block until it prints ``READY <url>``;
    ``api_key`` goes to its environment as ``$RADIX_WORKER_API_KEY``."""
    extra = dict(env or {})
    if api_key is not None:
        extra[WORKER_KEY_ENV] = api_key
    process = ManagedProcess(args, child_env(extra), api_key)
    if wait:
        process.wait_ready(timeout_s)
    return process


def stop_all(processes: Sequence[ManagedProcess]) -> None:
    """SIGTERM every process still running first (so they wind down together and an
    interrupt while waiting orphans none), then ``stop`` each."""
    for process in processes:
        if process.proc.poll() is None:
            process.proc.terminate()
    for process in processes:
        process.stop()


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
            *flags]  # fmt: skip


def start_worker(
    *flags: str, kv_cache_bytes: str = "4MiB", env: Mapping[str, str] | None = None,
    timeout_s: float = 120.0, wait: bool = True, api_key: str | None = None,
) -> ManagedProcess:  # fmt: skip
    """A demo-model worker on a free loopback port (see ``worker_args``); with
    ``api_key`` every route but ``/health`` requires it, else the worker runs keyless
    (loopback only)."""
    return start_process(worker_args(*flags, kv_cache_bytes=kv_cache_bytes), env, timeout_s,
                         wait, api_key)


def router_args(config_path: str | Path, *flags: str) -> list[str]:
    """``python -m router router --config PATH --port 0 FLAGS...`` (prints READY)."""
    return [sys.executable, "-m", "router", "router", "--config", str(config_path),
            "--port", "0", "--log-level", "WARNING", *flags]  # fmt: skip


def start_router(
    config_path: str | Path, *flags: str, env: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
) -> ManagedProcess:  # fmt: skip
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


class RedisServer:
    """A ``redis-server`` child on 127.0.0.1 (a free port unless given), persisting
    nothing. ``stop`` ends it by PID; ``start`` runs a fresh, empty one on the same
    port."""

    def __init__(self, port: int | None = None, timeout_s: float = 10.0) -> None:
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.start(timeout_s)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        """Start the server and wait until it answers PING; ProcessFailed otherwise."""
        self.proc = subprocess.Popen(redis_server_args(self.port), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not redis_answers(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise ProcessFailed(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM by PID, then SIGKILL after ``grace_s``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
