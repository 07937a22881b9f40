"""Reading the router configuration from TOML.

Every error is a ``ValueError`` whose message starts with the dotted path of the bad
field (``workers[1].kind: ...``). Unknown keys are errors too, so a typo never falls
back silently to a default.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

import tomllib

from router.config import (
    DEFAULT_CONFIG,
    RESERVED_TENANTS,
    WORKER_KEY_ENV_PREFIX,
    WORKER_KINDS,
    AdminConfig,
    AuthConfig,
    LaunchConfig,
    ListenConfig,
    MetricsConfig,
    ModelConfig,
    PolicyConfig,
    ProxyConfig,
    PublicPrefixSpec,
    RedisConfig,
    RegistryConfig,
    RouterConfig,
    SecretConfig,
    TenantConfig,
    TenantLimits,
    WorkerConfig,
    default_key_env,
)
from router.routing.index import IndexConfig
from router.tables import Table

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def load_config(path: str | Path = DEFAULT_CONFIG) -> RouterConfig:
    """Read and validate a TOML file; ValueError names the file and the bad field."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read config: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: invalid TOML: {exc}") from exc
    return parse_config(data)


def parse_config(data: Mapping[str, Any]) -> RouterConfig:
    """Validate a decoded TOML document into a RouterConfig."""
    root = Table(data, "")
    models = _models(root.table("models"))
    admin = _admin(root.table("admin"))
    workers = _workers(root.array("workers"), models, admin.worker_key_env_prefix)
    config = RouterConfig(
        listen=_listen(root.table("listen")),
        models=MappingProxyType(models),
        workers=workers,
        policy=_policy(root.table("policy")),
        auth=_auth(root.table("auth")),
        registry=_registry(root.table("registry")),
        proxy=_proxy(root.table("proxy")),
        secret=_secret(root.table("secret")),
        launch=_launch(root.table("launch")),
        index=_index(root.table("index")),
        metrics=_metrics(root.table("metrics")),
        admin=admin,
        redis=_redis(root.table("redis")),
    )
    root.finish()
    return config


def _address(t: Table) -> tuple[str, int]:
    host, port = t.text("host", "127.0.0.1"), t.integer("port", 0, low=0)
    if port > 65535:
        raise ValueError(f"{t.where('port')}: must be at most 65535")
    t.finish()
    return host, port


def _listen(t: Table) -> ListenConfig:
    drain = t.floats(("drain_timeout_s",))
    return ListenConfig(*_address(t), **drain)


def _metrics(t: Table) -> MetricsConfig:
    return MetricsConfig(*_address(t))


def _admin(t: Table) -> AdminConfig:
    prefix = t.text("worker_key_env_prefix", WORKER_KEY_ENV_PREFIX)
    if not _ENV_NAME.match(prefix):
        raise ValueError(f"{t.where('worker_key_env_prefix')}: use letters, digits and '_'")
    t.finish()
    return AdminConfig(prefix)


def check_worker_url(url: str, where: str) -> None:
    """ValueError naming ``where`` unless ``url`` is ``http(s)://HOST[:PORT][/PATH]``:
    a host, a port in [1, 65535] if given, no user info, query or fragment."""
    try:
        parsed = urllib.parse.urlsplit(url)
        port = parsed.port
    except ValueError as exc:
        raise ValueError(f"{where}: {url!r} is not a valid URL ({exc})") from exc
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"{where}: must be http:// or https:// with a host, got {url!r}")
    if port == 0 or parsed.username is not None or parsed.query or parsed.fragment:
        raise ValueError(f"{where}: give http(s)://HOST[:PORT] (port 1-65535, no user "
                         f"info, query or fragment), got {url!r}")


def _models(t: Table) -> dict[str, ModelConfig]:
    models = {}
    for name in t.names():
        m = t.table(name)
        if not _NAME.match(name):
            raise ValueError(f"{m.path}: model names use letters, digits, '.', '_', '-'")
        models[name] = ModelConfig(
            name=name,
            tokenizer=m.text("tokenizer"),
            block_size=m.integer("block_size", 16, low=1),
            public_prefixes=tuple(_prefix(p) for p in m.array("public_prefixes")),
            token_cache_chars=m.integer("token_cache_chars", 4_000_000, low=0),
        )
        m.finish()
    t.finish()
    if not models:
        raise ValueError("models: at least one model is required")
    return models


