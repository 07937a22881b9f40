"""KVEventFollower against a real aiohttp server on loopback serving a worker's event log.

The server (``EventLogServer``) keeps a bounded log of a ``SimCache``'s events and
answers ``GET /kv/events?since=N&epoch=E`` as docs/protocol.md says: the events after
N when it still has them, else a snapshot (``cleared`` at the head, the cached blocks,
then live events); heartbeats between events. Tests break the stream in each way the
follower must survive and check the index against the simulated worker's own tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from bench.sim_cache import SimCache
from radix.events import KVEvent, encode_event
from radix.keys import to_key
from radix.tree import PUBLIC
from router.config import KVEventsConfig, WorkerSpec
from router.fleet.events.follower import KVEventFollower
from router.fleet.events.metrics import KVEventMetrics
from router.fleet.worker_state import WorkerState
from router.routing.index import RouterIndex
from tests.support.aio import eventually

NS = "7a" * 32
ROUTER_NS = "b1" * 32
BLOCK = 4
KEY = "secret-key"
# How long a test waits for the follower to catch up.
FOLLOW_S = 5.0
FAST = KVEventsConfig(initial_backoff_s=0.01, max_backoff_s=0.05, read_timeout_s=2.0)
AUTH = {"Authorization": f"Bearer {KEY}"}


class EventLogServer:
    """A worker's ``/kv/events`` endpoint over a SimCache, with faults on demand."""

    def __init__(self, log_size: int = 1000) -> None:
        self.cache = SimCache("sim", NS, capacity_tokens=10_000, block_size=BLOCK)
        self.log: list[KVEvent] = []
        self.log_size = log_size
        self.requests: list[dict[str, str]] = []
        self.raw_lines: list[bytes] = []
        self.silent = False  # True: write nothing, not even heartbeats
        self._changed = asyncio.Event()
        self._streams: set[web.StreamResponse] = set()
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/kv/events", self.handle)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    def publish(self, events: list[KVEvent]) -> None:
        self.log = (self.log + events)[-self.log_size :]
        self._wake()

    def insert(self, tokens: list[int], scope: str = "tenant-a", num_public_tokens: int = 0) -> None:
        self.publish(self.cache.insert(to_key(tokens), scope, num_public_tokens))

    def restart(self) -> None:
        self.log = [self.cache.clear()]
        self._wake()

    def inject(self, line: bytes) -> None:
        self.raw_lines.append(line)
        self._wake()

    def drop_connections(self) -> None:
        for stream in list(self._streams):
            assert stream.task is not None
            stream.task.cancel()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    @property
    def head(self) -> int:
        return self.log[-1].seq if self.log else 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(dict(request.query))
        if request.headers.get("Authorization") != f"Bearer {KEY}":
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        self._streams.add(resp)
        try:
            position = self._resume_position(request.query)
            if position is None:
                snapshot = self.cache.snapshot()
                await resp.write(b"".join(encode_event(e).encode() + b"\n" for e in snapshot))
                position = snapshot[0].seq
            epoch = self.cache.epoch
            while True:
                while self.silent:
                    await asyncio.sleep(0.05)
                changed = self._changed
                if self.cache.epoch != epoch:
                    position, epoch = -1, self.cache.epoch
                for event in [e for e in self.log if e.seq > position]:
                    await resp.write(encode_event(event).encode() + b"\n")
                    position = event.seq
                while self.raw_lines:
                    await resp.write(self.raw_lines.pop(0))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), 0.2)
                await resp.write(b"\n")
        finally:
            self._streams.discard(resp)

    def _resume_position(self, query) -> int | None:
        if "since" not in query or query.get("epoch") != self.cache.epoch:
            return None
        since = int(query["since"])
        oldest = self.log[0].seq if self.log else self.head + 1
        return since if since >= oldest - 1 else None


def assert_index_mirrors(index: RouterIndex, cache: SimCache, namespace: str = NS) -> None:
    """The index holds what the simulated worker's tree holds (no evictions), in whole
    blocks: a prompt that leaves a cached block halfway is credited the blocks before."""
    index.check_invariants()
    for node in cache.tree.iter_nodes():
        key = cache.tree.path_key(node) + to_key([99])
        for scope in ("tenant-a", "tenant-b", PUBLIC):
            real = cache.tree.match(key, scope, touch=False).num_matched_tokens
            got = index.match(namespace, key, scope).get("w", 0)
            assert real // BLOCK * BLOCK <= got <= real, (node, scope)


def worker(url: str, headers: dict[str, str] = AUTH) -> WorkerState:
    """Worker ``w`` at ``url``, called with ``headers``."""
    return WorkerState(WorkerSpec(worker_id="w", model="demo", url=url), url, dict(headers))


