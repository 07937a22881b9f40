"""The disk tier's writer: block files written and deleted in order, off the engine
thread.

``write`` hands a block's encoded file to a thread and returns at once; the thread
writes it (``disk_files.write_atomic``: a temporary file, ``fsync``, rename, ``fsync``
of the directory). Until the file is on disk its bytes stay in memory (``pending``),
so a hit on a block still queued is served from them. Deletions go through the same
queue, so a file written and then deleted ends deleted, whatever the thread was
doing. At most ``max_queued`` operations wait: beyond that ``write`` and ``unlink``
block until the disk catches up, which bounds the memory held. A write that fails
(disk full) is logged, and its block is reported once by ``failed`` unless it was
deleted or written again since.
"""

from __future__ import annotations

import logging
import queue
import threading
from pathlib import Path

from radix.hashing import BlockHash
from workers.kv.tiers.disk_files import file_name, write_atomic

log = logging.getLogger(__name__)
_Operation = tuple[BlockHash, bytes | None] | None  # (hash, file bytes or None: delete)


class DiskWriter:
    """One thread writing and deleting the block files of ``directory`` in call order."""

    def __init__(self, directory: Path, max_queued: int = 64) -> None:
        self._directory = directory
        self._queue: queue.Queue[_Operation] = queue.Queue(max_queued)
        self._lock = threading.Lock()
        self._pending: dict[BlockHash, bytes] = {}
        self._failed: list[BlockHash] = []
        self.num_bytes_written = 0
        self._thread = threading.Thread(target=self._run, name="kv-disk-writer", daemon=True)
        self._thread.start()

    def write(self, block_hash: BlockHash, data: bytes) -> None:
        """Queue ``data`` as the file of ``block_hash`` (kept in ``pending`` until written)."""
        with self._lock:
            self._pending[block_hash] = data
        self._queue.put((block_hash, data))

    def unlink(self, block_hash: BlockHash) -> None:
        """Queue the deletion of ``block_hash``'s file (after every write queued before)."""
        with self._lock:
            self._pending.pop(block_hash, None)
        self._queue.put((block_hash, None))

    def pending(self, block_hash: BlockHash) -> bytes | None:
        """The bytes of ``block_hash``'s file while its write is still queued."""
        with self._lock:
            return self._pending.get(block_hash)

    def failed(self) -> list[BlockHash]:
        """The blocks whose write failed since the last call (and that were not deleted
        or written again since)."""
        with self._lock:
            failed, self._failed = self._failed, []
        return failed

    def flush(self) -> None:
        """Return once every operation queued so far is done."""
        self._queue.join()

    def close(self) -> None:
        """Finish every queued operation and stop the thread."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            operation = self._queue.get()
            try:
                if operation is None:
                    return
                block_hash, data = operation
                if data is None:
                    (self._directory / file_name(block_hash)).unlink(missing_ok=True)
                else:
                    self._write(block_hash, data)
            except Exception:  # a bug here must not stop the writes behind it
                log.exception("disk tier writer failed")
            finally:
                self._queue.task_done()

    def _write(self, block_hash: BlockHash, data: bytes) -> None:
        try:
            write_atomic(self._directory, file_name(block_hash), data)
        except OSError as exc:
            log.warning("disk tier: cannot write block %s: %s", block_hash.hex(), exc)
            with self._lock:
                if self._pending.get(block_hash) is data:
                    del self._pending[block_hash]
                    self._failed.append(block_hash)
            return
        self.num_bytes_written += len(data)
        with self._lock:
            if self._pending.get(block_hash) is data:
                del self._pending[block_hash]
