"""``radix-router up``: run the workers a config launches and its routers, as children.

Each child is ``python -m workers ...`` or ``python -m router router ...`` (never an
import of workers), or, with ``[redis] launch = true``, a ``redis-server`` on a free
loopback port that persists nothing, whose URL every router gets. ``launch.routers``
routers run, router ``i`` on ``listen.port + i`` and ``metrics.port + i``. Children
run in their own session so a terminal's Ctrl-C reaches only this
supervisor, and with a parent-death signal so a killed supervisor leaves no orphan.
Each child prints ``READY http://HOST:PORT`` when it serves; the supervisor waits
for every READY, prints how to use the router with the answer to one example
request (when the config names an example key), and on SIGINT/SIGTERM (or any child
exiting) stops them all: SIGTERM, then SIGKILL after a grace period.

Secrets travel in the environment only, never on a command line (``ps`` shows
argv): the deployment secret, and a worker API key generated for this deployment,
which each launched worker reads from ``$RADIX_WORKER_API_KEY`` and the router from
the worker's ``api_key_env``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import sys
import time
from pathlib import Path

import aiohttp

from radix.namespace import SECRET_ENV
from router.config import RouterConfig
from router.server.app import die_with_parent
from router.state.redis_state.server import redis_answers, redis_server_args

READY_PREFIX = "READY "
WORKER_KEY_ENV = "RADIX_WORKER_API_KEY"  # read by workers.server.access
_STOP_GRACE_S = 10.0
EXAMPLE_QUESTION = "What is the capital of France?"


class Child:
    """One supervised process whose stdout is echoed with a ``[name]`` prefix."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process) -> None:
        self.name = name
        self.proc = proc
        self.url: str | None = None
        self._echo: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, name: str, argv: list[str], env: dict[str, str]) -> Child:
        """Start ``argv`` with ``env``; RuntimeError if the program is not found."""
        try:
            proc = await cls._exec(argv, env)
        except FileNotFoundError as exc:
            raise RuntimeError(f"{name}: {argv[0]} not found on PATH") from exc
        return cls(name, proc)

    @staticmethod
    async def _exec(argv: list[str], env: dict[str, str]) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *argv, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True, preexec_fn=die_with_parent)

    def echo(self) -> None:
        """Echo the child's output from now on (for a child with no READY line)."""
        self._echo = asyncio.create_task(self._echo_rest())

    async def wait_ready(self) -> str:
        """Echo output until the READY line; returns the URL. RuntimeError if the child
        exits first."""
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            text = line.decode(errors="replace").rstrip()
            print(f"[{self.name}] {text}", flush=True)
            if text.startswith(READY_PREFIX):
                self.url = text[len(READY_PREFIX):].strip()
                self._echo = asyncio.create_task(self._echo_rest())
                return self.url
        raise RuntimeError(f"{self.name} exited with code {await self.proc.wait()} "
                           "before it was ready")

    async def _echo_rest(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            print(f"[{self.name}] {line.decode(errors='replace').rstrip()}", flush=True)

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after the grace period; waits for the exit."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), _STOP_GRACE_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        if self._echo is not None:
            await self._echo


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
            "messages": [{"role": "user", "content": EXAMPLE_QUESTION}]}  # fmt: skip
    headers = {"Authorization": f"Bearer {key}"}
    deadline = time.monotonic() + config.launch.ready_timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.post(f"{url}/v1/chat/completions", json=body,
                                        headers=headers) as response:  # fmt: skip
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


async def run_cluster(config: RouterConfig, config_path: str, port: int | None = None,
                      metrics_port: int | None = None) -> int:
    """Start Redis if the config launches it, the launched workers (in parallel), then
    the routers (from ``port`` and ``metrics_port`` if given, else the config's);
    serve until a signal or a child exits; stop everything, Redis last. Returns the
    exit code (130 when interrupted during start-up)."""
    env = cluster_env(config, deployment_secret(config), secrets.token_urlsafe(32))
    children: list[Child] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        redis_url = None
        if config.redis.launch:
            redis_url = await _start_redis(children, env, config, stop)
        launched = [w for w in config.workers if w.launch is not None]
        workers = [await Child.start(w.worker_id, [sys.executable, "-m", "workers", *w.launch],
                                     env) for w in launched]
        children += workers
        urls = await asyncio.gather(*(_ready(c, config, stop) for c in workers))
        worker_urls = [arg for w, url in zip(launched, urls, strict=True)
                       for arg in ("--worker-url", f"{w.worker_id}={url}")]
        routers = []
        for i in range(config.launch.num_routers):
            name = "router" if config.launch.num_routers == 1 else f"router{i}"
            args = _router_args(config, config_path, i, port, metrics_port, redis_url)
            routers.append(await Child.start(name, [*args, *worker_urls], env))
        children += routers
        router_urls = await asyncio.gather(*(_ready(r, config, stop) for r in routers))
        exchange = await example_exchange(router_urls[0], config)
        print(banner(list(router_urls), config, exchange), flush=True)
        exits = [asyncio.create_task(c.proc.wait()) for c in children]
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait([stopping, *exits], return_when=asyncio.FIRST_COMPLETED)
        for task in [stopping, *exits]:
            task.cancel()
        exited = [c.name for c in children if c.proc.returncode is not None]
        if exited:
            print(f"{', '.join(exited)} exited; stopping", flush=True)
        return 1 if exited else 0
    except Interrupted:
        return 130
    finally:
        for child in reversed(children):
            await child.stop()


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


async def _start_redis(children: list[Child], env: dict[str, str], config: RouterConfig,
                       stop: asyncio.Event) -> str:
    """Start ``redis-server`` on a free loopback port (appended to ``children``) and
    wait until it answers; its URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        redis_port = probe.getsockname()[1]
    child = await Child.start("redis", redis_server_args(redis_port), env)
    children.append(child)
    child.echo()
    deadline = asyncio.get_running_loop().time() + config.launch.ready_timeout_s
    while not redis_answers(redis_port):
        if stop.is_set():
            raise Interrupted
        if child.proc.returncode is not None:
            raise RuntimeError(f"redis exited with code {child.proc.returncode} before it "
                               "was ready")
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(f"redis not ready after {config.launch.ready_timeout_s}s")
        await asyncio.sleep(0.05)
    url = f"redis://127.0.0.1:{redis_port}/0"
    print(f"[redis] READY {url}", flush=True)
    return url


class Interrupted(Exception):
    """A stop signal arrived while children were starting."""


async def _ready(child: Child, config: RouterConfig, stop: asyncio.Event) -> str:
    """The child's URL once it is READY; Interrupted if ``stop`` is set first."""
    ready = asyncio.create_task(child.wait_ready())
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([ready, stopping], timeout=config.launch.ready_timeout_s,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if ready.done():
        return ready.result()
    ready.cancel()
    if stop.is_set():
        raise Interrupted
    raise RuntimeError(f"{child.name} not ready after {config.launch.ready_timeout_s}s")
