"""Assemble a worker's tiers below the device from its sizes."""

from __future__ import annotations

from pathlib import Path

from workers.kv.block_events import BlockChainer
from workers.kv.block_pool import BlockPool
from workers.kv.event_log import KVEventLog
from workers.kv.tensors import KVCacheTensors
from workers.kv.tiers.base import NoTiers, Tiers
from workers.kv.tiers.disk_tier import DiskTier, FileDiskTier
from workers.kv.tiers.host_crypto import BlockSealer
from workers.kv.tiers.host_link import HostLink
from workers.kv.tiers.host_tier import HostMemoryTier


def build_tiers(
    pool: BlockPool,
    tensors: KVCacheTensors,
    chainer: BlockChainer,
    event_log: KVEventLog,
    *,
    namespace_digest: bytes,
    secret: bytes,
    num_host_blocks: int,
    host_ttl_s: float | None,
    disk_dir: Path | None,
    num_disk_blocks: int,
) -> Tiers:
    """``NoTiers`` when ``num_host_blocks`` is 0; else a host tier of that many blocks
    of ``tensors``, sealed under keys derived from ``secret``, each kept
    ``host_ttl_s`` (None: no expiry), and, when ``num_disk_blocks`` > 0, a disk tier
    of that many blocks under ``disk_dir`` below it (it takes back, and logs in
    ``event_log``, the blocks a previous run left there under the same secret and
    namespace). Raises ValueError for a disk tier without a host tier or a
    directory."""
    if not num_host_blocks:
        if num_disk_blocks:
            raise ValueError("a disk tier needs a host tier")
        return NoTiers()
    sealer = BlockSealer(secret, namespace_digest)
    host = HostMemoryTier(num_host_blocks, tensors, sealer, host_ttl_s)
    disk: DiskTier | None = None
    if num_disk_blocks:
        if disk_dir is None:
            raise ValueError("a disk tier needs a directory")
        disk = FileDiskTier(disk_dir, num_disk_blocks, tensors, sealer, namespace_digest)
    return HostLink(host, pool, chainer, event_log, disk)
