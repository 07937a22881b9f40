"""Peer pulls between real worker processes (docs/pd.md, "Peer pulls"): a worker asked
to hold what it already caches of a prompt (``POST /kv_transfer/hold``, the router's)
runs nothing, holds the blocks under a prefill leg's rules and answers the same
``kv_transfer_params``; another worker given them pulls exactly the blocks it lacks,
and its greedy output equals a recompute. A worker still pulling a prefix relays each
block to a third as it arrives. A tenant's private blocks are never held for another
scope. A peer frozen or killed mid-pull gives a counted recompute (and the relay from
the worker it fed a clean failure), and no block stays held on any side. Output equality proves nothing alone (a recompute
answers the same), so every case reads the transfer counters and cached tokens."""

from __future__ import annotations

import base64
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.procs import ManagedProcess, started_workers
from radix.keys import to_key
from tests.support.metric_samples import worker_metric as metric
from tests.support.polling import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("peer_pull")]
KEY = "peer-pull-key"
B = 16
BOTH = '{"kv_role": "kv_both"}'


def prompt(seed: int, num_tokens: int = 5 * B + 7) -> list[int]:
    """A prompt of ``num_tokens`` demo-vocabulary ids (5 whole blocks + 7 by default)."""
    return [(seed * 37 + i * 11) % 200 + 20 for i in range(num_tokens)]


