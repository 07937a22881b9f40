"""``Incoming``, the blocks of a pull as they arrive (what a relay sends on): a reader
gets each block once it has come, in order, whenever it asks; a pull that breaks off
fails the readers still waiting, never those whose blocks had come."""

from __future__ import annotations

import asyncio

import pytest

from workers.kv_transfer.incoming import Incoming
from workers.kv_transfer.wire import TransferError

HASHES = [f"{i:032x}" for i in range(6)]


def test_a_reader_gets_each_block_once_it_arrives_whenever_it_asks():
    async def run() -> list[bytes]:
        incoming = Incoming("t1", HASHES, 2)
        early = asyncio.ensure_future(asyncio.gather(*(incoming.block(i) for i in (5, 2, 3))))
        for i in range(2, 6):
            await asyncio.sleep(0)
            assert not early.done()
            incoming.add(bytes([i]))
        incoming.stop("done")
        return [*await early, await incoming.block(4)]

    assert asyncio.run(run()) == [b"\x05", b"\x02", b"\x03", b"\x04"]


def test_a_broken_pull_fails_the_readers_of_blocks_that_never_came():
    async def run() -> None:
        incoming = Incoming("t1", HASHES, 0)
        waiting = asyncio.ensure_future(incoming.block(3))
        incoming.add(b"a")
        incoming.stop("the producer went away")
        assert incoming.broken == "the producer went away"
        assert await incoming.block(0) == b"a"
        with pytest.raises(TransferError) as failed:
            await waiting
        assert failed.value.reason == "protocol"

    asyncio.run(run())


def test_it_covers_a_chain_of_its_scope_ending_in_one_of_its_blocks():
    incoming = Incoming("t1", HASHES, 2)
    assert incoming.covers("t1", HASHES[:4]) and incoming.covers("t1", HASHES)
    assert not incoming.covers("t2", HASHES[:4])
    assert not incoming.covers("t1", [*HASHES[:3], "f" * 32])
    assert not incoming.covers("t1", [*HASHES, "e" * 32]) and not incoming.covers("t1", [])
    incoming.stop("gone")
    assert not incoming.covers("t1", HASHES)
