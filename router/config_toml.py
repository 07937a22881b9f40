"""Reading the router configuration from TOML (``radix.config_schema``).

Every error is a ``ValueError`` whose message starts with the dotted path of the bad
field (``workers[1].kind: ...``). Unknown keys are errors too, so a typo never falls
back silently to a default. The sections validate their own fields; this module
adds the rules across sections: tables of named models and tenants, worker models,
unique worker ids and key digests, launched workers' key variables.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from radix.config_schema import NAME, named_tables, read_section, table_array
from router.config import (
    DEFAULT_CONFIG,
    MAX_POOLS,
    WORKER_KEY_ENV_PREFIX,
    AuthConfig,
    ModelSpec,
    PoolConfig,
    PublicPrefixSpec,
    RouterConfig,
    TenantConfig,
    TenantLimits,
    WorkerSpec,
    default_key_env,
)

_TENANT_KEYS = frozenset({"key_digests", "band", "weight"})  # the rest are limits


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
    if not isinstance(data, Mapping):
        raise ValueError("config: must be a table")
    models = _models(data)
    sections = {k: v for k, v in data.items() if k not in ("models", "workers", "auth")}
    config = read_section(RouterConfig, sections, "", models=MappingProxyType(models),
                          workers=(), auth=_auth(data.get("auth", {})))
    prefix = config.admin.worker_key_env_prefix
    workers = tuple(parse_worker(item, models, where, prefix)
                    for item, where in table_array(data, "workers", ""))
    ids = [w.worker_id for w in workers]
    if len(set(ids)) != len(ids):
        raise ValueError("workers: ids must be unique")
    _check_pools(models, workers)
    if config.discovery.model is not None and config.discovery.model not in models:
        raise ValueError(f"discovery.model: unknown model {config.discovery.model!r}")
    return replace(config, workers=workers)


def _models(data: Mapping[str, Any]) -> dict[str, ModelSpec]:
    models = {name: _model(name, table, where)
              for name, table, where in named_tables(data, "models", "")}
    if not models:
        raise ValueError("models: at least one model is required")
    return models


def _model(name: str, table: Any, where: str) -> ModelSpec:
    """One ``[models.NAME]`` table with its table of named ``pools``."""
    if not isinstance(table, Mapping):
        raise ValueError(f"{where}: must be a table")
    pools = {}
    for pool, pool_table, pool_where in named_tables(table, "pools", where):
        if not NAME.regex.fullmatch(pool):
            raise ValueError(f"{pool_where}: {pool!r} is not {NAME.what}")
        pools[pool] = read_section(PoolConfig, pool_table, pool_where)
    if "canary" in table and not pools:
        raise ValueError(f"{where}.canary: give pools too (a canary guards pools)")
    if len(pools) > MAX_POOLS:
        raise ValueError(f"{where}.pools: at most {MAX_POOLS} pools")
    if pools and not sum(p.weight for p in pools.values()):
        raise ValueError(f"{where}.pools: at least one pool needs a weight above 0")
    rest = {k: v for k, v in table.items() if k != "pools"}
    return read_section(ModelSpec, rest, where, name=name, pools=pools)


def _check_pools(models: Mapping[str, ModelSpec], workers: tuple[WorkerSpec, ...]) -> None:
    """Each pool names workers of its own model, no worker is in two pools, and every
    configured worker of a model with pools is in one (run-time workers join the
    baseline: ``router.canary.pools``)."""
    by_id = {w.worker_id: w for w in workers}
    for model in models.values():
        pool_of: dict[str, str] = {}
        for pool, config in model.pools.items():
            where = f"models.{model.name}.pools.{pool}.workers"
            for worker_id in config.workers:
                worker = by_id.get(worker_id)
                if worker is None or worker.model != model.name:
                    raise ValueError(f"{where}: {worker_id!r} is no worker of model "
                                     f"{model.name!r}")
                if worker_id in pool_of:
                    raise ValueError(f"{where}: {worker_id!r} is in pool "
                                     f"{pool_of[worker_id]!r} too")
                pool_of[worker_id] = pool
        unpooled = [w.worker_id for w in workers if w.model == model.name and model.pools
                    and w.worker_id not in pool_of]
        if unpooled:
            raise ValueError(f"models.{model.name}.pools: worker {unpooled[0]!r} of this model "
                             f"is in no pool")


def parse_public_prefix(data: Mapping[str, Any], path: str) -> PublicPrefixSpec:
    """Validate one public prefix table (config or ``POST /admin/public-prefixes``)."""
    return read_section(PublicPrefixSpec, data, path)


def parse_worker(data: Mapping[str, Any], models: Mapping[str, Any], path: str,
                 key_env_prefix: str = WORKER_KEY_ENV_PREFIX) -> WorkerSpec:
    """Validate one worker table (config ``[[workers]]`` or ``POST /admin/workers``)
    whose model is one of ``models``; a launched worker without ``api_key_env`` gets
    ``default_key_env``."""
    worker = read_section(WorkerSpec, data, path)
    if worker.model not in models:
        raise ValueError(f"{path}.model: unknown model {worker.model!r}")
    if worker.api_key_env is None and worker.launch is not None:
        worker = replace(worker, api_key_env=default_key_env(worker.worker_id, key_env_prefix))
    return worker


def _auth(data: Any) -> AuthConfig:
    """The auth section; each tenant's table holds its ``key_digests``, ``band`` and
    ``weight`` beside its limits, and no digest belongs to two tenants."""
    if not isinstance(data, Mapping):
        raise ValueError("auth: must be a table")
    tenants = []
    seen_digests: set[str] = set()
    for tenant_id, table, where in named_tables(data, "tenants", "auth"):
        if not isinstance(table, Mapping):
            raise ValueError(f"{where}: must be a table")
        limits = read_section(TenantLimits, {k: v for k, v in table.items()
                                             if k not in _TENANT_KEYS}, where)
        own = {k: v for k, v in table.items() if k in _TENANT_KEYS}
        tenant = read_section(TenantConfig, own, where, tenant_id=tenant_id, limits=limits)
        if seen_digests & set(tenant.key_digests):
            raise ValueError(f"{where}.key_digests: digest used by two tenants")
        seen_digests.update(tenant.key_digests)
        tenants.append(tenant)
    rest = {k: v for k, v in data.items() if k != "tenants"}
    return read_section(AuthConfig, rest, "auth", tenants=tuple(tenants))
