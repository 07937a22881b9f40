"""Property test: the host and disk tiers together keep one LRU order.

A brute-force model keeps, per block, the time it last moved down from the device;
the tiers together must keep exactly the newest ``H + D`` blocks not taken back or
forgotten (the oldest are dropped first), the host tier only blocks newer than every
disk block, each within its size, and every block taken back must carry the K/V it
went down with. A restart (the host tier lost, the disk tier reopened) keeps the disk
part. The events, replayed, name the same blocks per medium.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from radix.events import EventBlock
from radix.hashing import BlockHasher
from radix.keys import to_key
from tests.workers.kv.kv_test_support import NAMESPACE_DIGEST, EventConsumer
from workers.kv.block_events import BlockChainer
from workers.kv.block_pool import BlockPool
from workers.kv.event_log import KVEventLog
from workers.kv.spec import KVCacheSpec
from workers.kv.tensors import KVCacheTensors
from workers.kv.tiers.base import HostHit
from workers.kv.tiers.disk_tier import FileDiskTier
from workers.kv.tiers.host_crypto import BlockSealer
from workers.kv.tiers.host_link import HostLink
from workers.kv.tiers.host_tier import HostMemoryTier

B = 2
H, D = 3, 4
SECRET = b"tier-lru-secret"


class Tiers:
    """A host link over a host tier of ``H`` and a disk tier of ``D`` blocks."""

    def __init__(self, directory: Path, tensors: KVCacheTensors, pool: BlockPool) -> None:
        sealer = BlockSealer(SECRET, NAMESPACE_DIGEST)
        self.host = HostMemoryTier(H, tensors, sealer)
        self.disk = FileDiskTier(directory, D, tensors, sealer, NAMESPACE_DIGEST)
        self.log = KVEventLog("w0", NAMESPACE_DIGEST)
        chainer = BlockChainer(BlockHasher(NAMESPACE_DIGEST), B)
        self.link = HostLink(self.host, pool, chainer, self.log, self.disk)
        self.events = EventConsumer(B)
        self.events.apply(self.log.since(-1, self.log.epoch))

    def replayed(self) -> tuple[set[str], set[str]]:
        self.events.apply(self.log.since(self.events.last_seq, self.log.epoch))
        return self.events.host_hashes, self.events.disk_hashes


def demote(link: HostLink, n: int, event_block: EventBlock) -> None:
    """Demote block ``n`` (``block_of``) from its device block ``2 + n``."""
    link.demote("t1", lambda: [(event_block, range((2 + n) * B, (3 + n) * B))])


def block_of(n: int) -> tuple[EventBlock, bytes]:
    """Block ``n``: a root block of tokens ``(n, n)`` (its K/V: device block ``2 + n``)."""
    hasher = BlockHasher(NAMESPACE_DIGEST)
    tokens = (n, n)
    block_hash = hasher.block_hash(hasher.root_hash("t1"), "t1", to_key(tokens))
    return EventBlock(block_hash.hex(), None, to_key(tokens)), block_hash


operations = st.lists(
    st.tuples(st.sampled_from(["down"] * 6 + ["take", "take", "forget", "restart"]),
              st.integers(0, 9)),
    min_size=8, max_size=50,
)


@settings(max_examples=30, deadline=None)
@given(operations)
def test_host_and_disk_keep_the_newest_blocks_in_one_lru_order(ops):
    spec = KVCacheSpec(1, 1, 2, "float32", B)
    tensors = KVCacheTensors(spec, 2 + 10, "cpu")
    for n in range(10):  # block n's distinctive K/V lives in device block 2 + n
        tensors.write_block(2 + n, bytes([n + 1]) * spec.kv_bytes_per_block)
    pool = BlockPool(2, B)  # where blocks taken back land
    with tempfile.TemporaryDirectory() as directory:
        tiers = Tiers(Path(directory), tensors, pool)
        moved_at: dict[int, int] = {}  # the model: block -> time it last moved down
        for clock, (op, n) in enumerate(ops):
            event_block, block_hash = block_of(n)
            if op == "down":
                tiers.link.forget("t1", [event_block])  # the device held it again first
                moved_at.pop(n, None)
                demote(tiers.link, n, event_block)
                moved_at[n] = clock
            elif op == "take":
                restored, _ = tiers.link.take([HostHit(block_hash, "t1", to_key(event_block.tokens))])
                assert bool(restored) == (n in moved_at)
                if restored:
                    assert tensors.read_slots(range(restored[0] * B, restored[0] * B + B)) == \
                        bytes([n + 1]) * spec.kv_bytes_per_block
                    pool.decref(restored)
                moved_at.pop(n, None)
            elif op == "forget":
                tiers.link.forget("t1", [event_block])
                moved_at.pop(n, None)
            else:
                tiers.disk.close()
                disk_blocks = {h for h, _ in tiers.disk.entries()}
                moved_at = {m: t for m, t in moved_at.items() if block_of(m)[1] in disk_blocks}
                tiers = Tiers(Path(directory), tensors, pool)
            check(tiers, moved_at)
        tiers.disk.close()


def check(tiers: Tiers, moved_at: dict[int, int]) -> None:
    """Drop from the model what it says the tiers drop, then compare."""
    newest = sorted(moved_at, key=moved_at.__getitem__)[-(H + D):]
    for n in set(moved_at) - set(newest):
        del moved_at[n]
    host = {h for h, _ in tiers.host.entries()}
    disk = {h for h, _ in tiers.disk.entries()}
    assert not host & disk and len(host) <= H and len(disk) <= D
    assert host | disk == {block_of(n)[1] for n in moved_at}
    time_of = {block_of(n)[1]: t for n, t in moved_at.items()}
    assert min((time_of[h] for h in host), default=1 << 30) > max(
        (time_of[h] for h in disk), default=-1)
    assert [h for h, _ in tiers.disk.entries()] == sorted(disk, key=time_of.__getitem__)
    assert tiers.replayed() == ({h.hex() for h in host}, {h.hex() for h in disk})
    tiers.disk.flush()  # the files once the queued writes have landed
    assert len(list(tiers.disk.directory.glob("*.kv"))) == len(disk)

