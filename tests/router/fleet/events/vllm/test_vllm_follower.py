"""VllmEventFollower against a publisher speaking vLLM's ZMQ wire format.

Each test drives the publisher (tests/support/vllm_publisher.py) through one of the
situations the follower must survive: a late start, a lost message, a gap the replay
buffer no longer covers, a restarted server (idle or busy), garbage, and both event
encodings, a batch that would file one block under two hashes, a replay longer than
the server's buffer, a seq the server never published, a gap with no replay endpoint,
a dropped connection, a frozen server (a publisher process under SIGSTOP). The index
is checked by exact matches per tenant, the worker's trust by its ``index_mode``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
import zmq.asyncio
from prometheus_client import CollectorRegistry

from radix.keys import to_key
from router.config import WorkerSpec
from router.config_toml import parse_worker
from router.fleet.events.health import StreamHealth
from router.fleet.events.metrics import KVEventMetrics
from router.fleet.events.vllm.follower import Endpoints, VllmEventFollower
from router.fleet.events.vllm.replay import MAX_MESSAGE_BYTES, replay_bytes
from router.fleet.events.vllm.translate import VllmTranslator
from router.fleet.worker_state import WorkerState
from router.routing.index import RouterIndex
from tests.support.aio import eventually
from tests.support.vllm_publisher import VllmPublisher, chain_hashes

BLOCK = 4
SALTS = {"salt-alice": "alice", "salt-bob": "bob"}
DOC = list(range(200, 216))


class Harness:
    """A publisher, a follower task and the index it feeds."""

    def __init__(self, tmp_path: Path, **publisher_args) -> None:
        self.events = f"ipc://{tmp_path}/events"
        self.replay = f"ipc://{tmp_path}/replay"
        self.publisher_args = publisher_args
        self.publisher = VllmPublisher(self.events, self.replay, **publisher_args)
        self.index = RouterIndex()
        self.registry = CollectorRegistry()
        self.metrics = KVEventMetrics(self.registry)
        self.translator = VllmTranslator("v0", SALTS.get, lambda lora: "ns")
        self.context = zmq.asyncio.Context()
        self.worker = WorkerState(WorkerSpec(worker_id="v0", model="m", kind="vllm",
                                             url="http://127.0.0.1:9", kv_events=self.events),
                                  "http://127.0.0.1:9", {})
        self.follower = self.follow(Endpoints(self.events, self.replay, 1.0))

    def follow(self, endpoints: Endpoints) -> VllmEventFollower:
        """A follower of the publisher at ``endpoints`` into this harness's index."""
        return VllmEventFollower(self.index, self.translator, endpoints, self.metrics,
                                 self.context, StreamHealth(self.worker, self.index))

    def store(self, tokens: list[int], salt: str = "salt-alice", send: bool = True) -> list[int]:
        hashes = chain_hashes(tokens, BLOCK, salt)
        self.publisher.publish([self.publisher.stored(hashes, None, tokens, BLOCK, salt)], send)
        return hashes

    def matched(self, tokens: list[int], tenant: str = "alice") -> int:
        return self.index.match("ns", to_key(tokens), tenant).get("v0", 0)

    def counter(self, name: str) -> float:
        return self.registry.get_sample_value(f"router_{name}_total", {"worker": "v0"}) or 0

    def malformed(self, reason: str) -> float:
        return self.registry.get_sample_value("router_kv_event_malformed_total",
                                              {"worker": "v0", "reason": reason}) or 0

    def restart_publisher(self) -> None:
        self.publisher.close()
        self.publisher = VllmPublisher(self.events, self.replay, **self.publisher_args)


def run(tmp_path: Path, test, **publisher_args) -> None:
    async def main() -> None:
        harness = Harness(tmp_path, **publisher_args)
        task = None
        try:
            await test(harness, lambda: asyncio.create_task(harness.follower.run()))
        finally:
            for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            harness.publisher.close()
            harness.context.destroy(linger=0)
            harness.index.check_invariants()

    asyncio.run(main())


@pytest.mark.parametrize("encoding,bytes_hashes,batch_as_map",
                         [("map", False, False), ("array", True, True)])
def test_a_late_follower_catches_up_by_replay_then_follows_live(tmp_path, encoding, bytes_hashes,
                                                                 batch_as_map):
    async def test(h: Harness, start) -> None:
        h.store(DOC[:8])
        h.store(DOC, salt="salt-bob")
        start()
        await eventually(lambda: h.matched(DOC, "bob") == 16)
        assert h.matched(DOC) == 8
        await asyncio.sleep(0.2)  # the subscription is up
        h.store(DOC)
        await eventually(lambda: h.matched(DOC) == 16)
        assert h.follower.last_seq == 2

    run(tmp_path, test, encoding=encoding, bytes_hashes=bytes_hashes, batch_as_map=batch_as_map)


