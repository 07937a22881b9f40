"""Our worker behind the real peer routers, when ``make bench-peers`` installed them
(skipped otherwise: they are never a dependency of this project)."""

from __future__ import annotations

import pytest

from bench import peers
from harness.procs import http_json, start_worker

# Its module-scoped processes start once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("peer_routers")]
KEY = "peer-test-key"
FOUND = peers.available()
PROMPT = "the same long shared prefix for both requests " * 8


@pytest.fixture(scope="module")
def worker_urls(request):
    workers = [start_worker(api_key=KEY) for _ in range(2)]
    for worker in workers:
        request.addfinalizer(worker.stop)
    return [w.url for w in workers]


@pytest.mark.parametrize("setup", list(peers.PEER_SETUPS))
def test_peer_router_serves_our_workers_and_reuses_their_cache(setup, worker_urls, tmp_path):
    if not FOUND[peers.PEER_SETUPS[setup].module]:
        pytest.skip(f"{peers.PEER_SETUPS[setup].module} is not installed in bench/.peers "
                    "(make bench-peers)")
    peer = peers.start_peer(peers.PEER_SETUPS[setup], worker_urls, KEY, "demo", tmp_path / "peer.log")
    try:
        auth = {"Authorization": f"Bearer {KEY}"}
        body = {"model": "demo", "prompt": PROMPT + setup, "max_tokens": 2}
        first = http_json("POST", f"{peer.url}/v1/completions", body, auth)
        second = http_json("POST", f"{peer.url}/v1/completions", body, auth)
        chat = http_json("POST", f"{peer.url}/v1/chat/completions",
                         {"model": "demo", "messages": [{"role": "user", "content": "hi"}],
                          "max_tokens": 2}, auth)
    finally:
        peer.stop()
    assert first[0] == second[0] == chat[0] == 200, (first, second, chat)
    assert second[1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
