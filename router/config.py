"""Router configuration: one frozen ``radix.config_schema.Section`` per component.

Each field declares its type and bounds; constructing a section validates it, and
``router.config_toml`` reads them from TOML (the rules that need other sections:
worker models, unique ids and digests). ``configs/local.toml`` is the embedded
default.
"""

from __future__ import annotations

import functools
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

from radix.config_schema import DIGEST, ENV_NAME, NAME, FieldError, Pattern, Section, setting
from radix.kv_dtypes import KV_DTYPE_NAMES
from radix.tree import RESERVED_SCOPES
from router.worker_kinds import WORKER_KINDS, EventSource

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "local.toml"
WORKER_ROLES = ("both", "prefill", "decode")
RESERVED_TENANTS: tuple[str, ...] = RESERVED_SCOPES
WORKER_KEY_ENV_PREFIX = "RADIX_WORKER_KEY_"
VLLM_REPLAY_BATCHES = 10_000  # vLLM's KVEventsConfig.buffer_steps default
REDIS_KEY_PREFIX = Pattern(re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"),
                           "a key prefix (letters, digits, '.', '_', ':', '-')")
_REDIS_SCHEMES = ("redis", "rediss", "unix")
SHA256 = Pattern(re.compile(r"^[0-9a-f]{64}$"), "a sha256 (64 lowercase hex characters, as "
                 "a worker's /ready reports it)")
NO_SCALES = "none"
SHA256_OR_NONE = Pattern(re.compile(r"^([0-9a-f]{64}|none)$"), "a sha256 (64 lowercase hex "
                         "characters), or \"none\" (no scales file)")
RELEASE = Pattern(re.compile(r"^[0-9]+(\.[0-9]+)*$"), "a release version (0.2, 1.4.0)")
MAX_BODY_BYTES = 32 * 2**20  # any request body, before a key's own bound
MAX_POOLS = 8
MAX_POOL_WEIGHT = 1e6  # weights are relative: a million to one is any share a pool needs
DEFAULT_PROBE_PROMPTS = (
    "The capital of France is",
    "Write a Python function that returns the sum of a list of integers.",
    "List three prime numbers greater than ten:",
    "Translate to German: The weather is nice today.",
)


@dataclass(frozen=True)
class ListenConfig(Section, section="listen"):
    """Where the router listens; ``port = 0`` picks a free port. On SIGTERM the router
    stops accepting connections and gives the requests in flight up to
    ``drain_timeout_s`` to finish before it exits. Slow clients
    (``router.server.slow_clients``): a connection with no complete request head
    ``keepalive_timeout_s`` after it opened or after its last response is closed; a
    request body not complete ``body_timeout_s`` after its handler began reading it is
    a 408."""

    host: str = setting("127.0.0.1", flag="--host", help="address to listen on")
    port: int = setting(0, low=0, high=65535, flag="--port",
                        help="port to listen on (0: a free port)")
    drain_timeout_s: float = setting(60.0, above=0)
    keepalive_timeout_s: float = setting(15.0, above=0)
    body_timeout_s: float = setting(30.0, above=0)


@dataclass(frozen=True)
class MetricsConfig(Section, section="metrics"):
    """Where ``GET /metrics`` listens: its own address, loopback by default, never the
    client port (it names tenants and workers). ``port = 0`` picks a free port; with
    ``--processes N`` process ``i`` listens on ``port + i``."""

    host: str = "127.0.0.1"
    port: int = setting(0, low=0, high=65535, flag="--metrics-port",
                        help="port of GET /metrics (0: a free port)")


@dataclass(frozen=True)
class AdminConfig(Section, section="admin"):
    """Rules for workers added at run time (``POST /admin/workers``, the shared
    registry): a worker ``x`` may take its key only from ``worker_key_env_prefix``
    plus ``X`` (``router.fleet.worker_keys``), so an admin request cannot send another
    worker's key, or the deployment secret, to a host it names."""

    worker_key_env_prefix: str = setting(WORKER_KEY_ENV_PREFIX, pattern=ENV_NAME)


@dataclass(frozen=True)
class PublicPrefixSpec(Section):
    """One operator-registered public prefix: exactly one of ``text`` (tokenized like a
    completions prompt), ``messages`` (each a ``role`` and a ``content``, rendered with
    the chat template, no generation prompt) or ``token_ids`` (each in [0, 2**32))."""

    text: str | None = None
    messages: tuple[Mapping[str, str], ...] | None = None
    token_ids: tuple[int, ...] | None = setting(None, low=0, high=2**32 - 1)

    def check(self) -> None:
        """Exactly one kind of prompt; messages have exactly a role and a content."""
        if sum(bool(x) for x in (self.text, self.messages, self.token_ids)) != 1:
            raise FieldError(None, "give exactly one of text, messages, token_ids")
        for i, message in enumerate(self.messages or ()):
            if set(message) != {"role", "content"}:
                raise FieldError("messages", "must have exactly a role and a content", f"[{i}]")


@dataclass(frozen=True)
class PoolConfig(Section):
    """One pool of a model: its workers (ids of ``[[workers]]`` of that model) and its
    share of new conversations, relative to the other pools' weights."""

    workers: tuple[str, ...] = setting(pattern=NAME)
    weight: float = setting(low=0, high=MAX_POOL_WEIGHT)

    def check(self) -> None:
        """At least one worker, none twice."""
        if not self.workers:
            raise FieldError("workers", "give at least one worker id")
        if len(set(self.workers)) != len(self.workers):
            raise FieldError("workers", "each worker at most once")