def test_a_lost_message_is_filled_by_replay(tmp_path):
    async def test(h: Harness, start) -> None:
        start()
        await asyncio.sleep(0.3)
        h.store(DOC[:4])
        await eventually(lambda: h.matched(DOC) == 4)
        h.store(DOC[4:12], send=False)
        first = chain_hashes(DOC[:4], BLOCK, "salt-alice")[0]
        more = chain_hashes(DOC[4:8], BLOCK, parent=first)
        h.publisher.publish([h.publisher.stored(more, first, DOC[4:8], BLOCK)])
        await eventually(lambda: h.matched(DOC) == 8)
        assert h.matched(DOC[4:12]) == 8
        assert (h.counter("kv_event_gaps"), h.counter("kv_event_resyncs")) == (1, 0)

    run(tmp_path, test)


def test_a_gap_the_buffer_no_longer_covers_clears_the_worker(tmp_path):
    async def test(h: Harness, start) -> None:
        start()
        await asyncio.sleep(0.3)
        h.store(DOC[:8])
        await eventually(lambda: h.matched(DOC) == 8)
        for i in range(4):
            h.store([1, 2, 3, 4 + i], send=False)  # lost, and soon out of the buffer
        h.store(DOC[8:], salt="salt-bob")
        await eventually(lambda: h.matched(DOC[8:], "bob") == 8)
        assert h.matched(DOC) == 0  # its store fell out of the buffer: not claimed
        assert h.matched([1, 2, 3, 7]) == 4
        assert h.counter("kv_event_gaps") == 1 and h.counter("kv_event_resyncs") == 1

    run(tmp_path, test, buffer_steps=2)


def test_a_restarted_server_is_cleared_at_once_even_when_idle(tmp_path):
    async def test(h: Harness, start) -> None:
        start()
        await asyncio.sleep(0.3)
        h.store(DOC)
        await eventually(lambda: h.matched(DOC) == 16)
        h.restart_publisher()
        await eventually(lambda: h.matched(DOC) == 0)
        await asyncio.sleep(0.3)
        h.store(DOC[:8], salt="salt-bob")
        await eventually(lambda: h.matched(DOC, "bob") == 8)
        assert h.follower.last_seq == 0

    run(tmp_path, test)


def test_a_seq_that_goes_back_clears_the_worker(tmp_path):
    async def test(h: Harness, start) -> None:
        start()
        await asyncio.sleep(0.3)
        h.store(DOC)
        h.store([9, 9, 9, 9])
        await eventually(lambda: h.matched([9, 9, 9, 9]) == 4)
        h.publisher.forget()
        h.publisher.publish([])  # a fresh process, same sockets: seq 0 again
        await eventually(lambda: h.matched(DOC) == 0)
        assert h.counter("kv_event_resyncs") >= 1

    run(tmp_path, test)


def test_garbage_is_counted_and_following_goes_on(tmp_path):
    async def test(h: Harness, start) -> None:
        start()
        await asyncio.sleep(0.3)
        h.publisher.send_raw([b"only one frame"])
        h.publisher.send_raw([b"", b"short", b"x"])
        h.publisher.publish([{"type": "BlockStored", "block_hashes": 5}, "junk"])
        h.publisher.send_raw([b"", (1).to_bytes(8, "big"), b"\xc1 not msgpack"])
        h.publisher.seq = 2
        h.store(DOC[:4])
        await eventually(lambda: h.matched(DOC) == 4)
        assert h.counter("kv_event_decode_errors") == 5
        assert [h.malformed(r) for r in ("message", "payload", "event")] == [2, 1, 2]
        assert h.counter("kv_events") == 2

    run(tmp_path, test)


def test_a_message_nested_past_the_decoders_depth_is_skipped(tmp_path):
    async def test(h: Harness, start) -> None:
        start()
        await asyncio.sleep(0.3)
        h.publisher.send_raw([b"", (1).to_bytes(8, "big"), b"\x91" * 200_000 + b"\x00"])
        h.publisher.seq = 2  # the nested message took seq 1
        h.store(DOC[:4])
        await eventually(lambda: h.matched(DOC) == 4)
        assert h.counter("kv_event_decode_errors") == 1
        assert h.counter("kv_event_follower_restarts") == 0

    run(tmp_path, test)


