"""Which pods are workers and where they serve (``router.fleet.discovery.pods``),
against the rule written out case by case."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.config import DiscoveryConfig
from router.fleet.discovery.pods import (
    PodEndpoint,
    label_selector,
    pod_endpoints,
    pool_target,
    refusal,
    serves,
)

CONFIG = DiscoveryConfig(kind="kubernetes", selector={"app": "w"}, port_name="http")


def pod(phase: str = "Running", ip: object = "10.1.2.3", ready: object = "True",
        deleting: bool = False, name: str = "w-0", uid: object = "u-1",
        labels: dict | None = None, annotations: dict | None = None,
        ports: list | None = None) -> dict:
    """A pod object as the API server writes it."""
    metadata = {"name": name, "uid": uid, "labels": labels or {},
                "annotations": annotations or {}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-05T00:00:00Z"
    conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    return {"metadata": metadata,
            "spec": {"containers": [{"name": "c", "ports": ports if ports is not None else [
                {"name": "http", "containerPort": 8000}]}]},
            "status": {"phase": phase, "podIP": ip, "conditions": conditions}}


@given(phase=st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown"]),
       ip=st.sampled_from([None, "", "10.0.0.1", "fd00::1", "not-an-ip"]),
       ready=st.sampled_from([None, "True", "False", "Unknown"]),
       deleting=st.booleans())
def test_a_pod_serves_exactly_when_running_ready_addressed_and_not_deleted(phase, ip, ready,
                                                                          deleting):
    expected = (phase == "Running" and ip in ("10.0.0.1", "fd00::1") and ready == "True"
                and not deleting)
    p = pod(phase, ip, ready, deleting)
    assert serves(p) == expected
    assert bool(pod_endpoints(p, CONFIG)) == expected


def test_an_evicted_pod_offers_nothing():
    evicted = pod(phase="Failed", ip=None, ready="False")
    evicted["status"]["reason"] = "Evicted"
    assert pod_endpoints(evicted, CONFIG) == ()


def test_the_endpoint_takes_the_named_port_labels_and_annotations():
    p = pod(labels={"radix-router/model": "demo", "radix-router/role": "decode"},
            annotations={"radix-router/kv-events-port": "5557",
                         "radix-router/kv-events-replay-port": "5558"})
    assert pod_endpoints(p, CONFIG) == (
        PodEndpoint("w-0", "u-1", "10.1.2.3", 8000, "demo", "decode", 5557, 5558),)
    (endpoint,) = pod_endpoints(p, CONFIG)
    assert endpoint.url == "http://10.1.2.3:8000"
    assert endpoint.zmq(endpoint.kv_events_port) == "tcp://10.1.2.3:5557"


def test_a_model_from_an_annotation_or_the_config_and_ipv6_in_brackets():
    config = DiscoveryConfig(kind="kubernetes", selector={"a": "b"}, port=9000, model="m")
    (endpoint,) = pod_endpoints(pod(ip="fd00::7"), config)
    assert (endpoint.model, endpoint.url, endpoint.port) == ("m", "http://[fd00::7]:9000", 9000)
    (endpoint,) = pod_endpoints(pod(annotations={"radix-router/model": "n"}), config)
    assert endpoint.model == "n"


def test_without_the_named_port_or_a_uid_a_pod_offers_nothing():
    assert pod_endpoints(pod(ports=[{"name": "metrics", "containerPort": 9090}]), CONFIG) == ()
    assert pod_endpoints(pod(uid=None), CONFIG) == ()
    bad = pod(annotations={"radix-router/kv-events-port": "99999"})
    assert pod_endpoints(bad, CONFIG)[0].kv_events_port is None


def test_several_ports_are_several_workers_named_by_port():
    endpoints = pod_endpoints(pod(name="p"), CONFIG, ports=(8000, 8001))
    assert [(e.worker_id, e.port) for e in endpoints] == [("p-8000", 8000), ("p-8001", 8001)]


def test_an_inference_pool_gives_its_selector_and_unique_ports():
    pool = {"spec": {"selector": {"matchLabels": {"app": "vllm", "tier": "x"}},
                     "targetPorts": [{"number": 8000}, {"number": 8000}, {"number": 8001}]}}
    assert pool_target(pool) == ({"app": "vllm", "tier": "x"}, (8000, 8001))
    assert label_selector({"tier": "x", "app": "vllm"}) == "app=vllm,tier=x"
    assert pool_target({"spec": {"selector": {"matchLabels": {}},
                                 "targetPorts": [{"number": 1}]}}) is None
    assert pool_target({"spec": {"selector": {"matchLabels": {"a": "b"}}}}) is None


def owned(p: dict, kind: str, name: str, controller: bool = True,
          account: str | None = None) -> dict:
    """``p`` with an owner reference (a controller's unless told) and a service account."""
    p["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": kind, "name": name,
                                         "uid": "o-1", "controller": controller}]
    if account is not None:
        p["spec"]["serviceAccountName"] = account
    return p


