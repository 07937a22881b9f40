"""Test helpers for the KV cache: a fake model that writes distinctive K/V values, and
a KV event consumer that replays a worker's log into a fresh RadixTree.

The fake model's K/V for position ``p`` is a function of the tokens ``[0, p]`` (as in
a real causal model), so any block holding the wrong data for a sequence's prefix is
caught by comparing what the sequence reads with what it should read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from radix.events import KVEvent
from radix.hashing import BlockHasher
from radix.keys import from_key, to_key
from radix.tree import PUBLIC, RadixTree
from workers.kv.build import build_kv_cache_manager
from workers.kv.manager import KVCacheManager
from workers.kv.spec import KVCacheSpec

NAMESPACE_DIGEST = b"kv-test-namespace"
NUM_LAYERS = 2
HEAD_DIM = 2
SCOPES = (PUBLIC, "t1", "t2")


def make_manager(
    num_blocks: int, block_size: int, prefix_caching: bool = True, num_host_blocks: int = 0,
    watermark: float = 0.0, host_ttl_s: float | None = None,
    disk_dir: Path | None = None, num_disk_blocks: int = 0, secret: bytes = b"kv-test-secret",
) -> KVCacheManager:
    """A CPU manager with small float32 tensors (values below 2**24 stay exact), with a
    host tier of ``num_host_blocks`` when > 0 (entries kept ``host_ttl_s``), a disk
    tier of ``num_disk_blocks`` under ``disk_dir`` when > 0, and admission's
    ``watermark``."""
    spec = KVCacheSpec(NUM_LAYERS, 1, HEAD_DIM, "float32", block_size)
    return build_kv_cache_manager(
        spec,
        num_blocks,
        namespace_digest=NAMESPACE_DIGEST,
        worker_id="w0",
        prefix_caching=prefix_caching,
        num_host_blocks=num_host_blocks,
        secret=secret,
        watermark=watermark,
        host_ttl_s=host_ttl_s,
        disk_dir=disk_dir,
        num_disk_blocks=num_disk_blocks,
    )


def expected_kv(tokens: Sequence[int], start: int, end: int) -> torch.Tensor:
    """What the fake model writes for positions [start, end): [n, layers, 2 (K/V), D]."""
    rows = []
    for p in range(start, end):
        digest = hashlib.blake2b(to_key(tokens[: p + 1]), digest_size=8).digest()
        a, b = (
            int.from_bytes(digest[:4], "little") >> 11,
            int.from_bytes(digest[4:], "little") >> 11,
        )
        rows.append([[[a + layer, b], [b + layer, a]] for layer in range(NUM_LAYERS)])
    return torch.tensor(rows, dtype=torch.float32).reshape(end - start, NUM_LAYERS, 2, HEAD_DIM)


def _slots(manager: KVCacheManager, seq_id: int, start: int, end: int) -> torch.Tensor:
    table, size = manager.block_table(seq_id), manager.block_size
    return torch.tensor([table[p // size] * size + p % size for p in range(start, end)])


def write_kv(
    manager: KVCacheManager, seq_id: int, tokens: Sequence[int], start: int, end: int
) -> None:
    """Write the fake model's K/V of positions [start, end) through the block table."""
    if end <= start:
        return
    slots, values = _slots(manager, seq_id, start, end), expected_kv(tokens, start, end)
    tensors = manager.tensors
    for layer in range(NUM_LAYERS):
        tensors.key_caches[layer].view(-1, 1, HEAD_DIM)[slots, 0] = values[:, layer, 0]
        tensors.value_caches[layer].view(-1, 1, HEAD_DIM)[slots, 0] = values[:, layer, 1]


def read_kv(manager: KVCacheManager, seq_id: int, start: int, end: int) -> torch.Tensor:
    """What the sequence reads for positions [start, end), shaped like ``expected_kv``."""
    slots = _slots(manager, seq_id, start, end)
    tensors = manager.tensors
    per_layer = [
        torch.stack(
            [
                tensors.key_caches[layer].view(-1, 1, HEAD_DIM)[slots, 0],
                tensors.value_caches[layer].view(-1, 1, HEAD_DIM)[slots, 0],
            ],
            dim=1,
        )
        for layer in range(NUM_LAYERS)
    ]
    return torch.stack(per_layer, dim=1)


def assert_reads(manager: KVCacheManager, seq_id: int, tokens: Sequence[int], end: int) -> None:
    """The sequence reads exactly its own prefix's K/V at every position < ``end``."""
    if end:
        assert torch.equal(read_kv(manager, seq_id, 0, end), expected_kv(tokens, 0, end)), seq_id


def serve(manager: KVCacheManager, seq_id: int, tokens: list[int], scope: str = "t1") -> int:
    """Admit ``tokens``, check what the hit reads, write the fake model's K/V for the
    rest, cache, finish and check the invariants; returns the cached tokens."""
    num_cached = manager.admit(seq_id, tokens, scope)
    assert num_cached is not None
    assert_reads(manager, seq_id, tokens, num_cached)
    assert manager.append_slots(seq_id, len(tokens) - num_cached)
    write_kv(manager, seq_id, tokens, num_cached, len(tokens))
    manager.commit(seq_id, tokens)
    manager.free(seq_id)
    manager.check_invariants()
    return num_cached


# ---- KV events -------------------------------------------------------------------------

BlockPath = tuple[tuple[str, ...], tuple[int, ...]]  # (scope of every block, tokens)


