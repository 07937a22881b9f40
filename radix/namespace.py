"""Cache namespaces: everything that changes what a KV block means.

Blocks of different namespaces are never matched against each other: each namespace
is its own tree. The canonical encoding is typed and length-prefixed (a tag byte, a
type byte, a 4-byte big-endian length, the value), so no choice of field values can
make two different namespaces encode alike; the digest is HMAC-SHA256 of that
encoding under a deployment secret. Fields added after encoding version 2 (the
engine's numerics, the key mode) are encoded only when they differ from their
default, so a namespace that leaves them at their defaults keeps the digest it had
before they existed (docs/protocol.md, Cache namespaces).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import struct
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields

from cryptography.hazmat.primitives import hashes, hmac

SECRET_ENV = "RADIX_ROUTER_SECRET"
ENCODING_VERSION = b"RRNS\x02"
# What a block's key is: "" its block_size tokens; "bigram" its block_size tokens and
# the next one (EAGLE-style engines, whose draft KV of a position needs the next token).
KEY_MODES = ("", "bigram")
_OMITTED_AT_DEFAULT = "omitted_at_default"  # field metadata: left out of encode() at its default
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CacheNamespace:
    """Identity of a KV cache: model weights, tokenizer, adapter, RoPE, KV format, the
    engine numerics that write its bytes, and what a block's key is.

    The KV format is ``kv_dtype``, ``block_size``, ``kv_layout_version`` and, for an
    FP8 cache, ``kv_scales_digest`` (the sha256 of its calibration file; empty for
    unit scales and non-FP8 caches). The numerics are ``attention_backend`` (the
    kernels that compute and store K and V) and ``engine_numerics_version`` (bumped
    whenever they change the bytes written for the same tokens); empty and 0: not
    reported. ``key_mode`` is one of ``KEY_MODES``. Two caches whose bytes for the
    same tokens may differ never have equal namespaces.
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
    attention_backend: str = field(default="", metadata={_OMITTED_AT_DEFAULT: True})
    engine_numerics_version: int = field(default=0, metadata={_OMITTED_AT_DEFAULT: True})
    key_mode: str = field(default="", metadata={_OMITTED_AT_DEFAULT: True})

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
        if self.engine_numerics_version < 0:
            raise ValueError("CacheNamespace.engine_numerics_version must not be negative, "
                             f"got {self.engine_numerics_version}")
        if self.key_mode not in KEY_MODES:
            raise ValueError(f"CacheNamespace.key_mode must be one of {KEY_MODES}, "
                             f"got {self.key_mode!r}")

    @staticmethod
    def canonical_rope(rope: Mapping[str, object]) -> str:
        """Canonical text of a RoPE config (sorted keys, no spaces) for the ``rope`` field."""
        return json.dumps(rope, sort_keys=True, separators=(",", ":"))

    def encode(self) -> bytes:
        """Typed, length-prefixed canonical bytes of every field, in declaration order,
        each under its own tag; a field added after version 2 is left out while it
        holds its default."""
        out = [ENCODING_VERSION]
        for tag, f in enumerate(fields(self)):
            value = getattr(self, f.name)
            if f.metadata.get(_OMITTED_AT_DEFAULT) and value == f.default:
                continue
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
