"""The peer routers (sglang-router, vllm-router) as benchmark processes.

They live in their own virtual environment, ``bench/.peers`` (``make bench-peers``
installs them there; they are never a dependency of this project). ``available()``
says which are installed; ``start_peer`` runs one in front of given worker URLs with
a policy, sends our workers' key with its ``--api-key`` and waits until a completion
goes through it. A run without them says so and goes on (callers check
``available()`` first).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.peer_rule import DEFAULT_THRESHOLDS, TUNED_THRESHOLDS
from router.up.launcher import free_port

PEERS_ENV = Path(__file__).resolve().parent / ".peers"
PEERS_PYTHON = PEERS_ENV / "bin" / "python"


@dataclass(frozen=True)
class PeerSetup:
    """One peer router configuration: its package module, policy and thresholds."""

    module: str
    policy: str
    thresholds: dict[str, float] | None = None

    def args(self, worker_urls: Sequence[str], port: int, metrics_port: int, api_key: str) -> list[str]:
        """The launch command line."""
        args = [str(PEERS_PYTHON), "-m", f"{self.module}.launch_router", "--host", "127.0.0.1",
                "--port", str(port), "--policy", self.policy, "--worker-urls", *worker_urls,
                "--prometheus-port", str(metrics_port), "--prometheus-host", "127.0.0.1",
                "--api-key", api_key, "--log-level", "warn" if self.module == "sglang_router" else "warning"]
        for name, value in (self.thresholds or {}).items():
            args += [f"--{name.replace('_', '-')}", str(value)]
        return args


PEER_SETUPS: dict[str, PeerSetup] = {
    "sglang cache_aware default": PeerSetup("sglang_router", "cache_aware", DEFAULT_THRESHOLDS),
    "sglang cache_aware tuned": PeerSetup("sglang_router", "cache_aware", TUNED_THRESHOLDS),
    "vllm cache_aware": PeerSetup("vllm_router", "cache_aware", DEFAULT_THRESHOLDS),
    "vllm consistent_hash": PeerSetup("vllm_router", "consistent_hash"),
}


def available() -> dict[str, bool]:
    """Which peer packages import in ``bench/.peers`` (False for both without it)."""
    found = {}
    for module in ("sglang_router", "vllm_router"):
        found[module] = PEERS_PYTHON.exists() and subprocess.run(
            [str(PEERS_PYTHON), "-c", f"import {module}"], capture_output=True).returncode == 0
    return found


def installed(requested: Sequence[str]) -> tuple[list[str], list[str]]:
    """The setups of ``requested`` to run (``ours ...`` always, a peer's only when its
    package is installed) and the requested peers' modules that are missing."""
    found = available()
    missing = sorted({PEER_SETUPS[s].module for s in requested
                      if not s.startswith("ours ") and not found[PEER_SETUPS[s].module]})
    setups = [s for s in requested if s.startswith("ours ") or found[PEER_SETUPS[s].module]]
    return setups, missing


def completes(url: str, model: str, api_key: str) -> bool:
    """Whether one one-token completion through ``url`` answers 200."""
    body = json.dumps({"model": model, "prompt": "ping", "max_tokens": 1}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", body, {
        "Content-Type": "application/json", "Authorization": f"Bearer {api_key}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class PeerProcess:
    """A running peer router: ``url`` to send requests to; ``stop()`` ends it."""

    process: subprocess.Popen
    url: str
    log_path: Path

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_peer(setup: PeerSetup, worker_urls: Sequence[str], api_key: str, model: str,
               log_path: Path, timeout_s: float = 90.0,
               extra_args: Sequence[str] = ()) -> PeerProcess:
    """Start ``setup`` (plus ``extra_args``) in front of ``worker_urls``; RuntimeError
    with its log's tail when no completion goes through within ``timeout_s``."""
    port = free_port()
    return launch([*setup.args(worker_urls, port, free_port(), api_key), *extra_args], port,
                  api_key, model, log_path, timeout_s, f"{setup.module} {setup.policy}")


def launch(args: Sequence[str], port: int, api_key: str, model: str, log_path: Path,
           timeout_s: float, what: str) -> PeerProcess:
    """Run the peer command ``args`` (listening on ``port``, its output to ``log_path``)
    until a completion of ``model`` goes through it; RuntimeError naming ``what`` with
    its log's tail when none does within ``timeout_s``."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    peer = PeerProcess(process, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if completes(peer.url, model, api_key):
            return peer
        time.sleep(0.5)
    peer.stop()
    tail = log_path.read_text(errors="replace")[-2000:]
    raise RuntimeError(f"{what} did not serve within {timeout_s} s:\n{tail}")
