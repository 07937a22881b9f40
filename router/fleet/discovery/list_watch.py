"""``ListWatch``: the objects of one Kubernetes list call, kept equal to the API
server's, level-triggered.

The loop: LIST (a consistent read) and replace the whole set, keyed by UID; WATCH
from the list's ``resourceVersion`` with bookmarks for at most ``resync_s``; then LIST
again. Any failure (410 Gone for an expired version, a stream that closes before its
deadline, 403, a refused connection, a timeout) drops the watch, waits a backoff
(``retry_initial_s`` doubling to ``retry_max_s``, reset by a successful LIST) and
re-lists. Because every watch ends in a full LIST that replaces the set, an event
lost in any gap (a ``DELETED`` during a reconnect) is recovered within
``resync_s`` of the gap at the latest, and a watch never resumes from a compacted
version. While the server is unreachable the last set stays as it was: the router
keeps routing to what it knows.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from router.config import DiscoveryConfig
from router.fleet.discovery.pods import uid_of
from router.fleet.discovery.status import DiscoveryStatus, StreamClosed

log = logging.getLogger(__name__)
EARLY_END_S = 1.0  # a watch ending this long before its deadline was closed on us


class ListWatch:
    """Follows the objects ``list_call(**query)`` returns (a ``kubernetes_asyncio``
    list method: ``CoreV1Api.list_namespaced_pod`` with its namespace bound, ...).
    ``objects`` is the current set by UID (read it, never mutate it); ``on_change``
    is called after every change of it (a LIST or a watch event)."""

    def __init__(self, what: str, list_call: Callable[..., Any], query: Mapping[str, Any],
                 config: DiscoveryConfig, status: DiscoveryStatus,
                 on_change: Callable[[], None]) -> None:
        self.what = what
        self.objects: dict[str, dict[str, Any]] = {}
        self._list_call = list_call
        self._query = dict(query)
        self._config = config
        self._status = status
        self._on_change = on_change

    async def run(self) -> None:
        """LIST, WATCH, re-LIST, forever (cancel to stop)."""
        delay = self._config.retry_initial_s
        while True:
            try:
                version = await self._list()
                delay = self._config.retry_initial_s
                await self._watch(version)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # every failure re-lists after a backoff
                self._status.failed(self.what, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._config.retry_max_s)

    async def _list(self) -> str:
        response = await self._list_call(
            **self._query, _preload_content=False,
            _request_timeout=self._config.request_timeout_s)
        try:
            raw = await response.read()
        finally:
            response.release()
        if response.status != 200:
            raise ApiException(status=response.status,
                               reason=raw[:200].decode(errors="replace"))
        body = json.loads(raw)
        items = body.get("items") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise ValueError(f"LIST {self.what}: no items in the answer")
        self.objects = {uid: item for item in items
                        if isinstance(item, dict) and (uid := uid_of(item)) is not None}
        self._status.listed()
        self._on_change()
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    async def _watch(self, version: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.resync_s
        timeout_s = max(1, int(self._config.resync_s))
        watch = Watch(return_type="object")
        stream = watch.stream(self._list_call, **self._query, resource_version=version,
                              allow_watch_bookmarks=True, timeout_seconds=timeout_s,
                              _request_timeout=timeout_s + self._config.request_timeout_s)
        async with watch:
            async for event in stream:
                self._apply(event.get("type"), event.get("raw_object"))
        if loop.time() < deadline - EARLY_END_S:
            raise StreamClosed(f"the watch of {self.what} ended before its deadline")

    def _apply(self, kind: object, obj: object) -> None:
        if kind == "BOOKMARK" or not isinstance(obj, dict):
            return
        uid = uid_of(obj)
        if uid is None:
            return
        self._status.num_events += 1
        if kind == "DELETED":
            self.objects.pop(uid, None)
        elif kind in ("ADDED", "MODIFIED"):
            self.objects[uid] = obj
        else:
            return
        self._on_change()
