"""``kv_transfer_params``: how a request tells a worker to prefill for another, and how
the other finds the blocks, in vLLM's shape (its NIXL connector's fields, plus the
ones our transfer checks: block hashes, block size, dtype, namespace).

A request to a producer carries ``{"do_remote_decode": true}``: prefill, answer, and
hold the prompt's blocks for a consumer. The producer's answer carries a
``RemotePrefill`` (``to_params``: ``do_remote_prefill`` true and where the blocks
are); the same request sent to a consumer with those params makes it pull the
blocks it lacks before it decodes. docs/pd.md has the protocol.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_BLOCKS = 1 << 20
# A producer's route that ends a hold at once: POST {"remote_request_id": ID} (the
# router's, for params it abandoned; docs/pd.md).
RELEASE_PATH = "/kv_transfer/release"
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
    endpoint, the transfer id, the held blocks' ids and chained hashes (hex, in
    prompt order: the prompt's whole blocks, or fewer when fewer were cached), and
    what a consumer must match to read them (block size, KV dtype, namespace digest
    in hex)."""

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
        hashes = field("remote_block_hashes", list, lambda v: len(v) == len(ids) and all(
            isinstance(h, str) and _HEX.fullmatch(h) for h in v))
        return cls(field("remote_engine_id", str, _ID.fullmatch),
                   field("remote_request_id", str, _ID.fullmatch),
                   field("remote_host", str, lambda v: 0 < len(v) <= 255),
                   field("remote_port", int, lambda v: 0 < v < 65536),
                   tuple(ids), tuple(hashes),
                   field("block_size", int, lambda v: v > 0),
                   field("kv_dtype", str, lambda v: 0 < len(v) <= 32),
                   field("namespace", str, _HEX.fullmatch))
