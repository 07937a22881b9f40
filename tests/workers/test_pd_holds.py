"""The life of a producer's holds and a consumer's imports between real worker
processes (docs/pd.md, "Holds"): whatever the clients and peers do, every pin ends and
both pools return to their baseline. Clients that hang up while the engine is busy
pinning (prefill legs) or importing (decode legs) leak no block; a producer that never
answers the acknowledgement cannot keep the consumer's imported blocks pinned; a hold
past a cap (all holds, or one tenant scope's) is refused with 429 before any compute
and pins nothing; ``/kv_transfer/release`` ends a hold at once; each ending is
counted in the transfer metrics, held block-seconds per scope."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Iterator

import aiohttp
import pytest

from harness.procs import ManagedProcess, started_workers
from tests.support.metric_samples import worker_metric as metric
from tests.support.polling import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("pd_holds")]
KEY = "pd-holds-key"
B = 16
PRODUCER = '{"kv_role": "kv_producer"}'
CONSUMER = '{"kv_role": "kv_consumer"}'
HOLD_S = 4  # the producers' hold deadline: short, so expiry ends every unread hold
NUM_WAVES, WAVE_SIZE, STORM_S = 12, 32, 8.0


def prompt(seed: int, num_tokens: int = 5 * B + 7) -> list[int]:
    """A prompt of ``num_tokens`` demo-vocabulary token ids (5 whole blocks + 7)."""
    return [(seed * 31 + i * 7) % 200 + 20 for i in range(num_tokens)]


def body(token_ids: list[int], max_tokens: int, params: dict | None = None,
         scope: str = "t1") -> dict:
    """A greedy ``/generate`` body in ``scope``."""
    request = {"token_ids": token_ids, "scope": scope,
               "sampling": {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}
    if params is not None:
        request["kv_transfer_params"] = params
    return request


def used_blocks(worker: ManagedProcess) -> int:
    """Blocks some request, hold or import references (0 on an idle worker)."""
    return worker.get_json("/info")[1]["kv"]["num_used_blocks"]


def back_to_baseline(worker: ManagedProcess, timeout_s: float = 15) -> bool:
    """Wait until ``worker`` references no block; True, or AssertionError."""
    return wait_until(lambda: used_blocks(worker) == 0, timeout_s,
                      lambda: f"no block in use (now {used_blocks(worker)})")


def prefill(producer: ManagedProcess, token_ids: list[int], scope: str = "t1") -> dict:
    """Run a prefill leg; its ``kv_transfer_params``."""
    status, answer = producer.post_json("/generate", body(token_ids, 1, {
        "do_remote_decode": True}, scope))
    assert status == 200, answer
    return answer["kv_transfer_params"]


async def _hang_up(url: str, bodies: list[dict], key: str, max_wait_s: float,
                   seed: int) -> int:
    """POST each of ``bodies`` to ``url`` at once and hang up each after a random
    time under ``max_wait_s`` (the ones answered sooner are read); how many hung up."""
    rng = random.Random(seed)
    hung_up = 0
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        async def one(request: dict) -> None:
            nonlocal hung_up
            try:
                async with asyncio.timeout(rng.uniform(0.02, max_wait_s)):
                    async with session.post(url, json=request) as response:
                        await response.read()
            except TimeoutError:
                hung_up += 1
        await asyncio.gather(*(one(request) for request in bodies))
    return hung_up


def hang_up(worker: ManagedProcess, bodies: list[dict], max_wait_s: float,
            seed: int = 0) -> int:
    """``_hang_up`` against ``worker``'s ``/generate``."""
    return asyncio.run(_hang_up(f"{worker.url}/generate", bodies, KEY, max_wait_s, seed))


