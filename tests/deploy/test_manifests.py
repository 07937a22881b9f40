"""The manifests in deploy/kubernetes: every built-in object validates (strictly: no
unknown field) against the Kubernetes OpenAPI schemas ``kubernetes-validate`` ships,
offline; the InferencePool against the v1 API's required shape; and the pieces agree
with each other (the router's config parses, its discovery selects the worker pods on
a port they name, its RBAC grants what the watcher calls, its secrets are the
variables the config reads)."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from router.config_toml import parse_config
from router.fleet.discovery.pods import pod_endpoints, pool_target

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
K8S_VERSION = kubernetes_validate.utils.latest_version()
# inference.networking.k8s.io/v1 InferencePool, as its API reference defines the fields
# the router reads and the ones the API server requires (selector, targetPorts: 1-8
# unique ports, endpointPickerRef with a name).
INFERENCE_POOL_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "inference.networking.k8s.io/v1"},
        "kind": {"const": "InferencePool"},
        "spec": {
            "type": "object",
            "required": ["selector", "targetPorts", "endpointPickerRef"],
            "additionalProperties": False,
            "properties": {
                "selector": {"type": "object", "required": ["matchLabels"],
                             "properties": {"matchLabels": {
                                 "type": "object", "minProperties": 1,
                                 "additionalProperties": {"type": "string"}}}},
                "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8,
                                "uniqueItems": True, "items": {
                                    "type": "object", "required": ["number"],
                                    "additionalProperties": False,
                                    "properties": {"number": {"type": "integer", "minimum": 1,
                                                              "maximum": 65535}}}},
                "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
                "endpointPickerRef": {"type": "object", "required": ["name"]},
            },
        },
    },
}


def documents(name: str) -> list[dict]:
    """The objects of ``deploy/kubernetes/NAME.yaml``."""
    return [d for d in yaml.safe_load_all((DEPLOY / f"{name}.yaml").read_text()) if d]


def find(name: str, kind: str) -> dict:
    """The one object of ``kind`` in ``NAME.yaml``."""
    (found,) = [d for d in documents(name) if d["kind"] == kind]
    return found


ALL = sorted(p.stem for p in DEPLOY.glob("*.yaml"))


@pytest.mark.parametrize("name", ALL)
def test_every_manifest_validates_against_the_kubernetes_schemas(name):
    for document in documents(name):
        if document["kind"] == "InferencePool":
            jsonschema.validate(document, INFERENCE_POOL_SCHEMA)
        else:
            kubernetes_validate.validate(document, K8S_VERSION, strict=True)


def test_the_validation_refuses_a_misspelt_or_mistyped_field():
    deployment = find("router", "Deployment")
    misspelt = copy.deepcopy(deployment)
    misspelt["spec"]["replicaz"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(misspelt, K8S_VERSION, strict=True)
    mistyped = copy.deepcopy(deployment)
    mistyped["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(mistyped, K8S_VERSION, strict=True)
    pool = copy.deepcopy(find("inferencepool", "InferencePool"))
    pool["spec"]["targetPorts"] = []
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(pool, INFERENCE_POOL_SCHEMA)


def router_config():
    """The router.toml of the router's ConfigMap, parsed as the router parses it."""
    return parse_config(tomllib.loads(find("router", "ConfigMap")["data"]["router.toml"]))


def running(template: dict) -> dict:
    """A pod of ``template`` as the API server shows it once it runs and is ready."""
    return {"metadata": {**template["metadata"], "name": "radix-worker-0", "uid": "u"},
            "spec": template["spec"],
            "status": {"phase": "Running", "podIP": "10.0.0.5",
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def test_the_router_discovers_the_worker_statefulset_and_the_pool_selects_it():
    config = router_config()
    workers = find("radix-workers", "StatefulSet")
    template = workers["spec"]["template"]
    assert dict(config.discovery.selector).items() <= template["metadata"]["labels"].items()
    assert workers["spec"]["selector"]["matchLabels"].items() <= \
        template["metadata"]["labels"].items()
    (endpoint,) = pod_endpoints(running(template), config.discovery)
    assert (endpoint.url, endpoint.model) == ("http://10.0.0.5:8000", "SmolLM2-135M-Instruct")
    assert endpoint.model in config.models and endpoint.role == "both"
    selector, ports = pool_target(find("inferencepool", "InferencePool"))
    assert selector.items() <= template["metadata"]["labels"].items() and ports == (8000,)


def test_the_vllm_example_offers_its_kv_event_ports():
    config = router_config()
    template = find("vllm-workers", "Deployment")["spec"]["template"]
    vllm = type(config.discovery)(kind="kubernetes", selector={"app": "vllm"},
                                  port_name="http", worker_kind="vllm")
    (endpoint,) = pod_endpoints(running(template), vllm)
    assert (endpoint.kv_events_port, endpoint.kv_events_replay_port) == (5557, 5558)
    container_ports = {p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
    assert {5557, 5558} <= container_ports


def test_the_router_has_the_permissions_and_secrets_its_config_needs():
    config = router_config()
    rules = {(g, r): set(rule["verbs"]) for rule in find("router", "Role")["rules"]
             for g in rule["apiGroups"] for r in rule["resources"]}
    assert rules[("", "pods")] >= {"get", "list", "watch"}
    assert rules[("inference.networking.k8s.io", "inferencepools")] >= {"get", "list", "watch"}
    binding = find("router", "RoleBinding")
    deployment = find("router", "Deployment")["spec"]["template"]["spec"]
    assert binding["subjects"][0]["name"] == deployment["serviceAccountName"]
    env = {e["name"] for e in deployment["containers"][0]["env"]}
    assert {config.discovery.api_key_env, config.secret.env} <= env
    probes = deployment["containers"][0]
    assert probes["readinessProbe"]["httpGet"]["path"] == "/health"
    ports = {p["name"]: p["containerPort"] for p in deployment["containers"][0]["ports"]}
    assert (ports["http"], ports["metrics"]) == (config.listen.port, config.metrics.port)
    assert config.redis.url == "redis://radix-redis:6379"
    assert find("redis", "Service")["metadata"]["name"] == "radix-redis"
