"""A KV event publisher that speaks vLLM's ZMQ wire format, for follower tests.

Written from the format the router documents (docs/protocol.md, "vLLM workers"): a
PUB socket sending ``[topic, seq (8 bytes, big-endian), msgpack batch]`` and a ROUTER
socket answering ``[b"", start_seq]`` with one ``[b"", topic, seq, payload]`` per
buffered batch from ``start_seq`` on, then ``[b"", b"", 0xFF * 8, b""]``. Batches are
``[ts, [events], dp_rank]`` (or a map, with ``batch_as_map``); events are tagged maps
(vLLM >= 0.9) or tagged arrays (older vLLM, SGLang), hashes uint64 ints or bytes.

``publish(..., send=False)`` keeps a batch in the replay buffer without sending it
(a message the subscriber lost). Plain module, no pytest.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import zmq

END = b"\xff" * 8


def chain_hashes(tokens: Sequence[int], block_size: int, salt: str = "",
                 parent: int | None = None) -> list[int]:
    """Engine-style chained uint64 hashes of the full blocks of ``tokens``."""
    hashes = []
    previous = parent or 0
    for start in range(0, len(tokens) - len(tokens) % block_size, block_size):
        block = tokens[start:start + block_size]
        extra = salt if start == 0 and parent is None else ""
        digest = hashlib.sha256(f"{previous}|{list(block)}|{extra}".encode()).digest()
        previous = int.from_bytes(digest[:8], "big")
        hashes.append(previous)
    return hashes


class VllmPublisher:
    """PUB + ROUTER sockets bound at the given endpoints, a replay buffer of the last
    ``buffer_steps`` batches and a thread answering replays (``endless_replay``: a
    hostile server that answers every replay with batches that never end)."""

    def __init__(self, endpoint: str, replay_endpoint: str, encoding: str = "map",
                 bytes_hashes: bool = False, batch_as_map: bool = False,
                 buffer_steps: int = 1000, topic: bytes = b"",
                 endless_replay: bool = False) -> None:
        self.endless_replay = endless_replay
        self.encoding = encoding
        self.bytes_hashes = bytes_hashes
        self.batch_as_map = batch_as_map
        self.topic = topic
        self.seq = 0
        self._buffer: list[tuple[int, bytes]] = []
        self._buffer_steps = buffer_steps
        self._lock = threading.Lock()
        self._context = zmq.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(endpoint)
        self._replay = self._context.socket(zmq.ROUTER)
        self._replay.setsockopt(zmq.LINGER, 0)
        self._replay.bind(replay_endpoint)
        self._running = True
        self._thread = threading.Thread(target=self._serve_replays, daemon=True)
        self._thread.start()

    def stored(self, hashes: Sequence[int], parent: int | None, tokens: Sequence[int],
               block_size: int, salt: str | None = None, lora_name: str | None = None,
               medium: str = "GPU", group_idx: int = 0,
               kind: str = "full_attention") -> Any:
        """A ``BlockStored`` event in this publisher's encoding."""
        extra = [[salt]] + [None] * (len(hashes) - 1) if salt is not None else None
        fields = [list(map(self._hash, hashes)), None if parent is None else self._hash(parent),
                  list(tokens), block_size, None, medium, lora_name, extra, group_idx, kind]
        return self._event("BlockStored", ("block_hashes", "parent_block_hash", "token_ids",
                                           "block_size", "lora_id", "medium", "lora_name",
                                           "extra_keys", "group_idx", "kv_cache_spec_kind"),
                           fields)

    def removed(self, hashes: Sequence[int], medium: str = "GPU", group_idx: int = 0) -> Any:
        """A ``BlockRemoved`` event."""
        return self._event("BlockRemoved", ("block_hashes", "medium", "group_idx"),
                           [list(map(self._hash, hashes)), medium, group_idx])

    def cleared(self) -> Any:
        """An ``AllBlocksCleared`` event."""
        return self._event("AllBlocksCleared", (), [])

    def publish(self, events: list[Any], send: bool = True, ts: float | None = None) -> int:
        """Encode one batch at the next seq, buffer it and (with ``send``) send it."""
        seq = self.seq
        self.seq += 1
        now = time.time() if ts is None else ts
        batch: Any = ({"ts": now, "events": events, "data_parallel_rank": 0}
                      if self.batch_as_map else [now, events, 0])
        payload = msgspec.msgpack.encode(batch)
        with self._lock:
            self._buffer = (self._buffer + [(seq, payload)])[-self._buffer_steps:]
        if send:
            self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def forget(self) -> None:
        """Start over at seq 0 with an empty buffer, on the same sockets: a restarted
        server whose restart the subscriber's connection did not see."""
        with self._lock:
            self._buffer = []
        self.seq = 0

    def send_raw(self, frames: list[bytes]) -> None:
        """Send arbitrary frames on the PUB socket (garbage tests)."""
        self._pub.send_multipart(frames)

    def close(self) -> None:
        """Stop the replay thread and close both sockets (like a killed server)."""
        self._running = False
        self._thread.join()
        self._pub.close(linger=0)
        self._replay.close(linger=0)
        self._context.term()

    def _hash(self, value: int) -> int | bytes:
        return value.to_bytes(8, "big") if self.bytes_hashes else value

    def _event(self, tag: str, names: tuple[str, ...], values: list[Any]) -> Any:
        if self.encoding == "array":
            return [tag, *values]
        return {"type": tag, **dict(zip(names, values, strict=True)), "unknown_field": 7}

    def _serve_replays(self) -> None:
        while self._running:
            if not self._replay.poll(20):
                continue
            frames = self._replay.recv_multipart()
            client, start = frames[0], int.from_bytes(frames[-1], "big")
            with self._lock:
                batches = [item for item in self._buffer if item[0] >= start]
            while self.endless_replay and self._running:
                self._replay.send_multipart([client, b"", self.topic, (0).to_bytes(8, "big"),
                                             b"\x90" * 4096])
            for seq, payload in batches:
                self._replay.send_multipart([client, b"", self.topic, seq.to_bytes(8, "big"),
                                             payload])
            self._replay.send_multipart([client, b"", b"", END, b""])
