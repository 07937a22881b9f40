"""`radix-router up` starts two demo workers and a router, serves, and stops cleanly."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from bench.procs import REPO_ROOT, child_env, http_json

pytestmark = pytest.mark.slow


def test_up_serves_and_exits_cleanly_on_sigint() -> None:
    env = child_env()
    del env["RADIX_ROUTER_SECRET"]  # `up` must make a shared dev secret itself
    proc = subprocess.Popen(
        [sys.executable, "-m", "router", "up", "--config", "configs/local.toml", "--port", "0"],
        cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "".join(output)
            output.append(line)
            if "Ctrl-C stops" in line:
                break
        text = "".join(output)
        url = re.search(r"is up at (http://\S+)", text).group(1)
        worker_urls = re.findall(r"\[w\d\] READY (http://\S+)", text)
        assert len(worker_urls) == 2
        assert "Authorization: Bearer sk-demo-alice" in text and "OpenAI(base_url=" in text

        def answered() -> tuple[int, object]:
            return http_json("POST", f"{url}/v1/completions",
                             {"model": "demo", "prompt": "Hello", "max_tokens": 2, "ignore_eos": True},
                             {"Authorization": "Bearer sk-demo-alice"})

        deadline = time.monotonic() + 30
        while (result := answered())[0] == 503 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert result[0] == 200 and result[1]["usage"]["completion_tokens"] == 2

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        for child_url in [url, *worker_urls]:
            with pytest.raises(urllib.error.URLError):
                urllib.request.urlopen(f"{child_url}/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
