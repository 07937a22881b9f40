"""The router naming a peer as the source of the blocks its chosen worker lacks, in
front of real worker processes that both hold blocks for others and pull them
(``kv_both``; docs/router-index.md, "Where the missing blocks come from"). The policy
here is round robin, so the second request of a conversation lands on the worker that
lacks its prefix: the router asks the other worker to hold the prefix, the chosen one
pulls exactly those blocks and answers as a recompute would; another tenant sending
the same text gets no pull (the first tenant's blocks are private); nothing stays held.
A request naming an agent session goes back to the worker that served the session,
which keeps its blocks for the hinted seconds (docs/router-index.md, "Sessions that
return")."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from harness.procs import ManagedProcess, http_json, start_router, start_worker
from tests.support.metric_samples import router_metric
from tests.support.metric_samples import worker_metric as metric
from tests.support.polling import wait_until
from tests.support.router_calls import admin, base_url, complete, wait_until_ready
from tests.support.router_configs import (
    ALICE,
    BOB,
    FAST_REGISTRY,
    WORKER_KEY,
    WORKER_KEY_ENV,
    auth_section,
    model_table,
    to_toml,
    worker_list,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e_peer_pull")]
DOCUMENT = "A long shared context that every sub-agent of the parent reads again. " * 4
WORKER_TOML = ('[kv_transfer]\nkv_role = "kv_both"\nfallback = "recompute"\n'
               "pull_timeout_s = 5.0\n")
# A demo worker computes faster than these say; they make a pull of this document win.
SOURCES = {"min_pull_tokens": 32, "pull_overhead_s": 0.001, "prefill_s_per_token": 1e-3,
           "link_bytes_per_s": 1e9}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Iterator[tuple[ManagedProcess, dict[str, ManagedProcess]]]:
    """(router, workers w0 and w1: both roles, a failed pull recomputes)."""
    directory = tmp_path_factory.mktemp("peer_pull")
    (directory / "worker.toml").write_text(WORKER_TOML)
    workers = {name: start_worker("--config", str(directory / "worker.toml"),
                                  kv_cache_bytes="16MiB", api_key=WORKER_KEY, wait=False)
               for name in ("w0", "w1")}
    router = None
    try:
        for worker in workers.values():
            worker.wait_ready(120)
        path = directory / "router.toml"
        path.write_text(to_toml({
            "models": {"demo": model_table()}, "registry": FAST_REGISTRY,
            "policy": {"name": "round_robin"}, "kv_sources": SOURCES,
            "auth": auth_section({"alice": {}, "bob": {}}),
            "workers": worker_list({n: w.url for n, w in workers.items()},
                                   api_key_env=WORKER_KEY_ENV)}))
        router = start_router(path, env={WORKER_KEY_ENV: WORKER_KEY})
        wait_until_ready(router)
        yield router, workers
    finally:
        if router is not None:
            router.stop()
        for worker in workers.values():
            worker.stop()


def indexed_blocks(router: ManagedProcess) -> dict[str, int]:
    return {w: v["num_blocks"] for w, v in admin(router, "/admin/index")["workers"].items()}


def received(workers: dict[str, ManagedProcess]) -> dict[str, float]:
    return {n: metric(w, "kv_transfer_blocks_received_total") for n, w in workers.items()}


def pulls(router: ManagedProcess) -> tuple[float, float]:
    """Pulls the router planned, and of those the ones whose hold failed."""
    return (router_metric(router, "router_kv_sources_total", {"source": "pull"}),
            router_metric(router, "router_kv_sources_total", {"source": "pull_failed"}))


def ask(router: ManagedProcess, prompt: str, key: str = ALICE) -> dict[str, Any]:
    status, answer = complete(router, prompt, key=key, max_tokens=6, temperature=0)
    assert status == 200, answer
    return answer


def test_the_worker_lacking_a_prefix_pulls_it_from_the_peer_and_answers_the_same(fleet):
    router, workers = fleet
    ask(router, DOCUMENT + "First question?")
    holder = wait_until(lambda: next((w for w, n in indexed_blocks(router).items() if n > 5),
                                     None), what="the first worker's blocks in the index")
    other = next(name for name in workers if name != holder)
    before, pulled_before = received(workers), pulls(router)
    second = DOCUMENT + "Second question, from a sub-agent?"
    answer = ask(router, second)  # round robin: the worker that lacks the document
    num_blocks = received(workers)[other] - before[other]
    assert num_blocks >= 16  # the document's whole blocks came from the holder
    assert received(workers)[holder] == before[holder]
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == num_blocks * 16
    assert pulls(router) == (pulled_before[0] + 1, pulled_before[1])
    _, expected = workers[holder].post_json("/v1/completions", {
        "model": "demo", "prompt": second, "max_tokens": 6, "temperature": 0,
        "ignore_eos": True})
    assert answer["choices"][0]["text"] == expected["choices"][0]["text"]
    assert router_metric(router, "router_kv_pulls_below_crossover_total") == 0
    for worker in workers.values():
        wait_until(lambda w=worker: w.get_json("/info")[1]["kv"]["num_used_blocks"] == 0,
                   what="no block held")


def test_sub_agents_sent_at_once_to_the_worker_lacking_a_prefix_share_one_pull(fleet):
    router, workers = fleet
    parent = "The parent agent's plan, which each of its sub-agents starts from. " * 4
    counts = served(router)
    ask(router, parent + "Plan?")
    holder = next(w for w, n in served(router).items() if n > counts[w])
    wait_until(lambda: indexed_blocks(router)[holder] > 15, what="the parent's blocks indexed")
    other = next(name for name in workers if name != holder)
    before, pulled_before, joined_before = received(workers), pulls(router), joins(router)
    prompts = [parent + f"Sub-agent {i}, your task?" for i in range(4)]
    with ThreadPoolExecutor(len(prompts)) as pool:  # round robin: two on each worker
        answers = list(pool.map(lambda p: ask(router, p), prompts))
    num_blocks = received(workers)[other] - before[other]
    assert num_blocks >= 16 and received(workers)[holder] == before[holder]
    # Decided while the first pull was on its way, the second joins it; decided after
    # the blocks arrived, it finds them there. Either way one pull, never two.
    assert pulls(router) == (pulled_before[0] + 1, pulled_before[1])
    assert joins(router) - joined_before <= 1
    for prompt, answer in zip(prompts, answers, strict=True):
        _, expected = workers[holder].post_json("/v1/completions", {
            "model": "demo", "prompt": prompt, "max_tokens": 6, "temperature": 0,
            "ignore_eos": True})
        assert answer["choices"][0]["text"] == expected["choices"][0]["text"]
    for worker in workers.values():
        wait_until(lambda w=worker: w.get_json("/info")[1]["kv"]["num_used_blocks"] == 0,
                   what="no block held")


def joins(router: ManagedProcess) -> float:
    """Requests the router sent to join a pull already on its way to their worker."""
    return router_metric(router, "router_kv_sources_total", {"source": "join"})


def served(router: ManagedProcess) -> dict[str, int]:
    return {w: v["num_requests"] for w, v in admin(router, "/admin/index")["workers"].items()}


def test_another_tenant_never_gets_a_pull_of_private_blocks(fleet):
    router, workers = fleet
    text = "Alice's private notes, which no other tenant may reuse. " * 4
    counts = served(router)
    ask(router, text + "One?")
    alices = next(w for w, n in served(router).items() if n > counts[w])
    wait_until(lambda: indexed_blocks(router)[alices] > 15, what="alice's blocks indexed")
    before, pulled_before = received(workers), pulls(router)
    counts = served(router)
    answer = ask(router, text + "Two?", key=BOB)  # round robin: the other worker
    assert [w for w, n in served(router).items() if n > counts[w]] != [alices]
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert received(workers) == before and pulls(router) == pulled_before


def test_a_session_returns_to_its_worker_which_keeps_its_blocks_for_the_hint(fleet):
    router, workers = fleet
    text = "An agent's working context, back after each tool call. " * 4
    headers = {"Authorization": f"Bearer {ALICE}", "x-session-id": "agent-7",
               "x-session-retention-s": "6"}
    counts = served(router)
    for turn in range(3):  # round robin alone would alternate between the two workers
        status, answer = http_json("POST", f"{base_url(router)}/v1/completions", {
            "model": "demo", "prompt": text + f"Turn {turn}?", "max_tokens": 2}, headers)
        assert status == 200, answer
    grown = {w: n - counts[w] for w, n in served(router).items()}
    assert sorted(grown.values()) == [0, 3], grown
    home = next(w for w, n in grown.items() if n == 3)
    num_blocks = answer["usage"]["prompt_tokens"] // 16  # the last turn's whole blocks
    wait_until(lambda: metric(workers[home], "kv_retained_blocks") == num_blocks, 5,
               lambda: f"{num_blocks} blocks kept once the stream ended, not "
                       f"{metric(workers[home], 'kv_retained_blocks')} ({served(router)})")
    wait_until(lambda: metric(workers[home], "kv_retained_blocks") == 0, 20,
               "the hint's 6 s to pass")
    status, answer = http_json("POST", f"{base_url(router)}/v1/completions", {
        "model": "demo", "prompt": text, "max_tokens": 2},
        {**headers, "x-session-retention-s": "never"})
    assert status == 400 and answer["error"]["param"] == "x-session-retention-s"
