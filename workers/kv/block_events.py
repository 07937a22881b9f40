"""The block model of KV events over the worker's radix tree (docs/protocol.md).

A path is cut into blocks at absolute positions ``[k*B, (k+1)*B)``. The blocks that
"belong" to a node spanning ``[start, end)`` are those whose end lies in
``(start, end]``: every full block ending inside the node, plus the (possibly
partial) block ending at ``end``. This one rule gives all three event kinds:

- an insert that adds the leaf ``[e0, e1)`` stores that leaf's blocks;
- evicting the leaf ``[a, b)`` removes that leaf's blocks;
- a snapshot stores the blocks of every node.

A block's scope is the scope of the node holding its last token, which is the node
it belongs to. Hashes chain through full blocks only: ``parent`` is the hash of the
previous full block (None for block 0, whose chain starts at ``root_hash(scope)``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from radix.events import EventBlock
from radix.hashing import BlockHash, BlockHasher
from radix.keys import TOKEN_BYTES
from radix.tree import Node, Scope


class ChainState(NamedTuple):
    """Where a path stands at some depth: the hash of its last full block (None before
    the first) and the tokens since that block's end (key encoding, < B tokens)."""

    parent: BlockHash | None
    tail: bytes


ROOT_STATE = ChainState(None, b"")


class PathEnd(NamedTuple):
    """Where a cached path that ends at a block boundary stands in the hash chain: the
    hash of its last full block (None at the root) and whether every node on it is
    PUBLIC (a continuation may then be public too)."""

    parent: BlockHash | None
    public: bool


ROOT_END = PathEnd(None, True)


class BlockChainer:
    """Computes the event blocks of tree nodes under one namespace's ``BlockHasher``."""

    def __init__(self, hasher: BlockHasher, block_size: int):
        self.hasher = hasher
        self.block_size = block_size
        self._root_hashes: dict[Scope, BlockHash] = {}

    def state_after(self, nodes: Iterable[Node], state: ChainState = ROOT_STATE) -> ChainState:
        """The chain state at the end of ``nodes`` (a path segment starting at ``state``)."""
        for node in nodes:
            state = self._walk(state, node, None)
        return state

    def node_blocks(
        self, state: ChainState, node: Node, with_tokens: bool
    ) -> tuple[list[EventBlock], ChainState]:
        """The blocks belonging to ``node`` (``state`` is the chain at ``node.start``)
        and the chain state at ``node.end``; tokens only ``with_tokens`` (stored)."""
        blocks: list[EventBlock] = []
        end_state = self._walk(state, node, (blocks, with_tokens))
        return blocks, end_state

    def _walk(
        self, state: ChainState, node: Node, out: tuple[list[EventBlock], bool] | None
    ) -> ChainState:
        step = self.block_size * TOKEN_BYTES
        data = state.tail + node.key
        parent = state.parent
        at = step
        while at <= len(data):
            block_key = data[at - step : at]
            block_hash = self._hash(parent, node.scope, block_key)
            if out is not None:
                out[0].append(_event_block(block_hash, parent, block_key, out[1]))
            parent = block_hash
            at += step
        tail = data[at - step :]
        if out is not None and tail:
            out[0].append(_event_block(self._hash(parent, node.scope, tail), parent, tail, out[1]))
        return ChainState(parent, tail)

    def block_hash(self, parent: BlockHash | None, scope: Scope, block_key: bytes) -> BlockHash:
        """The hash of one full block of ``scope`` under ``parent`` (None: the root)."""
        return self._hash(parent, scope, block_key)

    def _hash(self, parent: BlockHash | None, scope: Scope, block_key: bytes) -> BlockHash:
        if parent is None:
            parent = self._root_hashes.get(scope)
            if parent is None:
                parent = self._root_hashes[scope] = self.hasher.root_hash(scope)
        return self.hasher.block_hash(parent, scope, block_key)


def _event_block(
    block_hash: BlockHash, parent: BlockHash | None, block_key: bytes, with_tokens: bool
) -> EventBlock:
    return EventBlock(
        hash=block_hash.hex(),
        parent=None if parent is None else parent.hex(),
        key=block_key if with_tokens else None,
    )
