"""The worker's key: where it comes from, what it guards, and where a keyless worker
may listen."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.procs import REPO_ROOT, child_env, http_json, stream_lines
from workers.config import ServerConfig
from workers.server.access import check_listen_address, is_loopback, load_api_key

KEY = "file-key"
GENERATE = {"token_ids": [5] * 20, "sampling": {"max_tokens": 2}}
COMPLETION = {"model": "demo", "prompt": "hi", "max_tokens": 2}


@pytest.mark.slow
def test_key_from_file_guards_every_route_but_health(worker_factory, tmp_path):
    key_file = tmp_path / "worker.key"
    key_file.write_text(KEY + "\n")
    config = tmp_path / "worker.toml"
    config.write_text(f'[server]\napi_key_file = "{key_file}"\n')
    worker = worker_factory("--config", str(config), env={"RADIX_WORKER_API_KEY": "env-key"})
    url, auth = worker.url, {"Authorization": f"Bearer {KEY}"}
    for method, path, body in [("POST", "/generate", GENERATE), ("GET", "/kv/events", None),
                               ("POST", "/v1/completions", COMPLETION), ("GET", "/info", None)]:
        for headers in ({}, {"Authorization": "Bearer env-key"}, {"Authorization": KEY}):
            status, error = http_json(method, f"{url}{path}", body, headers)
            assert status == 401, (path, headers)
            assert error["error"]["code"] == "invalid_api_key"
    assert http_json("GET", f"{url}/health")[0] == 200
    status, result = http_json("POST", f"{url}/generate", GENERATE, auth)
    assert status == 200 and result["usage"]["completion_tokens"] == 2
    assert http_json("POST", f"{url}/v1/completions", COMPLETION, auth)[0] == 200
    assert stream_lines(f"{url}/kv/events", quiet_s=0.3, headers=auth)[0].startswith("{")


@pytest.mark.slow
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "example.invalid"])
def test_keyless_worker_refuses_to_listen_off_loopback(host):
    done = subprocess.run([sys.executable, "-m", "workers", "--model", "demo", "--host", host],
                          cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not loopback and no worker API key is set" in lines[0]


def test_key_sources_and_listen_rule(tmp_path):
    environ = {"RADIX_WORKER_API_KEY": "from-env"}
    assert load_api_key(ServerConfig(), environ) == "from-env"
    assert load_api_key(ServerConfig(), {}) is None
    key_file = tmp_path / "key"
    key_file.write_text("  from-file\n")
    assert load_api_key(ServerConfig(api_key_file=str(key_file)), environ) == "from-file"
    key_file.write_text("\n")
    with pytest.raises(ValueError, match="server.api_key_file: .* is empty"):
        load_api_key(ServerConfig(api_key_file=str(key_file)), environ)
    with pytest.raises(ValueError, match="server.api_key_file: cannot read"):
        load_api_key(ServerConfig(api_key_file=str(tmp_path / "missing")), environ)
    assert [is_loopback(h) for h in ("127.0.0.1", "127.8.0.1", "::1", "localhost")] == [True] * 4
    assert [is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "host")] == [False] * 4
    check_listen_address("0.0.0.0", "a-key")
    check_listen_address("127.0.0.1", None)
    with pytest.raises(ValueError, match="'10.0.0.1' is not loopback"):
        check_listen_address("10.0.0.1", None)
