"""Per-tenant limits: prompt and output size (413 / 400), concurrency and tokens per
minute (429 with ``Retry-After``), through the ``SharedState`` seam.

Admission and release are cancellation-safe: aiohttp cancels a handler whose client
went away, and that cancel may land at any await. Admission runs to its end in its
own task (a caller cancelled meanwhile gets the cancel, and what was taken is given
back at once); release runs to its end even if its caller is cancelled. So a client
that disconnects never leaves a concurrency slot or a reservation held.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, replace
from typing import Any

from radix.api_errors import ApiError
from router.front.auth import Tenant
from router.state.shared_state import SharedState

_CONCURRENCY_RETRY_AFTER_S = 1


@dataclass(frozen=True)
class Admission:
    """Proof that a request passed its tenant's limits; give it back to ``release``.
    ``hold_id`` names the one-token reservation taken before tokenizing (the window
    had room for the request's first token), ``reservation_id`` the rest: the prompt
    plus the most it may generate, ``num_reserved`` tokens with the hold's one (both
    None without a tokens-per-minute limit)."""

    tenant: Tenant
    holds_slot: bool
    hold_id: str | None = None
    reservation_id: str | None = None
    num_prompt_tokens: int = 0
    num_reserved: int = 0


class TenantLimiter:
    """Per-tenant limits: prompt and output size (413 / 400), concurrency and tokens per
    minute (429 with ``Retry-After``).

    Admission comes in two steps so that a tenant at its limits costs no tokenizing:
    ``hold`` (before tokenizing) takes the concurrency slot and one token of the
    window; ``reserve`` (once the prompt is counted) reserves the prompt plus the most
    the request may generate (``max_tokens x n``; the prompt alone when no cap is
    known). ``release`` settles the reservation to the prompt plus the completion
    tokens the client actually received, counted as they streamed, so a stream the
    client cuts pays for what it got; a request refused before ``reserve`` pays
    nothing. A request that outlives the window (its reservation expired) has the
    tokens above its reservation charged to the current window at release, so output
    with no cap is never free."""

    def __init__(self, state: SharedState) -> None:
        self._state = state
        self._background: set[asyncio.Task[Any]] = set()

    @staticmethod
    def output_cap(tenant: Tenant, max_tokens: int | None,
                   max_tokens_param: str = "max_tokens") -> int | None:
        """The output cap to use (``max_tokens``, else the tenant's limit, else None
        passes through as the worker default); 400 naming ``max_tokens_param`` (the
        field the client sent) when ``max_tokens`` is above the tenant's limit."""
        cap = tenant.limits.max_output_tokens
        if max_tokens is None:
            return cap
        if cap is not None and max_tokens > cap:
            raise ApiError(400, f"{max_tokens_param} is {max_tokens}; this key allows at most "
                           f"{cap}", param=max_tokens_param, code="max_tokens_too_large")
        return max_tokens

    @staticmethod
    def check_prompt(tenant: Tenant, num_prompt_tokens: int) -> None:
        """413 when the counted prompt is above the tenant's ``max_prompt_tokens`` or
        its ``tokens_per_minute``."""
        for limit, name in ((tenant.limits.max_prompt_tokens, "max_prompt_tokens"),
                            (tenant.limits.tokens_per_minute, "tokens_per_minute")):
            if limit is not None and num_prompt_tokens > limit:
                raise ApiError(413, f"prompt has {num_prompt_tokens} tokens; this key's "
                               f"{name} is {limit}", param="prompt", code="prompt_too_long")

    async def admit(self, tenant: Tenant, num_prompt_tokens: int,
                    max_completion_tokens: int) -> Admission:
        """``hold`` then ``reserve``, giving the hold back if the reservation is refused
        or the caller is cancelled."""
        admission = await self.hold(tenant)
        try:
            return await self.reserve(admission, num_prompt_tokens, max_completion_tokens)
        except (ApiError, asyncio.CancelledError):
            await self.release(admission, 0)
            raise

    async def hold(self, tenant: Tenant) -> Admission:
        """Take a concurrency slot and one token of the minute window, or raise 429.
        If the caller is cancelled meanwhile, the hold still completes and is given
        back at once. A tenant without concurrency or token limits holds nothing (and
        spends no task on it)."""
        limits = tenant.limits
        if limits.max_concurrent_requests is None and limits.tokens_per_minute is None:
            return Admission(tenant, False)
        task = asyncio.ensure_future(self._hold(tenant))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._release_abandoned)
            raise

    def _release_abandoned(self, task: asyncio.Task[Admission]) -> None:
        if not task.cancelled() and task.exception() is None:
            self._in_background(self._release(task.result(), 0))

    async def _hold(self, tenant: Tenant) -> Admission:
        limits = tenant.limits
        key = tenant.tenant_id
        holds_slot = limits.max_concurrent_requests is not None
        if holds_slot and not await self._state.acquire_slot(key, limits.max_concurrent_requests):
            raise ApiError(
                429, f"too many concurrent requests (limit {limits.max_concurrent_requests})",
                code="concurrency_limit",
                headers={"Retry-After": str(_CONCURRENCY_RETRY_AFTER_S)},
            )
        if limits.tokens_per_minute is None:
            return Admission(tenant, holds_slot)
        hold_id = uuid.uuid4().hex
        wait_s = await self._state.reserve_tokens(key, hold_id, 1, limits.tokens_per_minute)
        if wait_s is not None:
            if holds_slot:
                await self._state.release_slot(key)
            raise _rate_limited(limits.tokens_per_minute, wait_s)
        return Admission(tenant, holds_slot, hold_id)

    async def reserve(self, admission: Admission, num_prompt_tokens: int,
                      max_completion_tokens: int) -> Admission:
        """The admission with ``num_prompt_tokens + max_completion_tokens`` reserved in
        the minute window (the hold's token among them), or 429 (413 when it could
        never fit the limit); the caller still releases ``admission`` either way. If
        the caller is cancelled meanwhile, the reservation still completes and is
        settled to nothing at once."""
        tokens_per_minute = admission.tenant.limits.tokens_per_minute
        if admission.hold_id is None or tokens_per_minute is None:
            return admission
        num_reserved = num_prompt_tokens + max_completion_tokens
        if num_reserved > tokens_per_minute:
            raise ApiError(
                413, f"prompt and max_tokens x n need {num_reserved} tokens, more than this "
                f"key's tokens_per_minute ({tokens_per_minute})",
                param="max_tokens", code="prompt_too_long")
        key, reservation_id = admission.tenant.tenant_id, uuid.uuid4().hex
        task = asyncio.ensure_future(self._state.reserve_tokens(
            key, reservation_id, num_reserved - 1, tokens_per_minute))
        try:
            wait_s = await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(functools.partial(
                self._settle_abandoned, key, reservation_id, num_reserved - 1))
            raise
        if wait_s is not None:
            raise _rate_limited(tokens_per_minute, wait_s)
        return replace(admission, reservation_id=reservation_id,
                       num_prompt_tokens=num_prompt_tokens, num_reserved=num_reserved)

    def _settle_abandoned(self, key: str, reservation_id: str, num_reserved: int,
                          task: asyncio.Future[float | None]) -> None:
        if not task.cancelled() and task.exception() is None and task.result() is None:
            self._in_background(self._state.settle_tokens(key, reservation_id, num_reserved,
                                                          0, 0))

    async def tokens_in_window(self, tenant_id: str) -> int:
        """Tokens reserved or charged against ``tenant_id``'s minute window now."""
        return await self._state.tokens_in_window(tenant_id)

    async def release(self, admission: Admission, num_completion_tokens: int) -> None:
        """End the request: free its slot and settle its reservation to the prompt plus
        ``num_completion_tokens`` (what the client received). Runs to its end even if
        the caller is cancelled meanwhile."""
        if not admission.holds_slot and admission.hold_id is None:
            return  # it held nothing (``_release`` would do nothing)
        await asyncio.shield(self._in_background(self._release(admission,
                                                               num_completion_tokens)))

    def _in_background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """``work`` as a task this limiter holds until it ends (so it is not collected)."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _release(self, admission: Admission, num_completion_tokens: int) -> None:
        key = admission.tenant.tenant_id
        if admission.holds_slot:
            await self._state.release_slot(key)
        if admission.reservation_id is not None:  # the hold keeps the prompt's first token
            await self._state.settle_tokens(
                key, admission.reservation_id, admission.num_reserved - 1,
                max(admission.num_prompt_tokens - 1, 0), num_completion_tokens)
        elif admission.hold_id is not None:
            await self._state.settle_tokens(key, admission.hold_id, 1, 0, 0)


def _rate_limited(tokens_per_minute: int, wait_s: float) -> ApiError:
    return ApiError(429, f"tokens per minute limit ({tokens_per_minute}) reached",
                    code="rate_limit_exceeded",
                    headers={"Retry-After": str(max(1, int(wait_s + 0.999)))})
