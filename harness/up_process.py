"""``radix-router up`` as a child of a test or a benchmark: a demo deployment's config,
and the supervisor's output read on a thread, from which come its children's PIDs
and URLs.

``up`` prints every line of its children as ``[name] LINE`` and its own decisions
as ``[name] ...`` lines (``router.up.supervisor``): ``[name] started (pid N)`` at each
start, ``[name] READY URL`` (``[redis] READY redis://...``), ``[name] restarted``,
``... giving up ...``. ``UpProcess`` keeps every line and finds the latest PID and
URL of each child in them. Plain module (no pytest).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from harness.procs import REPO_ROOT, child_env
from router.front.auth import hash_key

ADMIN_KEY = "sk-demo-admin"
TENANT_KEYS = {"alice": "sk-demo-alice", "bob": "sk-demo-bob", "carol": "sk-demo-carol"}
WORKER_FLAGS = ("--kv-cache-bytes", "16MiB", "--num-threads", "1", "--log-level", "WARNING")
KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer", "both": "kv_both"}


def up_config(num_workers: int, num_routers: int = 1, launch_redis: bool = False,
              launch: Mapping[str, float] | None = None, policy: str = "round_robin",
              max_concurrent_requests: int = 64, keepalive_timeout_s: float = 15.0,
              roles: Sequence[str] | None = None, pd_min_uncached_tokens: int | None = None,
              first_byte_timeout_s: float = 30.0) -> str:
    """A deployment of demo workers on free ports, ``num_routers`` routers (sharing a
    launched Redis with ``launch_redis``; closing a connection that sends no complete
    request for ``keepalive_timeout_s``; waiting ``first_byte_timeout_s`` for an
    attempt's first byte), the tenants of ``TENANT_KEYS`` (4,096 prompt and 512 output
    tokens each, as a deployment facing untrusted keys sets), the admin key
    ``ADMIN_KEY``, and ``launch`` settings (restart policy) for ``up``. ``roles``, one
    per worker (docs/pd.md): worker ``i``'s router role and the matching
    ``--kv-transfer-config`` (``KV_ROLES``); with ``pd_min_uncached_tokens``, the
    router's ``[pd]``."""
    lines = ["[listen]", "port = 0", f"keepalive_timeout_s = {keepalive_timeout_s}",
             "[metrics]", "port = 0",
             "[models.demo]", 'tokenizer = "demo"', "block_size = 16",
             "[policy]", f'name = "{policy}"',
             "[registry]", "poll_interval_s = 0.5", "probe_timeout_s = 2.0",
             "[proxy]", "max_attempts = 3", f"first_byte_timeout_s = {first_byte_timeout_s}",
             "idle_timeout_s = 10",
             "[auth]", "allow_anonymous = false", f'admin_key_digest = "{hash_key(ADMIN_KEY)}"']
    for tenant, key in TENANT_KEYS.items():
        lines += [f"[auth.tenants.{tenant}]", f'key_digests = ["{hash_key(key)}"]',
                  "max_prompt_tokens = 4096", "max_output_tokens = 512",
                  f"max_concurrent_requests = {max_concurrent_requests}",
                  "tokens_per_minute = 100000000"]
    if launch_redis:
        lines += ["[redis]", "launch = true", 'key_prefix = "chaos"', "command_timeout_s = 0.5",
                  "heartbeat_interval_s = 0.5", "lease_ttl_s = 2.0", "sync_interval_s = 0.5"]
    if pd_min_uncached_tokens is not None:
        lines += ["[pd]", f"min_uncached_tokens = {pd_min_uncached_tokens}"]
    lines += ["[launch]", "ready_timeout_s = 180", f"routers = {num_routers}"]
    lines += [f"{key} = {value}" for key, value in (launch or {}).items()]
    for i in range(num_workers):
        role = "both" if roles is None else roles[i]
        args = ["--model", "demo", "--port", "0", *WORKER_FLAGS]
        if roles is not None:
            args += ["--kv-transfer-config", json.dumps({"kv_role": KV_ROLES[role]})]
        launch_args = ", ".join(json.dumps(a) for a in args)
        lines += ["[[workers]]", f'id = "w{i}"', 'model = "demo"', f'role = "{role}"',
                  f"launch = [{launch_args}]"]
    return "\n".join(lines) + "\n"