@dataclass(frozen=True)
class CanaryConfig(Section):
    """The guards of a model's pools (``[models.M.canary]``) and the pool they fall
    back to. A model with pools (``[models.M.pools.P]``) sends each conversation to one
    pool, picked by weight (``router.canary.pools``); the ``baseline`` pool is where a
    tripped pool's traffic goes. The guards judge every other pool over the last
    ``window_s`` seconds (its latest ``router.canary.guards.MAX_OUTCOMES`` requests at
    most) once it has ``min_requests`` requests there: a 5xx share above
    ``max_error_rate`` or a TTFT p99 above ``max_ttft_p99_s`` (None turns a guard off)
    trips it, and so does a probe (every ``probe_interval_s``: each of ``probe_prompts``
    run greedily for ``probe_max_tokens`` tokens on one worker of each pool) in which
    more than ``probe_max_diverged`` prompts differ from the baseline's tokens."""

    baseline: str = setting("baseline", pattern=NAME)
    window_s: float = setting(60.0, above=0)
    min_requests: int = setting(20, low=1)
    max_error_rate: float | None = setting(0.05, low=0, high=1)
    max_ttft_p99_s: float | None = setting(None, above=0)
    check_interval_s: float = setting(1.0, above=0)
    probe_interval_s: float = setting(60.0, above=0)
    probe_prompts: tuple[str, ...] = DEFAULT_PROBE_PROMPTS
    probe_max_tokens: int = setting(16, low=1, high=4096)
    probe_max_diverged: int = setting(0, low=0)
    probe_timeout_s: float = setting(30.0, above=0)

    def check(self) -> None:
        """Some probe prompts, and fewer allowed divergences than prompts."""
        if not self.probe_prompts:
            raise FieldError("probe_prompts", "give at least one prompt")
        if self.probe_max_diverged >= len(self.probe_prompts):
            raise FieldError("probe_max_diverged", "must be below the number of probe_prompts "
                                                   "(else the probe can never trip)")


@dataclass(frozen=True)
class ExpectConfig(Section):
    """What every worker of a model must report (``[models.M.expect]``), checked at each
    probe (``router.fleet.expectations``): its weights digest and KV dtype (a name
    ``radix.kv_dtypes`` knows), the digest of its FP8 scales file (``NO_SCALES``: none,
    as for unit scales and caches not in FP8) and at least this engine version. A
    field left out is not checked; a worker that does not match, or cannot report a
    field (``vllm``, ``openai`` and ``sglang`` workers report none), is not ready, with
    the reason in ``GET /admin/workers``."""

    weights_digest: str | None = setting(None, pattern=SHA256)
    kv_dtype: str | None = setting(None, choices=KV_DTYPE_NAMES)
    kv_scales_digest: str | None = setting(None, pattern=SHA256_OR_NONE)
    min_engine_version: str | None = setting(None, pattern=RELEASE)


@dataclass(frozen=True)
class ModelSpec(Section):
    """A served model: its tokenizer (``"demo"``, a packaged model name, a GGUF file or
    a local Hugging Face directory: ``radix.model_source``), KV block size, public
    prefixes registered at start, the character budget of its token cache
    (``radix.token_cache``; 0 turns it off), and its canary pools with their guards
    (``PoolConfig``, ``CanaryConfig``; no pools: every worker takes any request).
    ``max_model_len`` is the model's context in tokens (its workers refuse longer
    prompts): the router reads no request body longer than such a prompt can need,
    whatever the tenant's limits (``Models.max_body_bytes``)."""

    name: str = setting(pattern=NAME)
    tokenizer: str
    block_size: int = setting(16, low=1)
    public_prefixes: tuple[PublicPrefixSpec, ...] = ()
    token_cache_chars: int = setting(4_000_000, low=0)
    pools: Mapping[str, PoolConfig] = setting(default_factory=lambda: MappingProxyType({}))
    canary: CanaryConfig = CanaryConfig()
    max_model_len: int = setting(131_072, low=1)
    expect: ExpectConfig = ExpectConfig()

    def check(self) -> None:
        """With pools: the baseline is one of them (``router.config_toml`` checks their
        names, weights and workers)."""
        if self.pools and self.canary.baseline not in self.pools:
            raise FieldError("canary", f"no pool {self.canary.baseline!r} "
                                       f"(pools: {', '.join(self.pools)})", ".baseline")


