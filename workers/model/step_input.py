"""``StepInput``: one sequence's share of a model step, as the engine hands it over."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class StepInput(NamedTuple):
    """One sequence's share of a step.

    ``token_ids``: new tokens computed now (a prefill chunk, or one decode token).
    ``num_computed_tokens``: tokens already in the cache; the new ones take positions
    ``[num_computed_tokens, num_computed_tokens + len(token_ids))``.
    ``block_table``: physical block ids covering all those positions. The caller
    guarantees the blocks written this step are owned by this sequence alone.
    ``lora_slot``: the adapter slot the sequence runs (None: the base model).
    """

    token_ids: Sequence[int]
    num_computed_tokens: int
    block_table: Sequence[int]
    lora_slot: int | None = None
