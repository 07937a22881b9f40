"""The engine-facing KV cache manager: block tables, sharing, copy-on-write, commits.

One object owns the block pool, the KV tensors and the prefix cache (with its event
log). All calls are synchronous, from the engine thread only.

A sequence's block table maps logical block ``k`` (positions ``[k*B, (k+1)*B)``) to
a physical block. Positions are written only from ``num_computed_tokens`` on, and
only into a block that exactly one sequence holds and the prefix cache references
none of its slots (``BlockPool.is_writable``); any other block about to be written
is first copied, all layers K and V, onto a fresh block that replaces it in the
table (copy-on-write). So full cached blocks are never written in place, a prefix
hit ending inside a block copies that block on the first write, and forked
sequences copy their shared last block when they diverge.

Every call that can run out of blocks counts what it needs first, evicts cached
leaves if the free list is short, and changes nothing if the blocks are still not
there: a failed ``admit`` holds nothing, a failed ``append_slots`` holds nothing new.

Liveness. A sequence's tree lock covers exactly the tokens it matched or committed,
and the sequence references every block that locked path names (its table, plus the
few ``extra_blocks`` an ancestor edge names for a logical block it reads elsewhere).
So a block that no sequence references is never pinned by a lock: every cached
block is evictable at every moment, ``free + cached`` is exactly what admission can
get, and with no sequence live, evicting everything frees every block. An admission
that does not fit with its prefix hit retries with less of it (whole blocks, then,
with nothing else live, none), so a prompt that fits an empty pool is always
admitted when nothing else runs.

Decode headroom. While other sequences are live, an admission must leave
``num_watermark_blocks`` blocks obtainable (free or cached) after its own reservation,
so the running sequences can grow by that many blocks before anyone is preempted
(vLLM's ``watermark``). With nothing else live there is nobody to protect and the
watermark does not apply, so the liveness rule above holds unchanged.

Tiers (host memory, disk below it: ``workers.kv.tiers``, held by each prefix cache
as ``tiers``). The manager calls them at two points: before an admission's match,
the tiers' blocks that continue the device hit along the prompt are copied back
into fresh device blocks (evicting for room while the hit is locked) and cached, so
the hit that follows counts them as cached tokens; and ``swap_out``, preemption by
swapping, caches the sequence's computed tokens, releases them and evicts its own
leaves at once, which the prefix cache demotes into its tiers (as every eviction
does). ``expire_host`` and ``spill_to_disk`` (the whole cache down to disk before
the worker stops) are the tiers' housekeeping, passed on to the base cache's tiers.

Namespaces. The base model's blocks live in ``prefix_cache``; each other namespace
(a LoRA adapter, keyed by its namespace digest) gets its own prefix cache over the
same pool, made on first use by ``make_cache``, so nothing is ever matched across
namespaces. A sequence is admitted into one namespace and commits there only.
When blocks run short, eviction takes the least recently used namespace's leaves
first (a namespace is used when a sequence is admitted into it), then the next.
"""

from __future__ import annotations

import math
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from radix.events import KVEvent
from radix.keys import TOKEN_BYTES, to_key
from radix.tree import PUBLIC, Node, Scope
from workers.kv.block_pool import BlockPool
from workers.kv.event_log import KVEventLog
from workers.kv.ids import BlockId, SeqId
from workers.kv.prefix_cache import PrefixCache, PrefixHit
from workers.kv.tensors import KVCacheTensors
from workers.kv.tiers.disk_tier import DiskTierStats
from workers.kv.tiers.host_tier import HostTierStats


@dataclass(frozen=True)
class KVCacheStats:
    """Gauges and counters for ``/metrics`` (names in docs/operations.md, Monitoring)."""

    num_total_blocks: int
    num_free_blocks: int
    num_cached_blocks: int
    num_used_blocks: int
    kv_cache_usage_ratio: float
    num_cached_tokens: int
    prefix_cache_queries_tokens_total: int
    prefix_cache_hit_tokens_total: int
    num_evicted_blocks_total: int
    num_cow_copies_total: int
    host: HostTierStats
    disk: DiskTierStats