class SilentAcks:
    """A TCP peer between a consumer and a real producer: it relays the first
    connection (the pull) to the producer byte for byte, and accepts every later one
    (the acknowledgement) without ever answering it."""

    def __init__(self, producer_port: int) -> None:
        self._producer_port = producer_port
        self.num_connections = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.num_connections += 1
        if self.num_connections > 1:
            await asyncio.sleep(3600)  # never answers; the consumer must not wait on it
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._producer_port)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    def close(self) -> None:
        """Stop the peer's loop (its connections go with it)."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    writer.close()


@pytest.fixture(scope="module")
def fleet() -> Iterator[dict[str, ManagedProcess]]:
    """A producer holding blocks ``HOLD_S`` s, a consumer, and a producer whose scope
    cap is about one 5-block hold (one scope may hold 10% of its blocks)."""
    flags = {
        "producer": ("--kv-transfer-config", PRODUCER, "--kv-transfer-timeout-s", str(HOLD_S)),
        "consumer": ("--kv-transfer-config", CONSUMER),
        "capped": ("--kv-transfer-config", PRODUCER, "--kv-transfer-timeout-s", "60",
                   "--kv-transfer-max-scope-held-fraction", "0.1"),
    }
    with started_workers({name: (f, KEY) for name, f in flags.items()}) as workers:
        yield workers


def random_prompt(seed: int) -> list[int]:
    """5 whole blocks + 7 tokens of seeded random demo-vocabulary ids."""
    rng = random.Random(seed)
    return [rng.randrange(20, 220) for _ in range(5 * B + 7)]


def test_prefill_legs_whose_clients_hang_up_leak_no_block(fleet):
    producer = fleet["producer"]
    deadline = time.monotonic() + STORM_S
    num_hung_up = 0
    for wave in range(NUM_WAVES):  # waves of legs, each client gone within 0.6 s
        bodies = [body(random_prompt(1000 * wave + i), 1, {"do_remote_decode": True},
                       f"s{i % 16}") for i in range(WAVE_SIZE)]
        num_hung_up += hang_up(producer, bodies, 0.6, seed=wave)
        if time.monotonic() > deadline:
            break
    assert num_hung_up > 0
    assert back_to_baseline(producer, HOLD_S + 10)  # holds expire; leaked pins never would
    assert metric(producer, "kv_transfer_held_blocks") == 0
    assert metric(producer, "kv_transfer_orphan_pins_freed_total") == 0


def test_decode_legs_whose_clients_hang_up_leak_no_block(fleet):
    producer, consumer = fleet["producer"], fleet["consumer"]
    token_ids = [prompt(200 + i) for i in range(6)]  # 30 blocks: within every cap
    params = [prefill(producer, t, f"t{2 + i % 3}") for i, t in enumerate(token_ids)]
    bodies = [body(t, 4, p, f"t{2 + i % 3}")
              for i, (t, p) in enumerate(zip(token_ids, params, strict=True))]
    assert hang_up(consumer, bodies, 0.4, seed=2) > 0
    assert back_to_baseline(consumer) and back_to_baseline(producer, HOLD_S + 10)
    assert metric(consumer, "kv_transfer_orphan_pins_freed_total") == 0


def test_a_producer_that_never_acknowledges_cannot_pin_the_consumers_blocks(fleet):
    producer, consumer = fleet["producer"], fleet["consumer"]
    token_ids = prompt(7)
    params = prefill(producer, token_ids)
    peer = SilentAcks(params["remote_port"])
    try:
        status, answer = consumer.post_json("/generate", body(
            token_ids, 3, {**params, "remote_port": peer.port}))
        assert status == 200, answer
        assert answer["usage"]["cached_tokens"] == 5 * B  # pulled through the peer
        assert peer.num_connections == 2  # the pull, then the unanswered ack
        assert back_to_baseline(consumer)  # the import ended with its request
        assert back_to_baseline(producer, HOLD_S + 10)  # never acked: the deadline
        assert metric(consumer, "kv_transfer_ack_failures_total") == 1
    finally:
        peer.close()


def test_holds_past_a_scope_cap_are_refused_before_any_compute(fleet):
    capped = fleet["capped"]
    num_blocks = capped.get_json("/info")[1]["kv"]["num_total_blocks"]
    assert 5 <= int(0.1 * num_blocks) < 10  # one 5-block hold per scope
    held = prefill(capped, prompt(8), "alice")
    refused = metric(capped, "kv_transfer_refused_holds_total", {"cap": "scope"})
    status, answer = capped.post_json("/generate", body(prompt(9), 1, {
        "do_remote_decode": True}, "alice"))
    assert status == 429 and answer["error"]["code"] == "kv_hold_refused", answer
    assert metric(capped, "kv_transfer_refused_holds_total", {"cap": "scope"}) - refused == 1
    other = prefill(capped, prompt(9), "bob")  # another tenant's scope has room
    assert capped.get_json("/info")[1]["load"]["num_held_blocks"] == 10
    for params in (held, other):
        status, answer = capped.post_json("/kv_transfer/release",
                                          {"remote_request_id": params["remote_request_id"]})
        assert status == 200 and answer == {"released": True}
    status, answer = capped.post_json("/kv_transfer/release",
                                      {"remote_request_id": held["remote_request_id"]})
    assert status == 200 and answer == {"released": False}
    assert back_to_baseline(capped, 5)  # released at once, not at the 60 s deadline
    assert metric(capped, "kv_transfer_released_holds_total", {"reason": "abandoned"}) == 2
    assert metric(capped, "kv_transfer_held_block_seconds_total", {"scope": "alice"}) > 0
    assert metric(capped, "kv_transfer_held_block_seconds_total", {"scope": "bob"}) > 0
