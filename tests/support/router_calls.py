"""HTTP calls to a router process (a ``ManagedProcess``, or the base URL of one a test
did not start itself), as the tenants and the admin of ``tests.support.router_configs``."""

from __future__ import annotations

from typing import Any

from openai import OpenAI

from harness.procs import ManagedProcess, http_json
from tests.support.polling import wait_until
from tests.support.router_configs import ADMIN, ALICE

Router = ManagedProcess | str
# Test completions ask for exactly max_tokens: the random demo model may emit EOS at
# any step.
FULL_LENGTH = {"ignore_eos": True}


def base_url(router: Router) -> str:
    """The router's base URL."""
    return router if isinstance(router, str) else router.url


def admin(router: Router, path: str, body: object = None, key: str = ADMIN) -> Any:
    """GET ``path`` (POST ``body`` when given) with the admin ``key``; the JSON answer,
    which must be a 200."""
    status, result = http_json("GET" if body is None else "POST", f"{base_url(router)}{path}",
                               body, {"Authorization": f"Bearer {key}"})
    assert status == 200, result
    return result


def complete(router: Router, prompt: str, key: str = ALICE, model: str = "demo",
             max_tokens: int = 2, full_length: bool = True, timeout_s: float = 60.0,
             **fields: object) -> tuple[int, Any]:
    """POST ``/v1/completions`` for ``prompt`` as the tenant of ``key`` (``fields`` are
    further body fields: ``temperature``...), with ``full_length`` asking for exactly
    ``max_tokens``; (status, JSON answer)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens,
            **(FULL_LENGTH if full_length else {}), **fields}
    return http_json("POST", f"{base_url(router)}/v1/completions", body,
                     {"Authorization": f"Bearer {key}"}, timeout_s=timeout_s)


def openai_client(router: Router, key: str = ALICE) -> OpenAI:
    """The openai client on the router for the tenant of ``key``, without retries."""
    return OpenAI(base_url=f"{base_url(router)}/v1", api_key=key, max_retries=0)


def openai_complete(router: Router, prompt: str, key: str = ALICE, max_tokens: int = 2,
                    model: str = "demo") -> Any:
    """A completion of exactly ``max_tokens`` through the openai client: its answer
    object (a refusal raises the client's exception)."""
    return openai_client(router, key).completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, extra_body=FULL_LENGTH)


def num_ready_workers(router: Router) -> int:
    """How many ready workers the router's ``/health`` counts."""
    return http_json("GET", f"{base_url(router)}/health")[1]["num_ready_workers"]


def worker_states(router: Router) -> dict[str, str]:
    """Each worker's id and its readiness reason (``ready`` when ready), from the admin
    API."""
    return {w["id"]: w["reason"] for w in admin(router, "/admin/workers")["workers"]}


def wait_until_ready(router: Router, timeout_s: float = 60.0) -> None:
    """Wait until every worker of ``router`` is ready."""
    wait_until(lambda: set(worker_states(router).values()) == {"ready"}, timeout_s,
               lambda: f"every worker ready: {worker_states(router)}")