@dataclass(frozen=True)
class WorkerSpec(Section):
    """A worker: ``radix`` (our worker, exact KV events over HTTP), ``vllm`` (a vLLM
    server: exact from its ZMQ KV events when ``kv_events`` names its publisher
    endpoint, with ``kv_events_replay`` its replay endpoint; approximate without) or
    ``openai`` (any OpenAI-compatible server, approximate mode). ``url`` may be None
    only when ``launch`` says how ``radix-router up`` starts it (the URL is then
    learnt). ``api_key_env`` names the environment variable holding the worker's API
    key; a launched worker gets ``default_key_env(worker_id)`` unless the config names
    one, and ``up`` puts its generated key there. ``trust_cache_salt`` routes an
    ``openai``/``vllm`` backend whose ``cache_salt`` isolation cannot be checked (it
    reports no ``cached_tokens`` or does not answer the probe,
    ``router.fleet.salt_probe``). ``kv_events_replay_batches`` is the most batches a
    replay may bring: the server's buffer (vLLM's ``buffer_steps``, 10,000 by default);
    the replay's byte bound follows from it (docs/vllm.md). ``role`` (docs/pd.md):
    ``prefill`` workers only prefill for others, ``decode`` workers take whole requests
    and the decode legs of disaggregated ones, ``both`` either (a ``radix`` worker's
    ``--kv-transfer-config`` must say the same)."""

    worker_id: str = setting(pattern=NAME, key="id")
    model: str
    kind: str = setting("radix", choices=tuple(WORKER_KINDS))
    url: str | None = None
    api_key_env: str | None = setting(None, pattern=ENV_NAME)
    launch: tuple[str, ...] | None = None
    kv_events: str | None = None
    kv_events_replay: str | None = None
    kv_events_replay_batches: int = setting(VLLM_REPLAY_BATCHES, low=1, high=100_000)
    trust_cache_salt: bool = False
    role: str = setting("both", choices=WORKER_ROLES)

    def check(self) -> None:
        """A URL or a launch command; a URL that is ``http(s)://HOST[:PORT][/PATH]``;
        ZMQ endpoints only for ``vllm`` workers, a replay endpoint only with events."""
        if self.url is None and self.launch is None:
            raise FieldError(None, "give url, or launch for `radix-router up`")
        if self.url is not None and (problem := worker_url_problem(self.url)):
            raise FieldError("url", problem)
        for name in ("kv_events", "kv_events_replay"):
            endpoint = getattr(self, name)
            if endpoint is None:
                continue
            if WORKER_KINDS[self.kind].events is not EventSource.ZMQ_WHEN_CONFIGURED:
                kinds = " or ".join(f'"{k.name}"' for k in WORKER_KINDS.values()
                                    if k.events is EventSource.ZMQ_WHEN_CONFIGURED)
                raise FieldError(name, f"only workers of kind = {kinds} publish ZMQ KV events")
            if problem := zmq_endpoint_problem(endpoint):
                raise FieldError(name, problem)
        if self.kv_events_replay is not None and self.kv_events is None:
            raise FieldError("kv_events_replay", "give kv_events too")


