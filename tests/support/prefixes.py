"""Brute-force prefix helpers for the models the property tests check against."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (a plain loop: the model's side)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
