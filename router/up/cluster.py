"""``radix-router up``: run the workers a config launches and its routers, as children.

Each child is ``python -m workers ...`` or ``python -m router router ...`` (never an
import of workers), or, with ``[redis] launch = true``, a ``redis-server`` on a free
loopback port that persists nothing, whose URL every router gets. ``launch.routers``
routers run, router ``i`` on ``listen.port + i`` and ``metrics.port + i``. Children
run in their own session so a terminal's Ctrl-C reaches only this
supervisor, and with a parent-death signal so a killed supervisor leaves no orphan.
Each child prints ``READY http://HOST:PORT`` when it serves; the supervisor waits
for every READY, prints how to use the router with the answer to one example
request (when the config names an example key), then keeps every child serving:
one that exits is restarted on the ports it had, with backoff, or given up on
after too many crashes (``router.up.supervisor``, policy in ``[launch]``), while the
rest keeps serving. Only SIGINT/SIGTERM end ``up``: it stops every child by PID,
SIGTERM, then SIGKILL after a grace period, Redis last. Starting, waiting and
stopping are ``router.up.launcher``'s, shared with the tests.

Secrets travel in the environment only, never on a command line (``ps`` shows
argv): the deployment secret, and a worker API key generated for this deployment,
which each launched worker reads from ``$RADIX_WORKER_API_KEY`` and the router from
the worker's ``api_key_env``.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import aiohttp

from radix.namespace import SECRET_ENV
from router.config import RouterConfig
from router.up.launcher import (
    WORKER_KEY_ENV,
    ChildProcess,
    Interrupted,
    ProcessFailed,
    RedisServer,
    echo_line,
    stop_all,
)
from router.up.supervisor import Restart, RestartPolicy, Supervised

EXAMPLE_QUESTION = "What is the capital of France?"


def deployment_secret(config: RouterConfig) -> str:
    """The secret to hand every child: the config's file, else its environment
    variable, else a fresh dev secret shared by this cluster only."""
    if config.secret.file is not None:
        return Path(config.secret.file).read_text(encoding="utf-8").strip()
    return os.environ.get(config.secret.env) or secrets.token_hex(32)


def banner(urls: list[str], config: RouterConfig, exchange: str | None = None) -> str:
    """How to call the routers: URLs, an example curl, the openai-client snippet and,
    if given, the answer the first router gave to that example."""
    url = urls[0]
    model = next(iter(config.models))
    key = config.launch.example_api_key or "$RADIX_ROUTER_API_KEY"
    more = "".join(f"\nanother router (same workers and shared state) at {u}" for u in urls[1:])
    answered = f"\n  It answered: {exchange!r}\n" if exchange is not None else ""
    return f"""
radix-router is up at {url}{more}

  curl {url}/v1/chat/completions \\
    -H "Authorization: Bearer {key}" -H "Content-Type: application/json" \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "{EXAMPLE_QUESTION}"}}], "max_tokens": 32, "temperature": 0}}'
{answered}
  from openai import OpenAI
  client = OpenAI(base_url="{url}/v1", api_key="{key}")
  print(client.chat.completions.create(model="{model}", max_tokens=32, temperature=0,
        messages=[{{"role": "user", "content": "{EXAMPLE_QUESTION}"}}]).choices[0].message.content)

