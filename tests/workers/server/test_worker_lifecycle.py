"""Start-up (readiness gate, READY line), the worker API key, and the CLI's config checks."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import openai
import pytest

from harness.procs import REPO_ROOT, child_env, http_json
from harness.sse import data_lines
from router.up.launcher import free_port
from tests.workers.server.worker_checks import used_blocks_settle
from workers.config import WorkerConfig, load_config

KEY = "worker-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.mark.slow
def test_ready_is_503_until_the_self_test_passed_and_keys_are_checked(worker_factory):
    port = free_port()
    worker = worker_factory("--port", str(port), "--self-test-delay-s", "1.5", wait=False,
                            api_key=KEY)
    url = f"http://127.0.0.1:{port}"
    statuses = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            status, body = http_json("GET", f"{url}/ready", headers=AUTH, timeout_s=5)
        except OSError:  # not listening yet: the model is still loading
            time.sleep(0.05)
            continue
        statuses.append((status, body["ready"]))
        if status == 200:
            break
        assert http_json("GET", f"{url}/health")[0] == 200, "/health needs no key"
        time.sleep(0.05)
    assert statuses[0] == (503, False) and statuses[-1] == (200, True)
    assert worker.wait_ready(30) == url
    assert http_json("GET", f"{url}/ready")[0] == 401
    assert http_json("GET", f"{url}/metrics", headers={"Authorization": "Bearer nope"})[0] == 401
    status, body = http_json("GET", f"{url}/info", headers=AUTH)
    assert status == 200 and body["worker_id"] == f"127.0.0.1:{port}"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).completions.create(
            model="demo", prompt="x", max_tokens=1
        )
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    assert client.completions.create(model="demo", prompt="x", max_tokens=2).usage.completion_tokens >= 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "toml", "message"),
    [
        (["--block-size", "0"], None, "kv.block_size: must be at least 1"),
        (["--port", "70000"], None, "server.port: must be at most 65535"),
        ([], "[kv]\nbogus = 1\n", "kv.bogus: unknown key"),
        ([], "[engine]\nmax_num_seqs = 'many'\n", "engine.max_num_seqs: must be an integer"),
        ([], "[nope]\n", "nope: unknown key (known: engine, kv, kv_transfer, lora, model, retention, server)"),
    ],
)
def test_cli_rejects_bad_config_naming_the_field(tmp_path, flags, toml, message):
    if toml is not None:
        path = tmp_path / "worker.toml"
        path.write_text(toml)
        flags = [*flags, "--config", str(path)]
    done = subprocess.run([sys.executable, "-m", "workers", *flags], cwd=REPO_ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr


def test_toml_values_and_flag_overrides():
    config = load_config(REPO_ROOT / "configs" / "worker.toml")
    assert config == WorkerConfig(), "the shipped config spells out the defaults"
    changed = config.with_overrides({"kv": {"cache_bytes": 2**20, "prefix_cache": False}})
    assert (changed.kv.cache_bytes, changed.kv.prefix_cache) == (2**20, False)
    with pytest.raises(ValueError, match="kv.prefix_cache: must be true or false"):
        config.with_overrides({"kv": {"prefix_cache": 1}})
    with pytest.raises(ValueError, match="server.request_timeout_s: must be positive"):
        config.with_overrides({"server": {"request_timeout_s": 0}})


@pytest.mark.parametrize(
    ("kv", "message"),
    [({"watermark": 0.6}, "kv.watermark: must be at most 0.5"),
     ({"gpu_memory_utilization": 0}, "kv.gpu_memory_utilization: must be positive"),
     ({"gpu_memory_utilization": 1.5}, "kv.gpu_memory_utilization: must be at most 1"),
     ({"host_ttl_s": 60.0}, "kv.host_ttl_s: must be unset without a host tier")],
)
def test_kv_operation_settings_are_checked(kv, message):
    with pytest.raises(ValueError, match=message):
        WorkerConfig().with_overrides({"kv": kv})
    assert WorkerConfig().kv.cache_bytes is None, "unset: the device's rule sizes the cache"


@pytest.mark.slow
def test_requests_past_the_timeout_are_cancelled(worker_factory, tmp_path):
    config = tmp_path / "worker.toml"
    config.write_text("[server]\nrequest_timeout_s = 0.5\n")
    worker = worker_factory("--config", str(config))
    body = {"token_ids": [5] * 20, "sampling": {"max_tokens": 900, "ignore_eos": True}}
    status, error = worker.post_json("/generate", body)
    assert status == 504 and error["error"]["code"] == "timeout"
    raw = urllib.request.urlopen(urllib.request.Request(
        f"{worker.url}/generate", data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"})).read().decode()
    events = data_lines(raw)
    assert json.loads(events[-2])["error"]["code"] == "timeout" and events[-1] == "[DONE]"
    used_blocks_settle(worker)
