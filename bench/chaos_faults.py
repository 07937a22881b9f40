"""The chaos soak's deployments under ``radix-router up`` and the faults they suffer.

``Deployment`` is one of two ``FLEETS`` started through the supervisor, with the
handles a fault and a health check need:

- ``multi`` (the default): configs/multi-router.toml's shape, a launched Redis, two
  routers, three demo workers; faults ``FAULTS``;
- ``pd``: a prefill/decode fleet (docs/pd.md), one router in front of a prefill worker
  (w0, ``kv_producer``), a decode worker (w1, ``kv_consumer``) and a worker of role
  ``both`` (w2, ``kv_both``), ``[pd] min_uncached_tokens = 32``, the router waiting
  ``PD_FIRST_BYTE_TIMEOUT_S`` for an attempt's first byte; faults ``PD_FAULTS``.

Each fault is an async function that injects it and returns when it has ended (the
supervisor restarted what was killed, a hung worker was continued, hostile clients
closed), with notes on what it saw. Of ``FAULTS``, the last three are the attacks of
``harness.attacks`` (heads and bodies past the router's bounds), with ``/health``
timed while they run. Every signal goes to a PID the supervisor announced; every
socket goes to 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.chaos_traffic import HANG_UP_POINTS, Slowloris, close_all, hang_up, open_non_reading
from harness import attacks
from harness.up_process import TENANT_KEYS, UpProcess, up_config

NUM_WORKERS = 3
WORKERS = tuple(f"w{i}" for i in range(NUM_WORKERS))
ROUTERS = ("router0", "router1")
# Faults never exhaust the restart budget: each kind hits a child once per round.
RESTART_POLICY = {"restart_backoff_initial_s": 0.2, "restart_backoff_max_s": 2.0,
                  "max_crashes": 20, "crash_window_s": 60}


# The routers' header timeout ([listen] keepalive_timeout_s). The slowloris fault holds
# its sockets at least SLOWLORIS_MIN_HOLD_S, past it: a close is seen only by the next
# trickled byte (one a second) and its reset by the one after.
HEADER_TIMEOUT_S = 3.0
SLOWLORIS_MIN_HOLD_S = HEADER_TIMEOUT_S + 3.0


# The PD fleet's router gives up on an attempt's first byte (a prefill leg's answer, a
# decode leg's first token, the pull included) after PD_FIRST_BYTE_TIMEOUT_S; the
# frozen producer stays stopped PRODUCER_FREEZE_S, past it (its legs and pulls in
# flight time out, the router's probes find it unready) and well under anything that
# would restart it (the supervisor restarts only what exits).
PD_FIRST_BYTE_TIMEOUT_S = 5.0
PRODUCER_FREEZE_S = 8.0
PD_ROLES = ("prefill", "decode", "both")
PD_MIN_UNCACHED_TOKENS = 32


@dataclass(frozen=True)
class Fleet:
    """One deployment shape: its children's names, its ``up`` config, whether Redis is
    launched, its faults (by name, in their default order), and how long the soak waits
    at the end for blocks to be freed (a hold nobody releases ends at its 20 s
    deadline)."""

    name: str
    workers: tuple[str, ...]
    routers: tuple[str, ...]
    config: Callable[[], str]
    faults: dict[str, Fault] = field(default_factory=dict)
    launch_redis: bool = False
    settle_s: float = 20.0
    roles: tuple[str, ...] | None = None

    @property
    def children(self) -> tuple[str, ...]:
        return (*(("redis",) if self.launch_redis else ()), *self.workers, *self.routers)


class Deployment:
    """``up`` with the chaos config of ``fleet`` (``FLEETS``), started and serving
    (every router sees every worker) once ``start`` returns."""

    def __init__(self, workdir: Path | None = None, fleet: str = "multi") -> None:
        self.fleet = FLEETS[fleet]
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="chaos-"))
        self.config_path = self.workdir / "chaos.toml"
        self.config_path.write_text(self.fleet.config())
        self.up = UpProcess(self.config_path, log=self.workdir / "up.log")
        self.routers: list[str] = []
        self.metrics: list[str] = []
        self._worker_key: str | None = None

    async def start(self, session: aiohttp.ClientSession) -> None:
        await asyncio.to_thread(self.up.wait_banner)
        self.routers = self.up.router_urls()
        self.metrics = [self.up.metrics_url(name) for name in self.fleet.routers]
        if not await wait_healthy(session, self, 120.0):
            raise RuntimeError("chaos deployment not healthy after start:\n" + self.up.output())
        self.worker_key()

    @property
    def redis_port(self) -> int:
        return int(self.up.url("redis").rsplit(":", 1)[1].split("/")[0])

    def worker_key(self) -> str:
        """The worker API key ``up`` generated for the whole run (every worker, and
        every restart of one, gets the same), read from a worker's environment once,
        while the deployment is known to be healthy: later, the worker read from may be
        between a chaos kill and its restart."""
        if self._worker_key is None:
            pid = self.up.pid(self.fleet.workers[0])
            raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            env = dict(item.decode().partition("=")[::2] for item in raw if item)
            self._worker_key = env["RADIX_WORKER_API_KEY"]
        return self._worker_key


async def healthy(session: aiohttp.ClientSession, deployment: Deployment) -> bool:
    """Every router answers with every worker ready and Redis (if launched) up, and
    serves a request."""
    timeout = aiohttp.ClientTimeout(total=5)
    headers = {"Authorization": f"Bearer {TENANT_KEYS['alice']}"}
    body = {"model": "demo", "prompt": "health", "max_tokens": 1, "temperature": 0}
    try:
        for router, metrics in zip(deployment.routers, deployment.metrics, strict=True):
            async with session.get(f"{router}/health", timeout=timeout) as response:
                if (await response.json())["num_ready_workers"] < len(deployment.fleet.workers):
                    return False
            if deployment.fleet.launch_redis:
                async with session.get(f"{metrics}/metrics", timeout=timeout) as response:
                    if "router_shared_state_up 1.0" not in await response.text():
                        return False
            async with session.post(f"{router}/v1/completions", json=body, headers=headers,
                                    timeout=timeout) as response:
                if response.status != 200:
                    return False
    except (TimeoutError, aiohttp.ClientError, ValueError, KeyError):
        return False
    return True


async def wait_healthy(session: aiohttp.ClientSession, deployment: Deployment,
                       timeout_s: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await healthy(session, deployment):
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def _signal_until_restarted(up: UpProcess, name: str, sig: signal.Signals) -> dict:
    """Send ``sig`` to child ``name``; return once the supervisor restarted it."""
    since = len(up.lines)
    up.signal_child(name, sig)
    await asyncio.to_thread(up.wait_line, rf"^\[{name}\] restarted", 240.0, since)
    return {}


async def kill_worker(deployment: Deployment, hold_s: float) -> dict:
    """SIGKILL w0; ends when the supervisor has it serving again."""
    return await _signal_until_restarted(deployment.up, "w0", signal.SIGKILL)


async def hang_worker(deployment: Deployment, hold_s: float) -> dict:
    """SIGSTOP w1 for ``hold_s`` (a hang), then SIGCONT."""
    pid = deployment.up.signal_child("w1", signal.SIGSTOP)
    try:
        await asyncio.sleep(hold_s)
    finally:
        deployment.up.signal_child("w1", signal.SIGCONT)
    return {"pid": pid}


async def kill_redis(deployment: Deployment, hold_s: float) -> dict:
    """SIGKILL redis-server; ends when the supervisor has a fresh one on its port."""
    return await _signal_until_restarted(deployment.up, "redis", signal.SIGKILL)


async def restart_router(deployment: Deployment, hold_s: float) -> dict:
    """SIGTERM router1 (it drains and exits); ends when the supervisor restarted it."""
    return await _signal_until_restarted(deployment.up, "router1", signal.SIGTERM)


async def drop_connections(deployment: Deployment, hold_s: float) -> dict:
    """Drop every TCP connection to w2 (the routers' KV-event streams among them, and
    requests in flight there) with ``ss -K``; the routers reconnect and resync."""
    port = deployment.up.url("w2").rsplit(":", 1)[1]
    result = await asyncio.to_thread(
        subprocess.run, ["ss", "-K", "-t", "-n", "dst", "127.0.0.1", "dport", "=", f":{port}"],
        capture_output=True, text=True)
    killed = [line for line in result.stdout.splitlines()[1:] if line.strip()]
    return {"num_connections_dropped": len(killed),
            **({"error": result.stderr.strip()} if result.returncode else {})}


async def non_reading_clients(deployment: Deployment, hold_s: float) -> dict:
    """32 streams on router0 that are never read, for ``hold_s``."""
    sockets = await asyncio.to_thread(open_non_reading, deployment.routers[0],
                                      TENANT_KEYS["carol"], 32)
    await asyncio.sleep(hold_s)
    close_all(sockets)
    return {"num_clients": len(sockets)}


async def slowloris(deployment: Deployment, hold_s: float) -> dict:
    """64 sockets on router1 trickling a request's headers, for ``hold_s`` (at least
    ``SLOWLORIS_MIN_HOLD_S``); notes how many the router closed by itself (its header
    timeout should close all)."""
    attack = Slowloris(deployment.routers[1], 64)
    stop = asyncio.Event()
    task = asyncio.create_task(attack.run(stop))
    await asyncio.sleep(max(hold_s, SLOWLORIS_MIN_HOLD_S))
    stop.set()
    await task
    attack.close()
    return {"num_clients": 64, "num_closed_by_server": attack.num_closed_by_server}


async def _attack(router: str, attack: Callable[[], bytes], num_clients: int,
                  hold_s: float) -> dict:
    """``attack`` over and over from ``num_clients`` threads for ``hold_s`` while
    ``/health`` of ``router`` is timed: how many, the statuses they got, and /health."""
    statuses: Counter[int | None] = Counter()

    def client(deadline: float) -> None:
        while time.monotonic() < deadline:
            statuses[attacks.status_code(attack())] += 1

    deadline = time.monotonic() + hold_s
    with attacks.HealthWatch(router).running() as health:
        await asyncio.gather(*(asyncio.to_thread(client, deadline) for _ in range(num_clients)))
    return {"num_attacks": sum(statuses.values()),
            "statuses": {str(code): n for code, n in sorted(statuses.items(), key=str)},
            "health": health.summary()}


async def header_flood(deployment: Deployment, hold_s: float) -> dict:
    """8 clients on router0 sending request heads that never end (header values, and
    every fourth a header name), for ``hold_s``: each should get 431."""
    router, calls = deployment.routers[0], itertools.count()

    def attack() -> bytes:
        if next(calls) % 4 == 3:
            return attacks.unterminated_header_name(router, max_bytes=4 << 20)
        return attacks.unterminated_header(router, max_bytes=4 << 20)

    return await _attack(router, attack, 8, hold_s)


async def body_flood(deployment: Deployment, hold_s: float) -> dict:
    """8 clients on router1 sending 32 MiB prompts of token ids as tenant carol (every
    other one chunked, so only its bytes tell), for ``hold_s``: each should get 413."""
    router, calls = deployment.routers[1], itertools.count()

    def attack() -> bytes:
        return attacks.oversize_token_prompt(router, TENANT_KEYS["carol"],
                                             chunked=next(calls) % 2 == 1)

    return await _attack(router, attack, 8, hold_s)


async def handed_off_flood(deployment: Deployment, hold_s: float) -> dict:
    """8 clients on router0 sending ``GET /health`` with a 31 MiB body, for ``hold_s``:
    answered without the body being held."""
    router = deployment.routers[0]
    return await _attack(router, lambda: attacks.oversize_handed_off_body(router), 8, hold_s)


NUM_HANG_UPS = 64
HANG_UP_CONCURRENCY = 8


def _long_prompt(rng: random.Random, i: int) -> str:
    """A prompt no tenant sent before, long enough to be disaggregated."""
    words = " ".join(rng.choice(("alpha", "beta", "gamma", "delta", "omega", "sigma"))
                     for _ in range(24))
    return f"Client {i} hangs up on this document: {words}. Summarize it."


async def hang_up_clients(deployment: Deployment, hold_s: float) -> dict:
    """``NUM_HANG_UPS`` clients (``HANG_UP_CONCURRENCY`` at a time, within ``hold_s``
    plus one client's timeout) each sending a long, fresh prompt (so a PD fleet splits
    it) and closing the connection at a random point: right after sending, after a
    random delay (before the first byte: during the prefill leg, the pull, the
    queueing), or mid-stream; each point about a third of them."""
    rng = random.Random(45)
    deadline = time.monotonic() + hold_s
    points: Counter[str] = Counter()
    answered: Counter[str] = Counter()
    semaphore = asyncio.Semaphore(HANG_UP_CONCURRENCY)
    keys = list(TENANT_KEYS.values())

    async def client(i: int) -> None:
        async with semaphore:
            if time.monotonic() > deadline:
                return
            point = HANG_UP_POINTS[i % len(HANG_UP_POINTS)]
            points[point] += 1
            if await hang_up(rng.choice(deployment.routers), keys[i % len(keys)],
                             _long_prompt(rng, i), point, rng):
                answered[point] += 1

    await asyncio.gather(*(client(i) for i in range(NUM_HANG_UPS)))
    return {"num_clients": sum(points.values()), "points": dict(points),
            "num_with_bytes": dict(answered)}


async def freeze_producer(deployment: Deployment, hold_s: float) -> dict:
    """SIGSTOP the prefill worker (w0) for ``PRODUCER_FREEZE_S``, then SIGCONT."""
    pid = deployment.up.signal_child("w0", signal.SIGSTOP)
    try:
        await asyncio.sleep(PRODUCER_FREEZE_S)
    finally:
        deployment.up.signal_child("w0", signal.SIGCONT)
    return {"pid": pid, "frozen_s": PRODUCER_FREEZE_S}


async def kill_producer(deployment: Deployment, hold_s: float) -> dict:
    """SIGKILL the prefill worker (w0: its holds die with it); ends when the supervisor
    has it serving again."""
    return await _signal_until_restarted(deployment.up, "w0", signal.SIGKILL)


async def kill_decode_worker(deployment: Deployment, hold_s: float) -> dict:
    """SIGKILL the decode worker (w1: its pulls and imports die with it); ends when the
    supervisor has it serving again."""
    return await _signal_until_restarted(deployment.up, "w1", signal.SIGKILL)


Fault = Callable[[Deployment, float], Awaitable[dict]]
FAULTS: dict[str, Fault] = {
    "kill_worker": kill_worker, "hang_worker": hang_worker, "kill_redis": kill_redis,
    "restart_router": restart_router, "drop_connections": drop_connections,
    "non_reading_clients": non_reading_clients, "slowloris": slowloris,
    "header_flood": header_flood, "body_flood": body_flood,
    "handed_off_flood": handed_off_flood,
}
PD_FAULTS: dict[str, Fault] = {
    "hang_up_clients": hang_up_clients, "freeze_producer": freeze_producer,
    "kill_decode_worker": kill_decode_worker, "kill_producer": kill_producer,
}

FLEETS: dict[str, Fleet] = {
    "multi": Fleet("multi", WORKERS, ROUTERS, lambda: up_config(
        NUM_WORKERS, num_routers=2, launch_redis=True, launch=RESTART_POLICY,
        policy="cache_aware", keepalive_timeout_s=HEADER_TIMEOUT_S),
        FAULTS, launch_redis=True),
    "pd": Fleet("pd", tuple(f"w{i}" for i in range(len(PD_ROLES))), ("router",), lambda: up_config(
        len(PD_ROLES), launch=RESTART_POLICY, policy="cache_aware",
        keepalive_timeout_s=HEADER_TIMEOUT_S, roles=PD_ROLES,
        pd_min_uncached_tokens=PD_MIN_UNCACHED_TOKENS,
        first_byte_timeout_s=PD_FIRST_BYTE_TIMEOUT_S),
        PD_FAULTS, settle_s=30.0, roles=PD_ROLES),
}