@dataclass(frozen=True)
class PolicyConfig(Section, section="policy"):
    """Routing policy by registry name, with its weights (policy-specific)."""

    name: str = "cache_aware"
    weights: Mapping[str, float] = setting(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class TenantLimits(Section):
    """Per-tenant limits; None means unlimited. ``max_prompt_chars`` bounds a prompt's
    text before it is tokenized (default: ``max_prompt_tokens`` times the model's
    longest token, so no prompt that could fit is refused). ``max_cached_tokens`` is
    the tenant's prefix-cache quota on each worker, sent with every ``/generate``:
    a worker evicts an over-quota tenant's cached blocks before anyone else's."""

    max_prompt_tokens: int | None = setting(None, low=1)
    max_prompt_chars: int | None = setting(None, low=1)
    max_output_tokens: int | None = setting(None, low=1)
    max_concurrent_requests: int | None = setting(None, low=1)
    tokens_per_minute: int | None = setting(None, low=1)
    max_cached_tokens: int | None = setting(None, low=1)

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
class TenantConfig(Section):
    """A tenant: its id (the cache scope, never a reserved one), the HMAC digests of
    its API keys, and for flow control its band (None: ``flow.default_band``) and its
    weight in its band's fair share."""

    tenant_id: str = setting(pattern=NAME)
    key_digests: tuple[str, ...] = setting((), pattern=DIGEST)
    limits: TenantLimits = TenantLimits()
    band: str | None = setting(None, pattern=NAME)
    weight: float = setting(1.0, above=0)

    def check(self) -> None:
        """The id is not one of ``RESERVED_TENANTS``."""
        if self.tenant_id in RESERVED_TENANTS:
            raise FieldError("tenant_id", f"tenant ids are not {RESERVED_TENANTS}")


@dataclass(frozen=True)
class AdminKeyConfig(Section):
    """An admin key: its name (which the admin log records for every admin action
    made with it) and the HMAC digest of the key."""

    name: str = setting(pattern=NAME)
    key_digest: str = setting(pattern=DIGEST)


# The name of ``auth.admin_key_digest``, the single admin key of older configs.
LEGACY_ADMIN_KEY_NAME = "admin"


@dataclass(frozen=True)
class AuthConfig(Section, section="auth"):
    """API keys and tenants. Without ``allow_anonymous`` a request needs a known key;
    with it, keyless requests run as tenant ``anonymous`` under ``anonymous_limits``.
    The admin keys are ``admin_keys`` (named) and ``admin_key_digest`` (the key named
    ``admin``); with none the admin routes refuse every request."""

    tenants: tuple[TenantConfig, ...] = ()
    allow_anonymous: bool = False
    anonymous_limits: TenantLimits = TenantLimits()
    admin_key_digest: str | None = setting(None, pattern=DIGEST)
    admin_keys: tuple[AdminKeyConfig, ...] = ()

    def check(self) -> None:
        """Admin key names are unique (``admin`` is ``admin_key_digest``'s when set),
        and so are their digests."""
        names = [key.name for key in self.admin_keys]
        if self.admin_key_digest is not None:
            names.append(LEGACY_ADMIN_KEY_NAME)
        if len(set(names)) < len(names):
            raise FieldError("admin_keys", f"two admin keys have one name (admin_key_digest "
                             f"is the key named {LEGACY_ADMIN_KEY_NAME!r})")
        if len(self.admin_key_names()) < len(names):
            raise FieldError("admin_keys", "two admin keys have one digest")

    def admin_key_names(self) -> dict[str, str]:
        """Each admin key's digest -> its name."""
        named = {key.key_digest: key.name for key in self.admin_keys}
        if self.admin_key_digest is not None:
            named[self.admin_key_digest] = LEGACY_ADMIN_KEY_NAME
        return named

    def shared_by(self, num_sharers: int) -> AuthConfig:
        """This config with every tenant's (and the anonymous) rate limits cut to one
        of ``num_sharers`` shares: for router processes that share no state."""
        tenants = tuple(replace(t, limits=t.limits.shared_by(num_sharers)) for t in self.tenants)
        return replace(self, tenants=tenants,
                       anonymous_limits=self.anonymous_limits.shared_by(num_sharers))


@dataclass(frozen=True)
class RegistryConfig(Section, section="registry"):
    """Worker probes (``router.fleet.load_state``, docs/router.md "How load is known").
    With ``pushed_load`` on, the router asks our workers for their load on their KV
    event streams; a worker that sends it is probed (``/ready`` and ``/info``) every
    ``probe_interval_s`` for identity and liveness only, and at once when its stream
    (re)connects, ends, or says its ``/ready`` changed. Every other worker (vLLM,
    SGLang, OpenAI-compatible, ours that send no load, or all with ``pushed_load``
    off) is probed, load included (``/info`` or ``/metrics``), every
    ``poll_interval_s``, and so is any worker not ready. A probe slower than
    ``probe_timeout_s`` fails."""

    poll_interval_s: float = setting(1.0, above=0)
    probe_interval_s: float = setting(10.0, above=0)
    probe_timeout_s: float = setting(2.0, above=0)
    pushed_load: bool = setting(True)


@dataclass(frozen=True)
class KVEventsConfig(Section, section="kv_events"):
    """Following the workers' KV event streams. A stream silent for ``read_timeout_s``
    (not an event, not a heartbeat; our workers send one every 5 s when idle, so keep
    it above that) is dead: the worker is routed stale and the stream reconnected. For
    vLLM, whose stream has no heartbeat, the same deadline bounds the ZMQ connection's
    own pings. Reconnects back off from ``initial_backoff_s``, doubling up to
    ``max_backoff_s``; connecting may take ``connect_timeout_s``; no line or frame of
    our workers' streams may pass ``max_message_bytes``."""

    read_timeout_s: float = setting(15.0, above=0)
    initial_backoff_s: float = setting(0.05, above=0)
    max_backoff_s: float = setting(5.0, above=0)
    connect_timeout_s: float = setting(5.0, above=0)
    max_message_bytes: int = setting(64 << 20, low=1)


@dataclass(frozen=True)
class ProxyConfig(Section, section="proxy"):
    """Forwarding: at most ``max_attempts`` workers per request, each worker once (a
    retry before the client's first byte; a resume from the delivered tokens after
    it, on radix workers). Per attempt: ``connect_timeout_s`` to connect,
    ``first_byte_timeout_s`` for the headers and again for the first event (queueing
    and prefill included),
    ``idle_timeout_s`` between two reads of a stream, ``request_timeout_s`` in all;
    a timed-out attempt is a failed one (``router.forward.attempt``). The writes of
    one answer to its client may wait ``client_write_timeout_s`` in all: a client that
    stopped reading, or reads too slowly to take the answer in that time, ends the
    request as closed by the client (its connection dropped)."""

    max_attempts: int = setting(3, low=1)
    connect_timeout_s: float = setting(2.0, above=0)
    first_byte_timeout_s: float = setting(60.0, above=0)
    idle_timeout_s: float = setting(30.0, above=0)
    request_timeout_s: float = setting(600.0, above=0)
    client_write_timeout_s: float = setting(30.0, above=0)

    def check(self) -> None:
        """No phase timeout exceeds the total."""
        for name in ("connect_timeout_s", "first_byte_timeout_s", "idle_timeout_s"):
            if getattr(self, name) > self.request_timeout_s:
                raise FieldError(name, f"must be at most request_timeout_s "
                                       f"({self.request_timeout_s:g})")


@dataclass(frozen=True)
class SecretConfig(Section, section="secret"):
    """Where the deployment secret comes from: a file, else an environment variable;
    with neither present the router uses a random dev secret and warns."""

    env: str = "RADIX_ROUTER_SECRET"
    file: str | None = None


@dataclass(frozen=True)
class LaunchConfig(Section, section="launch"):
    """For ``radix-router up``: how long to wait for children, how many routers to run
    (router ``i`` on ``listen.port + i`` and ``metrics.port + i``), and a demo key
    shown in the start banner (leave it out of real configs).

    The restart policy (``router.up.supervisor``): a child that exits is started again
    after ``restart_backoff_initial_s``, doubled at each further crash within
    ``crash_window_s`` up to ``restart_backoff_max_s``; its ``max_crashes``-th crash
    within ``crash_window_s`` leaves it down for good."""

    ready_timeout_s: float = setting(120.0, above=0)
    num_routers: int = setting(1, low=1, key="routers")
    example_api_key: str | None = None
    restart_backoff_initial_s: float = setting(0.5, above=0)
    restart_backoff_max_s: float = setting(30.0, above=0)
    max_crashes: int = setting(5, low=1)
    crash_window_s: float = setting(60.0, above=0)

    def check(self) -> None:
        """The backoff cap is at least its start."""
        if self.restart_backoff_max_s < self.restart_backoff_initial_s:
            raise FieldError("restart_backoff_max_s",
                             "must be at least restart_backoff_initial_s")


@dataclass(frozen=True)
class RedisConfig(Section, section="redis"):
    """Shared state for several routers (``router.state.redis_state``). ``url`` None (and no
    ``launch``) keeps state in process. ``launch`` asks ``radix-router up`` to start a
    local ``redis-server`` and hand its URL to the routers.

    Every key lives under ``key_prefix:``. Each Redis call gives up after
    ``command_timeout_s`` (``connect_timeout_s`` to connect), and the router then
    runs on local state; a call waits its turn for one of ``max_connections``
    pooled connections within that bound. A router renews its lease every
    ``heartbeat_interval_s``; a router silent for ``lease_ttl_s`` counts as dead and
    its concurrency slots stop counting. The registry and prefixes are re-read every
    ``sync_interval_s``. Caps: ``max_workers`` shared workers, ``max_public_prefixes``
    shared prefixes, ``stream_maxlen`` (approximate) routing decisions of at most
    ``stream_entry_max_tokens`` tokens each (about 330 MB of Redis at the defaults);
    ``state_ttl_s`` is how long the shared registry outlives the last router.
    ``url_env``: the environment variable holding the URL instead (a password in it
    then appears in no file and no command line; ``with_url_from_env`` reads it)."""

    url: str | None = setting(None, flag="--redis-url",
                              help="the Redis holding the shared state (turns redis.launch "
                                   "off)")
    url_env: str | None = setting(None, pattern=ENV_NAME)
    key_prefix: str = setting("radix", pattern=REDIS_KEY_PREFIX)
    launch: bool = False
    command_timeout_s: float = setting(0.25, above=0)
    connect_timeout_s: float = setting(0.5, above=0)
    max_connections: int = setting(8, low=1)
    heartbeat_interval_s: float = setting(1.0, above=0)
    lease_ttl_s: float = setting(5.0, above=0)
    sync_interval_s: float = setting(0.5, above=0)
    max_workers: int = setting(1024, low=1)
    max_public_prefixes: int = setting(10_000, low=1)
    stream_maxlen: int = setting(10_000, low=1)
    stream_entry_max_tokens: int = setting(8192, low=1)
    state_ttl_s: float = setting(86_400.0, above=0)

    def check(self) -> None:
        """A valid URL or ``launch``, not both; a lease that outlives a late heartbeat."""
        if self.url is not None and self.url_env is not None:
            raise FieldError("url_env", "give url or url_env, not both")
        if self.url is not None:
            if problem := redis_url_problem(self.url):
                raise FieldError("url", problem)
            if self.launch:
                raise FieldError("launch", "give url (an existing server) or launch = true "
                                           "(`up` starts one), not both")
        if self.heartbeat_interval_s * 2 > self.lease_ttl_s:
            raise FieldError("lease_ttl_s", "must be at least twice heartbeat_interval_s "
                                            "(one late heartbeat must not end a lease)")

    @property
    def enabled(self) -> bool:
        """Whether routers share state (a URL is given or ``up`` launches a server)."""
        return self.url is not None or self.url_env is not None or self.launch

    def with_url_from_env(self, environ: Mapping[str, str]) -> RedisConfig:
        """This section with ``url`` read from ``environ[url_env]`` (itself when no
        ``url_env`` is set); ValueError naming ``redis.url_env`` when the variable is
        unset or not a Redis URL (the message never shows its value)."""
        if self.url_env is None:
            return self
        url = environ.get(self.url_env)
        if not url:
            raise ValueError(f"redis.url_env: ${self.url_env} is not set")
        if redis_url_problem(url):
            raise ValueError(f"redis.url_env: ${self.url_env} is not a Redis URL "
                             "(redis://HOST:PORT[/DB], rediss://... or unix:///PATH)")
        return replace(self, url=url, url_env=None, launch=False)


@dataclass(frozen=True)
class IndexConfig(Section, section="index"):
    """Ageing of routed prefixes. Speculative entries (every worker, at decision time)
    live ``speculative_ttl_s``; approximate ones (workers without KV events) live
    ``approximate_ttl_s``; each worker keeps at most the given tokens per namespace.
    ``host_hit_weight`` (in (0, 1]) is what a token found only in a worker's host
    tier counts for, against 1 for a token on its device; ``disk_hit_weight`` what a
    token found only on its disk tier counts for (never more than a host token).
    ``max_blocks`` bounds the exact index's distinct blocks: past it, the least
    recently used go first (docs/router-index.md)."""

    speculative_ttl_s: float = setting(2.0, above=0)
    speculative_capacity_tokens: int = setting(262_144, low=1)
    approximate_ttl_s: float = setting(300.0, above=0)
    approximate_capacity_tokens: int = setting(1_048_576, low=1)
    host_hit_weight: float = setting(0.5, above=0, high=1)
    disk_hit_weight: float = setting(0.25, above=0, high=1)
    max_blocks: int = setting(10_000_000, low=1)


DISCOVERY_KINDS = ("none", "kubernetes", "inferencepool")
LABEL_KEY = Pattern(re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]"
                               r"([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"),
                    "a Kubernetes label or annotation key ([prefix/]name)")
