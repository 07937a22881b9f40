"""Sealing KV blocks for the host tier: AES-256-GCM under a key per scope.

Each scope's key is HKDF-SHA256 of the deployment secret (salt fixed per format
version, info = the scope), so one tenant's key never opens another tenant's
blocks. The associated data binds a sealed block to its namespace, scope and block
hash (each length-prefixed): a block copied under another hash, scope or namespace
fails authentication, as does any changed byte. Nonces are 96 random bits per seal.
"""

from __future__ import annotations

import os
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

_SALT = b"radix-router host KV tier v1"
NONCE_BYTES = 12
TAG_BYTES = 16


class BlockSealer:
    """Seals and opens block bytes for one namespace under a deployment ``secret``."""

    def __init__(self, secret: bytes, namespace_digest: bytes) -> None:
        if not secret:
            raise ValueError("the host tier needs a non-empty deployment secret")
        self._secret = secret
        self._namespace = namespace_digest
        self._ciphers: dict[str, AESGCM] = {}

    def seal(self, scope: str, block_hash: bytes, plaintext: bytes) -> bytes:
        """``nonce || ciphertext || tag`` of ``plaintext``."""
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._cipher(scope).encrypt(nonce, plaintext, self._aad(scope, block_hash))

    def open(self, scope: str, block_hash: bytes, sealed: bytes) -> bytes | None:
        """The plaintext, or None when ``sealed`` fails authentication."""
        nonce, body = sealed[:NONCE_BYTES], sealed[NONCE_BYTES:]
        try:
            return self._cipher(scope).decrypt(nonce, body, self._aad(scope, block_hash))
        except InvalidTag:
            return None

    def _cipher(self, scope: str) -> AESGCM:
        cipher = self._ciphers.get(scope)
        if cipher is None:
            hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=scope.encode())
            cipher = self._ciphers[scope] = AESGCM(hkdf.derive(self._secret))
        return cipher

    def _aad(self, scope: str, block_hash: bytes) -> bytes:
        return b"".join(
            struct.pack(">I", len(part)) + part
            for part in (self._namespace, scope.encode(), block_hash)
        )