def generate(worker: ManagedProcess, token_ids: list[int], max_tokens: int,
             params: dict | None = None, scope: str = "t1") -> tuple[int, dict]:
    """POST ``/generate`` greedily in ``scope``."""
    body = {"token_ids": token_ids, "scope": scope,
            "sampling": {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}
    if params is not None:
        body["kv_transfer_params"] = params
    return worker.post_json("/generate", body)


def hold(worker: ManagedProcess, token_ids: list[int], scope: str = "t1",
         max_blocks: int = 64, **extra: object) -> tuple[int, dict]:
    """Ask ``worker`` to hold what it caches of ``token_ids`` for a peer's pull."""
    return worker.post_json("/kv_transfer/hold", {
        "token_ids_b64": base64.b64encode(to_key(token_ids)).decode(), "scope": scope,
        "max_blocks": max_blocks, **extra})


def used_blocks(worker: ManagedProcess) -> int:
    """Blocks some request or hold references (0 on an idle worker that leaked none)."""
    return worker.get_json("/info")[1]["kv"]["num_used_blocks"]


def holds(worker: ManagedProcess, num_blocks: int, timeout_s: float = 10) -> bool:
    """Wait until ``worker`` references exactly ``num_blocks`` blocks; True, or
    AssertionError."""
    return wait_until(lambda: used_blocks(worker) == num_blocks, timeout_s,
                      lambda: f"{num_blocks} blocks in use (now {used_blocks(worker)})")


def tokens_of(answer: dict) -> list[int]:
    return answer["choices"][0]["token_ids"]


def target_config(tmp: Path) -> str:
    """A worker TOML: both roles, a failed pull recomputes, pulls give up after 2 s."""
    path = tmp / "target.toml"
    path.write_text('[kv_transfer]\nkv_role = "kv_both"\nfallback = "recompute"\n'
                    "pull_timeout_s = 2.0\nack_timeout_s = 1.0\n")
    return str(path)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Iterator[dict[str, ManagedProcess]]:
    """A source and a target, both roles, on the demo model; the target recomputes
    when a pull fails. ``victim`` is a source a test freezes, then kills; its holds
    last 3 s."""
    flags = {
        "source": (("--kv-transfer-config", BOTH), KEY),
        "target": (("--config", target_config(tmp_path_factory.mktemp("peer"))), KEY),
        "victim": (("--kv-transfer-config", BOTH, "--kv-transfer-timeout-s", "3"), KEY),
    }
    with started_workers(flags) as workers:
        yield workers


def test_a_peer_holds_what_it_caches_and_the_worker_pulls_only_what_it_lacks(fleet):
    source, target = fleet["source"], fleet["target"]
    token_ids = prompt(1)
    status, expected = generate(source, token_ids, 8)
    assert status == 200
    assert generate(target, token_ids[: 2 * B + 3], 1)[0] == 200  # the target holds 2 blocks
    computed = metric(source, "prompt_tokens_total")
    status, answer = hold(source, token_ids)
    assert status == 200, answer
    params = answer["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and len(params["remote_block_ids"]) == 5
    assert metric(source, "prompt_tokens_total") == computed  # nothing ran
    assert metric(source, "kv_transfer_peer_holds_total") >= 1
    assert holds(source, 5)
    received = metric(target, "kv_transfer_blocks_received_total")
    status, pulled = generate(target, token_ids, 8, params)
    assert status == 200, pulled
    assert tokens_of(pulled) == tokens_of(expected)
    assert metric(target, "kv_transfer_blocks_received_total") - received == 3
    assert pulled["usage"]["cached_tokens"] == 5 * B
    assert holds(source, 0) and holds(target, 0)


def test_a_hold_names_at_most_max_blocks_and_bad_asks_are_refused(fleet):
    source = fleet["source"]
    token_ids = prompt(2)
    assert generate(source, token_ids, 1)[0] == 200
    status, answer = hold(source, token_ids, max_blocks=2)
    assert status == 200 and len(answer["kv_transfer_params"]["remote_block_ids"]) == 2
    assert holds(source, 2)
    status, _ = source.post_json("/kv_transfer/release", {
        "remote_request_id": answer["kv_transfer_params"]["remote_request_id"]})
    assert status == 200 and holds(source, 0)
    for extra, param in (({"scope": None}, "scope"), ({"max_blocks": 0}, "max_blocks"),
                         ({"num_public_tokens": 5}, "num_public_tokens")):
        status, answer = hold(source, token_ids, **{"scope": "t1", **extra})
        assert status == 400 and answer["error"]["param"] == param, answer
    status, answer = source.post_json("/kv_transfer/hold", {"scope": "t1", "max_blocks": 1})
    assert status == 400 and answer["error"]["param"] == "token_ids_b64"


def test_holds_of_one_prefix_count_its_blocks_once_and_a_hold_waits_for_blocks_on_their_way(
        fleet):
    source = fleet["source"]
    token_ids = prompt(6)
    assert generate(source, token_ids, 1)[0] == 200
    params = [hold(source, token_ids)[1]["kv_transfer_params"] for _ in range(3)]
    assert all(len(p["remote_block_ids"]) == 5 for p in params)
    assert source.get_json("/info")[1]["load"]["num_held_blocks"] == 5  # pinned once
    for p in params:
        source.post_json("/kv_transfer/release", {"remote_request_id": p["remote_request_id"]})
    assert holds(source, 0)
    coming = prompt(7)
    answers: list = []
    waiter = threading.Thread(target=lambda: answers.append(hold(source, coming, wait_s=10.0)))
    waiter.start()
    time.sleep(0.5)  # the hold waits: the blocks are not there yet
    assert generate(source, coming, 1)[0] == 200
    waiter.join(15)
    status, answer = answers[0]
    assert status == 200 and len(answer["kv_transfer_params"]["remote_block_ids"]) == 5
    source.post_json("/kv_transfer/release", {
        "remote_request_id": answer["kv_transfer_params"]["remote_request_id"]})
    assert holds(source, 0)


def test_a_hold_on_a_worker_still_pulling_the_blocks_answers_once_they_come(fleet):
    source, target = fleet["source"], fleet["target"]
    token_ids = prompt(9)
    assert generate(source, token_ids, 1)[0] == 200
    answers: list = []
    waiter = threading.Thread(target=lambda: answers.append(hold(target, token_ids,
                                                                 wait_s=10.0)))
    waiter.start()  # a router's hold for a third worker, sent before the pull starts
    time.sleep(0.3)
    received = metric(target, "kv_transfer_blocks_received_total")
    status, pulled = generate(target, token_ids, 4, hold(source, token_ids)[1]["kv_transfer_params"])
    assert status == 200 and pulled["usage"]["cached_tokens"] == 5 * B
    waiter.join(15)
    status, answer = answers[0]  # relayed (no id yet) or held once imported: all 5 blocks
    assert status == 200 and len(answer["kv_transfer_params"]["remote_block_hashes"]) == 5
    assert metric(target, "kv_transfer_blocks_received_total") - received == 5
    target.post_json("/kv_transfer/release", {
        "remote_request_id": answer["kv_transfer_params"]["remote_request_id"]})
    assert holds(source, 0) and holds(target, 0)


def test_a_worker_still_pulling_a_prefix_relays_each_block_as_it_arrives(fleet):
    source, target, third = fleet["source"], fleet["target"], fleet["victim"]
    token_ids = prompt(10)
    status, expected = generate(source, token_ids, 4)
    assert status == 200
    params = hold(source, token_ids)[1]["kv_transfer_params"]
    sent = metric(target, "kv_transfer_blocks_sent_total")
    os.kill(source.proc.pid, signal.SIGSTOP)  # the target's pull connects, gets nothing yet
    try:
        into_target = _pull_in_background(target, token_ids, params)
        time.sleep(0.3)
        status, relayed = hold(target, token_ids, wait_s=5.0)  # answers before any block came
        relay = relayed["kv_transfer_params"]
        assert status == 200 and len(relay["remote_block_hashes"]) == 5
        assert relay["remote_block_ids"] == []  # none on the target's device yet
        into_third = _pull_in_background(third, token_ids, relay)
        time.sleep(0.2)
    finally:
        os.kill(source.proc.pid, signal.SIGCONT)
    for thread, _ in (into_target, into_third):
        thread.join(30)
    for _, answers in (into_target, into_third):
        status, answer = answers[0]
        assert status == 200 and answer["usage"]["cached_tokens"] == 5 * B
        assert tokens_of(answer) == tokens_of(expected)
    assert metric(target, "kv_transfer_blocks_sent_total") - sent == 5
    assert holds(source, 0) and holds(target, 0) and holds(third, 0)


def test_two_pulls_of_one_prefix_into_a_worker_import_it_once(fleet):
    source, target = fleet["source"], fleet["target"]
    token_ids = prompt(8)
    assert generate(source, token_ids, 1)[0] == 200
    params = [hold(source, token_ids)[1]["kv_transfer_params"] for _ in range(2)]
    received = metric(target, "kv_transfer_blocks_received_total")
    pulls = [_pull_in_background(target, token_ids, p) for p in params]
    for thread, _ in pulls:
        thread.join(30)
    for _, answers in pulls:
        status, answer = answers[0]
        assert status == 200 and answer["usage"]["cached_tokens"] == 5 * B
    assert metric(target, "kv_transfer_blocks_received_total") - received == 5
    assert holds(source, 0) and holds(target, 0)


def test_private_blocks_are_never_held_for_another_scope(fleet):
    source, target = fleet["source"], fleet["target"]
    token_ids = prompt(3)
    assert generate(source, token_ids, 1, scope="tenant-a")[0] == 200
    status, answer = hold(source, token_ids, scope="tenant-b")
    assert status == 200 and answer["kv_transfer_params"]["remote_block_ids"] == []
    assert holds(source, 0)
    received = metric(target, "kv_transfer_blocks_received_total")
    status, pulled = generate(target, token_ids, 2, answer["kv_transfer_params"],
                              scope="tenant-b")
    assert status == 200 and pulled["usage"]["cached_tokens"] == 0
    assert metric(target, "kv_transfer_blocks_received_total") == received
    status, answer = hold(source, token_ids, scope="tenant-a")  # its own scope: all 5
    assert status == 200 and len(answer["kv_transfer_params"]["remote_block_ids"]) == 5
    source.post_json("/kv_transfer/release", {
        "remote_request_id": answer["kv_transfer_params"]["remote_request_id"]})
    assert holds(source, 0)


def _pull_in_background(target: ManagedProcess, token_ids: list[int], params: dict
                        ) -> tuple[threading.Thread, list]:
    answers: list = []
    thread = threading.Thread(target=lambda: answers.append(generate(target, token_ids, 4,
                                                                     params)))
    thread.start()
    return thread, answers


def test_a_peer_frozen_then_killed_mid_pull_gives_counted_recomputes_and_leaks_no_block(
        fleet):
    victim, target = fleet["victim"], fleet["target"]
    token_ids = prompt(4)
    status, expected = generate(victim, token_ids, 4)
    assert status == 200
    params = hold(victim, token_ids)[1]["kv_transfer_params"]
    assert holds(victim, 5)
    recomputes = metric(target, "kv_transfer_recomputes_total")
    os.kill(victim.proc.pid, signal.SIGSTOP)  # accepts connections, answers nothing
    try:
        thread, answers = _pull_in_background(target, token_ids, params)
        thread.join(30)
    finally:
        os.kill(victim.proc.pid, signal.SIGCONT)
    status, answer = answers[0]
    assert status == 200 and tokens_of(answer) == tokens_of(expected)
    assert answer["usage"]["cached_tokens"] == 0
    assert metric(target, "kv_transfer_recomputes_total") - recomputes == 1
    assert metric(target, "kv_transfer_failures_total", {"reason": "timeout"}) >= 1
    assert holds(target, 0) and holds(victim, 0)  # its hold ends (the ack, or 3 s)

    other = prompt(5)  # now killed while the pull waits for its blocks, which the
    assert generate(victim, other, 1)[0] == 200  # target relays to the source meanwhile
    params = hold(victim, other)[1]["kv_transfer_params"]
    os.kill(victim.proc.pid, signal.SIGSTOP)
    thread, answers = _pull_in_background(target, other, params)
    time.sleep(0.5)  # the pull has connected and waits
    relay = hold(target, other, wait_s=5.0)[1]["kv_transfer_params"]
    assert relay["remote_block_ids"] == [] and len(relay["remote_block_hashes"]) == 5
    relayed, relayed_answers = _pull_in_background(fleet["source"], other, relay)
    time.sleep(0.2)
    os.kill(victim.proc.pid, signal.SIGKILL)
    thread.join(30)
    relayed.join(30)
    status, answer = answers[0]
    assert status == 200 and answer["usage"]["cached_tokens"] == 0
    assert metric(target, "kv_transfer_recomputes_total") - recomputes == 2
    status, answer = relayed_answers[0]  # the source has no recompute fallback: a clean 503
    assert status == 503 and answer["error"]["code"] == "kv_transfer_failed"
    assert holds(target, 0) and holds(fleet["source"], 0)
