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
from typing import Any

from aiohttp import web

from radix.cost_model import Profile
from workers.build import BuiltWorker, build_worker
from workers.config import WorkerConfig
from workers.engine.async_engine import AsyncEngine
from workers.engine.selftest import keep_ready, run_self_test
from workers.kv_transfer.service import KVTransfer
from workers.model.timed import timed_link_s_per_block, timed_profile, timed_source_costs
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
    sock = _listen(server_config.host, server_config.port)
    port = sock.getsockname()[1]
    url = base_url(server_config.host, port)
    worker_id = server_config.worker_id or f"{server_config.host}:{port}"
    worker = await asyncio.to_thread(build_worker, config, worker_id, secret)
    loop = asyncio.get_running_loop()
    worker.engine.start(loop)
    transfer = await _start_transfer(config, worker, api_key)
    state = ServerState(server_config, worker, api_key, transfer=transfer)
    runner = web.AppRunner(create_app(state), handler_cancellation=True, access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    background = [asyncio.create_task(state.load_push.run())]
    try:
        await web.SockSite(runner, sock, shutdown_timeout=SHUTDOWN_TIMEOUT_S).start()
        log.info("worker %s listening on %s (model %s)", worker_id, url, worker.identity.model)
        background += await _become_ready(config, state)
        announce(f"READY {url}")
        await stop.wait()
        await _drain(worker, server_config.drain_timeout_s)
        log.info("shutting down")
    finally:
        for task in background:
            task.cancel()
        worker.engine.kv_feed.drop_all()  # KV event streams never end by themselves
        if transfer is not None:
            await transfer.close()
        await runner.cleanup()
        worker.engine.stop()


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket on ``host``:``port`` (IPv6 when ``host`` has a colon)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=1024)


async def _start_transfer(config: WorkerConfig, worker: BuiltWorker,
                          api_key: str | None) -> KVTransfer:
    """The KV transfer service (its roles, none with ``kv_role`` none, and the retained
    sessions); stops the engine thread if it fails to start."""
    try:
        profile = timed_profile(config.model.name)
        link_s = 0.0 if profile is None else timed_link_s_per_block(
            profile, config.kv.block_size, config.model.time_scale)
        return await KVTransfer.start(config.kv_transfer, worker, config.kv.hash_algorithm,
                                      api_key, config.server.host, link_s,
                                      _transfer_costs(config, worker, profile),
                                      config.retention)
    except BaseException:
        worker.engine.stop()
        raise


def _transfer_costs(config: WorkerConfig, worker: BuiltWorker, profile: Profile | None
                    ) -> dict[str, Any]:
    """What this worker reports a router of its KV costs (``/info`` ``kv_transfer.costs``):
    a timed profile's, or only its KV bytes per token and prefill chunk (a router
    assumes the rest: docs/router-index.md, "Where the missing blocks come from")."""
    max_batched_tokens = worker.engine_config.max_batched_tokens
    if profile is not None:
        return timed_source_costs(profile, config.kv.block_size, max_batched_tokens,
                                  config.model.time_scale).to_dict(with_rates=True)
    return {"kv_bytes_per_token": worker.identity.kv_plan.kv_bytes_per_token,
            "max_batched_tokens": max_batched_tokens, "time_scale": 1.0}


async def _become_ready(config: WorkerConfig, state: ServerState) -> list[asyncio.Task[None]]:
    """After the self-test delay, pass the self-test and mark the worker ready; returns
    the background tasks started then (readiness keeper, host-tier expiry)."""
    engine = state.worker.engine
    vocab_size = state.worker.identity.vocab_size
    block_size = state.worker.identity.namespace.block_size
    await asyncio.sleep(config.server.self_test_delay_s)
    await run_self_test(engine, vocab_size, block_size)
    state.ready.set()
    tasks = [asyncio.create_task(keep_ready(engine, state.ready, vocab_size, block_size))]
    if config.kv.host_ttl_s is not None:
        tasks.append(asyncio.create_task(expire_host_entries(engine, config.kv.host_ttl_s)))
    return tasks


async def _drain(worker: BuiltWorker, timeout_s: float) -> None:
    """Refuse new requests and give those in flight ``timeout_s`` to finish; then, unless
    the engine failed, spill its cache to the disk tier (``KVCacheManager.spill_to_disk``)."""
    worker.engine.stop_admitting()
    log.info("draining %d requests (at most %g s)", worker.engine.num_in_flight, timeout_s)
    if not await worker.engine.wait_idle(timeout_s):
        log.warning("drain timed out; cancelling %d requests", worker.engine.num_in_flight)
    if not worker.engine.failed:
        num_spilled = await worker.engine.call(lambda engine: engine.manager.spill_to_disk())
        log.info("%d device KV blocks spilled to disk", num_spilled)


async def expire_host_entries(engine: AsyncEngine, ttl_s: float) -> None:
    """Forever: drop the host tier's expired entries on the engine thread, every
    quarter of ``ttl_s`` (at most a minute apart)."""
    period_s = min(ttl_s / 4, 60.0)
    while True:
        await asyncio.sleep(period_s)
        await engine.call(lambda e: e.manager.expire_host(time.time()))
