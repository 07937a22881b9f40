"""End to end: a router process whose model ``demo`` expects the demo checkpoint's weights
(``[models.demo.expect]``), in front of two worker processes serving ``demo``: ``good``
loads the demo checkpoint, ``stranger`` a copy of it with one weight changed (same
tokenizer, block size and served name, so without the table it would be ready and
routed, in a namespace of its own). The stranger is never ready and never routed: its
reason and the unmet field are in ``GET /admin/workers`` and in
``router_worker_expectation_mismatch``, and it computes no prompt of the router's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.procs import ManagedProcess, start_router, started_workers
from tests.support.metric_samples import router_metric, worker_metric
from tests.support.polling import wait_until
from tests.support.router_calls import admin, complete, worker_states
from tests.support.router_configs import WORKER_KEY, WORKER_KEY_ENV, keyed_demo_config, to_toml
from workers.model.demo import write_demo_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e_expectations")]


def other_weights(root: Path) -> Path:
    """The demo checkpoint in ``root`` with one weight of its first layer changed."""
    path = write_demo_checkpoint(root)
    weights = load_file(path / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    weights[name] = weights[name] + torch.tensor(2.0**-8)
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[ManagedProcess, dict[str, ManagedProcess]]]:
    stranger = other_weights(tmp_path_factory.mktemp("stranger"))
    flags = {"good": ((), WORKER_KEY),
             "stranger": (("--model", str(stranger), "--served-model-name", "demo"), WORKER_KEY)}
    with started_workers(flags) as workers:
        config = keyed_demo_config({n: w.url for n, w in workers.items()})
        config["models"]["demo"]["expect"] = {
            "weights_digest": weights_digest(workers["good"]), "kv_dtype": "float32",
            "kv_scales_digest": "none", "min_engine_version": "0.1"}
        path = tmp_path_factory.mktemp("router") / "router.toml"
        path.write_text(to_toml(config))
        router = start_router(path, env={WORKER_KEY_ENV: WORKER_KEY})
        try:
            wait_until(lambda: worker_states(router)["good"] == "ready", 60,
                       lambda: f"good ready: {worker_states(router)}")
            yield router, workers
        finally:
            router.stop()


def weights_digest(worker: ManagedProcess) -> str:
    status, ready = worker.get_json("/ready")
    assert status == 200, ready
    return ready["namespace"]["weights_digest"]


def test_the_stranger_is_not_ready_and_says_which_expectation_it_misses(cluster):
    router, workers = cluster
    good, stranger = weights_digest(workers["good"]), weights_digest(workers["stranger"])
    assert good != stranger
    listed = {w["id"]: w for w in admin(router, "/admin/workers")["workers"]}
    assert listed["good"]["ready"] and listed["good"]["expectation_mismatches"] == []
    refused = listed["stranger"]
    assert not refused["ready"]
    assert refused["reason"] == (f"does not meet models.demo.expect: weights_digest: expected "
                                 f"{good!r}, reported {stranger!r}")
    assert refused["expectation_mismatches"] == [
        {"field": "weights_digest", "expected": good, "reported": stranger}]
    for worker, field, value in (("stranger", "weights_digest", 1), ("stranger", "kv_dtype", 0),
                                 ("good", "weights_digest", 0)):
        assert router_metric(router, "router_worker_expectation_mismatch",
                             {"worker": worker, "field": field}) == value
    assert "worker stranger not routed: does not meet models.demo.expect" in router.log_text()


def test_no_request_reaches_the_stranger(cluster):
    router, workers = cluster

    def served() -> dict[str, float]:  # its start-up self-test computed a prompt or two
        return {name: worker_metric(worker, "prompt_tokens_total")
                for name, worker in workers.items()}

    before = served()
    for i in range(8):
        status, answer = complete(router, f"Request {i}: where does it go?", max_tokens=2)
        assert status == 200, answer
    after = served()
    assert after["stranger"] == before["stranger"] and after["good"] > before["good"]
    assert router_metric(router, "router_prompt_tokens_total", {"worker": "good"}) > 0
    with pytest.raises(AssertionError, match="no sample"):
        router_metric(router, "router_prompt_tokens_total", {"worker": "stranger"})