def test_a_replay_that_never_ends_is_abandoned_in_time_and_live_events_go_on(tmp_path):
    async def test(h: Harness, start) -> None:
        start()
        await asyncio.sleep(1.5)  # the first replay (from seq 0) gave up after 1 s
        h.store(DOC[:4])
        await eventually(lambda: h.matched(DOC) == 4, timeout_s=5.0)

    run(tmp_path, test, endless_replay=True)


def test_a_follower_that_fails_starts_over_and_is_counted(tmp_path):
    class Flaky(RouterIndex):
        """An index whose first apply raises (a bug anywhere below the follower)."""

        failed = False

        def apply_event(self, worker_id, event) -> None:
            if not self.failed:
                self.failed = True
                raise RuntimeError("a bug")
            super().apply_event(worker_id, event)

    async def test(h: Harness, start) -> None:
        h.index = Flaky()
        h.follower = h.follow(Endpoints(h.events, h.replay, 1.0))
        start()
        await asyncio.sleep(0.3)
        h.store(DOC[:4])
        await eventually(lambda: h.counter("kv_event_follower_restarts") == 1, timeout_s=5.0)
        h.store(DOC[:8])
        await eventually(lambda: h.matched(DOC) == 8, timeout_s=5.0)

    run(tmp_path, test)


def test_a_batch_filing_a_block_under_a_second_hash_is_skipped_and_the_index_kept(tmp_path):
    """A store of alice's first block under another hash, then that hash's removal: one
    index block under two hashes. Before, the removal took alice's block out of the index
    (her chain matched nothing) and the real block's later removal ended the follower,
    which cleared the worker."""
    async def test(h: Harness, start) -> None:
        start()
        await asyncio.sleep(0.3)
        first = h.store(DOC)
        await eventually(lambda: h.matched(DOC) == 16)
        other = chain_hashes(DOC[:4], BLOCK, "another salt")
        h.publisher.publish([h.publisher.stored(other, None, DOC[:4], BLOCK, "salt-alice"),
                             h.publisher.removed(other)])
        h.store(DOC[:8], salt="salt-bob")
        await eventually(lambda: h.matched(DOC, "bob") == 8)
        assert h.matched(DOC) == 16
        assert h.malformed("conflict") == 1 and h.counter("kv_events") == 3
        h.publisher.publish([h.publisher.removed(first[:1])])
        await eventually(lambda: h.matched(DOC) == 0)
        assert h.matched(DOC, "bob") == 8
        assert (h.counter("kv_event_follower_restarts"), h.counter("kv_event_resyncs")) == (0, 0)

    run(tmp_path, test)


@pytest.mark.parametrize("replay_batches", [8, 7])
def test_a_replay_longer_than_the_servers_buffer_is_abandoned(tmp_path, replay_batches):
    """The server buffers 8 batches: a follower bounded at 8 takes the replay, one
    bounded at 7 abandons it and follows live."""
    async def test(h: Harness, start) -> None:
        for i in range(8):
            h.store([1, 2, 3, 10 + i])
        h.follower = h.follow(Endpoints(h.events, h.replay, 1.0, replay_batches))
        start()
        await asyncio.sleep(0.5)
        h.store(DOC[:4])
        await eventually(lambda: h.matched(DOC) == 4)
        assert h.matched([1, 2, 3, 17]) == (4 if replay_batches == 8 else 0)
        assert h.counter("kv_event_replays") == 1

    run(tmp_path, test, buffer_steps=8)


def test_the_replay_bound_is_the_servers_buffer_and_its_bytes_follow():
    spec = parse_worker({"id": "v0", "model": "m", "kind": "vllm", "url": "http://h:1",
                         "kv_events": "tcp://h:5557"}, {"m": None}, "workers[0]")
    assert spec.kv_events_replay_batches == 10_000 == Endpoints("ipc://e", None).replay_batches
    assert replay_bytes(10_000) == 10_000 * 32 * 2**10 < 512 * 2**20
    assert replay_bytes(2) == MAX_MESSAGE_BYTES
    for bad in (0, 100_001):
        with pytest.raises(ValueError, match="kv_events_replay_batches"):
            parse_worker({"id": "v0", "model": "m", "kind": "vllm", "url": "http://h:1",
                          "kv_events_replay_batches": bad}, {"m": None}, "workers[0]")


