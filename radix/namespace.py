"""Cache namespaces: everything that changes what a KV block means.

Blocks of different namespaces are never matched against each other: each namespace
is its own tree. The canonical encoding is typed and length-prefixed (a tag byte, a
type byte, a 4-byte big-endian length, the value), so no choice of field values can
make two different namespaces encode alike; the digest is HMAC-SHA256 of that
encoding under a deployment secret.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import struct
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

from cryptography.hazmat.primitives import hashes, hmac

SECRET_ENV = "RADIX_ROUTER_SECRET"
ENCODING_VERSION = b"RRNS\x02"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CacheNamespace:
    """Identity of a KV cache: model weights, tokenizer, adapter, RoPE and KV format.

    The KV format is ``kv_dtype``, ``block_size``, ``kv_layout_version`` and, for an
    FP8 cache, ``kv_scales_digest`` (the sha256 of its calibration file; empty for
    unit scales and non-FP8 caches).
    """

    model_id: str
    weights_digest: str
    tokenizer_digest: str
    adapter_name: str = ""
    adapter_digest: str = ""
    rope: str = "{}"
    kv_dtype: str = "float32"
    block_size: int = 16
    kv_layout_version: int = 1
    kv_scales_digest: str = ""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            expected = int if f.type in ("int", int) else str
            if type(value) is not expected:
                raise ValueError(f"CacheNamespace.{f.name} must be {expected.__name__}, got {value!r}")
        if self.block_size <= 0:
            raise ValueError(f"CacheNamespace.block_size must be positive, got {self.block_size}")
        if bool(self.adapter_name) != bool(self.adapter_digest):
            raise ValueError("CacheNamespace.adapter_name and adapter_digest go together")

    @staticmethod
    def canonical_rope(rope: Mapping[str, object]) -> str:
        """Canonical text of a RoPE config (sorted keys, no spaces) for the ``rope`` field."""
        return json.dumps(rope, sort_keys=True, separators=(",", ":"))

    def encode(self) -> bytes:
        """Typed, length-prefixed canonical bytes of every field, in declaration order."""
        out = [ENCODING_VERSION]
        for tag, f in enumerate(fields(self)):
            value = getattr(self, f.name)
            if isinstance(value, int):
                raw, kind = str(value).encode(), b"i"
            else:
                raw, kind = value.encode(), b"s"
            out.append(struct.pack(">Bc", tag, kind) + struct.pack(">I", len(raw)) + raw)
        return b"".join(out)

    def digest(self, secret: bytes) -> bytes:
        """HMAC-SHA256 of ``encode()`` under the deployment ``secret``."""
        mac = hmac.HMAC(secret, hashes.SHA256())
        mac.update(self.encode())
        return mac.finalize()

    def fingerprint(self, secret: bytes) -> str:
        """Hex digest, as reported by workers and used in KV events."""
        return self.digest(secret).hex()

    def to_dict(self) -> dict[str, object]:
        """Plain fields, for JSON."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> CacheNamespace:
        """Inverse of ``to_dict``; unknown or missing fields raise ValueError."""
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown CacheNamespace fields: {sorted(unknown)}")
        try:
            return cls(**data)  # type: ignore[arg-type]
        except TypeError as exc:
            raise ValueError(f"bad CacheNamespace: {exc}") from exc


def load_secret(configured: str | None = None) -> bytes:
    """The deployment secret: ``configured``, else $RADIX_ROUTER_SECRET, else a fresh
    random dev secret (with a warning: digests then differ between processes)."""
    value = configured or os.environ.get(SECRET_ENV)
    if value:
        return value.encode()
    log.warning("no deployment secret configured (%s): using a random dev secret", SECRET_ENV)
    return secrets.token_bytes(32)