class UpProcess:
    """``python -m router up --config PATH`` started now, stdout and stderr merged and
    read on a thread (each line also echoed to ``log`` if given)."""

    def __init__(self, config_path: str | Path, log: Path | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "router", "up", "--config", str(config_path)],
            cwd=REPO_ROOT, env=child_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, errors="replace")
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._log = None if log is None else log.open("w", encoding="utf-8")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if self._log is not None:
                self._log.write(line)
                self._log.flush()
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self.lines.append("")  # end of output
            self._changed.notify_all()

    def wait_line(self, pattern: str, timeout_s: float, start: int = 0) -> re.Match[str]:
        """The first line from index ``start`` on that matches ``pattern``; TimeoutError
        (with the output) after ``timeout_s`` or when ``up`` has exited without it."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for line in self.lines[start:]:
                    if match := regex.search(line):
                        return match
                start = len(self.lines)
                ended = self.lines and self.lines[-1] == "" and self.proc.poll() is not None
                if ended or time.monotonic() > deadline:
                    raise TimeoutError(f"no line matching {pattern!r}:\n" + self.output())
                self._changed.wait(0.2)

    def wait_banner(self, timeout_s: float = 240.0) -> None:
        """Block until ``up`` printed its start banner (every child serves)."""
        self.wait_line(r"Ctrl-C stops", timeout_s)

    def output(self) -> str:
        """Everything ``up`` printed so far."""
        with self._changed:
            return "\n".join(self.lines)

    def count(self, pattern: str) -> int:
        """How many lines so far match ``pattern``."""
        regex = re.compile(pattern)
        with self._changed:
            return sum(1 for line in self.lines if regex.search(line))

    def pid(self, name: str) -> int:
        """The PID of child ``name``'s latest start."""
        return int(self._last(rf"^\[{re.escape(name)}\] started \(pid (\d+)\)"))

    def url(self, name: str) -> str:
        """The URL child ``name`` announced last (``[name] READY URL``)."""
        return self._last(rf"^\[{re.escape(name)}\] READY (\S+)")

    def router_urls(self) -> list[str]:
        """The routers' client URLs, first router first."""
        names = sorted({m.group(1) for line in self.lines
                        if (m := re.match(r"^\[(router\d*)\] READY ", line))})
        return [self.url(name) for name in names]

    def metrics_url(self, name: str) -> str:
        """The metrics URL router ``name`` announced last."""
        return self._last(rf"^\[{re.escape(name)}\] METRICS (\S+)")

    def _last(self, pattern: str) -> str:
        regex = re.compile(pattern)
        with self._changed:
            found = [m.group(1) for line in self.lines if (m := regex.search(line))]
        if not found:
            raise LookupError(f"no line matching {pattern!r}:\n{self.output()}")
        return found[-1]

    def signal_child(self, name: str, signum: int) -> int:
        """Send ``signum`` to child ``name``'s latest PID (never by name); its PID."""
        pid = self.pid(name)
        os.kill(pid, signum)
        return pid

    def stop(self, signum: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        """Send ``signum`` to ``up`` and wait for its exit status (SIGKILL after
        ``timeout_s``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        if self._log is not None:
            self._log.close()
        return self.proc.returncode


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def all_pids(up: UpProcess, names: Sequence[str]) -> list[int]:
    """Every PID ``up`` announced for the children ``names`` (every start)."""
    return [int(m.group(1)) for line in up.lines for name in names
            if (m := re.match(rf"^\[{re.escape(name)}\] started \(pid (\d+)\)", line))]
