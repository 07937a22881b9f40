"""Asking a vLLM server's replay socket (ZMQ ROUTER) for the batches it buffered.

A request is ``[b"", start]`` (``start`` an 8-byte big-endian seq); the server answers
one ``[b"", topic, seq, payload]`` per buffered batch from ``start`` on, in order, then
``[b"", b"", END_OF_REPLAY, b""]``. A replay is bounded in time (``timeout_s`` in all,
not per message), in batches (the server's buffer) and in bytes (``replay_bytes``):
past any bound it is abandoned, and no message may pass ``MAX_MESSAGE_BYTES``.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import zmq
import zmq.asyncio

from router.fleet.events.vllm.wire import END_OF_REPLAY, WireError, decode_seq

MAX_MESSAGE_BYTES = 64 * 2**20
# A scheduler step of 8,192 new tokens in 16-token blocks publishes about 40 KiB; most
# steps (decode) publish far less. A replay may average this much per batch.
REPLAY_BYTES_PER_BATCH = 32 * 2**10


class ReplayFailed(Exception):
    """The server did not finish answering within the bounds; the text says which."""


class Replay(NamedTuple):
    """What a replay brought: its batches as (seq, payload), in order, and how many of
    its messages did not decode (skipped)."""

    batches: list[tuple[int, bytes]]
    num_malformed: int


def replay_bytes(replay_batches: int) -> int:
    """The most bytes a replay of ``replay_batches`` may bring: ``REPLAY_BYTES_PER_BATCH``
    each, and never less than one message of ``MAX_MESSAGE_BYTES``."""
    return max(replay_batches * REPLAY_BYTES_PER_BATCH, MAX_MESSAGE_BYTES)


async def request_replay(context: zmq.asyncio.Context, endpoint: str, start: int,
                         timeout_s: float, max_batches: int) -> Replay:
    """The batches the server at ``endpoint`` buffered from ``start`` on, within
    ``timeout_s``, ``max_batches`` and ``replay_bytes(max_batches)``; ``ReplayFailed``
    past any of them."""
    max_bytes = replay_bytes(max_batches)
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    dealer.connect(endpoint)
    deadline = time.monotonic() + timeout_s
    batches: list[tuple[int, bytes]] = []
    num_bytes = num_malformed = 0
    try:
        await dealer.send_multipart([b"", start.to_bytes(8, "big")])
        while (left_ms := int((deadline - time.monotonic()) * 1000)) > 0 \
                and await dealer.poll(left_ms):
            frames = await dealer.recv_multipart()
            if len(frames) < 3 or frames[-2] == END_OF_REPLAY:
                return Replay(batches, num_malformed)
            num_bytes += sum(len(frame) for frame in frames)
            if num_bytes > max_bytes or len(batches) >= max_batches:
                raise ReplayFailed(f"over {max_bytes} bytes or {max_batches} batches")
            try:
                batches.append((decode_seq(frames[-2]), frames[-1]))
            except WireError:
                num_malformed += 1
        raise ReplayFailed(f"not answered within {timeout_s:g} s")
    finally:
        dealer.close(linger=0)
