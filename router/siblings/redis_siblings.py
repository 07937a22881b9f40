"""``RedisSiblings``: the shared worker registry and public prefixes, plus the stream.

Workers: one hash, worker id -> its shared fields as JSON, and a version counter
bumped by every change (both in one script). A router's admin change is applied
locally, then published; every ``sync_interval_s`` each router reads the version
and, when it moved, the hash, and makes its own registry equal to it (adding,
re-adding a worker whose fields changed, removing one no longer listed; an entry it
cannot use, it skips and logs). A read that started before a local change is
discarded, so a router never undoes its own newer change. A worker
that stops answering leaves routing on every router by that router's own probes.

Prefixes: one hash, ``model:digest`` -> token ids, add-only; a router adds the
entries it does not know to its models' public prefixes.

Canary pools: one hash, model -> its pools' weights and trips (JSON), and a version
counter, written together by every change (admin or guard) on any router; every
``sync_interval_s`` a router whose read shows a new version adopts each model's
entry (``Canary.adopt``), the last writer winning.

Discovered workers (``router.fleet.discovery``) are never shared: every router
discovers them itself from the same API server, so they converge without Redis; a
shared entry never replaces or removes one.

Joining or rejoining (the resync hook) publishes every worker and prefix this
router holds (its config's, and changes made while Redis was down), then loads the
rest. Config workers are thus re-asserted by each router that starts. Canary state
goes the other way: a router publishes a model's pools only where Redis has no entry
for it, and otherwise adopts the entry, so a restarted router keeps a pool another
router drained (or that it drained itself before it restarted).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any

from radix.api_errors import ApiError
from radix.keys import TOKEN_BYTES, from_key
from radix.openai.json_body import decode_json_object
from router.canary.controller import Canary
from router.config import WorkerSpec
from router.config_toml import parse_worker
from router.fleet.registry import WorkerRegistry, WorkerState
from router.fleet.worker_keys import runtime_key_problem
from router.models import Models
from router.routing.index import RouterIndex
from router.siblings.routed import RoutedStream
from router.state.redis_state import scripts
from router.state.redis_state.link import RedisLink, RedisUnavailable
from router.tasks import cancel_and_wait

MAX_REMEMBERED_REFUSALS = 1024
log = logging.getLogger(__name__)


def shared_fields(worker: WorkerState) -> dict[str, str]:
    """What travels to other routers: id, model, kind, url, the role when it is not
    ``both``, and the name (never the value) of the worker's key variable."""
    fields = {"id": worker.worker_id, "model": worker.model, "kind": worker.kind,
              "url": worker.url}
    if worker.role != "both":
        fields["role"] = worker.role
    if worker.config.api_key_env is not None:
        fields["api_key_env"] = worker.config.api_key_env
    return fields


def prefix_field(model: str, key: bytes) -> str:
    """The hash field of a public prefix: the model and a digest of its tokens."""
    return f"{model}:{hashlib.sha256(key).hexdigest()[:32]}"


