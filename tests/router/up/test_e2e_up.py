"""`radix-router up` starts two workers and a router, serves, and stops cleanly; the
workers require the key it generated, which no child has on its command line. On the
embedded default (SmolLM2) the start banner shows a real answer in English. With
configs/multi-router.toml it also runs Redis and a second router."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from harness.procs import REPO_ROOT, child_env, http_json
from radix.model_source import packaged_model_path
from router.up.launcher import redis_answers
from tests.support.polling import wait_until
from tests.support.router_calls import complete, num_ready_workers

pytestmark = pytest.mark.slow


def children(pid: int) -> list[int]:
    """The direct children of ``pid``, from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[1] == str(pid):
                found.append(int(stat.parent.name))
        except (OSError, IndexError):
            continue
    return found


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().partition("=")[::2] for item in raw if item)


def check_worker_key(up_pid: int, worker_urls: list[str]) -> None:
    """Each worker child got one generated key through its environment, never argv;
    the router got it under each worker's api_key_env; the workers require it."""
    pids = children(up_pid)
    assert len(pids) == 3
    envs = {pid: environ(pid) for pid in pids}
    keys = {env["RADIX_WORKER_API_KEY"] for env in envs.values()}
    assert len(keys) == 1 and len(key := keys.pop()) >= 32
    for pid, env in envs.items():
        assert env["RADIX_WORKER_KEY_W0"] == env["RADIX_WORKER_KEY_W1"] == key
        assert key.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    for worker_url in worker_urls:
        assert http_json("GET", f"{worker_url}/info")[0] == 401
        assert http_json("GET", f"{worker_url}/info", None,
                         {"Authorization": f"Bearer {key}"})[0] == 200


def start_up(config: str) -> subprocess.Popen[str]:
    """``radix-router up --config CONFIG`` on free ports, stdout and stderr piped."""
    env = child_env()
    del env["RADIX_ROUTER_SECRET"]  # `up` must make a shared dev secret itself
    return subprocess.Popen(
        [sys.executable, "-m", "router", "up", "--config", config, "--port", "0",
         "--metrics-port", "0"],
        cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)


def read_banner(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """Everything ``up`` printed up to the end of its start banner."""
    assert proc.stdout is not None
    output: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, "".join(output)
        output.append(line)
        if "Ctrl-C stops" in line:
            break
    return "".join(output)


def test_up_serves_and_exits_cleanly_on_sigint() -> None:
    proc = start_up("configs/demo.toml")
    try:
        text = read_banner(proc, 120)
        url = re.search(r"is up at (http://\S+)", text).group(1)
        worker_urls = re.findall(r"\[w\d\] READY (http://\S+)", text)
        assert len(worker_urls) == 2
        assert "Authorization: Bearer sk-demo-alice" in text and "OpenAI(base_url=" in text

        result = wait_until(
            lambda: (answer := complete(url, "Hello", "sk-demo-alice"))[0] != 503 and answer,
            30, "an answer other than 503", interval_s=0.2)
        assert result[0] == 200 and result[1]["usage"]["completion_tokens"] == 2
        check_worker_key(proc.pid, worker_urls)
        metrics_url = re.search(r"\[router\] METRICS (http://\S+)", text).group(1)
        assert "router_requests_total" in http_json("GET", f"{metrics_url}/metrics")[1]
        assert http_json("GET", f"{url}/metrics")[0] == 404

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        for child_url in [url, *worker_urls]:
            with pytest.raises(urllib.error.URLError):
                urllib.request.urlopen(f"{child_url}/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_embedded_default_answers_in_english() -> None:
    try:
        packaged_model_path("SmolLM2-135M-Instruct")
    except ValueError as exc:
        pytest.skip(str(exc))
    proc = start_up("configs/local.toml")
    try:
        text = read_banner(proc, 240)
        assert re.search(r"It answered: '[^'\n]*Paris", text), text
        url = re.search(r"is up at (http://\S+)", text).group(1)
        request = {"model": "SmolLM2-135M-Instruct", "max_tokens": 24, "temperature": 0,
                   "messages": [{"role": "user", "content": "What is the capital of Germany?"}]}
        headers = {"Authorization": "Bearer sk-demo-bob"}
        status, body = http_json("POST", f"{url}/v1/chat/completions", request, headers)
        assert status == 200 and "Berlin" in body["choices"][0]["message"]["content"]
        time.sleep(1.0)  # the worker's KV events reach the router's index
        status, again = http_json("POST", f"{url}/v1/chat/completions", request, headers)
        assert again["choices"] == body["choices"]
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_multi_router_shares_one_launched_redis() -> None:
    """configs/multi-router.toml: a launched redis-server, two routers on the shared
    state (alice's 4-slot limit), three workers; everything, Redis included, stops."""
    proc = start_up("configs/multi-router.toml")
    try:
        text = read_banner(proc, 120)
        routers = [re.search(r"is up at (http://\S+)", text).group(1),
                   re.search(r"another router .* at (http://\S+)", text).group(1)]
        redis_port = int(re.search(r"\[redis\] READY redis://127.0.0.1:(\d+)", text).group(1))
        assert len(re.findall(r"\[w\d\] READY", text)) == 3
        metrics = re.findall(r"\[router\d\] METRICS (http://\S+)", text)
        for url in routers:
            wait_until(lambda url=url: num_ready_workers(url) >= 3, 30,
                       f"three ready workers behind {url}", interval_s=0.2)
            status, body = complete(url, "Hi", "sk-demo-alice", full_length=False)
            assert status == 200, body
        for url in metrics:
            assert "router_shared_state_up 1.0" in http_json("GET", f"{url}/metrics")[1]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert not redis_answers(redis_port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
