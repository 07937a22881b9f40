"""Router configurations for tests, built from shared pieces: the tenants and their keys,
the admin key, models and lists of workers. ``to_toml`` writes one for a router process
(``harness.procs.start_router``); ``make_config`` and ``shared_config`` parse one for a
router in this process (``tests.support.aio.running_router``)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.procs import ManagedProcess
from router.config import RouterConfig
from router.config_toml import parse_config
from router.front.auth import hash_key

ALICE, BOB, ADMIN = "key-alice", "key-bob", "key-admin"
TENANT_KEYS = {"alice": ALICE, "bob": BOB}
# The key keyed test workers require, and the variable a router config names for it.
WORKER_KEY, WORKER_KEY_ENV = "e2e-worker-key", "RADIX_WORKER_KEY_E2E"
# The public system prompt of ``keyed_demo_config``.
SYSTEM = "You are a careful assistant. Cite the document when you answer. " * 2
FAST_REGISTRY = {"poll_interval_s": 0.2, "probe_timeout_s": 1.0}


def auth_section(tenants: Mapping[str, Mapping[str, Any]], admin: bool = True
                 ) -> dict[str, Any]:
    """The ``auth`` section: each tenant named in ``tenants`` (alice, bob) with its key
    from TENANT_KEYS and the limits given for it; with ``admin``, the ADMIN key."""
    section: dict[str, Any] = {"admin_key_digest": hash_key(ADMIN)} if admin else {}
    section["tenants"] = {name: {"key_digests": [hash_key(TENANT_KEYS[name])], **limits}
                          for name, limits in tenants.items()}
    return section


def model_table(tokenizer: str = "demo", system: str | None = None, **fields: Any
                ) -> dict[str, Any]:
    """A ``models.<name>`` table: ``tokenizer``, ``system`` as its public system prompt
    (when given) and ``fields``."""
    table: dict[str, Any] = {"tokenizer": tokenizer, **fields}
    if system is not None:
        table["public_prefixes"] = [{"messages": [{"role": "system", "content": system}]}]
    return table


def worker_list(urls: Mapping[str, str], model: str = "demo", **fields: Any
                ) -> list[dict[str, Any]]:
    """The ``workers`` entries: one per (id, url) of ``urls``, serving ``model``, with
    ``fields``."""
    return [{"id": worker_id, "model": model, "url": url, **fields}
            for worker_id, url in urls.items()]


def keyed_demo_config(workers: Mapping[str, str], kind: str = "radix") -> dict[str, Any]:
    """A router in front of ``workers`` of model demo that require WORKER_KEY (read from
    WORKER_KEY_ENV): SYSTEM public, tenants alice (64 output tokens at most) and bob, the
    admin key and fast polling."""
    return {"models": {"demo": model_table(system=SYSTEM)},
            "registry": FAST_REGISTRY,
            "auth": auth_section({"alice": {"max_output_tokens": 64}, "bob": {}}),
            "workers": worker_list(workers, kind=kind, api_key_env=WORKER_KEY_ENV)}


def make_config(urls: list[str], kind: str = "radix", policy: str = "round_robin",
                poll_interval_s: float = 0.1, model: dict[str, Any] | None = None,
                worker: dict[str, Any] | None = None, **limits: int) -> RouterConfig:
    """Model ``demo`` (demo tokenizer, one public prefix, ``model``'s extra fields)
    served by ``urls`` as u0, u1, ... (with ``worker``'s extra fields); tenant alice
    with ``limits``."""
    return parse_config({
        "models": {"demo": model_table(**{"public_prefixes": [{"text": "x" * 40}],
                                          **(model or {})})},
        "workers": worker_list({f"u{i}": url for i, url in enumerate(urls)}, kind=kind,
                               **(worker or {})),
        "policy": {"name": policy},
        "registry": {"poll_interval_s": poll_interval_s},
        "auth": auth_section({"alice": limits}),
    })


def shared_config(redis_url: str, workers: list[dict[str, str]],
                  model: dict[str, Any] | None = None, redis: dict[str, Any] | None = None,
                  **sections: Any) -> RouterConfig:
    """Model ``demo`` (``model``'s extra fields) on ``workers``, Redis at ``redis_url``
    with fast syncs (and ``redis``'s extra fields), tenant alice, and ``sections``."""
    return parse_config({
        **sections,
        "models": {"demo": model_table(**(model or {}))},
        "workers": workers,
        "registry": {"poll_interval_s": 0.1},
        "redis": {"url": redis_url, "key_prefix": "peers-test", "heartbeat_interval_s": 0.1,
                  "lease_ttl_s": 2.0, "sync_interval_s": 0.1, **(redis or {})},
        "auth": auth_section({"alice": {}}),
    })


def to_toml(config: Mapping[str, Any]) -> str:
    """``config`` as TOML text: mappings become tables, lists of mappings arrays of
    tables, strings, numbers, booleans and lists of them values."""
    lines: list[str] = []
    _write_table(lines, (), config)
    return "\n".join(lines) + "\n"


def _write_table(lines: list[str], path: tuple[str, ...], table: Mapping[str, Any]) -> None:
    values = {k: v for k, v in table.items() if not _is_table(v) and not _is_table_array(v)}
    lines += [f"{_key(k)} = {_value(v)}" for k, v in values.items()]
    for key, value in table.items():
        inner = (*path, key)
        if _is_table(value):
            lines.append(f"[{'.'.join(map(_key, inner))}]")
            _write_table(lines, inner, value)
        elif _is_table_array(value):
            for item in value:
                lines.append(f"[[{'.'.join(map(_key, inner))}]]")
                _write_table(lines, inner, item)


def _is_table(value: Any) -> bool:
    return isinstance(value, Mapping)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(map(_is_table, value))


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return f"[{', '.join(map(_value, value))}]"
    raise TypeError(f"no TOML value for {value!r}")


def canary_pools(probe_interval_s: float) -> dict[str, Any]:
    """The ``pools`` and ``canary`` sections of a shared router: pool ``baseline``
    (worker base) and pool ``fp8`` (worker fp8) at weight 1 each, the canary probing
    every ``probe_interval_s`` and judging every 0.1 s."""
    return {"pools": {"baseline": {"workers": ["base"], "weight": 1},
                      "fp8": {"workers": ["fp8"], "weight": 1}},
            "canary": {"probe_interval_s": probe_interval_s, "check_interval_s": 0.1}}


def pd_config(directory: Path, prefill: ManagedProcess, decode_id: str,
              decode: ManagedProcess, decode_key_env: str) -> Path:
    """A router config in ``directory``: model demo, prefill worker p0 (its key in
    WORKER_KEY_ENV), the decode worker ``decode_id`` (its key in ``decode_key_env``),
    PD from 32 uncached tokens; returns its path."""
    path = directory / "router.toml"
    path.write_text(to_toml({
        "models": {"demo": model_table()},
        "registry": {"poll_interval_s": 0.2},
        "auth": auth_section({"alice": {}}),
        "pd": {"min_uncached_tokens": 32},
        "workers": [*worker_list({"p0": prefill.url}, api_key_env=WORKER_KEY_ENV,
                                 role="prefill"),
                    *worker_list({decode_id: decode.url}, api_key_env=decode_key_env,
                                 role="decode")],
    }))
    return path