class RedisSiblings:
    """``Siblings`` on Redis. Owns the link's lifecycle (``start`` starts its heartbeat).
    A shared worker passes the checks of ``POST /admin/workers`` before this router
    uses it: it may read only the key variable named for its id
    (``router.fleet.worker_keys``, under ``key_env_prefix``; ``config_workers`` keep
    theirs), so whoever writes to Redis cannot make the router send another worker's
    key, or any other of its variables, to a host they name."""

    def __init__(self, link: RedisLink, key_env_prefix: str,
                 config_workers: tuple[WorkerSpec, ...]) -> None:
        self._link = link
        self._key_env_prefix = key_env_prefix
        self._config_workers = config_workers
        self._add_worker = link.script(scripts.ADD_WORKER)
        self._remove_worker = link.script(scripts.REMOVE_WORKER)
        self._add_prefix = link.script(scripts.ADD_PREFIX)
        self._version: int | None = None
        self._num_local_changes = 0
        self._canary_version: int | None = None
        self._num_canary_changes = 0
        self._prefixes_seen: set[str] = set()
        self._refused: set[tuple[str, bytes]] = set()
        self.num_refused_entries = 0
        self._task: asyncio.Task[None] | None = None
        self._stream: RoutedStream | None = None

    @property
    def up(self) -> bool:
        """See ``Siblings.up``."""
        return self._link.up

    async def start(self, registry: WorkerRegistry, models: Models, index: RouterIndex,
                    canary: Canary) -> None:
        """See ``Siblings.start``."""
        self._registry, self._models, self._canary = registry, models, canary
        self._stream = RoutedStream(self._link, registry, index)
        self._link.on_resync(self._rejoin)
        await self._link.start()
        self._stream.start()
        self._task = asyncio.create_task(self._sync(), name="shared registry sync")

    async def close(self) -> None:
        """See ``Siblings.close``."""
        if self._task is not None:
            await cancel_and_wait(self._task)
        if self._stream is not None:
            await self._stream.close()
        await self._link.close()

    async def worker_added(self, worker: WorkerState) -> None:
        """See ``Siblings.worker_added``."""
        self._num_local_changes += 1
        with contextlib.suppress(RedisUnavailable):
            await self._publish_worker(worker)

    async def worker_removed(self, worker_id: str) -> None:
        """See ``Siblings.worker_removed``."""
        self._num_local_changes += 1
        keys = self._link.keys
        with contextlib.suppress(RedisUnavailable):
            await self._link.call(lambda _: self._remove_worker(
                keys=[keys.workers, keys.workers_version], args=[worker_id]))

    async def prefix_added(self, model: str, key: bytes) -> None:
        """See ``Siblings.prefix_added``."""
        with contextlib.suppress(RedisUnavailable):
            await self._publish_prefix(model, key)

    async def canary_changed(self, model: str, state: dict[str, Any]) -> None:
        """See ``Siblings.canary_changed``."""
        self._num_canary_changes += 1
        keys = self._link.keys

        async def write(client) -> None:
            async with client.pipeline(transaction=True) as pipe:
                pipe.hset(keys.canary, model, json.dumps(state))
                pipe.incr(keys.canary_version)
                await pipe.execute()

        with contextlib.suppress(RedisUnavailable):
            await self._link.call(write)

    def routed(self, worker: WorkerState, key: bytes, scope: str) -> None:
        """See ``Siblings.routed``."""
        if self._stream is not None:
            self._stream.note(worker, key, scope)

    async def _publish_worker(self, worker: WorkerState) -> None:
        keys = self._link.keys
        version = await self._link.call(lambda _: self._add_worker(
            keys=[keys.workers, keys.workers_version],
            args=[worker.worker_id, json.dumps(shared_fields(worker)),
                  self._link.config.max_workers]))
        if int(version) < 0:
            log.warning("shared registry full (redis.max_workers = %d): worker %s is known "
                        "to this router only", self._link.config.max_workers, worker.worker_id)

    async def _publish_prefix(self, model: str, key: bytes) -> None:
        field = prefix_field(model, key)
        stored = await self._link.call(lambda _: self._add_prefix(
            keys=[self._link.keys.prefixes],
            args=[field, key, self._link.config.max_public_prefixes]))
        if int(stored) < 0:
            log.warning("shared public prefixes full (redis.max_public_prefixes = %d): a "
                        "prefix of model %s is known to this router only",
                        self._link.config.max_public_prefixes, model)
        else:
            self._prefixes_seen.add(field)

    async def _rejoin(self) -> None:
        """Resync hook: publish everything held here, then load everything shared."""
        for worker in self._registry.workers():
            if not worker.discovered:
                await self._publish_worker(worker)
        for name in self._models.names():
            for key in self._models.get(name).public_prefixes.registered():
                await self._publish_prefix(name, key)
        self._version = None
        await self._pull_workers()
        await self._pull_prefixes()
        keys = self._link.keys
        for model in self._canary.models:
            state = json.dumps(self._canary.shared_state(model))
            if await self._link.call(lambda client, m=model, s=state: client.hsetnx(
                    keys.canary, m, s)):
                await self._link.call(lambda client: client.incr(keys.canary_version))
        self._canary_version = None
        await self._pull_canary()

    async def _sync(self) -> None:
        while True:
            await asyncio.sleep(self._link.config.sync_interval_s)
            if not self._link.up:
                continue
            try:
                await self._pull_workers()
                await self._pull_prefixes()
                await self._pull_canary()
            except RedisUnavailable:
                continue
            except Exception:  # a bug must not end following the registry
                log.exception("shared registry sync failed")

    async def _read_versioned(self, version_key: str, hash_key: str
                              ) -> tuple[int, dict[bytes, bytes]]:
        """(version, entries) of a hash and its version counter, read in one transaction."""
        async def read(client) -> list:
            async with client.pipeline(transaction=True) as pipe:
                pipe.get(version_key)
                pipe.hgetall(hash_key)
                return await pipe.execute()

        raw_version, entries = await self._link.call(read)
        return int(raw_version or 0), entries

    async def _pull_workers(self) -> None:
        keys = self._link.keys
        num_changes = self._num_local_changes
        version, entries = await self._read_versioned(keys.workers_version, keys.workers)
        if num_changes != self._num_local_changes or version == self._version:
            return
        await self._apply_workers(version, entries)
        self._version = version

    async def _apply_workers(self, version: int, entries: Mapping[bytes, bytes]) -> None:
        listed = {raw_id.decode(errors="replace"): raw for raw_id, raw in entries.items()}
        shared = {}
        for worker_id, raw in listed.items():
            try:
                shared[worker_id] = self._parse(worker_id, raw)
            except Exception as exc:  # one entry, whatever is wrong with it, never the sync
                self._refuse(f"worker {worker_id}", raw, f"{type(exc).__name__}: {exc}")
        for worker_id, (config, fields) in shared.items():
            local = self._registry.get(worker_id)
            if local is not None and (local.discovered or shared_fields(local) == fields):
                continue
            if local is not None:
                await self._registry.remove(worker_id)
            try:
                self._registry.add(config)
                log.info("worker %s added from the shared registry (version %d)", worker_id,
                         version)
            except ValueError as exc:
                self._refuse(f"worker {worker_id}", entries[worker_id.encode()], str(exc))
        for worker in self._registry.workers():
            if worker.worker_id not in listed and not worker.discovered:
                await self._registry.remove(worker.worker_id)
                log.info("worker %s removed by the shared registry (version %d)",
                         worker.worker_id, version)

    def _parse(self, worker_id: str, raw: bytes) -> tuple[WorkerSpec, dict[str, Any]]:
        """(config, decoded fields) of a shared entry; ValueError for anything this
        router cannot use, malformed JSON (too deep, not an object) included."""
        where = f"{self._link.keys.workers}[{worker_id}]"
        try:
            fields = decode_json_object(raw)
        except ApiError as exc:
            raise ValueError(f"{where}: {exc}") from exc
        config = parse_worker(fields, {name: None for name in self._models.names()}, where)
        if config.worker_id != worker_id or config.url is None:
            raise ValueError(f"{where}: id must be the field name, and url is required")
        if problem := runtime_key_problem(config, self._key_env_prefix, self._config_workers):
            raise ValueError(f"{where}.{problem}")
        return config, fields

    def _refuse(self, what: str, raw: bytes, reason: str) -> None:
        """Log and count once per (entry, value) that this router cannot use a shared
        entry (``what``: "worker ID", "canary of model M"); the entries remembered are
        bounded (past ``MAX_REMEMBERED_REFUSALS`` they start over)."""
        seen = (what, hashlib.sha256(raw).digest())
        if seen not in self._refused:
            if len(self._refused) >= MAX_REMEMBERED_REFUSALS:
                self._refused.clear()
            self._refused.add(seen)
            self.num_refused_entries += 1
            log.warning("shared %s not usable here: %s", what, reason)

    async def _pull_canary(self) -> None:
        keys = self._link.keys
        num_changes = self._num_canary_changes
        version, entries = await self._read_versioned(keys.canary_version, keys.canary)
        if num_changes != self._num_canary_changes or version == self._canary_version:
            return
        for raw_model, raw in entries.items():
            model = raw_model.decode(errors="replace")
            try:
                self._canary.adopt(model, decode_json_object(raw))
            except Exception as exc:  # one entry, whatever is wrong with it, never the sync
                self._refuse(f"canary of model {model}", raw, f"{type(exc).__name__}: {exc}")
        self._canary_version = version

    async def _pull_prefixes(self) -> None:
        key = self._link.keys.prefixes
        if await self._link.call(lambda client: client.hlen(key)) <= len(self._prefixes_seen):
            return
        entries = await self._link.call(lambda client: client.hgetall(key))
        names = set(self._models.names())
        for raw_field, token_key in entries.items():
            field = raw_field.decode(errors="replace")
            model = field.partition(":")[0]
            if field in self._prefixes_seen:
                continue
            self._prefixes_seen.add(field)
            if model in names and token_key and len(token_key) % TOKEN_BYTES == 0:
                self._models.get(model).public_prefixes.add(from_key(token_key))
