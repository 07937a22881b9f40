"""API keys, tenants and per-tenant limits.

Keys are never stored: the config holds ``hash_key(key)``, an HMAC-SHA256 digest under
a fixed domain key, and a request's key is looked up by its digest. The tenant a
request runs as (and so its cache scope) comes only from that lookup, never from a
client field. ``TenantLimiter`` enforces the limits through the ``SharedState`` seam.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from radix.api_errors import ApiError
from radix.tree import ANONYMOUS
from router.config import AuthConfig, TenantLimits
from router.state.shared_state import SharedState

_KEY_DOMAIN = b"radix-router/api-key/v1"
_CONCURRENCY_RETRY_AFTER_S = 1


def hash_key(key: str) -> str:
    """The digest of an API key as written in the config (64 lowercase hex chars)."""
    return hmac.new(_KEY_DOMAIN, key.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Tenant:
    """An authenticated caller: ``tenant_id`` is its cache scope."""

    tenant_id: str
    limits: TenantLimits


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
    not its HMAC, so lookup time reveals nothing about stored digests. The admin key,
    a single secret, is compared with ``hmac.compare_digest``.
    """

    def __init__(self, config: AuthConfig) -> None:
        self._tenants: Mapping[str, Tenant] = {
            digest: Tenant(t.tenant_id, t.limits) for t in config.tenants for digest in t.key_digests
        }
        self._anonymous = (
            Tenant(ANONYMOUS, config.anonymous_limits) if config.allow_anonymous else None
        )
        self._admin_digest = config.admin_key_digest

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

    def check_admin(self, authorization: str | None) -> None:
        """Return if the header carries the admin key; ApiError 401 otherwise (403 when
        the config sets no admin key at all)."""
        if self._admin_digest is None:
            raise ApiError(403, "admin routes are disabled: no auth.admin_key_digest configured")
        key = _bearer(authorization)
        if key is None or not hmac.compare_digest(hash_key(key), self._admin_digest):
            raise ApiError(401, "admin key required", code="invalid_api_key")


@dataclass(frozen=True)
class Admission:
    """Proof that a request passed its tenant's limits; give it back to ``release``.
    ``reservation_id`` names its tokens-per-minute reservation (None without a limit)
    of ``num_prompt_tokens`` plus the most it may generate."""

    tenant: Tenant
    holds_slot: bool
    reservation_id: str | None = None
    num_prompt_tokens: int = 0


class TenantLimiter:
    """Per-tenant limits: prompt and output size (413 / 400), concurrency and tokens per
    minute (429 with ``Retry-After``).

    Tokens per minute cannot be dodged: admission reserves the prompt plus the most
    the request may generate (``max_tokens x n``; the prompt alone when no cap is
    known), and ``release`` settles the reservation to the prompt plus the completion
    tokens the client actually received, counted as they streamed, so a stream the
    client cuts pays for what it got."""

    def __init__(self, state: SharedState) -> None:
        self._state = state

    def check_sizes(self, tenant: Tenant, num_prompt_tokens: int, max_tokens: int | None,
                    max_tokens_param: str = "max_tokens") -> int | None:
        """Check the prompt and the requested output against the tenant's limits and
        return the output cap to use (``max_tokens``, else the tenant's limit, else
        None passes through as the worker default). A refusal of ``max_tokens`` names
        ``max_tokens_param``, the field the client sent it in."""
        limits = tenant.limits
        if limits.max_prompt_tokens is not None and num_prompt_tokens > limits.max_prompt_tokens:
            raise ApiError(
                413,
                f"prompt has {num_prompt_tokens} tokens; this key allows at most "
                f"{limits.max_prompt_tokens}",
                param="prompt", code="prompt_too_long",
            )
        if limits.tokens_per_minute is not None and num_prompt_tokens > limits.tokens_per_minute:
            raise ApiError(
                413,
                f"prompt has {num_prompt_tokens} tokens, more than this key's "
                f"tokens_per_minute ({limits.tokens_per_minute})",
                param="prompt", code="prompt_too_long",
            )
        cap = limits.max_output_tokens
        if max_tokens is None:
            return cap
        if cap is not None and max_tokens > cap:
            raise ApiError(400, f"{max_tokens_param} is {max_tokens}; this key allows at most "
                           f"{cap}", param=max_tokens_param, code="max_tokens_too_large")
        return max_tokens

    async def admit(self, tenant: Tenant, num_prompt_tokens: int,
                    max_completion_tokens: int) -> Admission:
        """Take a concurrency slot and reserve ``num_prompt_tokens +
        max_completion_tokens`` in the minute window, or raise 429 (413 when the
        reservation could never fit the limit)."""
        limits = tenant.limits
        key = tenant.tenant_id
        tokens_per_minute = limits.tokens_per_minute
        num_reserved = num_prompt_tokens + max_completion_tokens
        if tokens_per_minute is not None and num_reserved > tokens_per_minute:
            raise ApiError(
                413, f"prompt and max_tokens x n need {num_reserved} tokens, more than this "
                f"key's tokens_per_minute ({tokens_per_minute})",
                param="max_tokens", code="prompt_too_long")
        holds_slot = limits.max_concurrent_requests is not None
        if holds_slot and not await self._state.acquire_slot(key, limits.max_concurrent_requests):
            raise ApiError(
                429, f"too many concurrent requests (limit {limits.max_concurrent_requests})",
                code="concurrency_limit",
                headers={"Retry-After": str(_CONCURRENCY_RETRY_AFTER_S)},
            )
        if tokens_per_minute is None:
            return Admission(tenant, holds_slot)
        reservation_id = uuid.uuid4().hex
        wait_s = await self._state.reserve_tokens(key, reservation_id, num_reserved,
                                                  tokens_per_minute)
        if wait_s is not None:
            if holds_slot:
                await self._state.release_slot(key)
            raise ApiError(
                429, f"tokens per minute limit ({tokens_per_minute}) reached",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(max(1, int(wait_s + 0.999)))},
            )
        return Admission(tenant, holds_slot, reservation_id, num_prompt_tokens)

    async def tokens_in_window(self, tenant_id: str) -> int:
        """Tokens reserved or charged against ``tenant_id``'s minute window now."""
        return await self._state.tokens_in_window(tenant_id)

    async def release(self, admission: Admission, num_completion_tokens: int) -> None:
        """End the request: free its slot and settle its reservation to the prompt plus
        ``num_completion_tokens`` (what the client received)."""
        key = admission.tenant.tenant_id
        if admission.holds_slot:
            await self._state.release_slot(key)
        if admission.reservation_id is not None:
            await self._state.settle_tokens(key, admission.reservation_id,
                                            admission.num_prompt_tokens + num_completion_tokens)
