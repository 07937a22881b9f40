"""The per-tenant ``cache_salt`` sent to OpenAI-compatible backends.

vLLM and SGLang mix ``cache_salt`` into the hash of a request's first KV block, so
requests with different salts never share prefix-cache blocks. The router sends
every tenant's requests with a salt of its own: an HMAC-SHA256 of the tenant id
under a key derived from the deployment secret. The tenant id is not recoverable
from it, a tenant cannot choose another tenant's salt (the field is refused from
clients), and routers sharing the secret derive the same salt.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

_SALT_DOMAIN = b"radix-router/cache-salt/v1"


class CacheSalts:
    """Tenant id -> its salt (43 URL-safe base64 characters, 256 bits). Salts are
    remembered per tenant: tenants are configured, so the memo is bounded."""

    def __init__(self, secret: bytes) -> None:
        self._key = hmac.new(secret, _SALT_DOMAIN, hashlib.sha256).digest()
        self._salts: dict[str, str] = {}

    def salt(self, tenant_id: str) -> str:
        """The salt of ``tenant_id``."""
        salt = self._salts.get(tenant_id)
        if salt is None:
            digest = hmac.new(self._key, tenant_id.encode(), hashlib.sha256).digest()
            salt = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
            self._salts[tenant_id] = salt
        return salt
