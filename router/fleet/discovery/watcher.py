"""``KubernetesDiscovery``: workers found by watching pods, directly or through an
InferencePool, with the ``kubernetes_asyncio`` client.

``kind = "kubernetes"``: one ``ListWatch`` of the pods in ``namespace`` matching
``selector``. ``kind = "inferencepool"``: a ``ListWatch`` of the one InferencePool
named ``pool`` (``inference.networking.k8s.io/v1``); each time its selector or target
ports change, the pod watch restarts with them (no pool, or one without a selector
or ports: no workers). Every change of the pod set hands the endpoints of the pods
that serve and pass the identity checks (``router.fleet.discovery.pods.refusal``:
owner, service account, role) to ``DiscoveredWorkers``; the others are refused,
counted and shown in ``status`` before any request or key reaches them.

The client's configuration: ``discovery.kubeconfig`` when given, else the pod's
service account when the router runs in a cluster (``KUBERNETES_SERVICE_HOST`` is
set), else ``$KUBECONFIG`` or ``~/.kube/config``.
"""

from __future__ import annotations

import asyncio
import logging
import os

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config

from router.config import DiscoveryConfig, RouterConfig
from router.fleet.discovery.list_watch import ListWatch
from router.fleet.discovery.pods import (
    PodEndpoint,
    label_selector,
    pod_endpoints,
    pool_target,
    refusal,
)
from router.fleet.discovery.reconcile import DiscoveredWorkers
from router.fleet.discovery.status import DiscoveryStatus
from router.fleet.registry import WorkerRegistry
from router.models import Models
from router.tasks import cancel_and_wait

log = logging.getLogger(__name__)
POOL_GROUP, POOL_VERSION, POOL_PLURAL = "inference.networking.k8s.io", "v1", "inferencepools"


async def api_client(config: DiscoveryConfig) -> k8s.ApiClient:
    """A client configured as the module docstring says; ValueError when no
    configuration can be loaded."""
    configuration = k8s.Configuration()
    try:
        if config.kubeconfig is not None:
            await k8s_config.load_kube_config(config_file=config.kubeconfig,
                                              client_configuration=configuration)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            await k8s_config.load_kube_config(client_configuration=configuration)
    except (k8s_config.ConfigException, OSError, ValueError) as exc:
        raise ValueError(f"discovery: cannot load a Kubernetes client configuration: "
                         f"{exc}") from exc
    return k8s.ApiClient(configuration)


class KubernetesDiscovery:
    """Discovery of one router (see the module docstring). ``start`` inside the event
    loop; ``close`` stops every watch (the workers stay until the registry closes)."""

    def __init__(self, config: RouterConfig, registry: WorkerRegistry, models: Models,
                 session: aiohttp.ClientSession) -> None:
        self._config = config.discovery
        self.status = DiscoveryStatus(self._config.kind, self._config.namespace)
        self._workers = DiscoveredWorkers(config, registry, models, session, self.status)
        self._api: k8s.ApiClient | None = None
        self._pods: ListWatch | None = None
        self._pods_task: asyncio.Task[None] | None = None
        self._pool: ListWatch | None = None
        self._pool_task: asyncio.Task[None] | None = None
        self._target: tuple[dict[str, str], tuple[int, ...]] | None = None

    async def start(self) -> None:
        """Load the client configuration (ValueError if none), then start watching."""
        self._api = await api_client(self._config)
        if self._config.owner_kind is None and self._config.service_account is None:
            log.warning("discovery trusts every pod with the labels %s: set discovery."
                        "owner_kind and owner_name, or service_account (docs/kubernetes.md)",
                        label_selector(self._config.selector) or "of the InferencePool")
        self._workers.start()
        if self._config.kind == "kubernetes":
            self._watch_pods(dict(self._config.selector), ())
            return
        objects = k8s.CustomObjectsApi(self._api)

        def list_pools(**query):
            return objects.list_namespaced_custom_object(
                POOL_GROUP, POOL_VERSION, self._config.namespace, POOL_PLURAL, **query)

        self._pool = ListWatch(
            f"InferencePool {self._config.pool}", list_pools,
            {"field_selector": f"metadata.name={self._config.pool}"}, self._config,
            self.status, self._pool_changed)
        self._pool_task = asyncio.create_task(self._pool.run())

    async def close(self) -> None:
        """Stop watching and reconciling."""
        for task in (self._pool_task, self._pods_task):
            if task is not None:
                await cancel_and_wait(task)
        await self._workers.close()
        if self._api is not None:
            await self._api.close()

    def _watch_pods(self, selector: dict[str, str], ports: tuple[int, ...]) -> None:
        assert self._api is not None
        if self._pods_task is not None:
            self._pods_task.cancel()
        core = k8s.CoreV1Api(self._api)
        namespace = self._config.namespace

        def list_pods(**query):
            return core.list_namespaced_pod(namespace, **query)

        pods = ListWatch("pods", list_pods, {"label_selector": label_selector(selector)},
                         self._config, self.status, lambda: self._pods_changed(pods, ports))
        self._pods = pods
        self._pods_task = asyncio.create_task(pods.run())

    def _pods_changed(self, pods: ListWatch, ports: tuple[int, ...]) -> None:
        if pods is not self._pods:
            return
        wanted: dict[str, PodEndpoint] = {}
        refused: dict[str, tuple[str, str, str]] = {}
        for uid, pod in pods.objects.items():
            if (why := refusal(pod, self._config)) is not None:
                refused[uid] = (str((pod.get("metadata") or {}).get("name") or uid), *why)
                continue
            for endpoint in pod_endpoints(pod, self._config, ports):
                wanted[endpoint.worker_id] = endpoint
        self.status.refuse(refused)
        self._workers.want(wanted)

    def _pool_changed(self) -> None:
        assert self._pool is not None
        targets = [t for pool in self._pool.objects.values()
                   if (t := pool_target(pool)) is not None]
        target = targets[0] if targets else None
        if target == self._target:
            return
        self._target = target
        if target is None:
            log.warning("InferencePool %s/%s: absent or without a selector and target "
                        "ports: no workers", self._config.namespace, self._config.pool)
            if self._pods_task is not None:
                self._pods_task.cancel()
            self._pods = self._pods_task = None
            self.status.refuse({})
            self._workers.want({})
            return
        log.info("InferencePool %s/%s selects %s on ports %s", self._config.namespace,
                 self._config.pool, label_selector(target[0]), list(target[1]))
        self._watch_pods(*target)
