"""What both ends of a transfer must agree on, and the chained hashes that name a
prompt's blocks in it."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from radix.hashing import BlockHash, BlockHasher
from radix.keys import TOKEN_BYTES
from radix.tree import PUBLIC
from workers.kv.ids import SeqId


@dataclass(frozen=True)
class TransferIdentity:
    """One worker's side of a transfer: its engine id, namespace digest (hex: it covers
    the model, weights, tokenizer, RoPE, KV dtype, layout version and FP8 scales),
    block size, KV dtype, bytes per block, the hasher of its KV events, and the most
    blocks one prompt can have (its longest sequence over the block size: what bounds
    a pull's size)."""

    engine_id: str
    namespace: str
    block_size: int
    kv_dtype: str
    block_bytes: int
    hasher: BlockHasher
    max_blocks: int
    _pin_ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    def next_pin_id(self) -> SeqId:
        """A sequence id for a pin, never one the engine gives (those are >= 0)."""
        return SeqId(-next(self._pin_ids))

    def block_hashes(self, key: bytes, scope: str, num_public_tokens: int) -> list[str]:
        """Hex hashes of the whole blocks of ``key`` (a radix key), its first
        ``num_public_tokens`` under ``PUBLIC`` and the rest under ``scope``, as the KV
        events name them."""
        step = self.block_size * TOKEN_BYTES
        whole = key[: len(key) - len(key) % step]
        public = whole[: num_public_tokens * TOKEN_BYTES]
        hashes: list[BlockHash] = self.hasher.chain(public, self.block_size, PUBLIC)
        hashes += self.hasher.chain(whole[len(public):], self.block_size, scope,
                                    parent=hashes[-1] if hashes else None)
        return [h.hex() for h in hashes]
