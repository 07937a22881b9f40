"""Which environment variable a worker added at run time may take its API key from.

A worker key grants ``/kv/events`` (every tenant's cached token ids) and
``/generate`` under any scope, so it must go only to the worker it was made for.
Workers in the config are the operator's and may read any variable. A worker added
at run time, through ``POST /admin/workers`` or the shared Redis registry (which
whoever can write to Redis controls), may read only the variable named for its own
id, ``default_key_env(id, prefix)``: the operator allows a run-time worker ``x`` by
setting ``<prefix>X`` in the router's environment, and no other worker can ask for
that key. Two more rules keep the binding one-to-one:

- the id must be canonical (lower-case letters, digits, ``-``), the ids on which
  ``default_key_env`` is one-to-one (``W0``, ``w0`` and ``w_0`` would otherwise share
  ``<prefix>W0`` or ``<prefix>W_0``);
- the variable must not be one a config worker reads, unless the run-time worker is
  that config worker (same id and URL, as when routers re-publish their config).
  So removing a config worker and adding it back at another host gets no key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from router.config import WorkerSpec, default_key_env

CANONICAL_ID = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def _same_worker(a: WorkerSpec, b: WorkerSpec) -> bool:
    return (a.worker_id == b.worker_id and a.url is not None and b.url is not None
            and a.url.rstrip("/") == b.url.rstrip("/"))


def runtime_key_problem(worker: WorkerSpec, prefix: str,
                        config_workers: Iterable[WorkerSpec]) -> str | None:
    """Why ``worker``, added at run time, may not read its ``api_key_env`` (None if it
    may: it names none, or exactly ``default_key_env(worker_id, prefix)`` for a
    canonical id that no other config worker's key variable is)."""
    env = worker.api_key_env
    if env is None:
        return None
    own = default_key_env(worker.worker_id, prefix)
    if env != own:
        return f"api_key_env: a worker added at run time may read only {own!r} (named for its id)"
    if not CANONICAL_ID.fullmatch(worker.worker_id):
        return ("id: a worker added at run time with a key needs an id of lower-case letters, "
                "digits and '-'")
    for config in config_workers:
        if config.api_key_env == env and not _same_worker(config, worker):
            return f"api_key_env: {env!r} belongs to config worker {config.worker_id!r}"
    return None
