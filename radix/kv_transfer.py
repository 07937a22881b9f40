"""``kv_transfer_params``: how a request tells a worker to prefill for another, and how
the other finds the blocks, in vLLM's shape (its NIXL connector's fields, plus the
ones our transfer checks: block hashes, block size, dtype, namespace).

A request to a producer carries ``{"do_remote_decode": true}``: prefill, answer, and
hold the prompt's blocks for a consumer. The producer's answer carries a
``RemotePrefill`` (``to_params``: ``do_remote_prefill`` true and where the blocks
are); the same request sent to a consumer with those params makes it pull the
blocks it lacks before it decodes. docs/pd.md has the protocol.

A ``PeerHold`` (``POST HOLD_PATH``, the router's) asks a worker to hold the blocks it
already caches of a prompt for another worker's pull, running nothing: it answers
the same ``kv_transfer_params`` a prefill leg does (docs/pd.md, "Peer pulls").
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from radix.api_errors import bad_request
from radix.keys import TOKEN_BYTES
from radix.openai.fields import Fields, token_ids_b64

MAX_BLOCKS = 1 << 20
# A producer's route that ends a hold at once: POST {"remote_request_id": ID} (the
# router's, for params it abandoned; docs/pd.md).
RELEASE_PATH = "/kv_transfer/release"
# A worker's route that holds a prompt's cached blocks for a peer's pull, running
# nothing: POST a PeerHold (the router's; docs/pd.md, "Peer pulls").
HOLD_PATH = "/kv_transfer/hold"
MAX_SCOPE_CHARS = 256
MAX_HOLD_WAIT_S = 60.0
_HEX = re.compile(r"^[0-9a-f]{1,128}$")
_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def wants_remote_decode(params: Mapping[str, Any] | None) -> bool:
    """Whether ``params`` ask this worker to prefill and hold the blocks for another."""
    return params is not None and params.get("do_remote_decode") is True


def wants_remote_prefill(params: Mapping[str, Any] | None) -> bool:
    """Whether ``params`` say the prompt's blocks wait on another worker."""
    return params is not None and params.get("do_remote_prefill") is True


@dataclass(frozen=True)
class RemotePrefill:
    """Where a prefilled prompt's blocks wait: the producer's engine id and transfer
    endpoint, the transfer id, the held blocks' chained hashes (hex, in prompt order:
    the prompt's whole blocks, or fewer when fewer were cached) and the ids of those
    on the producer's device (fewer ids than hashes: the rest are still on their way
    to it, and it relays them as they arrive), and what a consumer must match to read
    them (block size, KV dtype, namespace digest in hex)."""

    engine_id: str
    transfer_id: str
    host: str
    port: int
    block_ids: tuple[int, ...]
    block_hashes: tuple[str, ...]
    block_size: int
    kv_dtype: str
    namespace: str

    def to_params(self) -> dict[str, Any]:
        """The ``kv_transfer_params`` of the producer's answer."""
        return {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_engine_id": self.engine_id, "remote_request_id": self.transfer_id,
                "remote_host": self.host, "remote_port": self.port,
                "remote_block_ids": list(self.block_ids),
                "remote_block_hashes": list(self.block_hashes),
                "block_size": self.block_size, "kv_dtype": self.kv_dtype,
                "namespace": self.namespace}

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> RemotePrefill:
        """The ``RemotePrefill`` in ``params``; ValueError naming the bad field."""
        def field(name: str, kind: type, check=lambda v: True) -> Any:
            value = params.get(name)
            if not isinstance(value, kind) or isinstance(value, bool) or not check(value):
                raise ValueError(f"kv_transfer_params.{name}: missing or invalid")
            return value

        ids = field("remote_block_ids", list, lambda v: len(v) <= MAX_BLOCKS and all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in v))
        hashes = field("remote_block_hashes", list, lambda v: len(ids) <= len(v) <= MAX_BLOCKS
                       and all(isinstance(h, str) and _HEX.fullmatch(h) for h in v))
        return cls(field("remote_engine_id", str, _ID.fullmatch),
                   field("remote_request_id", str, _ID.fullmatch),
                   field("remote_host", str, lambda v: 0 < len(v) <= 255),
                   field("remote_port", int, lambda v: 0 < v < 65536),
                   tuple(ids), tuple(hashes),
                   field("block_size", int, lambda v: v > 0),
                   field("kv_dtype", str, lambda v: 0 < len(v) <= 32),
                   field("namespace", str, _HEX.fullmatch))


@dataclass(frozen=True)
class PeerHold:
    """A router's ask that a worker hold, for another worker's pull, the whole blocks
    it caches of a prompt (``prompt_key``, ``radix.keys`` bytes) visible to ``scope``,
    at most its first ``max_blocks``; ``num_public_tokens`` is the prompt's public
    prefix as the pulling request carries it (a multiple of the block size). With
    ``wait_s``, a worker caching fewer of those blocks (it is pulling them itself)
    waits up to that long for them before it holds what it has."""

    prompt_key: bytes
    scope: str
    num_public_tokens: int
    max_blocks: int
    wait_s: float = 0.0

    def to_json(self) -> bytes:
        """The request body."""
        return orjson.dumps({"token_ids_b64": base64.b64encode(self.prompt_key).decode(),
                             "scope": self.scope, "num_public_tokens": self.num_public_tokens,
                             "max_blocks": self.max_blocks, "wait_s": self.wait_s})

    def held_key(self, block_size: int) -> bytes:
        """The part of the prompt to hold: its first ``max_blocks`` whole blocks."""
        num_blocks = min(self.max_blocks, len(self.prompt_key) // TOKEN_BYTES // block_size)
        return self.prompt_key[: num_blocks * block_size * TOKEN_BYTES]

    @classmethod
    def parse(cls, fields: Fields, vocab_size: int, block_size: int) -> PeerHold:
        """The hold in ``fields``; 400 naming the field when one is missing or out of
        bounds (token ids past ``vocab_size``, a public prefix that is not whole
        blocks of ``block_size`` or passes the prompt)."""
        prompt_key, token_ids = token_ids_b64(fields.raw("token_ids_b64"), "token_ids_b64",
                                              vocab_size)
        scope = fields.string("scope", None, MAX_SCOPE_CHARS)
        if scope is None:
            raise bad_request("scope is required", "scope")
        num_public = fields.integer("num_public_tokens", 0, lo=0, hi=len(token_ids)) or 0
        if num_public % block_size:
            raise bad_request(f"num_public_tokens must be a multiple of the block size "
                              f"{block_size}", "num_public_tokens")
        max_blocks = fields.integer("max_blocks", None, lo=1, hi=MAX_BLOCKS)
        if max_blocks is None:
            raise bad_request("max_blocks is required", "max_blocks")
        return cls(prompt_key, scope, num_public, max_blocks,
                   fields.number("wait_s", 0.0, MAX_HOLD_WAIT_S) or 0.0)