def parse_public_prefix(data: Mapping[str, Any], path: str) -> PublicPrefixSpec:
    """Validate one public prefix table (config or ``POST /admin/public-prefixes``)."""
    return _prefix(Table(data, path))


def _prefix(t: Table) -> PublicPrefixSpec:
    spec = PublicPrefixSpec(
        text=t.text("text", None),
        messages=tuple(_message(m) for m in t.array("messages")) or None,
        token_ids=t.token_ids("token_ids"),
    )
    given = [x for x in (spec.text, spec.messages, spec.token_ids) if x is not None]
    if len(given) != 1:
        raise ValueError(f"{t.path}: give exactly one of text, messages, token_ids")
    t.finish()
    return spec


def _message(t: Table) -> Mapping[str, str]:
    message = MappingProxyType({"role": t.text("role"), "content": t.text("content")})
    t.finish()
    return message


def _workers(tables: list[Table], models: Mapping[str, ModelConfig],
             key_env_prefix: str) -> tuple[WorkerConfig, ...]:
    workers = tuple(_worker(t, models, key_env_prefix) for t in tables)
    ids = [w.worker_id for w in workers]
    if len(set(ids)) != len(ids):
        raise ValueError("workers: ids must be unique")
    return workers


def parse_worker(data: Mapping[str, Any], models: Mapping[str, Any], path: str,
                 key_env_prefix: str = WORKER_KEY_ENV_PREFIX) -> WorkerConfig:
    """Validate one worker table (config ``[[workers]]`` or ``POST /admin/workers``);
    a launched worker without ``api_key_env`` gets ``default_key_env``."""
    return _worker(Table(data, path), models, key_env_prefix)


def _worker(t: Table, models: Mapping[str, Any], key_env_prefix: str) -> WorkerConfig:
    worker_id, launch = t.text("id"), t.strings("launch")
    api_key_env = t.text("api_key_env", None)
    if api_key_env is None and launch is not None:
        api_key_env = default_key_env(worker_id, key_env_prefix)
    worker = WorkerConfig(
        worker_id=worker_id,
        model=t.text("model"),
        kind=t.text("kind", "radix"),
        url=t.text("url", None),
        api_key_env=api_key_env,
        launch=launch,
    )
    if not _NAME.match(worker.worker_id):
        raise ValueError(f"{t.where('id')}: use letters, digits, '.', '_', '-'")
    if worker.model not in models:
        raise ValueError(f"{t.where('model')}: unknown model {worker.model!r}")
    if worker.kind not in WORKER_KINDS:
        raise ValueError(f"{t.where('kind')}: must be one of {WORKER_KINDS}")
    if worker.url is None and worker.launch is None:
        raise ValueError(f"{t.path}: give url, or launch for `radix-router up`")
    if worker.url is not None:
        check_worker_url(worker.url, t.where("url"))
    if worker.api_key_env is not None and not _ENV_NAME.match(worker.api_key_env):
        raise ValueError(f"{t.where('api_key_env')}: an environment variable name "
                         "(letters, digits, '_')")
    t.finish()
    return worker


def _policy(t: Table) -> PolicyConfig:
    weights_table = t.table("weights")
    weights = {k: weights_table.number(k) for k in weights_table.names()}
    weights_table.finish()
    policy = PolicyConfig(name=t.text("name", "cache_aware"), weights=MappingProxyType(weights))
    t.finish()
    return policy


def _limits(t: Table) -> TenantLimits:
    return TenantLimits(
        **{
            name: t.integer(name, None, low=1)
            for name in (
                "max_prompt_tokens",
                "max_prompt_chars",
                "max_output_tokens",
                "max_concurrent_requests",
                "tokens_per_minute",
                "max_cached_tokens",
            )
        }
    )


