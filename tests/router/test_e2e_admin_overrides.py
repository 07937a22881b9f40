"""End to end: an admin override that expires, and an admin log that names the key.

A real router process (its workers need not run: the canary's weights and the admin
API work without them) with two admin keys, one named in ``auth.admin_keys`` and the
old ``auth.admin_key_digest`` (named ``admin``). Canary weights posted with
``ttl_s`` go back by themselves, and the router's log says what went back, to what,
and which key set it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.procs import ManagedProcess, http_json, start_router
from router.front.auth import hash_key
from router.up.launcher import free_port
from tests.support.polling import wait_until
from tests.support.router_configs import ADMIN, ALICE, auth_section, model_table, to_toml

# Its module-scoped router starts once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e_admin_overrides")]
OPS_KEY = "key-ops-alice"


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    nowhere = f"http://127.0.0.1:{free_port()}"  # no worker: none is needed here
    auth = auth_section({"alice": {}})
    auth["admin_keys"] = [{"name": "ops-alice", "key_digest": hash_key(OPS_KEY)}]
    config = {"models": {"demo": model_table(pools={
                  "baseline": {"workers": ["w0"], "weight": 100},
                  "candidate": {"workers": ["w1"], "weight": 0}})},
              "auth": auth,
              "workers": [{"id": w, "model": "demo", "url": nowhere} for w in ("w0", "w1")]}
    path: Path = tmp_path_factory.mktemp("router") / "router.toml"
    path.write_text(to_toml(config))
    process = start_router(path, "--log-level", "INFO")
    try:
        yield process
    finally:
        process.stop()


def post_weights(router: ManagedProcess, body: dict, key: str, request_id: str
                 ) -> tuple[int, dict]:
    status, answer = http_json("POST", f"{router.url}/admin/canary", body,
                               {"Authorization": f"Bearer {key}", "X-Request-Id": request_id})
    return status, answer  # type: ignore[return-value]


def candidate(router: ManagedProcess) -> dict:
    _, state = http_json("GET", f"{router.url}/admin/canary", None,
                         {"Authorization": f"Bearer {ADMIN}"})
    return state["models"]["demo"]["pools"]["candidate"]  # type: ignore[index]


def test_an_override_with_ttl_goes_back_by_itself_and_the_log_names_the_key(router) -> None:
    status, answer = post_weights(router, {"model": "demo", "weights": {"candidate": 30},
                                           "ttl_s": 1.5}, OPS_KEY, "override-1")
    assert status == 200, answer
    assert answer == {"model": "demo", "weights": {"baseline": 100, "candidate": 30},
                      "ttl_s": 1.5}
    override = candidate(router)["override"]
    assert candidate(router)["weight"] == 30
    assert (override["weight"], override["revert_to"], override["set_by"],
            override["request_id"]) == (30, 0, "ops-alice", "override-1")
    wait_until(lambda: candidate(router)["weight"] == 0, 15, lambda: candidate(router))
    assert candidate(router)["override"] is None
    log = wait_until(lambda: "admin override expired" in router.log_text() and router.log_text())
    assert ("admin change by key ops-alice from 127.0.0.1 (request override-1): set canary "
            "weights of model demo: {'baseline': 100.0, 'candidate': 30.0} for 1.5 s") in log
    assert ("admin override expired: model demo pool candidate: weight 30 -> 0 (set by key "
            "ops-alice, request override-1, for 1.5 s)") in log


def test_a_change_without_ttl_stays_and_the_old_admin_key_is_named_admin(router) -> None:
    status, _ = post_weights(router, {"model": "demo", "weights": {"candidate": 5}}, ADMIN,
                             "lasting-1")
    assert status == 200 and candidate(router)["override"] is None
    assert "admin change by key admin from 127.0.0.1 (request lasting-1)" in router.log_text()
    post_weights(router, {"model": "demo", "weights": {"candidate": 0}}, ADMIN, "lasting-2")


@pytest.mark.parametrize("ttl_s", [0, -1, "5", True, 10**9, None])
def test_a_bad_ttl_is_a_400_naming_it_and_changes_nothing(router, ttl_s) -> None:
    body = {"model": "demo", "weights": {"candidate": 7}, "ttl_s": ttl_s}
    if ttl_s is None:  # JSON null: no ttl, like an absent one; a tenant's key is refused
        status, answer = post_weights(router, body, ALICE, "tenant-1")
        assert status == 401, answer
    else:
        status, answer = post_weights(router, body, OPS_KEY, "bad-ttl")
        assert (status, answer["error"]["param"]) == (400, "ttl_s"), answer
    assert candidate(router)["weight"] == 0