def garbage(h: Harness, seq: int, tokens: list[int]) -> None:
    """A well-formed batch storing ``tokens`` for alice, sent raw under ``seq``: a
    number the server never gave it."""
    hashes = chain_hashes(tokens, BLOCK, "salt-alice")
    event = h.publisher.stored(hashes, None, tokens, BLOCK, "salt-alice")
    h.publisher.send_raw([b"", seq.to_bytes(8, "big"),
                          msgspec.msgpack.encode([time.time(), [event], 0])])


@pytest.mark.parametrize("seq", [1_000_000, 0])
def test_a_seq_the_server_never_published_is_skipped_and_nothing_cleared(tmp_path, seq):
    """Far ahead (no replay reaches it) or back (the replay still reaches the last
    one: no restart): a malformed message, skipped, where it used to clear."""
    async def test(h: Harness, start) -> None:
        start()
        await asyncio.sleep(0.3)
        h.store(DOC[:8])
        h.store([9, 9, 9, 9])
        await eventually(lambda: h.matched([9, 9, 9, 9]) == 4)
        garbage(h, seq, [7, 7, 7, 7])
        h.store(DOC[8:], salt="salt-bob")
        await eventually(lambda: h.matched(DOC[8:], "bob") == 8)
        assert h.matched(DOC) == 8 and h.matched([7, 7, 7, 7]) == 0
        assert h.malformed("message") == 1 and h.counter("kv_event_resyncs") == 0
        assert (h.worker.index_mode, h.worker.index_reason) == ("exact", "")

    run(tmp_path, test)


def test_without_a_replay_endpoint_a_gap_clears_the_worker_which_rebuilds_from_live(tmp_path):
    async def test(h: Harness, start) -> None:
        h.follower = h.follow(Endpoints(h.events, None))
        start()
        await asyncio.sleep(0.3)
        h.store(DOC[:8])
        await eventually(lambda: h.matched(DOC) == 8)
        h.store([1, 2, 3, 4], send=False)
        h.store(DOC[8:], salt="salt-bob")
        await eventually(lambda: h.matched(DOC[8:], "bob") == 8)
        assert h.matched(DOC) == 0  # cleared: its store may have been removed since
        assert (h.counter("kv_event_gaps"), h.counter("kv_event_resyncs")) == (1, 1)
        assert h.worker.index_mode == "exact"

    run(tmp_path, test)


def test_a_dropped_connection_routes_the_worker_stale_until_it_is_back_and_replayed(tmp_path):
    async def test(h: Harness, start) -> None:
        assert h.worker.index_mode == "stale"
        start()
        await eventually(lambda: h.worker.index_mode == "exact")
        h.store(DOC)
        await eventually(lambda: h.matched(DOC) == 16)
        h.publisher.close()
        await eventually(lambda: h.worker.index_mode == "stale")
        assert h.worker.index_reason.startswith("event connection dropped")
        h.publisher = VllmPublisher(h.events, h.replay)
        h.store(DOC[:8])
        await eventually(lambda: h.worker.index_mode == "exact")
        await eventually(lambda: h.matched(DOC) == 8)

    run(tmp_path, test)


PUBLISHING = """
import sys, time
from tests.support.vllm_publisher import VllmPublisher
publisher = VllmPublisher(sys.argv[1], sys.argv[2])
print("READY", flush=True)
while True:
    publisher.publish([])
    time.sleep(0.2)
"""


def test_a_frozen_server_is_a_dropped_connection_within_the_read_timeout(tmp_path):
    """vLLM's stream has no heartbeat; the connection's own pings find a server that
    stopped answering (SIGSTOP), and the worker is stale until it goes on."""
    h = Harness(tmp_path)
    h.publisher.close()
    server = subprocess.Popen([sys.executable, "-c", PUBLISHING, h.events, h.replay],
                              cwd=Path(__file__).parents[5], stdout=subprocess.PIPE)

    async def main() -> None:
        follower = h.follow(Endpoints(h.events, h.replay, 1.0, read_timeout_s=1.0))
        task = asyncio.create_task(follower.run())
        try:
            await eventually(lambda: h.worker.index_mode == "exact")
            server.send_signal(signal.SIGSTOP)
            await eventually(lambda: h.worker.index_mode == "stale", timeout_s=5.0)
            assert h.worker.index_reason.startswith("event connection dropped")
            server.send_signal(signal.SIGCONT)
            await eventually(lambda: h.worker.index_mode == "exact")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    try:
        assert server.stdout is not None and server.stdout.readline() == b"READY\n"
        asyncio.run(main())
    finally:
        server.send_signal(signal.SIGCONT)
        server.kill()
        server.wait()
        h.context.destroy(linger=0)
