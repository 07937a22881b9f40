"""The disk tier: blocks the host tier drops move to sealed files, come back on a hit
with the same K/V, survive a restart (re-announced as ``stored``/``disk``), and a torn
or tampered file is dropped and counted, never used."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.workers.kv.kv_test_support import EventConsumer, assert_reads, make_manager, serve
from workers.cli import _parser, config_from_args
from workers.config import WorkerConfig
from workers.kv.tiers import disk_writer
from workers.kv.tiers.disk_files import SUFFIX, check_private, lock_directory, write_atomic

B = 4
A = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # two full blocks and one token
FILLER = [[50 + 10 * i + j for j in range(2 * B)] for i in range(6)]


def pushed_to_disk(disk_dir: Path, num_disk_blocks: int = 16, host_ttl_s: float | None = None):
    """A 6-block pool and a 2-block host tier where A was cached, then pushed by six
    fillers through the host tier down to disk."""
    manager = make_manager(6, B, num_host_blocks=2, disk_dir=disk_dir,
                           num_disk_blocks=num_disk_blocks, host_ttl_s=host_ttl_s)
    assert serve(manager, 1, A) == 0
    for i, filler in enumerate(FILLER):
        serve(manager, 10 + i, filler)
    return manager


def files(manager) -> list[Path]:
    """The block files on disk once the writes queued so far have landed."""
    manager.prefix_cache.tiers.disk.flush()
    return sorted(manager.prefix_cache.tiers.disk.directory.glob("*" + SUFFIX))


def restart(manager, disk_dir: Path, secret: bytes = b"kv-test-secret"):
    """Stop as a worker does (spill to disk, release the directory), start a new one."""
    manager.spill_to_disk()
    manager.prefix_cache.tiers.disk.close()
    return make_manager(6, B, num_host_blocks=2, disk_dir=disk_dir, num_disk_blocks=16,
                        secret=secret)


def test_blocks_the_host_tier_drops_move_to_disk_and_come_back_as_cached(tmp_path):
    manager = pushed_to_disk(tmp_path)
    disk = manager.prefix_cache.tiers.disk
    assert disk.stats().num_disk_blocks_used >= 2 and len(files(manager)) == len(disk.entries())
    num_cached = manager.admit(99, A + [7], "t1")
    assert num_cached == 2 * B
    assert_reads(manager, 99, A + [7], num_cached)
    stats = manager.stats().disk
    assert stats.disk_hit_blocks_total == 2 and stats.disk_auth_failures_total == 0
    assert len(files(manager)) == len(disk.entries())  # read back: the files are gone
    manager.free(99)
    manager.check_invariants()


def test_events_name_the_disk_medium_and_a_snapshot_replays_to_the_same_tiers(tmp_path):
    manager = pushed_to_disk(tmp_path)
    log = manager.event_log
    consumer = EventConsumer(B)
    consumer.apply(log.since(-1, log.epoch))
    tiers = manager.prefix_cache.tiers
    assert consumer.disk_hashes == {h.hex() for h, _ in tiers.disk.entries()} != set()
    assert consumer.host_hashes == {h.hex() for h, _ in tiers.host.entries()}
    serve(manager, 99, A + [7])
    consumer.apply(log.since(consumer.last_seq, log.epoch))
    assert consumer.disk_hashes == {h.hex() for h, _ in tiers.disk.entries()}
    fresh = EventConsumer(B)
    fresh.apply(manager.snapshot()[1], snapshot=True)
    assert (fresh.disk_hashes, fresh.host_hashes) == (consumer.disk_hashes, consumer.host_hashes)


def test_a_restarted_manager_takes_back_its_disk_and_announces_it_under_a_new_epoch(tmp_path):
    manager = pushed_to_disk(tmp_path)
    old_epoch = manager.event_log.epoch
    manager = restart(manager, tmp_path)
    log = manager.event_log
    assert log.epoch != old_epoch
    kept = {h.hex() for h, _ in manager.prefix_cache.tiers.disk.entries()}
    assert len(kept) == 2 + 6 * 2  # A's and every filler's full blocks, in one LRU order
    consumer = EventConsumer(B)
    consumer.apply(log.since(-1, log.epoch))  # cleared, then the re-announce
    assert consumer.disk_hashes == kept
    snapshot = EventConsumer(B)
    snapshot.apply(manager.snapshot()[1], snapshot=True)
    assert snapshot.disk_hashes == kept
    assert serve(manager, 1, A + [7]) == 2 * B  # served from disk with A's own K/V


def test_disk_entries_keep_their_host_expiry_and_are_dropped_when_it_comes(tmp_path):
    manager = pushed_to_disk(tmp_path, host_ttl_s=60.0)
    disk = manager.prefix_cache.tiers.disk
    held = {h.hex() for h, _ in disk.entries()}
    assert held and all(e.expires_at is not None for _, e in disk.entries())
    log = manager.event_log
    head = log.since(-1, log.epoch)[-1].seq
    assert manager.expire_host(time.time()) == 0, "nothing expires before its TTL"
    num_host = len(manager.prefix_cache.tiers.host.entries())
    assert manager.expire_host(time.time() + 61) == len(held) + num_host
    removed_from_disk = {b.hash for e in log.since(head, log.epoch) if e.medium == "disk"
                         for b in e.blocks}
    assert removed_from_disk == held and disk.entries() == [] and files(manager) == []
    assert manager.admit(99, A + [7], "t1") == 0, "an expired prefix is not served"
    manager.free(99)
    manager.check_invariants()


def test_blocks_that_expired_while_the_worker_was_down_are_dropped_at_the_scan(tmp_path):
    manager = pushed_to_disk(tmp_path, host_ttl_s=2.0)
    manager.spill_to_disk()
    disk = manager.prefix_cache.tiers.disk
    last_expiry = max(e.expires_at for _, e in disk.entries())
    disk.close()
    assert files(manager) != []
    time.sleep(max(0.0, last_expiry - time.time()) + 0.05)
    manager = make_manager(6, B, num_host_blocks=2, disk_dir=tmp_path, num_disk_blocks=16,
                           host_ttl_s=2.0)
    assert manager.prefix_cache.tiers.disk.entries() == [] and files(manager) == []
    assert manager.stats().disk.disk_auth_failures_total == 0


def test_another_secret_opens_nothing_and_the_files_are_dropped_and_counted(tmp_path):
    manager = restart(pushed_to_disk(tmp_path), tmp_path, secret=b"another-secret")
    stats = manager.stats().disk
    assert stats.num_disk_blocks_used == 0 and stats.disk_auth_failures_total == 14
    assert files(manager) == [] and serve(manager, 1, A + [7]) == 0


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_torn_or_tampered_file_is_dropped_at_the_scan_and_counted(tmp_path, damage):
    manager = pushed_to_disk(tmp_path)
    manager.spill_to_disk()
    victims = files(manager)[:3]
    for path in victims:
        data = bytearray(path.read_bytes())
        if damage == "truncate":
            data = data[: len(data) - 7]
        else:
            data[len(data) // 2] ^= 0x20
        path.write_bytes(bytes(data))
    manager.prefix_cache.tiers.disk.close()
    manager = make_manager(6, B, num_host_blocks=2, disk_dir=tmp_path, num_disk_blocks=16)
    stats = manager.stats().disk
    assert stats.disk_auth_failures_total == 3 and stats.num_disk_blocks_used == 14 - 3
    assert not any(path.exists() for path in victims)
    for seq_id, tokens in enumerate([A + [7], *[f + [1] for f in FILLER]]):
        serve(manager, 100 + seq_id, tokens)  # reads only K/V that is right, or computes


def test_a_file_tampered_after_the_scan_is_refused_at_the_read(tmp_path):
    manager = pushed_to_disk(tmp_path)
    disk = manager.prefix_cache.tiers.disk
    for path in files(manager):
        data = bytearray(path.read_bytes())
        data[-1] ^= 1  # the last byte of the sealed K/V's tag
        path.write_bytes(bytes(data))
    assert manager.admit(99, A + [7], "t1") == 0
    assert disk.stats().disk_auth_failures_total == 1 and disk.stats().disk_hit_blocks_total == 0
    manager.free(99)
    manager.check_invariants()


def test_a_second_worker_cannot_open_a_directory_in_use(tmp_path):
    pushed_to_disk(tmp_path)
    with pytest.raises(ValueError, match="in use"):
        make_manager(6, B, num_host_blocks=2, disk_dir=tmp_path, num_disk_blocks=16)


def test_a_full_disk_tier_drops_its_oldest_blocks_and_their_files(tmp_path):
    manager = pushed_to_disk(tmp_path, num_disk_blocks=2)
    assert manager.stats().disk.num_disk_blocks_used == 2 and len(files(manager)) == 2
    assert serve(manager, 99, A + [7]) == 0  # A's blocks were the oldest: dropped


def test_a_disk_tier_needs_a_host_tier(tmp_path):
    with pytest.raises(ValueError, match="host tier"):
        make_manager(6, B, disk_dir=tmp_path, num_disk_blocks=4)


def test_the_disk_flags_and_their_config_checks(tmp_path):
    flags = ["--host-cache-bytes", "1MiB", "--disk-cache-dir", str(tmp_path),
             "--disk-cache-bytes", "2GiB"]
    kv = config_from_args(_parser().parse_args(flags)).kv
    assert (kv.disk_cache_dir, kv.disk_cache_bytes) == (str(tmp_path), 2 * 2**30)
    with pytest.raises(ValueError, match="kv.disk_cache_bytes: must be 0 without a host tier"):
        WorkerConfig().with_overrides({"kv": {"disk_cache_dir": "d", "disk_cache_bytes": 1}})
    with pytest.raises(ValueError, match="kv.disk_cache_dir: .* go together"):
        WorkerConfig().with_overrides({"kv": {"host_cache_bytes": 1, "disk_cache_bytes": 1}})


def test_a_block_whose_write_is_still_queued_is_served_from_memory(tmp_path, monkeypatch):
    gate = threading.Event()

    def held(directory: Path, name: str, data: bytes) -> None:
        gate.wait(30)
        write_atomic(directory, name, data)

    monkeypatch.setattr(disk_writer, "write_atomic", held)
    manager = pushed_to_disk(tmp_path)
    disk = manager.prefix_cache.tiers.disk
    assert not list(disk.directory.glob("*" + SUFFIX)) and len(disk.entries()) >= 2
    num_cached = manager.admit(99, A + [7], "t1")
    assert num_cached == 2 * B  # from the queued bytes: nothing is on disk yet
    assert_reads(manager, 99, A + [7], num_cached)
    gate.set()
    assert len(files(manager)) == len(disk.entries())  # A's files: written, then deleted
    manager.free(99)
    manager.check_invariants()


def test_blocks_that_cannot_be_written_are_dropped_by_the_next_put(tmp_path, monkeypatch):
    def full(directory: Path, name: str, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(disk_writer, "write_atomic", full)
    manager = pushed_to_disk(tmp_path)
    disk = manager.prefix_cache.tiers.disk
    disk.flush()
    log = manager.event_log
    events = EventConsumer(B)
    events.apply(log.since(-1, log.epoch))
    assert events.disk_hashes  # announced, then found unwritable
    serve(manager, 98, [90 + j for j in range(2 * B)])  # pushes more blocks down
    entries = disk.entries()
    assert len(entries) <= 2 and not files(manager)  # at most this put's, not yet failed
    events.apply(log.since(events.last_seq, log.epoch))
    assert events.disk_hashes == {h.hex() for h, _ in entries}
    assert serve(manager, 99, A + [7]) == 0
    manager.check_invariants()


def test_a_planted_link_is_never_followed(tmp_path):
    target = tmp_path / "precious"
    target.write_bytes(b"keep me")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / ("x" + SUFFIX + ".tmp")).symlink_to(target)
    write_atomic(tmp_path / "out", "x" + SUFFIX, b"block")
    assert target.read_bytes() == b"keep me"
    assert (tmp_path / "out" / ("x" + SUFFIX)).read_bytes() == b"block"
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "lock").symlink_to(target)
    with pytest.raises(ValueError, match="link"):
        lock_directory(locked)


def test_a_directory_others_may_write_to_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ValueError, match="writable by others"):
        check_private(shared)
    shared.chmod(0o700)
    check_private(shared)
    (tmp_path / "elsewhere").symlink_to(shared)
    with pytest.raises(ValueError, match="not a directory"):
        check_private(tmp_path / "elsewhere")
