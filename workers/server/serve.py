"""Start-up and shutdown of one worker process.

Sequence: bind the listening socket (so ``port`` 0 resolves to a real port before
the worker id and event log exist), build the worker off the event loop (model
load, KV plan, namespace), start serving HTTP (``/health`` answers; ``/ready`` is
503), start the engine thread, run the self-test, mark ready, and only then
announce ``READY http://HOST:PORT`` on stdout: a launcher that waits for that line
never sees a worker that is not ready. From then on ``keep_ready`` drops readiness
after a failed batched step until the self-test passes again. SIGTERM or SIGINT drain
it: ``/ready`` turns 503 and new requests get 503 with Retry-After at once (routers
stop sending on the first 503), requests in flight get ``drain_timeout_s`` to
finish, then the server closes and the engine thread finishes its step and exits.
With a host-tier TTL, ``expire_host_entries`` drops expired entries every quarter of
it (at most a minute apart), so an idle worker does not keep them: admissions alone
would only drop them at the next request.
With a disk tier, the whole cache (device and host tiers) is first spilled to disk,
so the next start with the same directory and secret comes back warm.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from collections.abc import Callable

from aiohttp import web

from workers.config import WorkerConfig
from workers.engine.async_engine import AsyncEngine
from workers.build import build_worker
from workers.engine.selftest import keep_ready, run_self_test
from workers.kv_transfer.service import KVTransfer
from workers.model.timed import timed_link_s_per_block, timed_profile
from workers.server.app import create_app
from workers.server.state import ServerState

log = logging.getLogger(__name__)
SHUTDOWN_TIMEOUT_S = 5.0


def base_url(host: str, port: int) -> str:
    """``http://host:port`` (IPv6 hosts bracketed)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def serve(config: WorkerConfig, secret: bytes, api_key: str | None,
                announce: Callable[[str], None]) -> None:
    """Run the worker until SIGTERM/SIGINT; ``announce`` gets the READY line. Every
    route but ``/health`` requires ``api_key`` (None: none, loopback only; the caller
    checked the listen address with ``workers.server.access``).

    Raises ValueError for a bad model or KV plan and ``SelfTestError`` if the engine
    fails its self-test (the process must then exit non-zero)."""
    server_config = config.server
    family = socket.AF_INET6 if ":" in server_config.host else socket.AF_INET
    sock = socket.create_server((server_config.host, server_config.port), family=family, backlog=1024)
    port = sock.getsockname()[1]
    url = base_url(server_config.host, port)
    worker_id = server_config.worker_id or f"{server_config.host}:{port}"
    worker = await asyncio.to_thread(build_worker, config, worker_id, secret)
    loop = asyncio.get_running_loop()
    worker.engine.start(loop)
    transfer = None
    if config.kv_transfer.kv_role != "none":
        try:
            profile = timed_profile(config.model.name)
            link_s = 0.0 if profile is None else timed_link_s_per_block(
                profile, config.kv.block_size, config.model.time_scale)
            transfer = await KVTransfer.start(config.kv_transfer, worker,
                                              config.kv.hash_algorithm, api_key,
                                              server_config.host, link_s)
        except BaseException:
            worker.engine.stop()
            raise
    state = ServerState(server_config, worker, api_key, transfer=transfer)
    runner = web.AppRunner(create_app(state), handler_cancellation=True, access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    keeper: asyncio.Task[None] | None = None
    expirer: asyncio.Task[None] | None = None
    vocab_size, block_size = worker.identity.vocab_size, worker.identity.namespace.block_size
    try:
        await web.SockSite(runner, sock, shutdown_timeout=SHUTDOWN_TIMEOUT_S).start()
        log.info("worker %s listening on %s (model %s)", worker_id, url, worker.identity.model)
        await asyncio.sleep(server_config.self_test_delay_s)
        await run_self_test(worker.engine, vocab_size, block_size)
        state.ready.set()
        keeper = asyncio.create_task(keep_ready(worker.engine, state.ready, vocab_size,
                                                block_size))
        if config.kv.host_ttl_s is not None:
            expirer = asyncio.create_task(expire_host_entries(worker.engine, config.kv.host_ttl_s))
        announce(f"READY {url}")
        await stop.wait()
        worker.engine.stop_admitting()
        log.info("draining %d requests (at most %g s)", worker.engine.num_in_flight,
                 server_config.drain_timeout_s)
        if not await worker.engine.wait_idle(server_config.drain_timeout_s):
            log.warning("drain timed out; cancelling %d requests", worker.engine.num_in_flight)
        if not worker.engine.failed:
            num_spilled = await worker.engine.call(lambda engine: engine.manager.spill_to_disk())
            log.info("%d device KV blocks spilled to disk", num_spilled)
        log.info("shutting down")
    finally:
        for task in (keeper, expirer):
            if task is not None:
                task.cancel()
        worker.engine.kv_feed.drop_all()  # KV event streams never end by themselves
        if transfer is not None:
            await transfer.close()
        await runner.cleanup()
        worker.engine.stop()


async def expire_host_entries(engine: AsyncEngine, ttl_s: float) -> None:
    """Forever: drop the host tier's expired entries on the engine thread, every
    quarter of ``ttl_s`` (at most a minute apart)."""
    period_s = min(ttl_s / 4, 60.0)
    while True:
        await asyncio.sleep(period_s)
        await engine.call(lambda e: e.manager.expire_host(time.time()))