K8S_NAME = Pattern(re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"),
                   "a Kubernetes object name (lower-case letters, digits, '-', '.')")
K8S_KIND = Pattern(re.compile(r"^[A-Z][A-Za-z0-9]{0,62}$"),
                   "a Kubernetes kind (StatefulSet, Deployment, ...)")


@dataclass(frozen=True)
class DiscoveryConfig(Section, section="discovery"):
    """Workers found by watching Kubernetes (``router.fleet.discovery``). ``kind``:
    ``none`` (workers come from the config, the admin API and the shared registry
    only), ``kubernetes`` (pods in ``namespace`` matching every ``selector`` label) or
    ``inferencepool`` (the pods and target ports of the InferencePool ``pool`` in
    ``namespace``). A pod serves on ``port``, or on its container port named
    ``port_name``; it is a worker of kind ``worker_kind`` for ``model``, else for
    the model its ``model_label`` label or annotation names, else for the one model
    its ``/v1/models`` lists that this router serves. ``role_label`` gives a
    disaggregated fleet's pods their role (``prefill``, ``decode``; default ``both``). A vLLM
    pod's ZMQ KV event ports come from its ``kv_events_port_annotation`` and
    ``kv_events_replay_port_annotation``. Identity is checked before any key is sent
    (docs/kubernetes.md): with ``owner_kind`` and ``owner_name`` a pod's controller
    must be that workload (a Deployment's through its ReplicaSet), with
    ``service_account`` it must run as that account, and its role must be one of
    ``roles``; any other pod is refused and counted. ``api_key_env`` (any variable:
    the operator sets it) is every discovered worker's key; without it a pod ``p``
    takes the key named for its id under ``admin.worker_key_env_prefix`` when that
    variable is set.
    The watch is re-listed after every error and every ``resync_s`` (retries back off
    from ``retry_initial_s`` to ``retry_max_s``); a pod being deleted stops taking
    requests and keeps those in flight for up to ``drain_timeout_s``. ``kubeconfig``:
    a kubeconfig file; None uses the pod's service account (in cluster), else
    ``$KUBECONFIG`` or ``~/.kube/config``."""

    kind: str = setting("none", choices=DISCOVERY_KINDS, flag="--service-discovery",
                        const="kubernetes",
                        help='discover workers from pods (kind = "kubernetes"; '
                             "sglang-router's flag names)")
    namespace: str = setting("default", pattern=K8S_NAME, flag="--service-discovery-namespace",
                             metavar="NS", help="the pods' namespace")
    selector: Mapping[str, str] = setting(default_factory=lambda: MappingProxyType({}),
                                          flag="--selector", help="the pods' labels")
    pool: str | None = setting(None, pattern=K8S_NAME)
    port: int | None = setting(None, low=1, high=65535, flag="--service-discovery-port",
                               metavar="PORT",
                               help="the port the workers serve on (replaces port_name)")
    port_name: str | None = None
    worker_kind: str = setting("radix", choices=tuple(WORKER_KINDS))
    model: str | None = setting(None, pattern=NAME)
    model_label: str = setting("radix-router/model", pattern=LABEL_KEY)
    role_label: str = setting("radix-router/role", pattern=LABEL_KEY)
    kv_events_port_annotation: str = setting("radix-router/kv-events-port", pattern=LABEL_KEY)
    kv_events_replay_port_annotation: str = setting("radix-router/kv-events-replay-port",
                                                    pattern=LABEL_KEY)
    owner_kind: str | None = setting(None, pattern=K8S_KIND)
    owner_name: str | None = setting(None, pattern=K8S_NAME)
    service_account: str | None = setting(None, pattern=K8S_NAME)
    roles: tuple[str, ...] = setting(("both",), choices=WORKER_ROLES)
    api_key_env: str | None = setting(None, pattern=ENV_NAME)
    resync_s: float = setting(60.0, above=0)
    watch_timeout_s: float = setting(300.0, above=0)
    retry_initial_s: float = setting(0.5, above=0)
    retry_max_s: float = setting(30.0, above=0)
    drain_timeout_s: float = setting(30.0, low=0)
    request_timeout_s: float = setting(10.0, above=0)
    kubeconfig: str | None = None

    def check(self) -> None:
        """``kubernetes`` needs a selector and a port; ``inferencepool`` a pool (its
        selector and ports come from it); the retry cap is at least its start; an owner
        has both a kind and a name."""
        for key, value in self.selector.items():
            if not LABEL_KEY.regex.fullmatch(key) or len(value) > 63:
                raise FieldError("selector", f"{key!r} = {value!r} is not a label", f".{key}")
        if self.kind == "kubernetes":
            if not self.selector:
                raise FieldError("selector", "give the labels that select the worker pods")
            if (self.port is None) == (self.port_name is None):
                raise FieldError("port", "give port or port_name (a named container port)")
        if self.kind == "inferencepool" and self.pool is None:
            raise FieldError("pool", "give the InferencePool's name")
        if self.retry_max_s < self.retry_initial_s:
            raise FieldError("retry_max_s", "must be at least retry_initial_s")
        if (self.owner_kind is None) != (self.owner_name is None):
            raise FieldError("owner_name", "give owner_kind and owner_name together")

    @property
    def enabled(self) -> bool:
        """Whether the router discovers workers."""
        return self.kind != "none"


