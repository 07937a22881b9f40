"""``python -m bench fuzz [--examples N]``: schemathesis against a real router and worker.

A demo worker (with a worker key) and a router in front of it run on loopback
(``fuzz_cluster``). ``fuzz`` loads each one's document from its own
``GET /openapi.json``, so what is fuzzed is what is served, and for every operation
draws generated (schema-conforming; three in four with the served model's name,
which a generator would never guess) and mutated (schema-violating) requests,
``examples`` per operation and mode (fewer when the schema allows fewer distinct
requests), sends each with the right key for the route and checks:

- no 5xx that a client caused: 500 anywhere, or any 5xx on a body schemathesis
  made invalid (``not_a_server_error`` plus ours);
- no hang: every request answers within ``timeout_s`` (else counted as a hang);
- no response slower than ``max_response_s``;
- schemathesis's conformance checks: documented status, content type, response
  body and headers; a mutated body refused with a 4xx (``negative_data_rejection``);
  a route that requires a key refuses the request without it (``ignored_auth``).

``/kv/events`` streams forever: its status and content type are checked on the
first bytes, then the connection is dropped. ``FuzzReport`` counts requests,
statuses, hangs, slow responses and check failures (with the first few samples);
``healthy_after`` then asks both servers for ``/health`` and the router for one
normal completion. Plain module (no pytest): tests/router/test_schema_fuzz.py runs
it with a small budget.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from harness.procs import ManagedProcess, http_json, start_router, start_worker
from router.front.auth import hash_key

TENANT_KEY, ADMIN_KEY, WORKER_KEY = "fuzz-tenant-key", "fuzz-admin-key", "fuzz-worker-key"
MODEL = "demo"
MODEL_VOCAB_SIZE = 262  # the demo tokenizer's: valid token ids and top_k bounds
TENANT_MAX_OUTPUT_TOKENS = 8
TEMPLATE_ROLES = ("system", "user", "assistant")
WORKER_ID, WORKER_KEY_ENV = "fuzz-target", "RADIX_WORKER_KEY_FUZZ_TARGET"
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, response_headers_conformance, negative_data_rejection,
          ignored_auth]
MAX_SAMPLES = 5


@dataclass
class FuzzReport:
    """What the fuzz saw: requests sent, statuses, hangs, slow responses, and check
    failures by check name with the first ``MAX_SAMPLES`` descriptions."""

    num_requests: int = 0
    statuses: collections.Counter = field(default_factory=collections.Counter)
    num_hangs: int = 0
    num_slow: int = 0
    slowest_s: float = 0.0
    failures: collections.Counter = field(default_factory=collections.Counter)
    answered_2xx: collections.Counter = field(default_factory=collections.Counter)
    samples: list[str] = field(default_factory=list)

    @property
    def num_500(self) -> int:
        return self.statuses[500]

    def fail(self, name: str, what: str) -> None:
        self.failures[name] += 1
        if len(self.samples) < MAX_SAMPLES:
            self.samples.append(f"{name}: {what}"[:2000])

    def summary(self) -> dict[str, object]:
        return {"requests": self.num_requests, "status_500": self.num_500,
                "hangs": self.num_hangs, "slow": self.num_slow,
                "slowest_s": round(self.slowest_s, 3),
                "statuses": dict(sorted(self.statuses.items())),
                "check_failures": dict(self.failures),
                "2xx_by_operation": dict(sorted(self.answered_2xx.items())),
                "samples": self.samples}


@dataclass(frozen=True)
class Target:
    """A server to fuzz: its URL and the headers each path is sent with."""

    name: str
    url: str
    headers_for: Callable[[str], dict[str, str]]


def fuzz(targets: list[Target], examples: int, timeout_s: float = 10.0,
         max_response_s: float = 5.0, derandomize: bool = False) -> FuzzReport:
    """Fuzz every operation of every target (see the module docstring); with
    ``derandomize`` the same requests every run."""
    report = FuzzReport()
    session = requests.Session()
    for target in targets:
        schema = schemathesis.openapi.from_url(f"{target.url}/openapi.json")
        for result in schema.get_all_operations():
            operation = result.ok()
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                _fuzz_operation(report, session, target, operation, mode, examples, timeout_s,
                                max_response_s, derandomize)
    return report


def _pin_to_model(body: dict) -> None:
    """Make a schema-valid body valid for the demo model and the tenant too (the schema
    cannot know a model's vocabulary, template or a tenant's caps): the model's name,
    token ids within the vocabulary, top_k within it, output within the tenant's cap,
    no ``best_of``, message roles the demo template renders. Else nearly every valid body is refused before the deep paths
    (tokenize, route, generate) are reached."""
    body["model"] = MODEL
    for name in ("prompt", "stop_token_ids"):
        if name in body:
            body[name] = _within_vocab(body[name])
    if isinstance(body.get("top_k"), int) and body["top_k"] > MODEL_VOCAB_SIZE:
        body["top_k"] = MODEL_VOCAB_SIZE
    for name in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(name), int):
            body[name] = min(body[name], TENANT_MAX_OUTPUT_TOKENS)
    body.pop("best_of", None)
    for message in body.get("messages") or ():
        if isinstance(message, dict) and message.get("role") not in TEMPLATE_ROLES:
            message["role"] = "user"


def _within_vocab(value: object) -> object:
    """Token ids (in lists, nested too) taken modulo the model's vocabulary."""
    if isinstance(value, bool) or not isinstance(value, (int, list)):
        return value
    if isinstance(value, int):
        return value % MODEL_VOCAB_SIZE
    return [_within_vocab(item) for item in value]


