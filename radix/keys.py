"""Token runs as ``bytes`` keys: 4 little-endian bytes per token id.

The tree compares keys with ``bytes.startswith`` (``memcmp``) and finds a first
mismatch by binary search over ``memoryview`` slices, so no Python loop ever walks
tokens one by one. Block hashes use the same encoding, so it is also the canonical
wire form of a token run.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

TOKEN_BYTES = 4
_NATIVE_LITTLE = sys.byteorder == "little"


def to_key(token_ids: Sequence[int] | array) -> bytes:
    """Encode token ids (each in [0, 2**32)) as a key; raises OverflowError otherwise."""
    packed = token_ids if isinstance(token_ids, array) and token_ids.typecode == "I" else array("I", token_ids)
    if not _NATIVE_LITTLE:
        packed = array("I", packed)
        packed.byteswap()
    return packed.tobytes()


def from_key(key: bytes) -> list[int]:
    """Decode a key back into token ids."""
    tokens = array("I")
    tokens.frombytes(key)
    if not _NATIVE_LITTLE:
        tokens.byteswap()
    return tokens.tolist()


def common_prefix_tokens(key: bytes, offset_tokens: int, edge: bytes) -> int:
    """How many leading tokens of ``edge`` equal ``key`` from token ``offset_tokens`` on.

    Binary search with ``startswith`` over shrinking windows (each probe one memcmp
    of the still-undecided window), then a short scan of at most 16 tokens.
    """
    base = offset_tokens * TOKEN_BYTES
    lo, hi = 0, min(len(edge), len(key) - base) // TOKEN_BYTES
    view_edge = memoryview(edge)
    while hi - lo > 16:
        mid = (lo + hi + 1) // 2
        if key.startswith(view_edge[lo * TOKEN_BYTES : mid * TOKEN_BYTES], base + lo * TOKEN_BYTES):
            lo = mid
        else:
            hi = mid - 1
    while lo < hi:
        at = lo * TOKEN_BYTES
        if key[base + at : base + at + TOKEN_BYTES] != edge[at : at + TOKEN_BYTES]:
            break
        lo += 1
    return lo
