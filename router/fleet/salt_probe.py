"""Does an OpenAI-compatible backend keep two ``cache_salt`` values apart?

The router keeps tenants apart on ``openai`` and ``vllm`` backends only through the
per-tenant ``cache_salt`` it sends: an engine that ignores the field (SGLang did until
April 2026) shares its prefix cache between tenants, and cache timing then leaks one
tenant's prompts to another. Before such a worker is routed to, the router sends one
prompt twice under a fresh salt and once under another fresh salt, one token of output
each: the repeat should hit the cache and the other salt must not. A hit seen across
salts refuses the backend. One that reports 0 on the repeat caches nothing and has
nothing to share. One whose isolation cannot be checked, because it reports no
``cached_tokens`` (vLLM without ``--enable-prompt-tokens-details``) or does not
answer the probe (``SaltProbeFailed``: it refused it, failed or timed out), is not
routed either, unless its worker entry says ``trust_cache_salt = true``.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Mapping, Sequence

import aiohttp

from router.fleet.probes import MAX_PROBE_BYTES, read_at_most

PROBE_TOKENS = 320  # more than two KV blocks of 128 tokens
log = logging.getLogger(__name__)


class SaltProbeFailed(Exception):
    """The backend did not answer the probe as an OpenAI server does."""


async def salt_isolation_problem(session: aiohttp.ClientSession, url: str,
                                 headers: Mapping[str, str], served_model: str,
                                 token_ids: Sequence[int], timeout_s: float,
                                 trust_unchecked: bool = False) -> str | None:
    """None when the backend keeps salts apart, caches nothing, or cannot be checked
    and ``trust_unchecked``; else why it may not be routed to tenants. Raises
    ``SaltProbeFailed`` when a probe request fails and not ``trust_unchecked``."""
    salt, other = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    try:
        await _cached_tokens(session, url, headers, served_model, token_ids, salt, timeout_s)
        repeat = await _cached_tokens(session, url, headers, served_model, token_ids, salt,
                                      timeout_s)
        if repeat is None and trust_unchecked:
            log.info("%s: reports no cached_tokens; cache_salt trusted unchecked", url)
            return None
        if repeat is None:
            return ("reports no cached_tokens, so its cache_salt isolation cannot be "
                    "checked (vLLM: --enable-prompt-tokens-details; or set "
                    "trust_cache_salt = true on the worker)")
        if not repeat:
            return None
        crossed = await _cached_tokens(session, url, headers, served_model, token_ids, other,
                                       timeout_s)
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError,
            AttributeError) as exc:
        failure = f"cache_salt probe failed: {type(exc).__name__}: {exc}"
        if trust_unchecked:
            log.info("%s: %s; cache_salt trusted unchecked", url, failure)
            return None
        raise SaltProbeFailed(failure) from exc
    if crossed:
        return (f"ignores cache_salt: a prompt cached under one salt hit {crossed} tokens "
                "under another, so tenants would share its prefix cache")
    return None


async def _cached_tokens(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str],
                         model: str, token_ids: Sequence[int], salt: str,
                         timeout_s: float) -> int | None:
    body = {"model": model, "prompt": list(token_ids), "max_tokens": 1, "temperature": 0,
            "cache_salt": salt}
    async with session.post(f"{url}/v1/completions", json=body, headers=headers,
                            timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        if resp.status != 200:
            raise ValueError(f"HTTP {resp.status}")
        raw = await read_at_most(resp, MAX_PROBE_BYTES)
        if raw is None:
            raise ValueError(f"an answer over {MAX_PROBE_BYTES} bytes")
        usage = json.loads(raw)["usage"]
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    return cached if isinstance(cached, int) else None
