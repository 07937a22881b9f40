"""Child processes that announce readiness, and a throwaway ``redis-server``.

The one launcher behind ``radix-router up`` (``router.up.cluster``) and the tests and
benchmarks (``harness.procs``). A child prints one line ``READY <url>`` on stdout once
it serves (a worker after its self-test, a router once it listens, just after a
``METRICS <url>`` line); ``ChildProcess.wait_ready`` waits for it. A child is
stopped by its PID, never by name: SIGTERM, then SIGKILL after a grace period.
``RedisServer`` runs ``redis-server`` on a loopback port, persisting nothing (the
shared state is rebuilt by the routers), and is ready once it answers PING.
Workers are started as ``python -m workers`` commands: this module imports neither
``workers`` nor ``bench``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from router.server.serve import die_with_parent

READY_PREFIX = "READY "
METRICS_PREFIX = "METRICS "
WORKER_KEY_ENV = "RADIX_WORKER_API_KEY"  # read by workers.server.access
REDIS_SERVER = "redis-server"
STOP_GRACE_S = 10.0


class ProcessFailed(RuntimeError):
    """A child exited, timed out or was not found before it was ready (the message
    carries its log when it has one)."""


class Interrupted(Exception):
    """The caller asked to stop while a child was starting."""


_OUTPUT = threading.Lock()


def echo_line(name: str, text: str) -> None:
    """Print ``[name] text`` as one whole line: never cut by another thread's line
    (``print`` writes its text and its newline apart, so a child's echoed line and a
    supervisor's note could share a line, and a reader waiting for the note at a line's
    start would miss it)."""
    with _OUTPUT:
        sys.stdout.write(f"[{name}] {text}\n")
        sys.stdout.flush()


class ChildProcess:
    """A child started from ``args`` with exactly ``env``. stdout is read on a thread
    until READY; with ``echo`` every line of stdout and stderr is printed as ``[name]
    LINE``, else stderr goes to a file (``log_text``) so a chatty child never blocks
    on a full pipe. ``supervised`` children run in their own session (a terminal's
    Ctrl-C reaches only the parent) and get SIGTERM when the parent dies. A child that
    ``announces`` nothing (no READY line) has its stdout discarded unless echoed."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str], name: str | None = None,
                 echo: bool = False, supervised: bool = False,
                 cwd: str | Path | None = None, announces: bool = True) -> None:
        self.args, self.name, self._echo = list(args), name or Path(args[0]).name, echo
        self._announces = announces
        # Outlives this call: the child writes to it until stop() closes it.
        self._log = None if echo else tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix="proc-", suffix=".log", delete=False)
        try:
            self.proc = subprocess.Popen(
                self.args, cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=self._log or subprocess.STDOUT, text=True,
                errors="replace", start_new_session=supervised,
                preexec_fn=die_with_parent if supervised else None)
        except FileNotFoundError as exc:
            raise ProcessFailed(f"{self.name}: {self.args[0]} not found on PATH") from exc
        self.url: str | None = None
        self.metrics_url: str | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        ready = not self._announces
        for raw in self.proc.stdout:
            line = raw.rstrip("\n")
            if self._echo:
                echo_line(self.name, line)
            if not ready:
                self._lines.put(line)
                ready = line.startswith(READY_PREFIX)
        self._lines.put(None)

    def poll(self) -> int | None:
        """The exit status, or None while the child runs."""
        return self.proc.poll()

    def wait_ready(self, timeout_s: float, interrupted: Callable[[], bool] = lambda: False
                   ) -> str:
        """Block until the READY line; returns the URL (``metrics_url`` is set if the
        child announced one). ProcessFailed if it exits first or ``timeout_s`` passes
        (the child is then stopped); Interrupted as soon as ``interrupted()`` holds."""
        deadline = time.monotonic() + timeout_s
        while True:
            if interrupted():
                raise Interrupted
            try:
                line = self._lines.get(timeout=min(0.1, max(deadline - time.monotonic(), 0.001)))
            except queue.Empty:
                if time.monotonic() < deadline:
                    continue
                self.stop()
                raise ProcessFailed(f"{self.name}: not ready after {timeout_s} s: "
                                    f"{self.args}\n{self.log_text()}") from None
            if line is None:
                raise ProcessFailed(f"{self.name}: exited with {self.proc.wait()} before it "
                                    f"was ready: {self.args}\n{self.log_text()}")
            if line.startswith(METRICS_PREFIX):
                self.metrics_url = line[len(METRICS_PREFIX):].strip()
            if line.startswith(READY_PREFIX):
                self.url = line[len(READY_PREFIX):].strip()
                return self.url

    def log_text(self) -> str:
        """Everything the child wrote to stderr so far (empty when echoed)."""
        return "" if self._log is None else Path(self._log.name).read_text(errors="replace")

    def stop(self, grace_s: float = STOP_GRACE_S) -> int:
        """SIGTERM by PID, then SIGKILL after ``grace_s``; waits for the exit (and for
        the echo of its last output) and returns the exit status."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(grace_s)
        if self._log is not None:
            self._log.close()
        return self.proc.returncode


def stop_all(children: Sequence[ChildProcess], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every child still running first (so they wind down together and an
    interrupt while waiting orphans none), then ``stop`` each in order."""
    for child in children:
        if child.poll() is None:
            child.proc.terminate()
    for child in children:
        child.stop(grace_s)


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (for a child that must know it before READY)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def redis_answers(port: int, host: str = "127.0.0.1", timeout_s: float = 0.2) -> bool:
    """Whether a Redis server on ``host:port`` answers ``PING`` within ``timeout_s``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """A ``redis-server`` child on 127.0.0.1 (a free port unless given), persisting
    nothing, ready once it answers PING. ``stop`` ends it by PID; ``start`` runs a
    fresh, empty one on the same port (an outage and its end). ``echo`` and
    ``supervised`` are as for ``ChildProcess``."""

    def __init__(self, port: int | None = None, timeout_s: float = 10.0,
                 env: Mapping[str, str] | None = None, echo: bool = False,
                 supervised: bool = False,
                 interrupted: Callable[[], bool] = lambda: False) -> None:
        self.port = port or free_port()
        self._env = dict(os.environ if env is None else env)
        self._echo, self._supervised = echo, supervised
        self.child: ChildProcess | None = None
        self.start(timeout_s, interrupted)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0,
              interrupted: Callable[[], bool] = lambda: False) -> None:
        """Start the server and wait until it answers PING; ProcessFailed if it exits
        or ``timeout_s`` passes, Interrupted as soon as ``interrupted()`` holds;
        RuntimeError while the previous one still runs (a second server could not bind
        the port, and the first would outlive ``stop``)."""
        if self.child is not None and self.child.poll() is None:
            raise RuntimeError(f"redis-server on port {self.port} is already running")
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"]
        self.child = ChildProcess(args, self._env, "redis", self._echo, self._supervised,
                                  announces=False)
        deadline = time.monotonic() + timeout_s
        while not redis_answers(self.port):
            if interrupted():
                raise Interrupted
            if self.child.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise ProcessFailed(f"redis-server on port {self.port} did not start\n"
                                    f"{self.child.log_text()}")
            time.sleep(0.02)

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM by PID, then SIGKILL after ``grace_s``."""
        if self.child is not None:
            self.child.stop(grace_s)

