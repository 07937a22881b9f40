"""Typed ids shared by the KV modules."""

from __future__ import annotations

from typing import NewType

BlockId = NewType("BlockId", int)
"""Index of a physical KV block: the first dimension of every K and V cache tensor."""

SeqId = NewType("SeqId", int)
"""The engine's id of one sequence (a request choice); unique among live sequences."""
