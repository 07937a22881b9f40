"""SIGTERM drains a worker: ``/ready`` is 503 at once, new requests get 503 with
Retry-After, the streams in flight run to their end, then the process exits 0."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import time
import urllib.request

import pytest

from harness.procs import http_json
from harness.sse import data_payload

pytestmark = pytest.mark.slow

NUM_TOKENS = 900


def generate_stream(url: str) -> list[dict]:
    """Every event of one greedy ``/generate`` stream of NUM_TOKENS tokens."""
    body = json.dumps({"token_ids": list(range(40, 60)), "stream": True,
                       "sampling": {"temperature": 0, "max_tokens": NUM_TOKENS,
                                    "ignore_eos": True}}).encode()
    request = urllib.request.Request(f"{url}/generate", data=body,
                                     headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(request, timeout=60) as response:
        for raw in response:
            payload = data_payload(raw.decode())
            if payload is not None and payload != "[DONE]":
                events.append(json.loads(payload))
    return events


def test_sigterm_finishes_streams_in_flight_and_refuses_new_requests(worker_factory):
    worker = worker_factory("--drain-timeout-s", "30")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        streams = [pool.submit(generate_stream, worker.url) for _ in range(3)]
        time.sleep(0.5)
        worker.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        status, ready = http_json("GET", f"{worker.url}/ready")
        assert status == 503 and ready["draining"] is True
        request = urllib.request.Request(
            f"{worker.url}/generate", data=b'{"token_ids": [1, 2, 3]}',
            headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=10)
            raise AssertionError("a draining worker admitted a request")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503 and exc.headers["Retry-After"] == "1"
            assert json.loads(exc.read())["error"]["code"] == "draining"
        for stream in streams:
            events = stream.result(timeout=60)
            tokens = [t for e in events for t in e.get("token_ids", ())]
            assert len(tokens) == NUM_TOKENS
            assert events[-1]["usage"]["completion_tokens"] == NUM_TOKENS
    assert worker.proc.wait(30) == 0
