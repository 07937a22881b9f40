"""API keys, tenants and per-tenant limits.

Keys are never stored: the config holds ``hash_key(key)``, an HMAC-SHA256 digest under
a fixed domain key, and a request's key is looked up by its digest. The tenant a
request runs as (and so its cache scope) comes only from that lookup, never from a
client field. ``router.front.limits`` enforces a tenant's limits.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from radix.api_errors import ApiError
from radix.tree import ANONYMOUS
from router.config import AuthConfig, TenantLimits

_KEY_DOMAIN = b"radix-router/api-key/v1"


def hash_key(key: str) -> str:
    """The digest of an API key as written in the config (64 lowercase hex chars)."""
    return hmac.new(_KEY_DOMAIN, key.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Tenant:
    """An authenticated caller: ``tenant_id`` is its cache scope; ``band`` (None: the
    default band) and ``weight`` place it in flow control."""

    tenant_id: str
    limits: TenantLimits
    band: str | None = None
    weight: float = 1.0


def _bearer(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header, None when absent;
    ApiError 401 when the header is malformed."""
    if authorization is None:
        return None
    scheme, _, key = authorization.strip().partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise ApiError(401, "Authorization must be 'Bearer <api key>'", code="invalid_api_key")
    return key


class Authenticator:
    """Maps an ``Authorization`` header to a Tenant.

    A digest-keyed dict is safe against timing attacks: the caller controls the key,
    not its HMAC, so lookup time reveals nothing about stored digests. An admin key is
    compared with every admin digest by ``hmac.compare_digest``, each of them always.
    """

    def __init__(self, config: AuthConfig) -> None:
        self._tenants: Mapping[str, Tenant] = {
            digest: Tenant(t.tenant_id, t.limits, t.band, t.weight)
            for t in config.tenants for digest in t.key_digests
        }
        self._anonymous = (
            Tenant(ANONYMOUS, config.anonymous_limits) if config.allow_anonymous else None
        )
        self._admin_names = config.admin_key_names()

    def tenant(self, authorization: str | None) -> Tenant:
        """The tenant of the request; ApiError 401 for a missing (unless anonymous
        access is allowed), malformed or unknown key. A wrong key is never downgraded
        to anonymous."""
        key = _bearer(authorization)
        if key is None:
            if self._anonymous is None:
                raise ApiError(401, "missing API key (Authorization: Bearer <key>)",
                               code="invalid_api_key")
            return self._anonymous
        tenant = self._tenants.get(hash_key(key))
        if tenant is None:
            raise ApiError(401, "invalid API key", code="invalid_api_key")
        return tenant

    def tenant_ids(self) -> set[str]:
        """Every tenant id a request can run as (the anonymous one when allowed)."""
        ids = {tenant.tenant_id for tenant in self._tenants.values()}
        if self._anonymous is not None:
            ids.add(self._anonymous.tenant_id)
        return ids

    def check_admin(self, authorization: str | None) -> str:
        """The name of the admin key the header carries; ApiError 401 when it carries
        none (403 when the config sets no admin key at all)."""
        if not self._admin_names:
            raise ApiError(403, "admin routes are disabled: no admin key configured "
                                "(auth.admin_keys or auth.admin_key_digest)")
        key = _bearer(authorization)
        digest = "" if key is None else hash_key(key)
        name = None
        for admin_digest, admin_name in self._admin_names.items():
            if hmac.compare_digest(digest, admin_digest):
                name = admin_name
        if name is None:
            raise ApiError(401, "admin key required", code="invalid_api_key")
        return name