@dataclass(frozen=True)
class PDConfig(Section, section="pd"):
    """Prefill/decode disaggregation (docs/pd.md), for models whose workers have
    ``prefill`` or ``decode`` roles: the decode worker is chosen first; when it would
    compute fewer than ``min_uncached_tokens`` of the prompt itself, it serves the
    request whole, else a prefill worker prefills and the decode worker pulls the
    blocks it lacks. ``protocol``: the ``kv_transfer_params`` shape (vLLM's)."""

    min_uncached_tokens: int = setting(256, low=0)
    protocol: str = setting("vllm", choices=("vllm",))


@dataclass(frozen=True)
class KVSourcesConfig(Section, section="kv_sources"):
    """Where a request's missing blocks come from (docs/router-index.md, "Where the
    missing blocks come from"), in a fleet of workers that both hold blocks for
    others and pull them (``kv_both``): for the worker the policy chose, the blocks it
    lacks come from its own host or disk tier (its admission restores them), from a
    peer that holds them (pulled), or are recomputed, whichever one cost model
    predicts is fastest. A pull is planned only for at least ``min_pull_tokens``
    (the measured crossover below which a pull never beats a recompute) and only when
    predicted faster: ``pull_overhead_s`` (the hold's round trip, a connection and the
    acknowledgement) plus the peer's wait (its link's queue of pulls this router
    planned, and two of its engine steps when it is busy) plus the blocks' bytes over
    the slower link of the two. Workers that report no rates (real ones) are assumed
    to prefill at ``prefill_s_per_token`` and move KV at ``link_bytes_per_s`` and
    ``restore_bytes_per_s``; ``python -m bench crossover`` measures the crossover, the
    overhead and the first two (docs/bench.md, "Pull or recompute"; the restore rate is
    assumed).
    ``max_peers``: the peers holding the longest chains considered; ``hold_timeout_s``:
    the longest a peer's hold may take before the request is recomputed instead."""

    enabled: bool = True
    min_pull_tokens: int = setting(1024, low=1)
    pull_overhead_s: float = setting(0.012, low=0)
    prefill_s_per_token: float = setting(8.6e-4, above=0)
    link_bytes_per_s: float = setting(3.4e7, above=0)
    restore_bytes_per_s: float = setting(2.0e9, above=0)
    max_peers: int = setting(2, low=1)
    hold_timeout_s: float = setting(2.0, above=0)

    def rate_defaults(self) -> dict[str, float]:
        """The rates assumed for a worker that reports none
        (``radix.kv_sources.DEFAULT_FIELDS``)."""
        return {"prefill_s_per_token": self.prefill_s_per_token,
                "link_bytes_per_s": self.link_bytes_per_s,
                "restore_bytes_per_s": self.restore_bytes_per_s}