Ctrl-C stops the router and the workers.
""".rstrip()


async def example_exchange(url: str, config: RouterConfig) -> str | None:
    """The router's answer to the banner's example request, sent with the config's
    example key (None without one, or when no answer comes within the launch
    timeout: a 503 while the registry first polls the workers is retried)."""
    key = config.launch.example_api_key
    if key is None:
        return None
    body = {"model": next(iter(config.models)), "max_tokens": 32, "temperature": 0,
            "messages": [{"role": "user", "content": EXAMPLE_QUESTION}]}
    headers = {"Authorization": f"Bearer {key}"}
    deadline = time.monotonic() + config.launch.ready_timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.post(f"{url}/v1/chat/completions", json=body,
                                        headers=headers) as response:
                    if response.status == 200:
                        return (await response.json())["choices"][0]["message"]["content"]
                    if response.status != 503:
                        return None
            except aiohttp.ClientError:
                return None
            await asyncio.sleep(0.2)
    return None


def cluster_env(config: RouterConfig, secret: str, worker_key: str) -> dict[str, str]:
    """The children's environment: this one plus the deployment secret and the worker
    key, under the worker's variable and every launched worker's ``api_key_env``."""
    env = dict(os.environ)
    env[SECRET_ENV] = secret
    env[config.secret.env] = secret
    env[WORKER_KEY_ENV] = worker_key
    for worker in config.workers:
        if worker.launch is not None and worker.api_key_env is not None:
            env[worker.api_key_env] = worker_key
    return env


def run_cluster(config: RouterConfig, config_path: str, port: int | None = None,
                metrics_port: int | None = None) -> int:
    """Start Redis if the config launches it, the launched workers (all at once), then
    the routers (from ``port`` and ``metrics_port`` if given, else the config's);
    supervise them (``router.up.supervisor``) until SIGINT or SIGTERM; stop everything,
    Redis last. Returns the exit code: 0, 1 if a child was given up on, 130 when
    interrupted during start-up."""
    env = cluster_env(config, deployment_secret(config), secrets.token_urlsafe(32))
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    policy = RestartPolicy.from_launch(config.launch)
    timeout_s = config.launch.ready_timeout_s
    started: list[Supervised] = []  # Redis, the workers, the routers
    redis: RedisServer | None = None
    try:
        if config.redis.launch:
            redis = _start_redis(env, timeout_s, stop)
            started.append(Supervised("redis", redis.child, _redis_restart(redis, timeout_s),
                                      policy, stop))
        launched = [w for w in config.workers if w.launch is not None]
        workers = [_supervised(w.worker_id, [sys.executable, "-m", "workers", *w.launch],
                               env, timeout_s, policy, stop, ("--port",)) for w in launched]
        started += workers
        urls = _wait_ready([s.child for s in workers], timeout_s, stop)
        worker_urls = [arg for w, url in zip(launched, urls, strict=True)
                       for arg in ("--worker-url", f"{w.worker_id}={url}")]
        commands = _router_commands(config, config_path, port, metrics_port,
                                    redis.url if redis else None, worker_urls)
        routers = [_supervised(name, args, env, timeout_s, policy, stop,
                               ("--port", "--metrics-port")) for name, args in commands]
        started += routers
        router_urls = _wait_ready([s.child for s in routers], timeout_s, stop)
        exchange = asyncio.run(example_exchange(router_urls[0], config))
        print(banner(router_urls, config, exchange), flush=True)
        return _supervise(started, stop)
    except Interrupted:
        return 130
    finally:
        stop.set()
        _stop_cluster(started, redis)


def _start_redis(env: dict[str, str], timeout_s: float, stop: threading.Event) -> RedisServer:
    """A supervised ``redis-server``, READY (Interrupted as soon as ``stop`` is set)."""
    redis = RedisServer(timeout_s=timeout_s, env=env, echo=True, supervised=True,
                        interrupted=stop.is_set)
    echo_line("redis", f"READY {redis.url}")
    _announce_start("redis", redis.child)
    return redis


def _router_commands(config: RouterConfig, config_path: str, port: int | None,
                     metrics_port: int | None, redis_url: str | None,
                     worker_urls: list[str]) -> list[tuple[str, list[str]]]:
    """Each router's name and command line (``_router_args`` and ``worker_urls``)."""
    num_routers = config.launch.num_routers
    return [("router" if num_routers == 1 else f"router{i}",
             [*_router_args(config, config_path, i, port, metrics_port, redis_url),
              *worker_urls])
            for i in range(num_routers)]


def _supervise(started: list[Supervised], stop: threading.Event) -> int:
    """Keep every child serving until ``stop`` is set; 1 if one was given up on, else 0."""
    for supervised in started:
        supervised.start()
    while not stop.wait(0.5):
        pass
    return 1 if any(s.given_up for s in started) else 0


def _stop_cluster(started: list[Supervised], redis: RedisServer | None) -> None:
    """Once ``stop`` is set: wait for every watch to end, then stop the children, last
    started first, Redis last."""
    for supervised in started:
        supervised.join()
    stop_all([s.child for s in started if s.name != "redis"][::-1])
    if redis is not None:
        redis.stop()


def _announce_start(name: str, child: ChildProcess | None) -> None:
    if child is not None:
        echo_line(name, f"started (pid {child.proc.pid})")


def _supervised(name: str, args: list[str], env: dict[str, str], timeout_s: float,
                policy: RestartPolicy, stop: threading.Event,
                port_flags: tuple[str, ...]) -> Supervised:
    """Start ``args`` as child ``name`` under ``policy``. A restart keeps the ports
    the first child announced: its READY port after ``port_flags[0]`` and (a router)
    its METRICS port after ``port_flags[1]`` (so routers and clients find it again)."""
    child = ChildProcess(args, env, name, echo=True, supervised=True)
    _announce_start(name, child)

    def restart(previous: ChildProcess, interrupted: Callable[[], bool]) -> ChildProcess:
        urls = (previous.url, previous.metrics_url)
        ports = [f for flag, url in zip(port_flags, urls, strict=False)
                 for f in (flag, str(urllib.parse.urlsplit(url).port))]
        fresh = ChildProcess([*args, *ports], env, name, echo=True, supervised=True)
        _announce_start(name, fresh)
        try:
            fresh.wait_ready(timeout_s, interrupted)
        except (Interrupted, ProcessFailed):
            fresh.stop()
            raise
        return fresh

    return Supervised(name, child, restart, policy, stop)


def _redis_restart(redis: RedisServer, timeout_s: float) -> Restart:
    """A fresh, empty ``redis-server`` on the same port (the routers reconnect)."""
    def restart(previous: ChildProcess, interrupted: Callable[[], bool]) -> ChildProcess:
        try:
            redis.start(timeout_s, interrupted)
        except Interrupted:
            redis.stop()
            raise
        assert redis.child is not None
        _announce_start("redis", redis.child)
        return redis.child

    return restart


def _wait_ready(children: list[ChildProcess], timeout_s: float, stop: threading.Event
                ) -> list[str]:
    """Each child's URL once READY, all within one ``timeout_s`` from now (they start
    together); Interrupted as soon as ``stop`` is set."""
    deadline = time.monotonic() + timeout_s
    return [c.wait_ready(max(deadline - time.monotonic(), 0.0), stop.is_set) for c in children]


def _router_args(config: RouterConfig, config_path: str, index: int, port: int | None,
                 metrics_port: int | None, redis_url: str | None) -> list[str]:
    """The command line of router ``index``: ports offset by ``index`` (0 stays 0: a
    free port each) and the launched Redis."""
    base = config.listen.port if port is None else port
    metrics_base = config.metrics.port if metrics_port is None else metrics_port
    args = [sys.executable, "-m", "router", "router", "--config", config_path,
            "--port", str(base + index if base else 0),
            "--metrics-port", str(metrics_base + index if metrics_base else 0)]
    if redis_url is not None:
        args += ["--redis-url", redis_url]
    return args
