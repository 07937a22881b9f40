"""``AttentionMetadata``: where a flattened batch's tokens sit in the paged KV cache.

A step computes ``T`` new tokens from ``B`` sequences, laid out back to back::

    tokens      | seq 0: q0 new tokens | seq 1: q1 new tokens | ... |
    query_start   0                      q0                     q0+q1 ...

Sequence ``b`` already has ``seq_lens[b] - query_lens[b]`` tokens in the cache, so
its new tokens take positions ``[seq_lens[b] - query_lens[b], seq_lens[b])``. Token
position ``p`` of sequence ``b`` lives in slot
``block_tables[b][p // block_size] * block_size + p % block_size`` of the flattened
``[num_blocks * block_size]`` cache.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass(frozen=True)
class AttentionMetadata:
    """Device tensors describing one step's batch; built once per step, read by every layer.

    ``block_tables`` rows are padded with block 0 past each sequence's last block;
    kernels never read a padded entry because they stop at ``seq_lens``.
    """

    positions: torch.Tensor  # [T] int64, position of each new token in its sequence
    slot_mapping: torch.Tensor  # [T] int64, cache slot each new token's K/V is written to
    query_start_loc: torch.Tensor  # [B + 1] int32, offsets of each sequence's new tokens
    seq_lens: torch.Tensor  # [B] int32, cached + new tokens per sequence
    block_tables: torch.Tensor  # [B, max_blocks] int32
    max_query_len: int
    max_seq_len: int

    @property
    def num_seqs(self) -> int:
        """Sequences in the batch."""
        return self.seq_lens.shape[0]

    @property
    def last_token_indices(self) -> torch.Tensor:
        """Index into the flattened tokens of each sequence's last new token, [B] int64."""
        return self.query_start_loc[1:].long() - 1

    @classmethod
    def build(
        cls,
        query_lens: Sequence[int],
        num_computed_tokens: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        block_size: int,
        num_blocks: int,
        device: torch.device | str,
    ) -> AttentionMetadata:
        """Lay out a batch. Raises ValueError if a query is empty, a block table does
        not cover its sequence's positions, or names a block outside ``[0, num_blocks)``.

        The layout is computed in Python lists (one loop over sequences, C-level
        ``range`` runs per block) and becomes two tensors (int64 and int32, one copy
        each to the device) whose contiguous slices are the fields."""
        num_seqs = len(query_lens)
        if not (num_seqs == len(num_computed_tokens) == len(block_tables)) or num_seqs == 0:
            raise ValueError(
                "query_lens, num_computed_tokens and block_tables must be equal, non-empty"
            )
        max_blocks = max(len(table) for table in block_tables)
        positions, slots, query_start, seq_lens, flat_tables = _lay_out(
            query_lens, num_computed_tokens, block_tables, block_size, max_blocks
        )
        if not 0 <= min(flat_tables) <= max(flat_tables) < num_blocks:  # padding is block 0
            raise ValueError(f"block table names a block outside [0, {num_blocks})")
        num_tokens = len(positions)
        longs = int_tensor("q", positions + slots, device)
        ints = int_tensor("i", query_start + seq_lens + flat_tables, device)
        return cls(
            positions=longs[:num_tokens],
            slot_mapping=longs[num_tokens:],
            query_start_loc=ints[: num_seqs + 1],
            seq_lens=ints[num_seqs + 1 : 2 * num_seqs + 1],
            block_tables=ints[2 * num_seqs + 1 :].view(num_seqs, max_blocks),
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
        )


class _Layout(NamedTuple):
    """A batch's fields as Python lists: each new token's position and cache slot, the
    sequences' query offsets and lengths, and their block tables padded with block 0."""

    positions: list[int]
    slots: list[int]
    query_start: list[int]
    seq_lens: list[int]
    flat_tables: list[int]


def _lay_out(
    query_lens: Sequence[int],
    num_computed_tokens: Sequence[int],
    block_tables: Sequence[Sequence[int]],
    block_size: int,
    max_blocks: int,
) -> _Layout:
    """Lay the sequences out back to back (``AttentionMetadata.build``'s checks per
    sequence; the block range is checked by the caller)."""
    positions: list[int] = []
    slots: list[int] = []
    query_start = [0]
    seq_lens: list[int] = []
    flat_tables: list[int] = []
    for b, (new, computed, table) in enumerate(
        zip(query_lens, num_computed_tokens, block_tables, strict=True)
    ):
        end = computed + new
        if new <= 0 or computed < 0:
            raise ValueError(f"sequence {b}: needs >= 1 new token and >= 0 computed tokens")
        if len(table) * block_size < end:
            raise ValueError(
                f"sequence {b}: {len(table)} blocks of {block_size} cannot hold {end} tokens"
            )
        if new == 1:
            positions.append(computed)
            slots.append(table[computed // block_size] * block_size + computed % block_size)
        else:
            positions.extend(range(computed, end))
            for k in range(computed // block_size, (end - 1) // block_size + 1):
                base = (table[k] - k) * block_size
                first, last = max(computed, k * block_size), min(end, (k + 1) * block_size)
                slots.extend(range(base + first, base + last))
        query_start.append(query_start[-1] + new)
        seq_lens.append(end)
        flat_tables.extend(table)
        flat_tables.extend([0] * (max_blocks - len(table)))
    return _Layout(positions, slots, query_start, seq_lens, flat_tables)


def int_tensor(typecode: str, values: list[int], device: torch.device | str) -> torch.Tensor:
    """``values`` as a 1-D int64 (``typecode`` "q") or int32 ("i") tensor on ``device``,
    packed by ``array`` at C speed (``torch.tensor`` of a list converts each int in
    Python). ``values`` must not be empty."""
    dtype = torch.int64 if typecode == "q" else torch.int32
    return torch.frombuffer(array(typecode, values), dtype=dtype).to(device)
