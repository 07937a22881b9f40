"""Which pods are workers, and where they serve: pure functions over pod objects as the
Kubernetes API writes them (decoded JSON).

A pod is a worker while it is ``Running``, its ``Ready`` condition is ``True``, it has
a ``podIP`` and no ``deletionTimestamp`` (``serves``). Anything else (pending, not
ready, evicted with ``podIP: null``, being deleted) is not, whatever the event that
brought it: the watcher judges each pod by its whole state, never by the event type
alone. One pod is one worker per port: its id is the pod's name (a DNS-1123 name,
so a canonical worker id), or ``NAME-PORT`` when the pod serves several ports.

A pod (serving or not) is trusted only if ``refusal`` finds nothing: its controller is
the configured workload, it runs as the configured service account, and its role is
one the config allows. Labels alone never make a pod a worker when those are set.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from router.config import DiscoveryConfig

REFUSAL_REASONS = ("owner", "service_account", "role")


@dataclass(frozen=True)
class PodEndpoint:
    """One worker a pod offers: its id, the pod's UID and address, the model it serves
    (None: ask its ``/v1/models``), its role, and a vLLM pod's ZMQ KV event ports."""

    worker_id: str
    uid: str
    ip: str
    port: int
    model: str | None
    role: str = "both"
    kv_events_port: int | None = None
    kv_events_replay_port: int | None = None

    @property
    def url(self) -> str:
        """``http://IP:PORT`` (an IPv6 address in brackets)."""
        return f"http://{_host(self.ip)}:{self.port}"

    def zmq(self, port: int | None) -> str | None:
        """``tcp://IP:PORT`` for a KV event port, None without one."""
        return None if port is None else f"tcp://{_host(self.ip)}:{port}"


def _host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip


def serves(pod: Mapping[str, Any]) -> bool:
    """Whether ``pod`` may take requests: Running, Ready, with an IP, not being deleted."""
    status = pod.get("status") or {}
    metadata = pod.get("metadata") or {}
    if metadata.get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    if not _valid_ip(status.get("podIP")):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in status.get("conditions") or () if isinstance(c, Mapping))


def _valid_ip(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def uid_of(pod: Mapping[str, Any]) -> str | None:
    """The pod's UID, None when it has none (such an object is ignored)."""
    uid = (pod.get("metadata") or {}).get("uid")
    return uid if isinstance(uid, str) and uid else None


def pod_endpoints(pod: Mapping[str, Any], config: DiscoveryConfig,
                  ports: tuple[int, ...] = ()) -> tuple[PodEndpoint, ...]:
    """The workers ``pod`` offers now: none unless it ``serves``; one per port of
    ``ports`` (an InferencePool's target ports) or else the one port the config
    names (``port``, or the container port called ``port_name``; a pod without it
    offers none)."""
    if not serves(pod):
        return ()
    metadata = pod.get("metadata") or {}
    name, uid = metadata.get("name"), uid_of(pod)
    if not isinstance(name, str) or not name or uid is None:
        return ()
    ports = ports or _config_port(pod, config)
    labels = _strings(metadata.get("labels"))
    notes = _strings(metadata.get("annotations"))
    model = labels.get(config.model_label) or notes.get(config.model_label) or config.model
    role = _role(metadata, config)
    kv_events = _port(notes.get(config.kv_events_port_annotation))
    replay = _port(notes.get(config.kv_events_replay_port_annotation))
    ip = pod["status"]["podIP"]
    return tuple(
        PodEndpoint(name if len(ports) == 1 else f"{name}-{port}", uid, ip, port, model,
                    role, kv_events, replay if kv_events is not None else None)
        for port in ports)


def refusal(pod: Mapping[str, Any], config: DiscoveryConfig) -> tuple[str, str] | None:
    """Why ``pod`` must not become a worker, as (reason, detail) with a reason of
    ``REFUSAL_REASONS``; None when it passes every configured check: its controller
    is ``owner_kind`` ``owner_name``, it runs as ``service_account``, its role is
    one of ``roles``."""
    metadata = pod.get("metadata") or {}
    if config.owner_kind is not None and not _owned_by(metadata, config):
        controller = _controller(metadata)
        found = f"{controller[0]} {controller[1]!r}" if controller else "none"
        return "owner", (f"its controller is {found}, not {config.owner_kind} "
                         f"{config.owner_name!r}")
    account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
    if config.service_account is not None and account != config.service_account:
        return "service_account", (f"it runs as service account {account!r}, not "
                                   f"{config.service_account!r}")
    role = _role(metadata, config)
    if role not in config.roles:
        return "role", f"its role {role!r} is not in discovery.roles {list(config.roles)}"
    return None


def _controller(metadata: Mapping[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the owner reference marked ``controller``, None without one."""
    for ref in metadata.get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return str(ref.get("kind")), str(ref.get("name"))
    return None


def _owned_by(metadata: Mapping[str, Any], config: DiscoveryConfig) -> bool:
    """Whether the pod's controller is the configured workload. A Deployment's pods
    are controlled by its ReplicaSet ``NAME-HASH``, HASH being their
    ``pod-template-hash`` label."""
    controller = _controller(metadata)
    if config.owner_kind == "Deployment":
        template = _strings(metadata.get("labels")).get("pod-template-hash")
        return template is not None and controller == ("ReplicaSet",
                                                       f"{config.owner_name}-{template}")
    return controller == (config.owner_kind, config.owner_name)


def _role(metadata: Mapping[str, Any], config: DiscoveryConfig) -> str:
    """The role the pod's ``role_label`` label or annotation names; ``both`` without."""
    return (_strings(metadata.get("labels")).get(config.role_label)
            or _strings(metadata.get("annotations")).get(config.role_label) or "both")


def _config_port(pod: Mapping[str, Any], config: DiscoveryConfig) -> tuple[int, ...]:
    if config.port is not None:
        return (config.port,)
    for container in (pod.get("spec") or {}).get("containers") or ():
        for port in container.get("ports") or ():
            if port.get("name") == config.port_name and _port(port.get("containerPort")):
                return (int(port["containerPort"]),)
    return ()


def _strings(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def _port(value: object) -> int | None:
    """A port number from an int or a decimal string; None for anything else."""
    if isinstance(value, str) and value.isdecimal():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535:
        return value
    return None


def pool_target(pool: Mapping[str, Any]) -> tuple[dict[str, str], tuple[int, ...]] | None:
    """(label selector, target ports) of an InferencePool (``inference.networking.k8s.io/v1``:
    ``spec.selector.matchLabels`` and ``spec.targetPorts[].number``); None when the
    object has no usable selector or port."""
    spec = pool.get("spec") or {}
    selector = _strings((spec.get("selector") or {}).get("matchLabels"))
    ports = tuple(p for p in (_port((t or {}).get("number"))
                              for t in spec.get("targetPorts") or ()) if p is not None)
    if not selector or not ports:
        return None
    return selector, tuple(dict.fromkeys(ports))


def label_selector(labels: Mapping[str, str]) -> str:
    """``k1=v1,k2=v2``: the ``labelSelector`` query value matching every label."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
