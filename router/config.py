"""Router configuration: one frozen dataclass per component.

``router.config_toml`` builds them from TOML and validates every field at start;
``configs/local.toml`` is the embedded default.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from router.routing.index import IndexConfig

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "local.toml"
WORKER_KINDS = ("radix", "openai")
RESERVED_TENANTS = ("public", "anonymous")
WORKER_KEY_ENV_PREFIX = "RADIX_WORKER_KEY_"


@dataclass(frozen=True)
class ListenConfig:
    """Where the router listens; ``port = 0`` picks a free port. On SIGTERM the router
    stops accepting connections and gives the requests in flight up to
    ``drain_timeout_s`` to finish before it exits."""

    host: str = "127.0.0.1"
    port: int = 0
    drain_timeout_s: float = 60.0


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
    a local Hugging Face directory: ``radix.model_source``), KV block size, public
    prefixes registered at start, and the character budget of its token cache
    (``radix.token_cache``; 0 turns it off)."""

    name: str
    tokenizer: str
    block_size: int = 16
    public_prefixes: tuple[PublicPrefixSpec, ...] = ()
    token_cache_chars: int = 4_000_000


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

    def shared_by(self, num_sharers: int) -> TenantLimits:
        """These limits with the concurrency and tokens-per-minute limits cut to one of
        ``num_sharers`` conservative shares (``local_share``); the size limits stay."""
        return replace(
            self,
            max_concurrent_requests=local_share(self.max_concurrent_requests, num_sharers),
            tokens_per_minute=local_share(self.tokens_per_minute, num_sharers),
        )


def local_share(limit: int | None, num_sharers: int) -> int | None:
    """One of ``num_sharers`` shares of ``limit``, rounded down but at least 1 (so the
    shares together never exceed the limit unless it is below ``num_sharers``);
    None (unlimited) stays None."""
    if limit is None:
        return None
    return max(1, limit // max(1, num_sharers))


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

    def shared_by(self, num_sharers: int) -> AuthConfig:
        """This config with every tenant's (and the anonymous) rate limits cut to one
        of ``num_sharers`` shares: for router processes that share no state."""
        tenants = tuple(replace(t, limits=t.limits.shared_by(num_sharers)) for t in self.tenants)
        return replace(self, tenants=tenants,
                       anonymous_limits=self.anonymous_limits.shared_by(num_sharers))


@dataclass(frozen=True)
class RegistryConfig:
    """Worker polling: ``/ready`` and load (``/info`` or ``/metrics``) every
    ``poll_interval_s``; a probe slower than ``probe_timeout_s`` fails."""

    poll_interval_s: float = 1.0
    probe_timeout_s: float = 2.0


@dataclass(frozen=True)
class ProxyConfig:
    """Forwarding: at most ``max_attempts`` workers per request, each worker once (a
    retry before the client's first byte; a resume from the delivered tokens after
    it, on radix workers). Per attempt: ``connect_timeout_s`` to connect,
    ``first_byte_timeout_s`` for the headers and again for the first event (queueing
    and prefill included),
    ``idle_timeout_s`` between two reads of a stream, ``request_timeout_s`` in all;
    a timed-out attempt is a failed one (``router.upstream.attempt``)."""

    max_attempts: int = 3
    connect_timeout_s: float = 2.0
    first_byte_timeout_s: float = 60.0
    idle_timeout_s: float = 30.0
    request_timeout_s: float = 600.0


@dataclass(frozen=True)
class SecretConfig:
    """Where the deployment secret comes from: a file, else an environment variable;
    with neither present the router uses a random dev secret and warns."""

    env: str = "RADIX_ROUTER_SECRET"
    file: str | None = None


@dataclass(frozen=True)
class LaunchConfig:
    """For ``radix-router up``: how long to wait for children, how many routers to run
    (router ``i`` on ``listen.port + i`` and ``metrics.port + i``), and a demo key
    shown in the start banner (leave it out of real configs)."""

    ready_timeout_s: float = 120.0
    num_routers: int = 1
    example_api_key: str | None = None


@dataclass(frozen=True)
class RedisConfig:
    """Shared state for several routers (``router.state.redis_state``). ``url`` None (and no
    ``launch``) keeps state in process. ``launch`` asks ``radix-router up`` to start a
    local ``redis-server`` and hand its URL to the routers.

    Every key lives under ``key_prefix:``. Each Redis call gives up after
    ``command_timeout_s`` (``connect_timeout_s`` to connect), and the router then
    runs on local state. A router renews its lease every ``heartbeat_interval_s``; a
    router silent for ``lease_ttl_s`` counts as dead and its concurrency slots stop
    counting. The registry and prefixes are re-read every ``sync_interval_s``. Caps:
    ``max_workers`` shared workers, ``max_public_prefixes`` shared prefixes,
    ``stream_maxlen`` (approximate) routing decisions; ``state_ttl_s`` is how long the
    shared registry outlives the last router."""

    url: str | None = None
    key_prefix: str = "radix"
    launch: bool = False
    command_timeout_s: float = 0.25
    connect_timeout_s: float = 0.5
    heartbeat_interval_s: float = 1.0
    lease_ttl_s: float = 5.0
    sync_interval_s: float = 0.5
    max_workers: int = 1024
    max_public_prefixes: int = 10_000
    stream_maxlen: int = 100_000
    state_ttl_s: float = 86_400.0

    @property
    def enabled(self) -> bool:
        """Whether routers share state (a URL is given or ``up`` launches a server)."""
        return self.url is not None or self.launch


@dataclass(frozen=True)
class RouterConfig:
    """The whole router configuration."""

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
    redis: RedisConfig = RedisConfig()


def default_key_env(worker_id: str, prefix: str = WORKER_KEY_ENV_PREFIX) -> str:
    """The key variable of a launched worker: ``prefix`` + its id in upper case, with
    every character that is not a letter or digit as ``_`` (``w-0`` -> ``..._W_0``)."""
    return prefix + re.sub(r"[^A-Z0-9]", "_", worker_id.upper())