def test_an_owner_is_the_pods_controller_and_a_deployment_is_seen_through_its_replicaset():
    sts = DiscoveryConfig(kind="kubernetes", selector={"a": "b"}, port_name="http",
                          owner_kind="StatefulSet", owner_name="w")
    assert refusal(owned(pod(), "StatefulSet", "w"), sts) is None
    assert refusal(owned(pod(), "StatefulSet", "w", controller=False), sts)[0] == "owner"
    assert refusal(owned(pod(), "StatefulSet", "other"), sts)[0] == "owner"
    assert refusal(pod(), sts) == ("owner", "its controller is none, not StatefulSet 'w'")
    deploy = DiscoveryConfig(kind="kubernetes", selector={"a": "b"}, port_name="http",
                             owner_kind="Deployment", owner_name="w")
    hashed = {"pod-template-hash": "5d8f7b"}
    assert refusal(owned(pod(labels=hashed), "ReplicaSet", "w-5d8f7b"), deploy) is None
    assert refusal(owned(pod(labels=hashed), "ReplicaSet", "w-x-5d8f7b"), deploy)[0] == "owner"
    assert refusal(owned(pod(), "ReplicaSet", "w-5d8f7b"), deploy)[0] == "owner"
    assert refusal(owned(pod(labels=hashed), "Deployment", "w"), deploy)[0] == "owner"


def test_a_service_account_must_match_and_a_pod_without_one_runs_as_default():
    config = DiscoveryConfig(kind="kubernetes", selector={"a": "b"}, port_name="http",
                             service_account="radix-worker")
    assert refusal(owned(pod(), "StatefulSet", "w", account="radix-worker"), config) is None
    assert refusal(pod(), config) == (
        "service_account", "it runs as service account 'default', not 'radix-worker'")


def test_a_role_label_is_honoured_only_when_the_config_allows_it():
    decode = pod(labels={"radix-router/role": "decode"})
    assert refusal(pod(), CONFIG) is None  # no label: both, allowed by default
    assert refusal(decode, CONFIG)[0] == "role"
    assert refusal(pod(annotations={"radix-router/role": "prefill"}), CONFIG)[0] == "role"
    allowing = DiscoveryConfig(kind="kubernetes", selector={"a": "b"}, port_name="http",
                               roles=("both", "decode"))
    assert refusal(decode, allowing) is None
    assert pod_endpoints(decode, allowing)[0].role == "decode"
    assert refusal(pod(labels={"radix-router/role": "boss"}), allowing)[0] == "role"


def test_an_owner_needs_both_its_kind_and_its_name():
    with pytest.raises(ValueError, match="owner_name: give owner_kind and owner_name"):
        DiscoveryConfig(kind="kubernetes", selector={"a": "b"}, port=1, owner_kind="StatefulSet")