def _fuzz_operation(report: FuzzReport, session: requests.Session, target: Target, operation,
                    mode: GenerationMode, examples: int, timeout_s: float, max_response_s: float,
                    derandomize: bool) -> None:
    headers = target.headers_for(operation.path)
    streams = operation.path == "/kv/events"

    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), derandomize=derandomize)
    @given(case=operation.as_strategy(generation_mode=mode), pin_model=st.integers(0, 3))
    def run(case, pin_model: int) -> None:
        label = f"{target.name} {operation.method.upper()} {operation.path} ({mode.value})"
        if pin_model and mode is GenerationMode.POSITIVE and isinstance(case.body, dict) \
                and "model" in case.body:
            _pin_to_model(case.body)
        report.num_requests += 1
        started = time.monotonic()
        try:
            if streams:
                _check_stream(report, session, case, target.url, headers, timeout_s, label)
                return
            response = case.call(base_url=target.url, session=session, headers=headers,
                                 timeout=timeout_s)
        except requests.Timeout:
            report.num_hangs += 1
            report.fail("hang", f"{label}: no answer in {timeout_s} s: {case.body!r:.300}")
            return
        elapsed = time.monotonic() - started
        report.statuses[response.status_code] += 1
        if response.status_code < 300:
            report.answered_2xx[label] += 1
        report.slowest_s = max(report.slowest_s, elapsed)
        if elapsed > max_response_s:
            report.num_slow += 1
            report.fail("slow", f"{label}: {elapsed:.2f} s")
        if response.status_code >= 500 and mode is GenerationMode.NEGATIVE:
            report.fail("5xx on invalid input", f"{label}: {response.status_code}")
        try:
            case.validate_response(response, checks=CHECKS, headers=headers,
                                   transport_kwargs={"base_url": target.url, "headers": headers,
                                                     "timeout": timeout_s})
        except FailureGroup as group:
            for failure in group.exceptions:
                report.fail(failure.title, f"{label}: {failure}: {case.body!r:.300}")

    with contextlib.suppress(Unsatisfiable):  # a negative mode with nothing to mutate
        run()


def _check_stream(report: FuzzReport, session: requests.Session, case, url: str,
                  headers: dict[str, str], timeout_s: float, label: str) -> None:
    kwargs = case.as_transport_kwargs(base_url=url, headers=headers)
    with session.request(**kwargs, stream=True, timeout=timeout_s) as response:
        report.statuses[response.status_code] += 1
        kind = response.headers.get("Content-Type", "")
        expected = "application/x-ndjson" if response.status_code == 200 else "application/json"
        if response.status_code not in (200, 400, 401) or not kind.startswith(expected):
            report.fail("stream", f"{label}: {response.status_code} {kind}")


