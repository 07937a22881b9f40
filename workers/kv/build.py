"""Assemble a KV cache manager from a spec and a block count."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from radix.hashing import BlockHasher
from workers.kv.block_events import BlockChainer
from workers.kv.block_pool import BlockPool
from workers.kv.event_log import KVEventLog
from workers.kv.manager import KVCacheManager
from workers.kv.prefix_cache import NullPrefixCache, PrefixCache
from workers.kv.radix_cache import RadixPrefixCache
from workers.kv.spec import KVCacheSpec
from workers.kv.tensors import KVCacheTensors
from workers.kv.tiers.base import Tiers
from workers.kv.tiers.build import build_tiers


def build_kv_cache_manager(
    spec: KVCacheSpec,
    num_blocks: int,
    *,
    namespace_digest: bytes,
    worker_id: str,
    device: torch.device | str = "cpu",
    prefix_caching: bool = True,
    hash_algorithm: str = "blake2b",
    max_events: int = 65536,
    max_event_tokens: int = 1 << 20,
    num_host_blocks: int = 0,
    secret: bytes = b"",
    watermark: float = 0.0,
    host_ttl_s: float | None = None,
    disk_dir: Path | None = None,
    num_disk_blocks: int = 0,
) -> KVCacheManager:
    """A manager over ``num_blocks`` preallocated blocks on ``device`` (see
    ``plan_kv_cache`` for the count), with the radix prefix cache or, when
    ``prefix_caching`` is False, the null one. ``num_host_blocks``, ``secret``,
    ``host_ttl_s``, ``disk_dir`` and ``num_disk_blocks`` give the radix cache its tiers
    below the device (``build_tiers``; none without host blocks). ``watermark`` is the
    fraction of the blocks admission keeps obtainable for running sequences to grow
    into (``KVCacheManager``, whole blocks, rounded down). A new event log epoch
    starts here, and announces the blocks taken back from disk. Other namespaces (LoRA
    adapters) get their own prefix caches over the same pool and event log, with no
    tiers (``KVCacheManager.namespace_cache``)."""
    if not 0 <= watermark < 1:
        raise ValueError(f"watermark must be in [0, 1), got {watermark}")
    pool = BlockPool(num_blocks, spec.block_size)
    log = KVEventLog(worker_id, namespace_digest, max_events, max_event_tokens)
    tensors = KVCacheTensors(spec, num_blocks, device)
    if prefix_caching:
        chainer = BlockChainer(BlockHasher(namespace_digest, hash_algorithm), spec.block_size)
        tiers = build_tiers(
            pool, tensors, chainer, log,
            namespace_digest=namespace_digest, secret=secret, num_host_blocks=num_host_blocks,
            host_ttl_s=host_ttl_s, disk_dir=disk_dir, num_disk_blocks=num_disk_blocks,
        )
        cache, make_cache = _radix_caches(pool, log, tiers, namespace_digest, hash_algorithm)
    elif num_host_blocks or num_disk_blocks:
        raise ValueError("host and disk tiers need the prefix cache")
    else:
        cache, make_cache = _null_caches(pool, log)
    return KVCacheManager(pool, tensors, cache, int(watermark * num_blocks), make_cache)


def _radix_caches(
    pool: BlockPool, log: KVEventLog, tiers: Tiers, namespace_digest: bytes, hash_algorithm: str
) -> tuple[PrefixCache, Callable[[bytes], PrefixCache]]:
    """The base namespace's radix prefix cache over ``tiers``, and the maker of another
    namespace's (no tiers), all over ``pool`` and ``log``."""

    def make_cache(digest: bytes) -> PrefixCache:
        return RadixPrefixCache(pool, BlockHasher(digest, hash_algorithm),
                                log.for_namespace(digest))

    base = RadixPrefixCache(pool, BlockHasher(namespace_digest, hash_algorithm), log, tiers)
    return base, make_cache


def _null_caches(
    pool: BlockPool, log: KVEventLog
) -> tuple[PrefixCache, Callable[[bytes], PrefixCache]]:
    """The null prefix cache of the base namespace and the maker of another's."""

    def make_cache(digest: bytes) -> PrefixCache:
        return NullPrefixCache(pool, log.for_namespace(digest))

    return NullPrefixCache(pool, log), make_cache
