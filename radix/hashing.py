"""Chained block hashes: ``h_i = H(h_{i-1}, scope_i, tokens of block i)``.

A token run is cut into blocks of ``block_size`` tokens at absolute positions
(the last block may be partial). Each link hashes the parent hash, the block's
scope (length-prefixed) and the block's tokens in the canonical key encoding of
``radix.keys``. The chain is seeded by the namespace digest: with BLAKE2b it is the
key, with xxh3_128 the seed, and the first block's parent is ``root_hash(scope)``.
Putting the scope in every link keeps two tenants' identical continuations of a
public prefix apart. Hashes name blocks in KV events; they never decide a match
where tokens are available.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from typing import NewType

import xxhash

from radix.keys import TOKEN_BYTES

BlockHash = NewType("BlockHash", bytes)
HASH_BYTES = 16
ALGORITHMS = ("blake2b", "xxh3_128")


class BlockHasher:
    """Hashes blocks of one namespace. ``blake2b`` (keyed, collision resistant) is the
    default; ``xxh3_128`` is faster and only for trusted single-tenant deployments."""

    def __init__(self, namespace_digest: bytes, algorithm: str = "blake2b"):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"hash algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
        if not namespace_digest:
            raise ValueError("namespace_digest must not be empty")
        self.algorithm = algorithm
        key = hashlib.blake2b(namespace_digest, digest_size=64).digest()
        self._keyed_blake2b = hashlib.blake2b(digest_size=HASH_BYTES, key=key)
        self._seed = int.from_bytes(key[:8], "little")

    def _digest(self, data: bytes) -> BlockHash:
        if self.algorithm == "blake2b":
            h = self._keyed_blake2b.copy()
            h.update(data)
            return BlockHash(h.digest())
        return BlockHash(xxhash.xxh3_128_digest(data, seed=self._seed))

    def root_hash(self, scope: str) -> BlockHash:
        """The parent of a path's first block."""
        return self._digest(b"root" + _field(scope))

    def block_hash(self, parent: BlockHash, scope: str, block_key: bytes) -> BlockHash:
        """Hash of one block (``block_key`` in key encoding) under ``parent``."""
        return self._digest(parent + _field(scope) + block_key)

    def chain(
        self, key: bytes, block_size: int, scope: str, parent: BlockHash | None = None
    ) -> list[BlockHash]:
        """Hashes of consecutive blocks of ``key`` (last one may be partial), all of one
        ``scope``, starting under ``parent`` (the root of ``scope`` when None). A path
        that crosses from PUBLIC into a tenant is hashed by continuing the chain:
        ``chain(public_part, B, PUBLIC)`` then ``chain(rest, B, tenant, parent=last)``."""
        step = block_size * TOKEN_BYTES
        scope_field = _field(scope)
        h = self.root_hash(scope) if parent is None else parent
        hashes: list[BlockHash] = []
        for at in range(0, len(key), step):
            h = self._digest(h + scope_field + key[at : at + step])
            hashes.append(h)
        return hashes


@functools.lru_cache(maxsize=4096)
def _field(text: str) -> bytes:
    """``text`` length-prefixed (a scope name; cached: every block hash needs one)."""
    raw = text.encode()
    return struct.pack(">I", len(raw)) + raw