def healthy_after(router: ManagedProcess, worker: ManagedProcess) -> list[str]:
    """What is wrong after the fuzz: ``/health`` of both, the worker ready again within
    30 s (a probe that timed out on a loaded machine takes it out of routing until the
    next one passes), one normal completion."""
    problems = []
    for process in (router, worker):
        status, body = http_json("GET", f"{process.url}/health", timeout_s=10)
        if status != 200:
            problems.append(f"{process.url}/health: {status} {body}")
    deadline = time.monotonic() + 30
    while (http_json("GET", f"{router.url}/health", timeout_s=10)[1].get("num_ready_workers")
           or 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    status, body = http_json("POST", f"{router.url}/v1/completions",
                             {"model": "demo", "prompt": "hello", "max_tokens": 2},
                             {"Authorization": f"Bearer {TENANT_KEY}"}, timeout_s=30)
    if status != 200:
        problems.append(f"completion after the fuzz: {status} {body}")
    return problems


def router_config(worker_url: str) -> str:
    """TOML: the demo model, one tenant (small output cap: answers stay fast), the
    admin key, fast polling and the one worker."""
    return "\n".join([
        "[models.demo]", 'tokenizer = "demo"',
        "[registry]", "poll_interval_s = 0.2", "probe_timeout_s = 2.0",
        "[auth]", f'admin_key_digest = "{hash_key(ADMIN_KEY)}"',
        "[auth.tenants.fuzz]", f'key_digests = ["{hash_key(TENANT_KEY)}"]',
        "max_prompt_tokens = 1024", f"max_output_tokens = {TENANT_MAX_OUTPUT_TOKENS}",
        "[[workers]]", f'id = "{WORKER_ID}"', 'model = "demo"', f'url = "{worker_url}"',
        f'api_key_env = "{WORKER_KEY_ENV}"',
    ]) + "\n"


@contextlib.contextmanager
def fuzz_cluster() -> Iterator[tuple[ManagedProcess, ManagedProcess]]:
    """A keyed demo worker (contexts of 64 tokens: a direct request generates at most
    that many, so each answers well within ``max_response_s``) and a router in front
    of it, routable; yields (router, worker) and stops both."""
    worker = start_worker("--max-model-len", "64", kv_cache_bytes="8MiB", api_key=WORKER_KEY)
    router = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "router.toml"
            path.write_text(router_config(worker.url))
            router = start_router(path, env={WORKER_KEY_ENV: WORKER_KEY})
        deadline = time.monotonic() + 60
        while http_json("GET", f"{router.url}/health")[1]["num_ready_workers"] < 1:
            if time.monotonic() > deadline:
                raise RuntimeError("fuzz: the router never saw its worker ready")
            time.sleep(0.1)
        yield router, worker
    finally:
        if router is not None:
            router.stop()
        worker.stop()


def targets(router: ManagedProcess, worker: ManagedProcess) -> list[Target]:
    """The router (admin key on /admin routes, the tenant's elsewhere) and the worker."""
    def router_headers(path: str) -> dict[str, str]:
        key = ADMIN_KEY if path.startswith("/admin") else TENANT_KEY
        return {"Authorization": f"Bearer {key}"}

    return [Target("router", router.url, router_headers),
            Target("worker", worker.url, lambda _: {"Authorization": f"Bearer {WORKER_KEY}"})]


def main(argv: list[str]) -> dict:
    """Fuzz with ``--examples`` per operation and mode; print and return the counts."""
    parser = argparse.ArgumentParser(prog="python -m bench fuzz")
    parser.add_argument("--examples", type=int, default=200,
                        help="examples per operation and mode (about 50 operation-modes)")
    parser.add_argument("--timeout-s", type=float, default=10.0)
    parser.add_argument("--max-response-s", type=float, default=5.0)
    args = parser.parse_args(argv)
    started = time.monotonic()
    with fuzz_cluster() as (router, worker):
        report = fuzz(targets(router, worker), args.examples, args.timeout_s,
                      args.max_response_s)
        problems = healthy_after(router, worker)
    result = {**report.summary(), "unhealthy_after": problems,
              "wall_s": round(time.monotonic() - started, 1)}
    for name, value in result.items():
        print(f"{name:16} {value}")
    return result