@dataclass(frozen=True)
class SessionsConfig(Section, section="sessions"):
    """Sessions that return (docs/router-index.md, "Sessions that return"): a request
    naming a session (``x-session-id``) goes to the worker that served the session's
    last request while that worker's active requests are below
    ``ceil(load_cap_factor * (all active + 1) / workers)``, for the request's retention
    hint (``x-session-retention-s``, at most ``max_retention_s``, passed on to the
    worker, which keeps the prompt's blocks that long) or ``ttl_s`` without one; at
    most ``max_entries`` sessions are remembered."""

    enabled: bool = True
    ttl_s: float = setting(300.0, above=0)
    max_retention_s: float = setting(600.0, above=0)
    max_entries: int = setting(65536, low=1)
    load_cap_factor: float = setting(1.5, above=0)


@dataclass(frozen=True)
class BandConfig(Section):
    """A priority band of flow control: its name (what tenants name), how long a
    request may wait in it before it is shed (429 with Retry-After), the share of
    each worker's headroom bound its requests may fill (the rest stays free for the
    bands above), and ``max_pending_prefill_tokens``: a request of the band goes to a
    worker only while the prompt tokens this router sent it that are not yet prefilled
    (uncached, no first token yet) stay below it (None: no bound), so the band's
    prefills never make the worker's steps long for the bands above."""

    name: str = setting(pattern=NAME)
    queue_ttl_s: float = setting(30.0, above=0)
    max_slot_fraction: float = setting(1.0, above=0, high=1)
    max_pending_prefill_tokens: int | None = setting(None, low=1)


DEFAULT_BANDS = (BandConfig("interactive", 10.0), BandConfig("standard", 30.0),
                 BandConfig("batch", 120.0, 0.75, max_pending_prefill_tokens=2048))


