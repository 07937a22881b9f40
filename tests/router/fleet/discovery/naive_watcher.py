"""The control of the discovery tests: a pod watch loop as the ones that failed in
production (vLLM production-stack's), kept to show that each production case does
break a naive watcher and so that the test of ours is not one that cannot fail.

It never re-lists. When its stream ends it watches again, either resuming from the
last resourceVersion it saw (``resume``: on 410 Gone it retries that same version,
forever) or afresh from now (a fresh watch replays the pods that exist, so a pod
deleted in the gap is never removed). It keeps a pod until a ``DELETED`` event names
it, with the first address an event gave it (an evicted pod's ``MODIFIED`` with
``podIP: null`` changes nothing).
"""

from __future__ import annotations

import asyncio

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch


class NaiveWatcher:
    """``endpoints``: pod name -> IP as this loop believes; ``statuses``: the HTTP or
    Status codes of the errors it met, in order."""

    def __init__(self, api: k8s.ApiClient, namespace: str, selector: str, resume: bool) -> None:
        self.endpoints: dict[str, str] = {}
        self.statuses: list[int] = []
        self._core = k8s.CoreV1Api(api)
        self._namespace, self._selector, self._resume = namespace, selector, resume
        self._version: str | None = None

    async def run(self) -> None:
        """Watch forever (cancel to stop)."""
        while True:
            query = {"label_selector": self._selector, "timeout_seconds": 30}
            if self._resume and self._version:
                query["resource_version"] = self._version
            watch = Watch(return_type="object")
            try:
                async with watch:
                    async for event in watch.stream(self._core.list_namespaced_pod,
                                                    self._namespace, **query):
                        self._apply(event["type"], event["raw_object"])
            except ApiException as exc:
                self.statuses.append(exc.status)
            except (TimeoutError, OSError, ValueError):
                self.statuses.append(0)
            await asyncio.sleep(0.05)

    def _apply(self, kind: str, pod: dict) -> None:
        self._version = pod["metadata"].get("resourceVersion", self._version)
        name = pod["metadata"]["name"]
        if kind == "DELETED":
            self.endpoints.pop(name, None)
        elif (ip := (pod.get("status") or {}).get("podIP")) and name not in self.endpoints:
            self.endpoints[name] = ip