def run_with_follower(test, log_size: int = 1000, **follower_args):
    """Run ``test(server, index, follower)`` with a following task; cancel it after.
    ``follower_args`` override the follower's (``metrics`` to read its counters)."""

    async def main() -> None:
        server = EventLogServer(log_size)
        await server.start()
        index = RouterIndex()
        async with aiohttp.ClientSession() as session:
            args = {"config": FAST, "metrics": KVEventMetrics(CollectorRegistry()),
                    **follower_args}
            follower = KVEventFollower(index, worker(server.url), session, **args)
            task = asyncio.create_task(follower.run())
            try:
                await test(server, index, follower)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await server.stop()

    asyncio.run(main())


def caught_up(server: EventLogServer, follower: KVEventFollower):
    """Whether the follower applied the server's log to its head and (a heartbeat came
    after it) trusts the worker's entries again."""
    return lambda: ((follower.status().epoch, follower.status().last_seq)
                    == (server.cache.epoch, server.head) and not follower.health.is_stale)


def counted(registry: CollectorRegistry, name: str) -> float:
    """Worker ``w``'s ``router_<name>_total`` (0 before its first count)."""
    return registry.get_sample_value(f"router_{name}_total", {"worker": "w"}) or 0


def test_snapshot_then_live_events_build_the_workers_cache():
    async def test(server, index, follower):
        server.insert([1, 2, 3, 4, 5, 6, 7, 8, 9], num_public_tokens=4)
        server.insert([1, 2, 3, 4, 5, 6, 0, 0], "tenant-b")
        await eventually(caught_up(server, follower), FOLLOW_S)
        assert server.requests[0] == {}
        server.insert([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13])
        server.insert([5, 5, 5, 5, 5, 5], PUBLIC)
        await eventually(caught_up(server, follower), FOLLOW_S)
        assert_index_mirrors(index, server.cache)
        status = follower.status()
        assert (status.connected, status.num_connects, status.num_resyncs) == (True, 1, 0)

    run_with_follower(test)


def test_a_dropped_connection_resumes_from_the_last_seq():
    async def test(server, index, follower):
        server.insert([1, 2, 3, 4, 5])
        await eventually(caught_up(server, follower), FOLLOW_S)
        server.drop_connections()
        server.insert([1, 2, 3, 4, 6, 6, 6])
        await eventually(caught_up(server, follower), FOLLOW_S)
        assert server.requests[-1] == {"since": str(server.head - 1), "epoch": server.cache.epoch}
        assert (follower.status().num_connects, follower.status().num_resyncs) == (2, 0)
        assert_index_mirrors(index, server.cache)

    run_with_follower(test)


def test_a_gap_resyncs_from_a_snapshot():
    async def test(server, index, follower):
        server.insert([1, 2, 3, 4, 5])
        await eventually(caught_up(server, follower), FOLLOW_S)
        lost = server.cache.insert(to_key([7, 7, 7, 7, 7]), "tenant-a")
        server.insert([8, 8, 8, 8, 8])
        await eventually(lambda: follower.status().num_resyncs == 1, FOLLOW_S)
        await eventually(caught_up(server, follower), FOLLOW_S)
        assert lost and server.requests[-1] == {}
        assert_index_mirrors(index, server.cache)

    run_with_follower(test)


def test_a_malformed_line_is_logged_counted_and_resyncs_without_crashing(caplog):
    registry = CollectorRegistry()

    async def test(server, index, follower):
        server.insert([1, 2, 3, 4, 5])
        await eventually(caught_up(server, follower), FOLLOW_S)
        assert counted(registry, "kv_event_decode_errors") == 0
        with caplog.at_level(logging.WARNING, logger="router.fleet.events.follower"):
            server.inject(b'{"type": "stored", "seq": "x"}\n')
            await eventually(lambda: follower.status().num_resyncs == 1, FOLLOW_S)
        assert "malformed event" in caplog.text and "event.seq" in caplog.text
        assert counted(registry, "kv_event_decode_errors") == 1
        server.insert([2, 2, 2, 2, 2])
        await eventually(caught_up(server, follower), FOLLOW_S)
        assert_index_mirrors(index, server.cache)
        assert counted(registry, "kv_event_follower_restarts") == 0

    run_with_follower(test, metrics=KVEventMetrics(registry))


def test_a_line_over_the_message_bound_is_counted_as_a_decode_error():
    registry = CollectorRegistry()

    async def test(server, index, follower):
        server.insert([1, 2, 3, 4, 5])
        await eventually(caught_up(server, follower), FOLLOW_S)
        server.inject(b"x" * 300)  # no newline within the bound
        await eventually(lambda: counted(registry, "kv_event_decode_errors") == 1, FOLLOW_S)
        server.insert([2, 2, 2, 2, 2])
        await eventually(caught_up(server, follower), FOLLOW_S)
        assert_index_mirrors(index, server.cache)

    bounded = KVEventsConfig(initial_backoff_s=0.01, max_backoff_s=0.05, read_timeout_s=2.0,
                             max_message_bytes=256)
    run_with_follower(test, metrics=KVEventMetrics(registry), config=bounded)


