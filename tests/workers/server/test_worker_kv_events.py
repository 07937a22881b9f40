"""``GET /kv/events``: a live replay equals a fresh snapshot; resync rules on reconnect;
load frames only to a stream that asks for them."""

from __future__ import annotations

import msgspec
import pytest

from harness.procs import start_worker
from radix.events import KVEvent
from tests.support.load_frames import FrameStream
from tests.support.polling import wait_until
from tests.workers.server.kv_replay import EventStream, Replay, tree_paths

# Its module-scoped processes start once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("worker_kv_events")]

BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    config = tmp_path_factory.mktemp("kv") / "worker.toml"
    config.write_text("[server]\nkv_events_heartbeat_s = 0.2\n[kv]\nevent_log_size = 40\n")
    process = start_worker("--config", str(config), kv_cache_bytes="1MiB")  # 15 blocks
    yield process
    process.stop()


@pytest.fixture(scope="module")
def ready(worker):
    status, body = worker.get_json("/ready")
    assert status == 200
    return body


def new_replay(ready: dict) -> Replay:
    return Replay(ready["namespace_digest"], ready["block_size"])


def snapshot(worker, ready) -> Replay:
    """A fresh snapshot: everything before the first heartbeat."""
    stream = EventStream(worker.url, new_replay(ready))
    stream.wait_for(lambda s: None in s.lines)
    stream.close()
    assert stream.lines[0]["type"] == "cleared"
    return stream.replay


def generate(worker, token_ids, max_tokens=4, scope="anonymous", num_public_tokens=0):
    status, body = worker.post_json("/generate", {
        "token_ids": token_ids, "scope": scope, "num_public_tokens": num_public_tokens,
        "sampling": {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
    })
    assert status == 200, body
    return body


def split(paths):
    full = {p for p in paths if len(p[1]) % BLOCK_SIZE == 0}
    return full, paths - full


def test_live_replay_equals_a_fresh_snapshot(worker, ready):
    live = EventStream(worker.url, new_replay(ready))
    system = [200 + i % 50 for i in range(32)]
    for i in range(12):  # public system prompt, tenant continuations, then evictions
        tenant = f"t{i % 2}"
        generate(worker, system + [i, i + 1, i + 2] * (3 + i % 4), scope=tenant, num_public_tokens=32)
    for i in range(6):
        generate(worker, [100 + i] * (40 + 8 * i), max_tokens=6)
    fresh = snapshot(worker, ready)
    live.wait_for(lambda s: s.replay.last_seq >= fresh.last_seq)
    live.close()
    assert any(e and e["type"] == "removed" for e in live.lines), "the workload must evict"
    assert live.replay.num_snapshots == 1 and fresh.num_snapshots == 1
    live_full, live_partial = split(live.replay.paths())
    fresh_full, fresh_partial = split(fresh.paths())
    assert live_full == fresh_full
    assert live_partial <= fresh_partial, "a split point's partial block is never stored"
    live_tree, fresh_tree = tree_paths(live.replay.tree()), tree_paths(fresh.tree())
    for scope, tokens in live_tree:
        assert any(s == scope and t[: len(tokens)] == tokens for s, t in fresh_tree)
    stored_scopes = {e["scope"] for e in live.lines if e and e["type"] == "stored"}
    assert stored_scopes >= {"public", "t0", "t1", "anonymous"}


def test_reconnect_resumes_or_resyncs(worker, ready):
    head = snapshot(worker, ready).last_seq
    epoch = ready["epoch"]
    resumed = EventStream(worker.url, new_replay(ready), since=head, epoch=epoch)
    resumed.replay.last_seq = head
    generate(worker, [7, 8, 9] * 12)
    resumed.wait_for(lambda s: s.replay.last_seq > head)
    resumed.close()
    # Heartbeats (None) may come first while the request runs; the first event resumes.
    first_event = next(line for line in resumed.lines if line is not None)
    assert first_event["seq"] == head + 1
    assert resumed.replay.num_snapshots == 0
    for since, other_epoch in ((head, "another-epoch"), (0, epoch)):  # other epoch; too old
        stream = EventStream(worker.url, new_replay(ready), since=since, epoch=other_epoch)
        stream.wait_for(lambda s: None in s.lines)
        stream.close()
        first = stream.lines[0]
        assert first["type"] == "cleared" and first["seq"] >= head + 1 and first["epoch"] == epoch
    status, body = worker.get_json("/kv/events?since=-1")
    assert status == 400 and body["error"]["param"] == "since"


def test_reset_prefix_cache_announces_every_block_it_drops(worker, ready):
    """``POST /reset_prefix_cache`` empties the cache, and a live replay, applying the
    ``removed`` events it published, is empty too: a follower is never left claiming
    what the worker dropped."""
    live = EventStream(worker.url, new_replay(ready))
    generate(worker, [200 + i for i in range(40)])
    status, body = worker.post_json("/reset_prefix_cache", {})
    assert status == 200 and body["num_freed_blocks"] >= 40 // BLOCK_SIZE
    fresh = snapshot(worker, ready)
    live.wait_for(lambda s: s.replay.last_seq >= fresh.last_seq)
    live.close()
    assert any(e and e["type"] == "removed" for e in live.lines)
    assert fresh.paths() == set() and live.replay.paths() == set()


def test_a_stream_that_asks_for_load_gets_a_frame_at_each_change_and_another_gets_none(worker):
    """With ``load=1`` the binary stream carries a load frame after its first heartbeat
    and one each time the load changes (a request admitted, a request done), ``seq``
    growing (a heartbeat that falls between them repeats the last frame, ``seq`` and
    all); without it (what an older router asks) no header and no frame but arrays
    of events, which the event-only decoder of an older router reads."""
    pushed = FrameStream(worker.url, ask_load=True, headers=worker.auth)
    older = FrameStream(worker.url, ask_load=False, headers=worker.auth)
    try:
        _, first = pushed.wait_for_load(lambda r: True)
        generate(worker, [250 + i for i in range(40)], max_tokens=8)
        pushed.wait_for_load(lambda r: r.seq > first.seq and r.num_requests_running == 0)
        wait_until(lambda: len(older.frames) >= 3)  # snapshot, heartbeat, the request's events
    finally:
        pushed.close()
        older.close()
    assert pushed.load_frames_header == "1" and older.load_frames_header is None
    assert first.num_requests_running == 0 and first.max_num_running is not None
    reports = [r for _, r in pushed.loads()]
    assert any(r.num_requests_running + r.num_requests_waiting >= 1 for r in reports)
    seqs = [r.seq for r in reports]  # a heartbeat with nothing new repeats the last seq
    assert seqs == sorted(seqs) and len(set(seqs)) >= 3
    assert all(a == b for a, b in zip(reports, reports[1:], strict=False) if a.seq == b.seq)
    old_decoder = msgspec.msgpack.Decoder(list[KVEvent])
    assert all(isinstance(old_decoder.decode(f.body), list) for f in older.frames)
