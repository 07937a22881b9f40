"""The manifests in deploy/kubernetes: every built-in object validates (strictly: no
unknown field) against the Kubernetes OpenAPI schemas ``kubernetes-validate`` ships,
offline; the InferencePool against the v1 API's required shape; and the pieces agree
with each other (the router's config parses, its discovery selects the worker pods on
a port they name, its RBAC grants what the watcher calls, its secrets are the
variables the config reads). ``trust_problems`` checks who may reach what: Redis asks
for a password from a Secret (never written in a manifest) and only routers reach it,
the router's metrics only from the monitoring namespace when they listen off loopback,
workers' HTTP (radix and vLLM, ZMQ ports included) only from routers, radix workers'
KV transfer port only from workers; mutated copies show each check fails."""

from __future__ import annotations

import copy
import ipaddress
import re
import tomllib
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from router.config import redis_url_problem
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
    assert config.redis.url is None  # it comes from $RADIX_REDIS_URL, password and all
    assert config.redis.url_env == "RADIX_REDIS_URL"
    assert find("redis", "Service")["metadata"]["name"] == "radix-redis"


# ---- who may reach what ---------------------------------------------------------------

MONITORING = {"kubernetes.io/metadata.name": "monitoring"}
WORKLOADS = {"router": ("router", "Deployment"), "redis": ("redis", "Deployment"),
             "radix-worker": ("radix-workers", "StatefulSet"),
             "vllm": ("vllm-workers", "Deployment")}


def shipped() -> dict[str, list[dict]]:
    """Every manifest's objects, by file name (mutable copies)."""
    return {name: documents(name) for name in ALL}


def workload(manifests: dict[str, list[dict]], component: str) -> dict:
    """The pod template of one of ``WORKLOADS``."""
    name, kind = WORKLOADS[component]
    (found,) = [d for d in manifests[name] if d["kind"] == kind]
    return found["spec"]["template"]