class EventConsumer:
    """A router-side view of one worker: ``hash -> (parent, tokens, scope)``, fed by
    events. It checks the protocol as it goes: seq is gapless, a stored block is new,
    its parent is known and its hash is the chained hash of its scope and tokens.
    Device events build ``blocks``; host and disk events only the sets ``host_hashes``
    and ``disk_hashes``."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.hasher = BlockHasher(NAMESPACE_DIGEST)
        self.blocks: dict[str, tuple[str | None, tuple[int, ...], str]] = {}
        self.host_hashes: set[str] = set()
        self.disk_hashes: set[str] = set()
        self.last_seq: int | None = None

    def apply(self, events: Iterable[KVEvent], snapshot: bool = False) -> None:
        """Apply log events (gapless) or a snapshot's events (all stamped head_seq)."""
        for event in events:
            if not snapshot and self.last_seq is not None:
                assert event.seq == self.last_seq + 1, f"gap: {self.last_seq} -> {event.seq}"
            self.last_seq = event.seq
            if event.type == "cleared":
                self.blocks.clear()
                self.host_hashes.clear()
                self.disk_hashes.clear()
            if event.medium != "device":
                held = self.host_hashes if event.medium == "host" else self.disk_hashes
                for block in event.blocks:
                    if event.type == "stored":
                        assert block.hash not in held, f"{event.medium} stored twice: {block}"
                        held.add(block.hash)
                    else:
                        held.discard(block.hash)
                continue
            for block in event.blocks:
                if event.type == "removed":
                    self.blocks.pop(block.hash, None)
                    continue
                assert block.hash not in self.blocks, f"stored twice: {block}"
                assert block.tokens and len(block.tokens) <= self.block_size
                parent = block.parent
                assert parent is None or len(self.blocks[parent][1]) == self.block_size
                chain_parent = (
                    self.hasher.root_hash(event.scope) if parent is None else bytes.fromhex(parent)
                )
                expected = self.hasher.block_hash(chain_parent, event.scope, to_key(block.tokens))
                assert block.hash == expected.hex(), "hash is not the chained block hash"
                self.blocks[block.hash] = (parent, block.tokens, event.scope)

    def paths(self) -> set[BlockPath]:
        """Every known block as (scopes of the blocks on its path, path tokens)."""
        out: set[BlockPath] = set()
        for parent, tokens, scope in self.blocks.values():
            scopes, parts = [scope], [tokens]
            while parent is not None:
                parent, tokens, scope = self.blocks[parent]
                scopes.append(scope)
                parts.append(tokens)
            out.add((tuple(reversed(scopes)), sum(reversed(parts), ())))
        return out

    def tree(self) -> RadixTree:
        """A fresh RadixTree with every known block's path inserted under its scope,
        shorter paths first (so public prefixes exist before tenant continuations)."""
        tree: RadixTree = RadixTree()
        for scopes, tokens in sorted(self.paths(), key=lambda path: len(path[1])):
            tree.insert(to_key(tokens), scopes[-1])
        return tree


def worker_paths(tree: RadixTree, block_size: int) -> set[BlockPath]:
    """The worker tree in the same form: for each node, the blocks whose end lies in
    (start, end] (the protocol's block model)."""
    out: set[BlockPath] = set()
    stack = [(tree.root, (), ())]
    while stack:
        node, full_scopes, tokens = stack.pop()
        for child in (node.children or {}).values():
            path = tokens + tuple(from_key(child.key))
            scopes = list(full_scopes)
            for end in range(child.start + 1, child.end + 1):
                if end % block_size == 0 or end == child.end:
                    block_scopes = (*scopes, child.scope)
                    out.add((block_scopes, path[:end]))
                    if end % block_size == 0:
                        scopes.append(child.scope)
            stack.append((child, tuple(scopes), path))
    return out


def split_full(paths: set[BlockPath], block_size: int) -> tuple[set[BlockPath], set[BlockPath]]:
    """(paths ending at a block boundary, paths ending inside a block)."""
    full = {p for p in paths if len(p[1]) % block_size == 0}
    return full, paths - full


def assert_replay_equivalent(worker_tree: RadixTree, consumer: EventConsumer, exact: bool) -> None:
    """Compare the consumer's replay with the worker's tree.

    Always: the same full-block paths (tokens and the scope of every block); every
    partial block the consumer knows ends at a node end of the worker's tree; and in
    a fresh RadixTree built from the replay, every path and scope matches no more
    than in the worker's tree and no less than the worker's match rounded down to a
    block boundary. The slack is the protocol's conservative case: a partial block
    ending at a split point is never stored, so once the nodes below the split are
    evicted the worker still holds up to B - 1 tokens the consumer does not know.
    With ``exact`` (workloads where every node boundary is a block boundary, so that
    case cannot arise), the path sets and all matches are equal.
    """
    size = consumer.block_size
    worker, replayed = worker_paths(worker_tree, size), consumer.paths()
    worker_full, worker_partial = split_full(worker, size)
    replayed_full, replayed_partial = split_full(replayed, size)
    assert replayed_full == worker_full
    assert replayed_partial <= worker_partial
    if exact:
        assert replayed == worker
    replay_tree = consumer.tree()
    for tokens in {tokens for _, tokens in worker | replayed}:
        key = to_key(tokens)
        for scope in SCOPES:
            in_worker = worker_tree.match(key, scope, touch=False).num_matched_tokens
            in_replay = replay_tree.match(key, scope, touch=False).num_matched_tokens
            if exact:
                assert in_replay == in_worker, (tokens, scope)
            else:
                assert in_worker - in_worker % size <= in_replay <= in_worker, (tokens, scope)
