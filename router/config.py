"""Router configuration: one frozen dataclass per component.

``router.config_toml`` builds them from TOML and validates every field at start;
``configs/local.toml`` is the embedded default.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from router.index import IndexConfig

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "local.toml"
WORKER_KINDS = ("radix", "openai")
RESERVED_TENANTS = ("public", "anonymous")
WORKER_KEY_ENV_PREFIX = "RADIX_WORKER_KEY_"


@dataclass(frozen=True)
class ListenConfig:
    """Where the router listens; ``port = 0`` picks a free port."""

    host: str = "127.0.0.1"
    port: int = 0


@dataclass(frozen=True)
class MetricsConfig:
    """Where ``GET /metrics`` listens: its own address, loopback by default, never the
    client port (it names tenants and workers). ``port = 0`` picks a free port; with
    ``--processes N`` process ``i`` listens on ``port + i``."""

    host: str = "127.0.0.1"
    port: int = 0


@dataclass(frozen=True)
class AdminConfig:
    """Rules for ``POST /admin/workers``: the environment variable an added worker's
    key comes from must start with ``worker_key_env_prefix`` (so an admin request
    cannot send the deployment secret, or any other variable, to a host it names)."""

    worker_key_env_prefix: str = WORKER_KEY_ENV_PREFIX


@dataclass(frozen=True)
class PublicPrefixSpec:
    """One operator-registered public prefix: exactly one of ``text`` (tokenized like a
    completions prompt), ``messages`` (rendered with the chat template, no generation
    prompt) or ``token_ids``."""

    text: str | None = None
    messages: tuple[Mapping[str, str], ...] | None = None
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ModelConfig:
    """A served model: its tokenizer (``"demo"``, a packaged model name, a GGUF file or
    a local Hugging Face directory: ``radix.model_source``),
    KV block size, and public prefixes registered at start."""

    name: str
    tokenizer: str
    block_size: int = 16
    public_prefixes: tuple[PublicPrefixSpec, ...] = ()


@dataclass(frozen=True)
class WorkerConfig:
    """A worker: ``radix`` (our worker, exact KV events) or ``openai`` (any
    OpenAI-compatible server, approximate mode). ``url`` may be None only when
    ``launch`` says how ``radix-router up`` starts it (the URL is then learnt).
    ``api_key_env`` names the environment variable holding the worker's API key; a
    launched worker gets ``default_key_env(worker_id)`` unless the config names one,
    and ``up`` puts its generated key there."""

    worker_id: str
    model: str
    kind: str = "radix"
    url: str | None = None
    api_key_env: str | None = None
    launch: tuple[str, ...] | None = None


@dataclass(frozen=True)
class PolicyConfig:
    """Routing policy by registry name, with its weights (policy-specific)."""

    name: str = "cache_aware"
    weights: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class TenantLimits:
    """Per-tenant limits; None means unlimited. ``max_prompt_chars`` bounds a prompt's
    text before it is tokenized (default: ``max_prompt_tokens`` times the model's
    longest token, so no prompt that could fit is refused). ``max_cached_tokens`` is
    the tenant's prefix-cache quota on each worker, sent with every ``/generate``:
    a worker evicts an over-quota tenant's cached blocks before anyone else's."""

    max_prompt_tokens: int | None = None
    max_prompt_chars: int | None = None
    max_output_tokens: int | None = None
    max_concurrent_requests: int | None = None
    tokens_per_minute: int | None = None
    max_cached_tokens: int | None = None


@dataclass(frozen=True)
class TenantConfig:
    """A tenant: its id (the cache scope) and the HMAC digests of its API keys."""

    tenant_id: str
    key_digests: tuple[str, ...]
    limits: TenantLimits = TenantLimits()


@dataclass(frozen=True)
class AuthConfig:
    """API keys and tenants. Without ``allow_anonymous`` a request needs a known key;
    with it, keyless requests run as tenant ``anonymous`` under ``anonymous_limits``.
    With no ``admin_key_digest`` the admin routes refuse every request."""

    tenants: tuple[TenantConfig, ...] = ()
    allow_anonymous: bool = False
    anonymous_limits: TenantLimits = TenantLimits()
    admin_key_digest: str | None = None


@dataclass(frozen=True)
class RegistryConfig:
    """Worker polling: ``/ready`` and load (``/info`` or ``/metrics``) every
    ``poll_interval_s``; a probe slower than ``probe_timeout_s`` fails."""

    poll_interval_s: float = 1.0
    probe_timeout_s: float = 2.0


@dataclass(frozen=True)
class ProxyConfig:
    """Forwarding: at most ``max_attempts`` workers per request (retries happen only
    before the first byte reaches the client)."""

    max_attempts: int = 3
    connect_timeout_s: float = 2.0
    request_timeout_s: float = 600.0


@dataclass(frozen=True)
class SecretConfig:
    """Where the deployment secret comes from: a file, else an environment variable;
    with neither present the router uses a random dev secret and warns."""

    env: str = "RADIX_ROUTER_SECRET"
    file: str | None = None


@dataclass(frozen=True)
class LaunchConfig:
    """For ``radix-router up``: how long to wait for children, and a demo key shown in
    the start banner (leave it out of real configs)."""

    ready_timeout_s: float = 120.0
    example_api_key: str | None = None


@dataclass(frozen=True)
class RouterConfig:
    """The whole router configuration. ``redis_url`` is accepted for the multi-router
    setup; this version keeps shared state in process."""

    listen: ListenConfig
    models: Mapping[str, ModelConfig]
    workers: tuple[WorkerConfig, ...]
    policy: PolicyConfig = PolicyConfig()
    auth: AuthConfig = AuthConfig()
    registry: RegistryConfig = RegistryConfig()
    proxy: ProxyConfig = ProxyConfig()
    secret: SecretConfig = SecretConfig()
    launch: LaunchConfig = LaunchConfig()
    index: IndexConfig = IndexConfig()
    metrics: MetricsConfig = MetricsConfig()
    admin: AdminConfig = AdminConfig()
    redis_url: str | None = None


def default_key_env(worker_id: str, prefix: str = WORKER_KEY_ENV_PREFIX) -> str:
    """The key variable of a launched worker: ``prefix`` + its id in upper case, with
    every character that is not a letter or digit as ``_`` (``w-0`` -> ``..._W_0``)."""
    return prefix + re.sub(r"[^A-Z0-9]", "_", worker_id.upper())
