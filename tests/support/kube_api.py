"""A small Kubernetes API server for discovery tests: the only stand-in in them (no
Kubernetes runs on these machines; the client is the real ``kubernetes_asyncio``).

It speaks the list/watch protocol as the API server writes it, for pods
(``/api/v1/namespaces/NS/pods``) and InferencePools
(``/apis/inference.networking.k8s.io/v1/namespaces/NS/inferencepools``):

- LIST: ``{"kind": "PodList", "metadata": {"resourceVersion": RV}, "items": [...]}``,
  filtered by ``labelSelector`` (``k=v,...``) or ``fieldSelector``
  (``metadata.name=X``).
- WATCH (``watch=true``): from ``resourceVersion`` RV, every change after RV, then the
  live ones, one JSON event per line (``{"type": "ADDED"|"MODIFIED"|"DELETED"|
  "BOOKMARK"|"ERROR", "object": ...}``); without RV, a synthetic ``ADDED`` per
  current object first. An RV older than the last ``compact`` gets the API server's
  ``ERROR`` event with a 410 ``Expired`` Status. ``allowWatchBookmarks`` adds a
  ``BOOKMARK`` every ``bookmark_interval_s``; ``timeoutSeconds`` ends the stream.
- One resourceVersion counter for everything, as etcd's.

A test changes objects through the methods (``add_pod``, ``set_ready``, ``evict``,
``delete``, ...) and injects faults: ``close_watches`` (every stream ends mid-way),
``compact``, ``watches_refused`` (watch requests get 503 while set),
``events_lost`` (changes reach no open stream while set: a stream that silently
dropped them), ``forbidden`` (every request gets 403 Forbidden), ``stop``/``start``
(the server is unreachable). ``num_watchers(kind)`` counts the open streams.
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

POOL_PATH = "/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools"


@dataclass
class _Kind:
    list_kind: str
    api_version: str
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    history: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    watchers: list[asyncio.Queue] = field(default_factory=list)


def _matches(obj: dict[str, Any], labels: str | None, fields: str | None) -> bool:
    metadata = obj["metadata"]
    for term in filter(None, (labels or "").split(",")):
        key, _, value = term.partition("=")
        if (metadata.get("labels") or {}).get(key) != value:
            return False
    for term in filter(None, (fields or "").split(",")):
        key, _, value = term.partition("=")
        if key != "metadata.name" or metadata.get("name") != value:
            return False
    return True


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class KubeApiServer:
    """The server (see the module docstring). ``url`` once started;
    ``kubeconfig(path)`` writes a kubeconfig pointing at it. Every request is recorded
    in ``requests`` as ``(method, path, query)``."""

    def __init__(self, namespace: str = "default", bookmark_interval_s: float = 1.0) -> None:
        self.namespace = namespace
        self.bookmark_interval_s = bookmark_interval_s
        self.version = 1
        self.compacted = 0
        self.forbidden = False
        self.watches_refused = False
        self.events_lost = False
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._kinds = {"pods": _Kind("PodList", "v1"),
                       "inferencepools": _Kind("InferencePoolList",
                                               "inference.networking.k8s.io/v1")}
        self._port = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self._port}"

    async def start(self) -> None:
        """Listen (on the same port as before after a ``stop``)."""
        async def pods(request: web.Request) -> web.StreamResponse:
            return await self._serve(request, "pods")

        async def pools(request: web.Request) -> web.StreamResponse:
            return await self._serve(request, "inferencepools")

        app = web.Application()
        app.router.add_get(f"/api/v1/namespaces/{self.namespace}/pods", pods)
        app.router.add_get(POOL_PATH.format(ns=self.namespace), pools)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self._port, reuse_address=True)
        await site.start()
        self._port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        """Stop listening and end every stream (clients see refused connections)."""
        self.close_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def kubeconfig(self, path: str) -> str:
        """Write a kubeconfig for this server at ``path``; returns ``path``."""
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": "test-token"}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test",
                                                       "namespace": self.namespace}}],
        }
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f)
        return path

    # --- changes -------------------------------------------------------------------

    def add_pod(self, name: str, ip: str | None, port: int, labels: dict[str, str],
                ready: bool = True, annotations: dict[str, str] | None = None,
                phase: str = "Running", owner: tuple[str, str] | None = None,
                service_account: str = "default") -> dict[str, Any]:
        """Create a pod (a new UID) with a container port named ``http``, run as
        ``service_account``, controlled by ``owner`` (kind, name) when given (its
        ``ownerReferences``, as a controller writes them)."""
        metadata = {"name": name, "namespace": self.namespace, "uid": str(uuid.uuid4()),
                    "labels": dict(labels), "annotations": dict(annotations or {})}
        if owner is not None:
            metadata["ownerReferences"] = [{
                "apiVersion": "apps/v1", "kind": owner[0], "name": owner[1],
                "uid": str(uuid.uuid4()), "controller": True, "blockOwnerDeletion": True}]
        pod = {
            "metadata": metadata,
            "spec": {"serviceAccountName": service_account,
                     "containers": [{"name": "worker", "ports": [
                         {"name": "http", "containerPort": port, "protocol": "TCP"}]}]},
            "status": {"phase": phase, "podIP": ip,
                       "conditions": [{"type": "Ready",
                                       "status": "True" if ready else "False"}]},
        }
        self._put("pods", "ADDED", pod)
        return pod

    def set_ready(self, name: str, ready: bool) -> None:
        """Flip the pod's Ready condition."""
        pod = self._copy("pods", name)
        pod["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
        self._put("pods", "MODIFIED", pod)

    def set_ip(self, name: str, ip: str) -> None:
        """Give the pod another IP (same UID)."""
        pod = self._copy("pods", name)
        pod["status"]["podIP"] = ip
        self._put("pods", "MODIFIED", pod)

    def evict(self, name: str) -> None:
        """What an evicted pod looks like: ``MODIFIED``, phase ``Failed``, no IP, not ready."""
        pod = self._copy("pods", name)
        pod["status"] = {"phase": "Failed", "reason": "Evicted", "podIP": None,
                         "conditions": [{"type": "Ready", "status": "False"}]}
        self._put("pods", "MODIFIED", pod)

    def start_deleting(self, name: str) -> None:
        """Set the pod's ``deletionTimestamp`` (graceful deletion begins; still Ready)."""
        pod = self._copy("pods", name)
        pod["metadata"]["deletionTimestamp"] = "2026-12-05T00:00:00Z"
        self._put("pods", "MODIFIED", pod)

    def delete(self, name: str, kind: str = "pods") -> None:
        """Remove the object (``DELETED``)."""
        obj = self._copy(kind, name)
        self._put(kind, "DELETED", obj)

    def put_pool(self, name: str, labels: dict[str, str], ports: list[int]) -> None:
        """Create or change an InferencePool selecting ``labels`` on ``ports``."""
        kind = self._kinds["inferencepools"]
        old = kind.objects.get(name)
        pool = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
                "metadata": {"name": name, "namespace": self.namespace,
                             "uid": old["metadata"]["uid"] if old else str(uuid.uuid4())},
                "spec": {"selector": {"matchLabels": dict(labels)},
                         "targetPorts": [{"number": p} for p in ports],
                         "endpointPickerRef": {"name": "radix-router", "port": {"number": 9002}}}}
        self._put("inferencepools", "MODIFIED" if old else "ADDED", pool)

    def num_watchers(self, kind: str = "pods") -> int:
        """Open watch streams of ``kind``."""
        return len(self._kinds[kind].watchers)

    def pod(self, name: str) -> dict[str, Any]:
        """The pod as stored now."""
        return self._kinds["pods"].objects[name]

    # --- faults --------------------------------------------------------------------

    def close_watches(self) -> None:
        """End every open watch stream now, mid-way."""
        for kind in self._kinds.values():
            for queue in kind.watchers:
                queue.put_nowait(None)

    def compact(self) -> None:
        """Forget the history: a watch from any version before now gets 410 Gone."""
        self.compacted = self.version
        for kind in self._kinds.values():
            kind.history.clear()

    # --- protocol ------------------------------------------------------------------

    def _copy(self, kind: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self._kinds[kind].objects[name])

    def _put(self, kind_name: str, event: str, obj: dict[str, Any]) -> None:
        kind = self._kinds[kind_name]
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        name = obj["metadata"]["name"]
        if event == "DELETED":
            kind.objects.pop(name, None)
        else:
            kind.objects[name] = obj
        frozen = copy.deepcopy(obj)
        kind.history.append((self.version, event, frozen))
        for queue in [] if self.events_lost else kind.watchers:
            queue.put_nowait((event, frozen))

    async def _serve(self, request: web.Request, kind_name: str) -> web.StreamResponse:
        query = dict(request.query)
        self.requests.append((request.method, request.path, query))
        if self.forbidden:
            return web.json_response(_status(
                403, "Forbidden", f'{kind_name} is forbidden: User "system:serviceaccount:'
                f'{self.namespace}:radix-router" cannot list resource "{kind_name}"'),
                status=403)
        kind = self._kinds[kind_name]
        labels, fields = query.get("labelSelector"), query.get("fieldSelector")
        if query.get("watch", "").lower() not in ("true", "1"):
            items = [o for o in kind.objects.values() if _matches(o, labels, fields)]
            return web.json_response({"kind": kind.list_kind, "apiVersion": kind.api_version,
                                      "metadata": {"resourceVersion": str(self.version)},
                                      "items": items})
        if self.watches_refused:
            return web.json_response(_status(503, "ServiceUnavailable", "try again"),
                                     status=503)
        return await self._watch(request, kind, labels, fields, query)

    async def _watch(self, request: web.Request, kind: _Kind, labels: str | None,
                     fields: str | None, query: dict[str, str]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        queue: asyncio.Queue = asyncio.Queue()
        kind.watchers.append(queue)
        since = query.get("resourceVersion") or ""

        async def send(event: str, obj: dict[str, Any]) -> None:
            await response.write(json.dumps({"type": event, "object": obj}).encode() + b"\n")

        try:
            if since and since != "0" and int(since) < self.compacted:
                await send("ERROR", _status(410, "Expired", f"too old resource version: "
                                            f"{since} ({self.compacted})"))
                return response
            if not since or since == "0":
                for obj in list(kind.objects.values()):
                    if _matches(obj, labels, fields):
                        await send("ADDED", obj)
            else:
                for version, event, obj in list(kind.history):
                    if version > int(since) and _matches(obj, labels, fields):
                        await send(event, obj)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + float(query.get("timeoutSeconds") or 1800)
            bookmarks = query.get("allowWatchBookmarks", "").lower() == "true"
            while (left := deadline - loop.time()) > 0:
                wait = min(left, self.bookmark_interval_s) if bookmarks else left
                try:
                    item = await asyncio.wait_for(queue.get(), wait)
                except TimeoutError:
                    if bookmarks and deadline - loop.time() > 0:
                        await send("BOOKMARK", {"kind": "Pod", "apiVersion": "v1", "metadata": {
                            "resourceVersion": str(self.version)}})
                    continue
                if item is None:
                    break
                if _matches(item[1], labels, fields):
                    await send(*item)
        except (ConnectionResetError, RuntimeError):
            pass
        finally:
            kind.watchers.remove(queue)
        return response
