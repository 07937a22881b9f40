"""LoRA adapters over HTTP on one real timed worker (config-only adapters): the /ready
contract routers code against, /v1/models, ``model`` and ``/generate``'s ``adapter``,
no prefix hit across adapters, the run-time load and unload routes with their
refusals, and the metrics; and the run-time routes off without the flag."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from harness.lora_adapters import adapter_config, lora_module_flags, write_config_adapters
from harness.procs import http_json, start_worker
from tests.support.aio import serving
from workers.build import build_worker
from workers.config import LoraSettings, ModelSettings, WorkerConfig
from workers.server.app import create_app
from workers.server.state import ServerState

# Its module-scoped processes start once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("worker_lora")]
PROFILE = "timed:llama3-8b-h100"
KEY = "lora-test-key"


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    return dict(write_config_adapters(tmp_path_factory.mktemp("adapters"), 3, rank=8))


@pytest.fixture(scope="module")
def lora_root(tmp_path_factory):
    return tmp_path_factory.mktemp("lora-root")


@pytest.fixture(scope="module")
def worker(adapters, lora_root):
    process = start_worker(
        "--model", PROFILE, "--time-scale", "0.01", "--max-loras", "1",
        *lora_module_flags([("lora-0", adapters["lora-0"])]),
        json.dumps({"name": "lora-1", "path": str(adapters["lora-1"]), "base_model_name": "x"}),
        "--allow-runtime-lora-updates", "--lora-root", str(lora_root), api_key=KEY)
    yield process
    process.stop()


def complete_on_worker(worker, model: str, prompt: str) -> dict:
    status, body = worker.post_json("/v1/completions", {
        "model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0})
    assert status == 200, body
    return body


def test_ready_lists_every_adapter_and_requests_select_one(worker):
    status, ready = worker.get_json("/ready")
    assert status == 200
    assert ready["max_loras"] == 1 and ready["lora_load_ms"] is None
    assert [(a["name"], a["resident"]) for a in ready["adapters"]] == [
        ("lora-0", False), ("lora-1", False)]
    assert all(len(a["digest"]) == 64 and len(a["namespace"]) == 64 for a in ready["adapters"])
    assert len({a["namespace"] for a in ready["adapters"]} | {ready["namespace_digest"]}) == 3
    models = worker.get_json("/v1/models")[1]["data"]
    assert [(m["id"], m["parent"]) for m in models] == [
        (PROFILE, None), ("lora-0", PROFILE), ("lora-1", PROFILE)]
    status, body = worker.post_json("/generate", {"token_ids": [5, 6, 7], "adapter": "lora-0",
                                                  "sampling": {"max_tokens": 2}})
    assert status == 200, body
    ready = worker.get_json("/ready")[1]
    assert [a["resident"] for a in ready["adapters"]] == [True, False]
    assert ready["lora_load_ms"] > 0
    for path, body in (("/generate", {"token_ids": [5], "adapter": "nope"}),
                       ("/v1/completions", {"model": "nope", "prompt": "x"})):
        status, error = worker.post_json(path, body)
        assert status == 404 and error["error"]["code"] == "model_not_found", error


def test_the_same_prompt_under_two_adapters_shares_no_cached_token(worker):
    prompt = "a long shared system prompt for every adapter " * 3
    cached = [complete_on_worker(worker, model, prompt)["usage"]["prompt_tokens_details"][
        "cached_tokens"] for model in ("lora-0", "lora-1", PROFILE, "lora-1")]
    assert cached[:3] == [0, 0, 0] and cached[3] > 0
    status, metrics = worker.get_json("/metrics")
    assert status == 200
    assert "worker_lora_loads_total" in metrics and "worker_lora_resident_adapters 1.0" in metrics


def test_runtime_load_checks_the_adapter_first_and_unload_hides_it(worker, lora_root):
    def write(name: str, **fields) -> str:
        (lora_root / name).mkdir()
        config = {**adapter_config(8, 16), **fields}
        (lora_root / name / "adapter_config.json").write_text(json.dumps(config))
        return str(lora_root / name)

    for name, fields, param in (("big", {"r": 64}, "r"),
                                ("head", {"target_modules": ["lm_head"]}, "target_modules"),
                                ("dora", {"use_dora": True}, "use_dora")):
        status, error = worker.post_json("/v1/load_lora_adapter",
                                         {"lora_name": name, "lora_path": write(name, **fields)})
        assert status == 400 and error["error"]["param"] == param, error
    path = write("fresh")
    status, text = worker.post_json("/v1/load_lora_adapter", {"lora_name": "fresh", "lora_path": path})
    assert status == 200, text
    status, error = worker.post_json("/v1/load_lora_adapter", {"lora_name": "fresh", "lora_path": path})
    assert status == 400 and error["error"]["param"] == "lora_name"
    assert complete_on_worker(worker, "fresh", "hello")["model"] == "fresh"
    assert worker.post_json("/v1/unload_lora_adapter", {"lora_name": "fresh"})[0] == 200
    assert worker.post_json("/v1/unload_lora_adapter", {"lora_name": "fresh"})[0] == 404
    assert "fresh" not in [a["name"] for a in worker.get_json("/ready")[1]["adapters"]]
    status, _ = worker.post_json("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": path},
                                 headers={"Authorization": "Bearer wrong"})
    assert status == 401


def test_runtime_loads_read_only_regular_files_under_the_lora_roots(worker, lora_root,
                                                                   tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "adapter_config.json").write_text(json.dumps(adapter_config(8, 16)))
    answers = [worker.post_json("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": path})
               for path in (str(outside), str(tmp_path / "absent"), f"{lora_root}/../outside",
                            "/etc")]
    assert {(s, e["error"]["param"], e["error"]["message"]) for s, e in answers} == {
        (400, "lora_path", "lora_path must be under one of the directories this worker "
                           "loads adapters from (--lora-root)")}
    (lora_root / "fifo").mkdir()
    os.mkfifo(lora_root / "fifo" / "adapter_config.json")
    status, error = worker.post_json("/v1/load_lora_adapter",
                                     {"lora_name": "fifo", "lora_path": str(lora_root / "fifo")})
    assert status == 400 and "not a regular file" in error["error"]["message"], error


def test_runtime_routes_are_off_without_the_flag():
    config = WorkerConfig(model=ModelSettings(name=PROFILE), lora=LoraSettings(enable=True))
    state = ServerState(config.server, build_worker(config, "w", b"secret"))

    async def main() -> tuple[int, object]:
        async with serving(create_app(state)) as url:
            return await asyncio.get_running_loop().run_in_executor(
                None, http_json, "POST", f"{url}/v1/load_lora_adapter",
                {"lora_name": "a", "lora_path": "/nowhere"})

    status, error = asyncio.run(main())
    assert status == 404, error
    off = build_worker(WorkerConfig(model=ModelSettings(name=PROFILE)), "w", b"secret")
    assert off.lora.describe() == {"max_loras": 0, "lora_load_ms": None, "adapters": []}