def peers(manifests: dict[str, list[dict]], component: str, port: str) -> list[dict] | None:
    """The ``from`` peers of every ingress rule letting traffic reach ``port`` (a container
    port name) of ``component``'s pods; ``{}`` stands for anyone; None when no policy
    selects the pods, so that anyone reaches every port."""
    template = workload(manifests, component)
    labels = template["metadata"]["labels"]
    numbers = {p["name"]: p["containerPort"] for c in template["spec"]["containers"]
               for p in c.get("ports", [])}
    selecting = [d for docs in manifests.values() for d in docs
                 if d["kind"] == "NetworkPolicy"
                 and "Ingress" in d["spec"].get("policyTypes", ["Ingress"])
                 and d["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()]
    if not selecting:
        return None
    found: list[dict] = []
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports is None or any(p.get("port") in (port, numbers.get(port)) for p in ports):
                found += rule.get("from") or [{}]
    return found


def only_pods_of(manifests: dict[str, list[dict]], target: str, port: str,
                 source: str) -> str | None:
    """What lets others than ``source``'s pods (same namespace) reach ``target``'s port."""
    found = peers(manifests, target, port)
    if found is None:
        return f"no NetworkPolicy guards {target}:{port}"
    labels = {name: workload(manifests, name)["metadata"]["labels"].items() for name in WORKLOADS}
    for peer in found:
        selected = peer.get("podSelector", {}).get("matchLabels", {}).items()
        if set(peer) != {"podSelector"} or not selected or not selected <= labels[source] or any(
                selected <= theirs for name, theirs in labels.items() if name != source):
            return f"{target}:{port} is open to {peer or 'anyone'}, not only {source} pods"
    return None


def metrics_problem(manifests: dict[str, list[dict]]) -> str | None:
    """What lets others than the monitoring namespace reach metrics off loopback."""
    (configmap,) = [d for d in manifests["router"] if d["kind"] == "ConfigMap"]
    host = parse_config(tomllib.loads(configmap["data"]["router.toml"])).metrics.host
    if host == "localhost" or ipaddress.ip_address(host).is_loopback:
        return None
    found = peers(manifests, "router", "metrics")
    if found is None:
        return f"metrics listen on {host} and no NetworkPolicy guards them"
    for peer in found:
        if set(peer) - {"namespaceSelector", "podSelector"} or peer.get(
                "namespaceSelector", {}).get("matchLabels") != MONITORING:
            return f"metrics on {host} are open to {peer or 'anyone'}, not only monitoring"
    return None


def secret_env(container: dict) -> dict[str, tuple[str, str]]:
    """Each variable of ``container`` taken from a Secret: (secret, key)."""
    return {e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
            for e in container.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}


def redis_password(manifests: dict[str, list[dict]]) -> tuple[str, str] | None:
    """The Secret (name, key) Redis's ``requirepass`` reads, None without one."""
    (redis,) = workload(manifests, "redis")["spec"]["containers"]
    script = " ".join(redis.get("command", []) + redis.get("args", []))
    match = re.search(r"requirepass\s+\$\{?(\w+)", script)
    return secret_env(redis).get(match.group(1)) if match else None


def router_redis_problem(manifests: dict[str, list[dict]], password: tuple[str, str]) -> str | None:
    """What is wrong with how the routers give Redis its password."""
    (router,) = workload(manifests, "router")["spec"]["containers"]
    (configmap,) = [d for d in manifests["router"] if d["kind"] == "ConfigMap"]
    if parse_config(tomllib.loads(configmap["data"]["router.toml"])).redis.url is not None:
        return "router.toml names the Redis URL: its password would be in the ConfigMap"
    if "--redis-url" in router["args"]:
        return "the router's --redis-url puts the password on its command line"
    variable = parse_config(tomllib.loads(configmap["data"]["router.toml"])).redis.url_env
    url = {e["name"]: e.get("value", "") for e in router["env"]}.get(variable or "", "")
    uses = re.findall(r"\$\((\w+)\)", url)
    if not uses or secret_env(router).get(uses[0]) != password:
        return f"the router's redis.url_env ${variable} does not take {password} from its Secret"
    return redis_url_problem(url.replace(f"$({uses[0]})", "0f" * 16))


def trust_problems(manifests: dict[str, list[dict]]) -> list[str]:
    """Every way the manifests trust more than they must (module docstring)."""
    password = redis_password(manifests)
    problems = [None if password else "Redis asks for no password from a Secret",
                password and router_redis_problem(manifests, password),
                only_pods_of(manifests, "redis", "redis", "router"),
                metrics_problem(manifests),
                only_pods_of(manifests, "radix-worker", "http", "router"),
                only_pods_of(manifests, "radix-worker", "kv-transfer", "radix-worker"),
                *(only_pods_of(manifests, "vllm", port, "router")
                  for port in ("http", "kv-events", "kv-replay"))]
    return [p for p in problems if p]


def test_the_shipped_manifests_trust_only_whom_they_must():
    assert trust_problems(shipped()) == []


def test_the_worker_is_ready_on_ready_with_its_key_and_the_router_on_health():
    (worker,) = workload(shipped(), "radix-worker")["spec"]["containers"]
    probe = "\n".join(worker["readinessProbe"]["exec"]["command"])
    assert "/ready" in probe and 'os.environ["RADIX_WORKER_API_KEY"]' in probe
    assert "RADIX_WORKER_API_KEY" in secret_env(worker)
    (router,) = workload(shipped(), "router")["spec"]["containers"]
    assert router["readinessProbe"]["httpGet"]["path"] == "/health"  # its only readiness


def _drop_policy(name: str):
    def mutate(manifests):
        manifests[name] = [d for d in manifests[name] if d["kind"] != "NetworkPolicy"]
    return mutate


def _no_redis_auth(manifests):
    (redis,) = workload(manifests, "redis")["spec"]["containers"]
    redis.pop("command")
    redis["args"] = ["--save", "", "--appendonly", "no"]


def _literal_password(manifests):
    (redis,) = workload(manifests, "redis")["spec"]["containers"]
    redis["args"] = ['exec redis-server --requirepass hunter2']


def _url_in_config(manifests):
    (configmap,) = [d for d in manifests["router"] if d["kind"] == "ConfigMap"]
    configmap["data"]["router.toml"] = configmap["data"]["router.toml"].replace(
        'url_env = "RADIX_REDIS_URL"', 'url = "redis://:hunter2@radix-redis:6379"')


def _redis_open_to_namespace(manifests):
    (policy,) = [d for d in manifests["redis"] if d["kind"] == "NetworkPolicy"]
    policy["spec"]["ingress"][0]["from"] = [{"podSelector": {}}]


def _metrics_from_any_address(manifests):
    (policy,) = [d for d in manifests["router"] if d["kind"] == "NetworkPolicy"]
    policy["spec"]["ingress"][1]["from"] = [{"ipBlock": {"cidr": "0.0.0.0/0"}}]


def _metrics_to_everyone(manifests):
    (policy,) = [d for d in manifests["router"] if d["kind"] == "NetworkPolicy"]
    policy["spec"]["ingress"] = [{}]


@pytest.mark.parametrize("mutate,problem", [
    (_no_redis_auth, "Redis asks for no password"),
    (_literal_password, "Redis asks for no password"),
    (_url_in_config, "router.toml names the Redis URL"),
    (_drop_policy("redis"), "no NetworkPolicy guards redis:redis"),
    (_redis_open_to_namespace, "redis:redis is open to"),
    (_drop_policy("router"), "metrics listen on 0.0.0.0 and no NetworkPolicy"),
    (_metrics_from_any_address, "metrics on 0.0.0.0 are open to {'ipBlock'"),
    (_metrics_to_everyone, "metrics on 0.0.0.0 are open to anyone"),
    (_drop_policy("radix-workers"), "no NetworkPolicy guards radix-worker:http"),
    (_drop_policy("vllm-workers"), "no NetworkPolicy guards vllm:http"),
])
def test_each_trust_check_fails_on_a_manifest_that_breaks_it(mutate, problem):
    manifests = shipped()
    mutate(manifests)
    assert any(p.startswith(problem) for p in trust_problems(manifests)), trust_problems(manifests)