def _auth(t: Table) -> AuthConfig:
    tenants_table = t.table("tenants")
    tenants = []
    seen_digests: set[str] = set()
    for tenant_id in tenants_table.names():
        tt = tenants_table.table(tenant_id)
        if not _NAME.match(tenant_id) or tenant_id in RESERVED_TENANTS:
            raise ValueError(f"{tt.path}: tenant ids use letters, digits, '.', '_', '-' "
                             f"and are not {RESERVED_TENANTS}")
        digests = tt.strings("key_digests") or ()
        for digest in digests:
            _check_digest(digest, tt.where("key_digests"))
            if digest in seen_digests:
                raise ValueError(f"{tt.where('key_digests')}: digest used by two tenants")
            seen_digests.add(digest)
        tenants.append(TenantConfig(tenant_id, digests, _limits(tt)))
        tt.finish()
    tenants_table.finish()
    anonymous = t.table("anonymous_limits")
    auth = AuthConfig(
        tenants=tuple(tenants),
        allow_anonymous=t.boolean("allow_anonymous", False),
        anonymous_limits=_limits(anonymous),
        admin_key_digest=t.text("admin_key_digest", None),
    )
    anonymous.finish()
    if auth.admin_key_digest is not None:
        _check_digest(auth.admin_key_digest, t.where("admin_key_digest"))
    t.finish()
    return auth


def _check_digest(digest: str, where: str) -> None:
    if not _DIGEST.match(digest):
        raise ValueError(f"{where}: {digest!r} is not a key digest "
                         "(64 lowercase hex characters from `python -m router hash-key`)")


def _registry(t: Table) -> RegistryConfig:
    registry = RegistryConfig(**t.floats(("poll_interval_s", "probe_timeout_s")))
    t.finish()
    return registry


def _proxy(t: Table) -> ProxyConfig:
    proxy = ProxyConfig(
        max_attempts=t.integer("max_attempts", 3, low=1),
        **t.floats(("connect_timeout_s", "first_byte_timeout_s", "idle_timeout_s",
                    "request_timeout_s")),
    )
    for name in ("connect_timeout_s", "first_byte_timeout_s", "idle_timeout_s"):
        if getattr(proxy, name) > proxy.request_timeout_s:
            raise ValueError(f"{t.where(name)}: must be at most request_timeout_s "
                             f"({proxy.request_timeout_s:g})")
    t.finish()
    return proxy


def _secret(t: Table) -> SecretConfig:
    secret = SecretConfig(env=t.text("env", "RADIX_ROUTER_SECRET"), file=t.text("file", None))
    t.finish()
    return secret


def _index(t: Table) -> IndexConfig:
    values: dict[str, Any] = {}
    for f in fields(IndexConfig):
        if isinstance(f.default, int):
            value = t.integer(f.name, None, low=1)
            if value is not None:
                values[f.name] = value
        else:
            values.update(t.floats((f.name,)))
    t.finish()
    return IndexConfig(**values)


def _launch(t: Table) -> LaunchConfig:
    launch = LaunchConfig(
        **t.floats(("ready_timeout_s",)), num_routers=t.integer("routers", 1, low=1),
        example_api_key=t.text("example_api_key", None),
    )
    t.finish()
    return launch


_REDIS_SCHEMES = ("redis", "rediss", "unix")
_KEY_PREFIX = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")


def check_redis_url(url: str, where: str) -> None:
    """ValueError naming ``where`` unless ``url`` is ``redis://``, ``rediss://`` (TLS)
    or ``unix://`` with a host (or socket path)."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in _REDIS_SCHEMES or not (parsed.netloc or parsed.path):
        raise ValueError(f"{where}: must be redis://HOST:PORT[/DB], rediss://... or "
                         f"unix:///PATH, got {url!r}")


def _redis(t: Table) -> RedisConfig:
    config = RedisConfig(
        url=t.text("url", None),
        key_prefix=t.text("key_prefix", "radix"),
        launch=t.boolean("launch", False),
        **t.floats(("command_timeout_s", "connect_timeout_s", "heartbeat_interval_s",
                    "lease_ttl_s", "sync_interval_s", "state_ttl_s")),
        **{name: value for name in ("max_workers", "max_public_prefixes", "stream_maxlen")
           if (value := t.integer(name, None, low=1)) is not None},
    )
    if config.url is not None:
        check_redis_url(config.url, t.where("url"))
        if config.launch:
            raise ValueError(f"{t.where('launch')}: give url (an existing server) or "
                             "launch = true (`up` starts one), not both")
    if not _KEY_PREFIX.match(config.key_prefix):
        raise ValueError(f"{t.where('key_prefix')}: use letters, digits, '.', '_', ':', '-'")
    if config.heartbeat_interval_s * 2 > config.lease_ttl_s:
        raise ValueError(f"{t.where('lease_ttl_s')}: must be at least twice "
                         "heartbeat_interval_s (one late heartbeat must not end a lease)")
    t.finish()
    return config
