"""The KV transfer plane authenticates before it trusts (docs/pd.md, "What is
checked"), between real worker processes: the producer's port refuses an oversized or
unsigned request before it buffers or parses it and serves a good pull after; a
consumer answered by a rogue producer (a real TCP server here, relaying the real
producer's frames with one block's bytes changed, or re-signed under another key, or
recorded from another pull) imports nothing, counts it, and fails the request loudly
or recomputes it as it was told; and a consumer never takes public-prefix blocks from
another worker, so no other tenant reads transferred bytes."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from harness.attacks import oversized_transfer_header, unsigned_transfer_request
from harness.procs import ManagedProcess, started_workers
from tests.support.metric_samples import worker_metric as metric
from tests.support.polling import wait_until
from workers.kv_transfer.wire import FRAME, MAC_BYTES, answer_context, frame

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("pd_transfer_auth")]
KEY = "pd-auth-key"
B = 16
PRODUCER = '{"kv_role": "kv_producer"}'
CONSUMER = '{"kv_role": "kv_consumer"}'
Tamper = Callable[[int, bytes, str], bytes]  # (frame number, frame, pull nonce) -> frame


def prompt(seed: int, num_tokens: int = 5 * B + 7) -> list[int]:
    """A prompt of ``num_tokens`` demo-vocabulary token ids (5 whole blocks + 7)."""
    return [(seed * 37 + i * 11) % 200 + 20 for i in range(num_tokens)]


def generate(worker: ManagedProcess, token_ids: list[int], max_tokens: int,
             params: dict | None = None, scope: str = "t1",
             num_public_tokens: int = 0) -> tuple[int, dict]:
    """POST ``/generate`` greedily."""
    body = {"token_ids": token_ids, "scope": scope, "num_public_tokens": num_public_tokens,
            "sampling": {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}
    if params is not None:
        body["kv_transfer_params"] = params
    return worker.post_json("/generate", body)


def holds_nothing(worker: ManagedProcess) -> bool:
    """Wait until no block of ``worker`` is referenced by a request or a hold."""
    def used() -> int:
        return worker.get_json("/info")[1]["kv"]["num_used_blocks"]
    return wait_until(lambda: used() == 0, 10, lambda: f"no block in use (now {used()})")


@pytest.fixture(scope="module")
def fleet() -> Iterator[dict[str, ManagedProcess]]:
    """A producer, a consumer that fails a bad pull, and one that recomputes. A refused
    pull leaves its hold to the producer's deadline, so each test runs in a scope of
    its own (the producer caps one scope's holds)."""
    flags = {"producer": ("--kv-transfer-config", PRODUCER),
             "consumer": ("--kv-transfer-config", CONSUMER),
             "recompute": ("--kv-transfer-config", CONSUMER, "--kv-transfer-fallback",
                           "recompute")}
    with started_workers({name: (f, KEY) for name, f in flags.items()}, "8MiB") as workers:
        yield workers


def prefill(fleet: dict[str, ManagedProcess], token_ids: list[int], **kwargs) -> dict:
    status, answer = generate(fleet["producer"], token_ids, 1, {"do_remote_decode": True},
                              **kwargs)
    assert status == 200, answer
    return answer["kv_transfer_params"]


def test_the_port_refuses_before_it_buffers_or_parses_and_serves_on(fleet):
    producer = fleet["producer"]
    endpoint = producer.get_json("/info")[1]["kv_transfer"]
    host, port = endpoint["host"], endpoint["port"]
    refused = {r: metric(producer, "kv_transfer_port_refusals_total", {"reason": r})
               for r in ("oversized", "unauthenticated")}
    for _ in range(3):
        answer = oversized_transfer_header(host, port)
        assert answer is not None and answer["error"] == "oversized", answer
        answer = unsigned_transfer_request(host, port)
        assert answer is not None and answer["error"] == "unauthenticated", answer
    for reason, before in refused.items():
        assert metric(producer, "kv_transfer_port_refusals_total",
                      {"reason": reason}) - before == 3, reason
    token_ids = prompt(1)
    received = metric(fleet["consumer"], "kv_transfer_blocks_received_total")
    status, answer = generate(fleet["consumer"], token_ids, 4, prefill(fleet, token_ids))
    assert status == 200 and answer["usage"]["cached_tokens"] == 5 * B  # the port serves on
    assert metric(fleet["consumer"], "kv_transfer_blocks_received_total") - received == 5


def _read_frame(sock: socket.socket) -> bytes | None:
    """One whole frame's bytes from ``sock``; None at its end."""
    def exactly(n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data
    lengths = exactly(FRAME.size)
    if lengths is None:
        return None
    header_len, payload_len = FRAME.unpack(lengths)
    rest = exactly(MAC_BYTES + header_len + payload_len)
    return None if rest is None else lengths + rest


def _parts(raw: bytes) -> tuple[dict, bytes]:
    header_len, _ = FRAME.unpack(raw[: FRAME.size])
    start = FRAME.size + MAC_BYTES
    return json.loads(raw[start: start + header_len]), raw[start + header_len:]


class Rogue:
    """A TCP server on loopback between a consumer and the real producer: each
    connection's request is relayed to the producer and each frame of its answer back
    through ``tamper``; with ``replay``, later connections get the first one's answer
    without asking the producer."""

    def __init__(self, producer_port: int, tamper: Tamper, replay: bool = False) -> None:
        self._producer_port, self._tamper, self._replay = producer_port, tamper, replay
        self._recorded: list[bytes] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.port = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Rogue:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._server.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            with conn, contextlib.suppress(OSError):
                conn.settimeout(10)
                self._relay(conn)

    def _relay(self, conn: socket.socket) -> None:
        request = _read_frame(conn)
        if request is None:
            return
        nonce = _parts(request)[0].get("nonce", "")
        if self._replay and self._recorded:
            conn.sendall(b"".join(self._recorded))
            return
        with socket.create_connection(("127.0.0.1", self._producer_port), 10) as upstream:
            upstream.sendall(request)
            number = 0
            while (answer := _read_frame(upstream)) is not None:
                if self._replay:
                    self._recorded.append(answer)
                conn.sendall(self._tamper(number, answer, nonce))
                number += 1


def flip_a_block_byte(number: int, raw: bytes, nonce: str) -> bytes:
    """The third block's last byte changed, its MAC kept."""
    return raw[:-1] + bytes([raw[-1] ^ 1]) if number == 3 else raw


def resign_with_another_key(number: int, raw: bytes, nonce: str) -> bytes:
    """Every frame as the producer sent it, signed under the right nonce and a wrong key."""
    header, payload = _parts(raw)
    return frame(b"rogue-key", answer_context(nonce), header, payload)


def unchanged(number: int, raw: bytes, nonce: str) -> bytes:
    return raw


@pytest.mark.parametrize(("seed", "tamper", "replay"), [
    (2, flip_a_block_byte, False), (3, resign_with_another_key, False),
    (4, unchanged, True)])
def test_a_rogue_producers_answer_is_refused_and_nothing_imported(fleet, seed, tamper, replay):
    consumer, recompute = fleet["consumer"], fleet["recompute"]
    token_ids, scope = prompt(seed), f"t{seed}"
    _, expected = generate(fleet["producer"], token_ids, 6, scope=scope)
    params = prefill(fleet, token_ids, scope=scope)
    with Rogue(params["remote_port"], tamper, replay) as rogue:
        via_rogue = {**params, "remote_port": rogue.port}
        if replay:  # a genuine pull through the relay, recorded; the next gets it again
            status, answer = generate(recompute, token_ids, 6, via_rogue, scope)
            assert status == 200 and answer["usage"]["cached_tokens"] == 5 * B, answer
            params = prefill(fleet, token_ids, scope=scope)  # held anew for the replay
            via_rogue = {**params, "remote_port": rogue.port}
        received = metric(consumer, "kv_transfer_blocks_received_total")
        failed = metric(consumer, "kv_transfer_failures_total", {"reason": "unauthenticated"})
        status, answer = generate(consumer, token_ids, 6, via_rogue, scope)
        assert status == 503 and answer["error"]["code"] == "kv_transfer_failed", answer
        assert "unauthenticated" in answer["error"]["message"]
        assert metric(consumer, "kv_transfer_failures_total",
                      {"reason": "unauthenticated"}) - failed == 1
        assert metric(consumer, "kv_transfer_blocks_received_total") == received
        assert holds_nothing(consumer)
        status, answer = generate(consumer, token_ids, 6, scope=scope)  # nothing cached
        assert status == 200 and answer["usage"]["cached_tokens"] == 0
        assert answer["choices"][0]["token_ids"] == expected["choices"][0]["token_ids"]
    if not replay:  # the relay itself speaks the protocol: unchanged, it works
        with Rogue(params["remote_port"], unchanged) as relay:
            status, answer = generate(recompute, token_ids, 6,
                                      {**params, "remote_port": relay.port}, scope)
            assert status == 200 and answer["usage"]["cached_tokens"] == 5 * B, answer
            assert answer["choices"][0]["token_ids"] == expected["choices"][0]["token_ids"]


def test_a_recompute_consumer_answers_right_after_a_rogue_answer(fleet):
    recompute = fleet["recompute"]
    token_ids = prompt(5)
    _, expected = generate(fleet["producer"], token_ids, 6, scope="t5")
    params = prefill(fleet, token_ids, scope="t5")
    recomputes = metric(recompute, "kv_transfer_recomputes_total")
    with Rogue(params["remote_port"], flip_a_block_byte) as rogue:
        status, answer = generate(recompute, token_ids, 6,
                                  {**params, "remote_port": rogue.port}, "t5")
    assert status == 200 and answer["usage"]["cached_tokens"] == 0, answer
    assert answer["choices"][0]["token_ids"] == expected["choices"][0]["token_ids"]
    assert metric(recompute, "kv_transfer_recomputes_total") - recomputes == 1
    assert holds_nothing(recompute)


def test_received_blocks_are_never_public(fleet):
    consumer = fleet["consumer"]
    token_ids = prompt(6)
    public = 3 * B  # the request's first three blocks are a public prefix
    params = prefill(fleet, token_ids, scope="t6", num_public_tokens=public)
    sent = metric(fleet["producer"], "kv_transfer_blocks_sent_total")
    status, answer = generate(consumer, token_ids, 2, params, "t6", public)
    assert status == 503 and "public_prefix" in answer["error"]["message"], answer
    assert metric(fleet["producer"], "kv_transfer_blocks_sent_total") == sent  # no pull
    status, answer = generate(consumer, token_ids, 1, scope="o6")  # another tenant
    assert answer["usage"]["cached_tokens"] == 0, answer
    # Holding the public prefix itself (computed here), it pulls the rest, into t6.
    status, _ = generate(consumer, token_ids[: public + 1], 1, None, "t6", public)
    assert status == 200
    params = prefill(fleet, token_ids, scope="t6", num_public_tokens=public)
    status, answer = generate(consumer, token_ids, 2, params, "t6", public)
    assert status == 200 and answer["usage"]["cached_tokens"] == 5 * B, answer
    status, answer = generate(consumer, token_ids, 1, None, "p6", public)  # a third tenant
    assert answer["usage"]["cached_tokens"] == public, answer  # the received two: not public
    assert holds_nothing(consumer)


def test_params_that_name_no_block_open_no_connection(fleet):
    token_ids = prompt(7, B - 3)  # no whole block: the producer holds none
    params = prefill(fleet, token_ids)
    assert params["remote_block_ids"] == []
    with socket.create_server(("127.0.0.1", 0)) as trap:  # accepts nothing, counts tries
        trap.settimeout(0.5)
        status, answer = generate(fleet["consumer"], token_ids, 2,
                                  {**params, "remote_port": trap.getsockname()[1]})
        assert status == 200, answer
        with pytest.raises(TimeoutError):
            trap.accept()
