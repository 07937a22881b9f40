"""vllm-router's PD mode (``--vllm-pd-disaggregation``, from ``bench/.peers``; skipped
without it) drives our workers with vLLM's ``kv_transfer_params`` protocol on
``/v1/completions``: the decode worker pulls the prompt's blocks from the prefill
worker (counted on both), and the answer equals an aggregated worker's."""

from __future__ import annotations

import subprocess
import time

import pytest

from bench.peers import PEERS_PYTHON, available, completes
from harness.procs import http_json, start_worker
from router.up.launcher import free_port
from tests.support.metric_samples import sample

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not available()["vllm_router"], reason="vllm-router is not installed in bench/.peers")]
PROMPT = "Disaggregated by vllm-router, prefilled and pulled between our workers. " * 3


def counter(url: str, name: str) -> float:
    """One unlabelled sample of a keyless worker's ``/metrics``."""
    return sample(http_json("GET", f"{url}/metrics")[1], name)


def test_vllm_router_pd_mode_moves_blocks_between_our_workers(tmp_path):
    # vllm-router sends no API key in PD mode: the workers run keyless (loopback only).
    prefill = start_worker("--kv-transfer-config", '{"kv_role": "kv_producer"}', wait=False)
    decode = start_worker("--kv-transfer-config", '{"kv_role": "kv_consumer"}', wait=False)
    whole = start_worker(wait=False)
    router = None
    try:
        for worker in (prefill, decode, whole):
            worker.wait_ready(120)
        port = free_port()
        with (tmp_path / "vllm-router.log").open("wb") as log:
            router = subprocess.Popen(
                [str(PEERS_PYTHON), "-m", "vllm_router.launch_router", "--host", "127.0.0.1",
                 "--port", str(port), "--vllm-pd-disaggregation", "--prefill", prefill.url,
                 "--decode", decode.url, "--policy", "round_robin",
                 "--prometheus-port", str(free_port())], stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while not completes(url, "demo", "any"):
            assert router.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "vllm-router.log").read_text()[-2000:]
            time.sleep(0.5)
        body = {"model": "demo", "prompt": PROMPT, "max_tokens": 6, "temperature": 0,
                "ignore_eos": True}
        _, expected = http_json("POST", f"{whole.url}/v1/completions", body)
        received = counter(decode.url, "kv_transfer_blocks_received_total")
        status, answer = http_json("POST", f"{url}/v1/completions", body)
        assert status == 200, answer
        assert answer["choices"][0]["text"] == expected["choices"][0]["text"]
        pulled = counter(decode.url, "kv_transfer_blocks_received_total") - received
        assert pulled == (answer["usage"]["prompt_tokens"] - 1) // 16 > 5
        assert counter(prefill.url, "kv_transfer_held_blocks") == 0  # acknowledged
    finally:
        if router is not None:
            router.terminate()
            router.wait(10)
        for worker in (prefill, decode, whole):
            worker.stop()