@dataclass(slots=True)
class _SeqState:
    """One admitted sequence. ``num_computed_tokens`` is the only count of its positions
    with KV written or assigned to the step being prepared (the engine reads it, see
    docs/kv-cache.md)."""

    block_table: list[BlockId]
    num_computed_tokens: int
    scope: Scope
    num_public_tokens: int
    lock: Node | None
    extra_blocks: list[BlockId]
    cache: PrefixCache


class KVCacheManager:
    """Paged KV memory for the engine (see the module docstring for the rules)."""

    def __init__(
        self, pool: BlockPool, tensors: KVCacheTensors, prefix_cache: PrefixCache,
        num_watermark_blocks: int = 0, make_cache: Callable[[bytes], PrefixCache] | None = None,
    ):
        if pool.num_total_blocks != tensors.num_blocks or pool.block_size != tensors.block_size:
            raise ValueError("pool and tensors disagree on num_blocks or block_size")
        if not 0 <= num_watermark_blocks < pool.num_total_blocks:
            raise ValueError(f"num_watermark_blocks must be in [0, {pool.num_total_blocks}), "
                             f"got {num_watermark_blocks}")
        self.num_watermark_blocks = num_watermark_blocks
        self.pool = pool
        self.tensors = tensors
        self.prefix_cache = prefix_cache
        self._make_cache = make_cache
        self._caches: OrderedDict[bytes | None, PrefixCache] = OrderedDict({None: prefix_cache})
        self.block_size = pool.block_size
        self._seqs: dict[SeqId, _SeqState] = {}
        self._num_query_tokens = 0
        self._num_hit_tokens = 0
        self._num_cow_copies = 0
        self.num_host_restored_blocks_total = 0

    # ---- sequences -----------------------------------------------------------------

    def admit(
        self,
        seq_id: SeqId,
        token_ids: Sequence[int] | bytes,
        scope: Scope,
        num_public_tokens: int = 0,
        max_cached_tokens: int | None = None,
        namespace: bytes | None = None,
    ) -> int | None:
        """Start ``seq_id``: match the prompt (token ids, or their ``radix.keys`` key,
        which saves encoding them) in the prefix cache (at most ``len - 1``
        tokens, so the last one is always computed), lock and share the matched blocks,
        and reserve every block the prompt needs. Returns the number of cached tokens
        (= ``num_computed_tokens``), or None, holding nothing, when the blocks are not
        there even after eviction. ``num_public_tokens`` (a multiple of the block size)
        leading tokens are cached under ``PUBLIC`` at commit. ``max_cached_tokens`` is
        ``scope``'s cache quota (see ``PrefixCache.set_quota``; None: none).
        ``namespace`` (a namespace digest; None: the base model's) selects the prefix
        cache the sequence matches and commits in."""
        num_tokens = len(token_ids) // TOKEN_BYTES if isinstance(token_ids, bytes) else len(token_ids)
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id} is already admitted")
        if num_tokens == 0:
            raise ValueError("token_ids must not be empty")
        if num_public_tokens % self.block_size or not 0 <= num_public_tokens <= num_tokens:
            raise ValueError(
                f"num_public_tokens must be a multiple of {self.block_size} in [0, {num_tokens}],"
                f" got {num_public_tokens}"
            )
        cache = self.namespace_cache(namespace)
        cache.set_quota(scope, max_cached_tokens)
        key = _key(token_ids)
        seq = None
        num_hit_tokens: int | None = num_tokens - 1
        while seq is None and num_hit_tokens is not None:
            seq = self._try_admit(key[: num_hit_tokens * TOKEN_BYTES], scope, num_tokens, cache)
            num_hit_tokens = self._smaller_hit(num_hit_tokens) if seq is None else None
        if seq is None:
            return None
        seq.num_public_tokens = num_public_tokens
        self._seqs[seq_id] = seq
        self._num_query_tokens += num_tokens
        self._num_hit_tokens += seq.num_computed_tokens
        return seq.num_computed_tokens

    def namespace_cache(self, namespace: bytes | None) -> PrefixCache:
        """The prefix cache of ``namespace`` (None: the base model's), made on first
        use, and marked as the most recently used one."""
        cache = self._caches.get(namespace)
        if cache is None:
            if self._make_cache is None:
                raise ValueError("this KV manager serves the base namespace only")
            cache = self._caches[namespace] = self._make_cache(namespace)  # type: ignore[arg-type]
        self._caches.move_to_end(namespace)
        return cache

    def _try_admit(
        self, hit_key: bytes, scope: Scope, num_tokens: int, cache: PrefixCache
    ) -> _SeqState | None:
        """Match ``hit_key``, then hold the hit and reserve ``num_tokens`` positions;
        None, holding nothing, when the blocks are not there."""
        hit = self._restore_from_tiers(cache, cache.match(hit_key, scope), hit_key, scope)
        cache.lock(hit.node)
        table = list(hit.block_ids)
        extra = cache.blocks_beyond(hit.node, table)
        self.pool.incref(table)
        self.pool.incref(extra)
        seq = _SeqState(table, hit.num_cached_tokens, scope, 0, hit.node, extra, cache)
        num_needed = self._num_blocks_needed(seq, num_tokens)
        if not (self._leaves_headroom(num_needed) and self._make_room(num_needed)):
            self.pool.decref(table)
            self.pool.decref(extra)
            cache.unlock(hit.node)
            return None
        self._reserve(seq, num_tokens)
        return seq

    def _restore_from_tiers(
        self, cache: PrefixCache, hit: PrefixHit, key: bytes, scope: Scope
    ) -> PrefixHit:
        """``hit`` extended by the blocks of ``cache``'s tiers that continue it, as far as
        room can be made for them (see the module docstring); expired entries go
        first."""
        tiers = cache.tiers
        tiers.expire(time.time())
        found = tiers.find(key, hit.num_cached_tokens, scope, lambda: cache.path_end(hit.node))
        if not found:
            return hit
        cache.lock(hit.node)
        self._make_room(len(found))
        restored, num_public = tiers.take(found[: self.pool.num_free_blocks])
        if restored:
            self._cache_restored(cache, hit, key, scope, restored, num_public)
        cache.unlock(hit.node)
        self.num_host_restored_blocks_total += len(restored)
        return cache.match(key, scope) if restored else hit

    def _cache_restored(
        self, cache: PrefixCache, hit: PrefixHit, key: bytes, scope: Scope,
        restored: Sequence[BlockId], num_public: int,
    ) -> None:
        """Cache ``restored`` (taken from the tiers, held once here, the first
        ``num_public`` public) after ``hit``'s whole blocks like a commit (public blocks
        under PUBLIC), then drop the hold. The caller holds a lock on ``hit.node``."""
        num_whole = hit.num_cached_tokens // self.block_size
        table = [*hit.block_ids[:num_whole], *restored]
        block_bytes = self.block_size * TOKEN_BYTES
        public_end = (num_whole + num_public) * block_bytes
        end = (num_whole + len(restored)) * block_bytes
        if num_public:
            cache.insert(key[:public_end], PUBLIC, table)
        if end > public_end:
            cache.insert(key[:end], scope, table)
        self.pool.decref(restored)

    def cached_prefix(self, key: bytes, scope: Scope) -> int:
        """Tokens of ``key`` (a radix key) cached for ``scope`` in the base namespace
        once the tiers' blocks that continue the device hit are restored, as an
        admission restores them: what this worker holds of it without computing."""
        cache = self.prefix_cache
        return self._restore_from_tiers(cache, cache.match(key, scope), key,
                                        scope).num_cached_tokens

    def pin(self, pin_id: SeqId, key: bytes, scope: Scope) -> list[BlockId]:
        """Hold the whole blocks of ``key`` (a radix key) cached for ``scope`` in the base
        namespace, as sequence ``pin_id`` (``free`` releases them): nothing evicts or
        changes them meanwhile. Returns their ids, in order: the cached whole-block
        prefix of ``key``, possibly shorter than it (empty: nothing held)."""
        if pin_id in self._seqs:
            raise ValueError(f"sequence {pin_id} is already admitted")
        step = self.block_size * TOKEN_BYTES
        whole = key[: len(key) - len(key) % step]
        hit = self.prefix_cache.match(whole, scope)
        num_tokens = hit.num_cached_tokens - hit.num_cached_tokens % self.block_size
        if not num_tokens:
            return []
        seq = self._try_admit(whole[: num_tokens * TOKEN_BYTES], scope, num_tokens,
                              self.prefix_cache)
        if seq is None:
            return []
        self._seqs[pin_id] = seq
        return list(seq.block_table[: seq.num_computed_tokens // self.block_size])

    def import_blocks(self, pin_id: SeqId, key: bytes, scope: Scope, num_public_tokens: int,
                      num_local_tokens: int, blocks: Sequence[bytes]) -> bool:
        """Cache the whole blocks of ``key`` for ``scope`` in the base namespace: its first
        ``num_local_tokens`` (whole blocks) as this cache holds them, the next
        ``len(blocks)`` blocks written from ``blocks`` (``KVCacheTensors.read_slots``
        bytes), the first ``num_public_tokens`` under ``PUBLIC`` but never a written
        block (bytes from elsewhere stay in ``scope``: at most the local part is
        public); then hold them as
        sequence ``pin_id`` (``free`` releases them). The insert emits their KV events
        like any commit. False, holding nothing, when the local part is no longer
        cached or there is no room."""
        if pin_id in self._seqs:
            raise ValueError(f"sequence {pin_id} is already admitted")
        if num_local_tokens % self.block_size:
            raise ValueError(f"num_local_tokens must be whole blocks, got {num_local_tokens}")
        num_tokens = num_local_tokens + len(blocks) * self.block_size
        if num_tokens * TOKEN_BYTES > len(key):
            raise ValueError(f"{len(blocks)} blocks go past the key's end")
        seq = self._try_admit(key[: num_local_tokens * TOKEN_BYTES], scope, num_tokens,
                              self.prefix_cache)
        if seq is None:
            return False
        if seq.num_computed_tokens < num_local_tokens:
            self._seqs[pin_id] = seq
            self.free(pin_id)
            return False
        first = num_local_tokens // self.block_size
        for k, data in enumerate(blocks):
            self.tensors.write_block(seq.block_table[first + k], data)
        seq.num_computed_tokens = num_tokens
        seq.num_public_tokens = min(num_public_tokens, num_local_tokens)
        self._seqs[pin_id] = seq
        self.commit(pin_id, key[: num_tokens * TOKEN_BYTES])
        return True

    def expire_host(self, now: float) -> int:
        """Drop the base cache's tiers' entries expired at ``now`` (wall-clock seconds;
        admissions do this too), logged ``removed``; returns how many."""
        return self.prefix_cache.tiers.expire(now)

    def swap_out(self, seq_id: SeqId, token_ids: Sequence[int] | bytes) -> int:
        """Preempt ``seq_id`` by swapping: cache its first ``num_computed_tokens`` of
        ``token_ids`` (or of their key), free it, and evict its own now-unlocked leaves
        to the host tier (dropped when there is none). Returns the blocks freed by that
        eviction."""
        seq = self._seqs[seq_id]
        key = _key(token_ids)[: seq.num_computed_tokens * TOKEN_BYTES]
        self.commit(seq_id, key)
        self.free(seq_id)
        return seq.cache.evict_path(key, seq.scope)

    def spill_to_disk(self) -> int:
        """Move every base-namespace cached block no sequence holds, and every host-tier
        block, down to the disk tier, in LRU order, and return once all of it is on disk
        (a worker stopping, so its cache outlives it); returns the device blocks freed.
        Without a disk tier nothing moves (see ``Tiers.spill``)."""
        cache = self.prefix_cache
        return cache.tiers.spill(lambda: cache.evict(self.pool.num_total_blocks))

    def _smaller_hit(self, num_hit_tokens: int) -> int | None:
        """The prefix hit to try after one of ``num_hit_tokens`` did not fit, or None:
        first drop a partial last block (its copy costs a block); then, when no other
        sequence is live, no hit at all (every cached block is then evictable, so a
        prompt that fits the pool fits); else wait for the running sequences."""
        whole = num_hit_tokens - num_hit_tokens % self.block_size
        if whole < num_hit_tokens:
            return whole
        return 0 if num_hit_tokens and not self._seqs else None

    def append_slots(self, seq_id: SeqId, num_new_tokens: int) -> bool:
        """Make positions ``[c, c + num_new_tokens)`` writable, ``c`` being
        ``num_computed_tokens(seq_id)``, and advance it to ``c + num_new_tokens``: the
        caller writes exactly those positions in the step it prepares. Shared blocks in
        that range are copied first. False, holding nothing new, when out of blocks
        even after eviction (the engine preempts)."""
        seq = self._seqs[seq_id]
        end = seq.num_computed_tokens + num_new_tokens
        if num_new_tokens == 1 and self._append_in_place(seq):
            seq.num_computed_tokens = end
            return True
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        if not self._make_room(self._num_blocks_needed(seq, end)):
            return False
        self._reserve(seq, end)
        seq.num_computed_tokens = end
        return True

    def _append_in_place(self, seq: _SeqState) -> bool:
        """Whether the next position falls in a block ``seq`` may already write (the
        decode step's common case: no block to allocate, copy or evict)."""
        k = seq.num_computed_tokens // self.block_size
        return k < len(seq.block_table) and self.pool.is_writable(seq.block_table[k])

    def block_table(self, seq_id: SeqId) -> list[int]:
        """A copy of the physical block ids of ``seq_id``'s logical blocks."""
        return list(self._seqs[seq_id].block_table)

    def num_table_blocks(self, seq_id: SeqId) -> int:
        """Length of ``seq_id``'s block table (blocks it holds for its positions)."""
        return len(self._seqs[seq_id].block_table)

    def num_computed_tokens(self, seq_id: SeqId) -> int:
        """Positions with KV written or assigned to the current step."""
        return self._seqs[seq_id].num_computed_tokens

    def commit(
        self,
        seq_id: SeqId,
        token_ids: Sequence[int] | bytes,
        num_computed_tokens: int | None = None,
    ) -> None:
        """Cache the first ``num_computed_tokens`` (default: all) of ``token_ids``, the
        sequence's tokens (or their ``radix.keys`` key): its public part under
        ``PUBLIC``, the rest under its scope. Tokens already cached are not
        re-referenced. The sequence's lock moves to the inserted path. Pass whole
        blocks while the sequence still runs: a cached partial block is copied on the
        sequence's next write into it.

        Incremental: given a key, nothing is encoded, and only the path below the
        sequence's previous lock is scanned for blocks to hold (the tree insert itself
        walks the path by ``memcmp``), so committing after each prefill chunk does not
        redo the work of the chunks before."""
        seq = self._seqs[seq_id]
        is_key = isinstance(token_ids, bytes)
        num_given = len(token_ids) // TOKEN_BYTES if is_key else len(token_ids)
        count = num_given if num_computed_tokens is None else num_computed_tokens
        if not 0 <= count <= min(num_given, seq.num_computed_tokens):
            raise ValueError(
                f"cannot commit {count} tokens of sequence {seq_id} "
                f"({seq.num_computed_tokens} computed, {num_given} given)"
            )
        if count == 0:
            return
        if is_key:
            key = token_ids if count == num_given else token_ids[: count * TOKEN_BYTES]
        else:
            key = to_key(token_ids[:count])
        num_public = min(seq.num_public_tokens, count)
        cache = seq.cache
        node = None
        if num_public:
            node = cache.insert(key[: num_public * TOKEN_BYTES], PUBLIC, seq.block_table)
        if count > num_public:
            node = cache.insert(key, seq.scope, seq.block_table)
        cache.lock(node)
        previous_lock, seq.lock = seq.lock, node
        self._extend_lock_path(seq, previous_lock)
        cache.unlock(previous_lock)

    def fork(self, parent_seq_id: SeqId, child_seq_id: SeqId) -> None:
        """Start ``child_seq_id`` sharing every block of ``parent_seq_id`` (each copied on
        its first write by either). Call between steps, after the parent's assigned
        positions were written."""
        if child_seq_id in self._seqs:
            raise ValueError(f"sequence {child_seq_id} is already admitted")
        parent = self._seqs[parent_seq_id]
        self.pool.incref(parent.block_table)
        self.pool.incref(parent.extra_blocks)
        parent.cache.lock(parent.lock)
        self._seqs[child_seq_id] = _SeqState(
            list(parent.block_table),
            parent.num_computed_tokens,
            parent.scope,
            parent.num_public_tokens,
            parent.lock,
            list(parent.extra_blocks),
            parent.cache,
        )

    def pin_ids(self) -> list[SeqId]:
        """The ids of the live pins (``pin``, ``import_blocks``): the sequences with a
        negative id, which the engine never gives."""
        return [seq_id for seq_id in self._seqs if seq_id < 0]

    def free(self, seq_id: SeqId) -> None:
        """Unlock and release every block of ``seq_id``; a no-op for an unknown id, so it
        is safe at any point (finish, abort, preemption)."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            return
        self.pool.decref(seq.block_table)
        self.pool.decref(seq.extra_blocks)
        seq.cache.unlock(seq.lock)

    # ---- blocks --------------------------------------------------------------------

    def _num_blocks_needed(self, seq: _SeqState, end: int) -> int:
        """Fresh blocks to write positions ``[num_computed_tokens, end)``: one per missing
        logical block plus one per existing block there that is not writable."""
        start, table = seq.num_computed_tokens, seq.block_table
        if end <= start:
            return 0
        first, stop = start // self.block_size, math.ceil(end / self.block_size)
        num_copies = sum(not self.pool.is_writable(b) for b in table[first:stop])
        return num_copies + max(0, stop - max(first, len(table)))

    def _leaves_headroom(self, num_blocks: int) -> bool:
        """Whether taking ``num_blocks`` more leaves the watermark obtainable for the
        live sequences (always, with none live)."""
        pool = self.pool
        num_left = pool.num_free_blocks + pool.num_cached_blocks - num_blocks
        return not self._seqs or num_left >= self.num_watermark_blocks

    def _make_room(self, num_blocks: int) -> bool:
        """Evict cached leaves until ``num_blocks`` are free, the least recently used
        namespace's first; False if they cannot be."""
        pool = self.pool
        if pool.num_free_blocks >= num_blocks:
            return True
        if pool.num_free_blocks + pool.num_cached_blocks < num_blocks:
            return False
        self.evict(num_blocks - pool.num_free_blocks)
        return pool.num_free_blocks >= num_blocks

    def evict(self, num_blocks: int) -> int:
        """Evict unlocked cached leaves, the least recently used namespace's first, until
        ``num_blocks`` blocks were freed or none is left; returns the blocks freed."""
        num_freed = 0
        for cache in list(self._caches.values()):
            if num_freed >= num_blocks:
                break
            num_freed += cache.evict(num_blocks - num_freed)
        return num_freed

    def reset_prefix_cache(self) -> int:
        """Evict every cached block that no sequence (nor pin) holds, in every namespace,
        as vLLM's ``reset_prefix_cache`` drops every unreferenced cached block: each
        leaves with a ``removed`` event, and goes to the host or disk tier where the
        worker has one, as any eviction does. Returns the blocks freed."""
        return self.evict(self.pool.num_total_blocks)

    def _reserve(self, seq: _SeqState, end: int) -> None:
        """Give positions ``[num_computed_tokens, end)`` writable blocks (room is there)."""
        start, table = seq.num_computed_tokens, seq.block_table
        if end <= start:
            return
        copies: list[tuple[BlockId, BlockId]] = []
        for k in range(start // self.block_size, math.ceil(end / self.block_size)):
            if k == len(table):
                table.append(self.pool.allocate())
            elif not self.pool.is_writable(table[k]):
                copies.append((table[k], self.pool.allocate()))
                table[k] = copies[-1][1]
        if copies:
            self.tensors.copy_blocks(copies)
            self._hold_lock_path(seq)  # the lock may name a source: keep holding it
            self.pool.decref([source for source, _ in copies])
            self._num_cow_copies += len(copies)

    def _extend_lock_path(self, seq: _SeqState, previous_lock: Node | None) -> None:
        """``_hold_lock_path`` after the lock moved from ``previous_lock``: when that node
        is on the new path, only the nodes below it are scanned (the blocks named above
        it are held already, and the table did not change for them)."""
        added = seq.cache.blocks_beyond_since(seq.lock, seq.block_table, previous_lock)
        if added is None:
            self._hold_lock_path(seq)
            return
        held = set(seq.extra_blocks)
        new = [block for block in added if block not in held]
        if new:
            self.pool.incref(new)
            seq.extra_blocks = sorted([*seq.extra_blocks, *new])

    def _hold_lock_path(self, seq: _SeqState) -> None:
        """Reference exactly the blocks ``seq``'s locked path names beyond its table."""
        extra = seq.cache.blocks_beyond(seq.lock, seq.block_table)
        self.pool.incref(extra)
        self.pool.decref(seq.extra_blocks)
        seq.extra_blocks = extra

    # ---- observation ---------------------------------------------------------------

    @property
    def event_log(self) -> KVEventLog:
        """The KV event log (``since`` may be called from any thread)."""
        return self.prefix_cache.event_log

    def snapshot(self) -> tuple[int, list[KVEvent]]:
        """``(head_seq, [cleared, stored...])`` describing every cached block of every
        namespace (engine thread only)."""
        head_seq, events = self.prefix_cache.snapshot()
        for namespace, cache in self._caches.items():
            if namespace is not None:
                events.extend(e for e in cache.snapshot()[1] if e.type != "cleared")
        return head_seq, events

    @property
    def num_evicted_blocks_total(self) -> int:
        """Blocks freed by eviction so far, all namespaces."""
        return sum(cache.num_evicted_blocks_total for cache in self._caches.values())

    @property
    def num_free_blocks(self) -> int:
        """Blocks on the free list (cached blocks are not counted, though evictable)."""
        return self.pool.num_free_blocks

    def stats(self) -> KVCacheStats:
        """Current gauges and counters."""
        pool = self.pool
        tiers = self.prefix_cache.tiers.stats()
        return KVCacheStats(
            num_total_blocks=pool.num_total_blocks,
            num_free_blocks=pool.num_free_blocks,
            num_cached_blocks=pool.num_cached_blocks,
            num_used_blocks=pool.num_used_blocks,
            kv_cache_usage_ratio=pool.num_used_blocks / pool.num_total_blocks,
            num_cached_tokens=sum(cache.num_cached_tokens for cache in self._caches.values()),
            prefix_cache_queries_tokens_total=self._num_query_tokens,
            prefix_cache_hit_tokens_total=self._num_hit_tokens,
            num_evicted_blocks_total=self.num_evicted_blocks_total,
            num_cow_copies_total=self._num_cow_copies,
            host=tiers.host,
            disk=tiers.disk,
        )

    def check_invariants(self) -> None:
        """Raise AssertionError unless pool, prefix cache and block tables agree: each
        block's refcount is the number of sequences holding it (tables and extra
        blocks), tree slot counts match the tree, locks match the sequences, no lock
        pins a block that no sequence holds (so every cached block is evictable),
        free + cached + in use == total."""
        self.pool.check_invariants()
        tree_slots = [0] * self.pool.num_total_blocks
        for cache in self._caches.values():
            locks = [seq.lock for seq in self._seqs.values() if seq.cache is cache]
            for block, count in enumerate(cache.check_invariants(locks)):
                tree_slots[block] += count
        for block, count in enumerate(tree_slots):
            assert self.pool.num_tree_slots(BlockId(block)) == count, f"block {block} tree slots"
        held: Counter[BlockId] = Counter()
        for seq_id, seq in self._seqs.items():
            table = seq.block_table
            assert len(set(table)) == len(table), f"sequence {seq_id} holds a block twice"
            assert len(table) * self.block_size >= seq.num_computed_tokens, f"{seq_id}: short table"
            assert not set(seq.extra_blocks) & set(table), f"sequence {seq_id} holds a block twice"
            assert seq.extra_blocks == seq.cache.blocks_beyond(seq.lock, table), (
                f"sequence {seq_id}: extra blocks are not exactly those its lock names")
            held.update(table)
            held.update(seq.extra_blocks)
        for block in range(self.pool.num_total_blocks):
            assert self.pool.refcount(BlockId(block)) == held[BlockId(block)], f"block {block} refs"


def _key(token_ids: Sequence[int] | bytes) -> bytes:
    """``token_ids`` as a radix key; a key is passed through unchanged."""
    return token_ids if isinstance(token_ids, bytes) else to_key(token_ids)