@dataclass(frozen=True)
class FlowConfig(Section, section="flow"):
    """Flow control (docs/flow-control.md): with ``enabled``, a request goes to a worker
    only when that worker has headroom, else it waits in the router, in ``bands``
    (served in order; a band whose oldest request waited ``aging_s`` moves up one
    level for each ``aging_s``), fair by weighted tokens across fairness ids within a
    band. A worker
    has headroom while this router's requests on it (or its polled running plus
    waiting, when higher) stay below ``max_requests_per_worker``, or, when that is
    None, below its batch slots (``max_num_seqs``) plus ``queue_per_worker``
    (``fallback_requests_per_worker`` for a worker that reports no slots). The
    dispatcher looks at most ``locality_window`` requests past the fair order for
    one whose best worker holds its prefix. ``fairness_header``: a request header
    whose value splits a tenant into fairness ids (agent or session ids); None: the
    tenant is the fairness id. A request's token cost is its prompt plus
    ``expected_decode_tokens`` (at most its ``max_tokens``) per choice. Past
    ``max_queued_requests`` waiting, a new request is shed at once. With Redis, every
    ``share_sync_interval_s`` a router publishes what it dispatched per fairness id
    and reads what the other routers did, so shares hold across routers."""

    enabled: bool = setting(False, flag="--flow-control",
                            help="queue requests in the router until a worker has headroom")
    bands: tuple[BandConfig, ...] = DEFAULT_BANDS
    default_band: str = setting("standard", pattern=NAME)
    aging_s: float | None = setting(10.0, above=0)
    max_requests_per_worker: int | None = setting(None, low=1)
    queue_per_worker: int = setting(0, low=0)
    fallback_requests_per_worker: int = setting(8, low=1)
    locality_window: int = setting(4, low=1)
    fairness_header: str | None = setting(None, pattern=NAME)
    expected_decode_tokens: int = setting(256, low=0)
    max_queued_requests: int = setting(10_000, low=1)
    share_sync_interval_s: float = setting(0.5, above=0)

    def check(self) -> None:
        """At least one band, names unique, the default band among them."""
        names = [band.name for band in self.bands]
        if not names:
            raise FieldError("bands", "give at least one band")
        if len(set(names)) != len(names):
            raise FieldError("bands", "band names must be unique")
        if self.default_band not in names:
            raise FieldError("default_band", f"must be one of the bands {names}")

    @functools.cached_property
    def _band_indexes(self) -> dict[str | None, int]:
        indexes: dict[str | None, int] = {band.name: i for i, band in enumerate(self.bands)}
        indexes[None] = indexes[self.default_band]
        return indexes

    def band_index(self, name: str | None) -> int:
        """The index of band ``name`` (None: the default band); ValueError if unknown.
        A dictionary lookup: it runs once per request."""
        try:
            return self._band_indexes[name]
        except KeyError:
            raise ValueError(f"unknown band {name!r}") from None

    def effective_band(self, name: str | None, priority: int) -> int:
        """The band a request of a tenant in band ``name`` runs in when it asks for
        ``priority`` (vLLM's: lower first): each unit above 0 moves it one band down, to
        the last at most; a negative one never moves it above its tenant's band."""
        return min(self.band_index(name) + max(priority, 0), len(self.bands) - 1)


@dataclass(frozen=True)
class RouterConfig(Section):
    """The whole router configuration."""

    models: Mapping[str, ModelSpec]
    workers: tuple[WorkerSpec, ...]
    listen: ListenConfig = ListenConfig()
    policy: PolicyConfig = PolicyConfig()
    auth: AuthConfig = AuthConfig()
    registry: RegistryConfig = RegistryConfig()
    kv_events: KVEventsConfig = KVEventsConfig()
    proxy: ProxyConfig = ProxyConfig()
    secret: SecretConfig = SecretConfig()
    launch: LaunchConfig = LaunchConfig()
    index: IndexConfig = IndexConfig()
    metrics: MetricsConfig = MetricsConfig()
    admin: AdminConfig = AdminConfig()
    redis: RedisConfig = RedisConfig()
    discovery: DiscoveryConfig = DiscoveryConfig()
    pd: PDConfig = PDConfig()
    flow: FlowConfig = FlowConfig()
    kv_sources: KVSourcesConfig = KVSourcesConfig()
    sessions: SessionsConfig = SessionsConfig()

    def check(self) -> None:
        """Every tenant's band is one of ``flow.bands``."""
        names = {band.name for band in self.flow.bands}
        for tenant in self.auth.tenants:
            if tenant.band is not None and tenant.band not in names:
                raise FieldError(None, f"auth.tenants.{tenant.tenant_id}.band: "
                                       f"{tenant.band!r} is not one of flow.bands "
                                       f"{sorted(names)}")


def default_key_env(worker_id: str, prefix: str = WORKER_KEY_ENV_PREFIX) -> str:
    """The key variable of a launched worker: ``prefix`` + its id in upper case, with
    every character that is not a letter or digit as ``_`` (``w-0`` -> ``..._W_0``)."""
    return prefix + re.sub(r"[^A-Z0-9]", "_", worker_id.upper())


def worker_url_problem(url: str) -> str | None:
    """What is wrong with a worker URL (None if nothing): it must be
    ``http(s)://HOST[:PORT][/PATH]`` with a port in [1, 65535] if given, no user info,
    query or fragment."""
    try:
        parsed = urllib.parse.urlsplit(url)
        port = parsed.port
    except ValueError as exc:
        return f"{url!r} is not a valid URL ({exc})"
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return f"must be http:// or https:// with a host, got {url!r}"
    if port == 0 or parsed.username is not None or parsed.query or parsed.fragment:
        return (f"give http(s)://HOST[:PORT] (port 1-65535, no user info, query or "
                f"fragment), got {url!r}")
    return None


def zmq_endpoint_problem(endpoint: str) -> str | None:
    """What is wrong with a ZMQ endpoint the router connects to (None if nothing): it
    must be ``ipc://PATH`` or ``tcp://HOST:PORT`` (the server binds ``tcp://*:PORT``)."""
    if endpoint.startswith("ipc://") and len(endpoint) > len("ipc://"):
        return None
    parsed = urllib.parse.urlsplit(endpoint)
    try:
        port = parsed.port
    except ValueError:
        port = None
    if parsed.scheme == "tcp" and parsed.hostname and parsed.hostname != "*" and port:
        return None
    return f"give ipc://PATH or tcp://HOST:PORT, got {endpoint!r}"


def redis_url_problem(url: str) -> str | None:
    """What is wrong with a Redis URL (None if nothing): it must be ``redis://``,
    ``rediss://`` (TLS) or ``unix://`` with a host (or socket path)."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in _REDIS_SCHEMES or not (parsed.netloc or parsed.path):
        return f"must be redis://HOST:PORT[/DB], rediss://... or unix:///PATH, got {url!r}"
    return None