def test_a_follower_that_fails_starts_over_from_a_snapshot_and_is_counted(caplog):
    registry = CollectorRegistry()

    async def test(server, index, follower):
        server.insert([1, 2, 3, 4, 5])
        await eventually(caught_up(server, follower), FOLLOW_S)

        def fail_once(worker_id, event) -> None:  # a bug anywhere below the follower
            del index.apply_event
            raise RuntimeError("a bug")

        index.apply_event = fail_once
        server.insert([2, 2, 2, 2, 2])
        await eventually(lambda: counted(registry, "kv_event_follower_restarts") == 1, FOLLOW_S)
        assert "unexpected error" in caplog.text
        await eventually(caught_up(server, follower), FOLLOW_S)
        assert server.requests[-1] == {}, "started over from a snapshot"
        assert_index_mirrors(index, server.cache)
        assert counted(registry, "kv_event_decode_errors") == 0

    run_with_follower(test, metrics=KVEventMetrics(registry))


def test_a_worker_restart_clears_its_entries_and_follows_the_new_epoch():
    async def test(server, index, follower):
        server.insert([1, 2, 3, 4, 5, 6, 7, 8])
        await eventually(caught_up(server, follower), FOLLOW_S)
        server.restart()
        server.insert([3, 3, 3, 3])
        await eventually(caught_up(server, follower), FOLLOW_S)
        assert index.match(NS, to_key([1, 2, 3, 4]), "tenant-a") == {}
        assert_index_mirrors(index, server.cache)
        assert follower.status().num_resyncs == 0

    run_with_follower(test)


def test_a_log_that_moved_past_the_position_sends_a_snapshot():
    async def test(server, index, follower):
        server.insert([1, 2, 3, 4, 5])
        await eventually(caught_up(server, follower), FOLLOW_S)
        await server.stop()
        for i in range(6):
            server.publish(server.cache.insert(to_key([i] * 6), "tenant-a"))
        await server.start()
        follower.url = server.url + "/kv/events"
        await eventually(caught_up(server, follower), FOLLOW_S)
        assert server.requests[-1]["since"] == "1"
        assert_index_mirrors(index, server.cache)

    run_with_follower(test, log_size=3)


def test_events_are_filed_under_the_routers_namespace_digest():
    async def test(server, index, follower):
        server.insert([1, 2, 3, 4, 5])
        await eventually(caught_up(server, follower), FOLLOW_S)
        assert index.match(NS, to_key([1, 2, 3, 4, 5]), "tenant-a") == {}
        assert_index_mirrors(index, server.cache, namespace=ROUTER_NS)

    run_with_follower(test, namespace_of=lambda namespace: ROUTER_NS)


def test_a_refused_key_is_retried_with_backoff_and_cancel_ends_the_task():
    async def main() -> None:
        server = EventLogServer()
        await server.start()
        async with aiohttp.ClientSession() as session:
            follower = KVEventFollower(RouterIndex(), worker(server.url, {}), session,
                                       KVEventMetrics(CollectorRegistry()), config=FAST)
            task = asyncio.create_task(follower.run())
            await eventually(lambda: len(server.requests) >= 3, FOLLOW_S)
            assert "HTTP 401" in (follower.status().last_error or "")
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert task.done()
        await server.stop()

    asyncio.run(main())


def test_cancel_closes_a_live_stream():
    async def main() -> None:
        server = EventLogServer()
        await server.start()
        server.insert([1, 2, 3, 4, 5])
        async with aiohttp.ClientSession() as session:
            follower = KVEventFollower(RouterIndex(), worker(server.url), session,
                                       KVEventMetrics(CollectorRegistry()), config=FAST)
            task = asyncio.create_task(follower.run())
            await eventually(caught_up(server, follower), FOLLOW_S)
            assert len(server._streams) == 1
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await eventually(lambda: not server._streams, FOLLOW_S)
            assert len(server.requests) == 1
        await server.stop()

    asyncio.run(main())


def test_a_silent_stream_makes_the_worker_stale_until_it_resumes_from_its_position():
    async def test(server, index, follower):
        server.insert([1, 2, 3, 4, 5])
        await eventually(caught_up(server, follower), FOLLOW_S)
        worker = follower.health.worker
        assert (worker.index_mode, worker.index_reason) == ("exact", "")
        server.silent = True
        await eventually(lambda: worker.index_mode == "stale", FOLLOW_S)
        assert worker.index_reason == "KV event stream: no event or heartbeat for 0.5 s"
        assert index.match(NS, to_key([1, 2, 3, 4, 5]), "tenant-a") == {}
        server.insert([2, 2, 2, 2, 2])
        server.silent = False
        await eventually(caught_up(server, follower), FOLLOW_S)
        assert worker.index_mode == "exact"
        assert_index_mirrors(index, server.cache)
        assert server.requests[-1]["since"] == "1" and follower.status().num_resyncs == 0

    silence = KVEventsConfig(initial_backoff_s=0.01, max_backoff_s=0.05, read_timeout_s=0.5)
    run_with_follower(test, config=silence)
