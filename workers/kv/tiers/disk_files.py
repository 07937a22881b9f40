"""The disk tier's files: one file per KV block, sealed, written atomically.

Layout of ``<hash hex>.kv``::

    MAGIC | u16 len | scope | u16 len | block hash | u32 len | sealed meta | sealed K/V

``sealed meta`` is the block's arrival number (its place in the LRU order), its
expiry (wall-clock seconds, 0 for none: the host tier's TTL, carried down), its
parent hash and its tokens (key bytes); ``sealed K/V`` is the host tier's sealed
block, written as it is. Both are ``BlockSealer`` seals (AES-256-GCM, a key per
scope from the deployment secret, namespace digest, scope and hash as associated
data), so a file opens only under the same secret and namespace, and a changed
byte anywhere, a cut-off tail, or a block filed under another hash or scope fails
authentication. Scope and hash stay in clear: they select the key and are the
associated data.

A file is written to a temporary name in the same directory, flushed with
``fsync``, renamed over its final name and the directory ``fsync``ed: a crash leaves
the old file or the new one, never a torn one; a leftover temporary file is deleted
by the next scan. A ``lock`` file, ``flock``ed by the tier that owns the directory,
keeps a second worker out. Nothing here follows a symbolic link or writes into a file
it did not create (``O_NOFOLLOW``, ``O_EXCL``), and a directory others may write to
is refused (``check_private``): a planted link would otherwise aim a write anywhere.
"""

from __future__ import annotations

import fcntl
import os
import stat
import struct
from pathlib import Path
from typing import NamedTuple

from radix.hashing import BlockHash
from workers.kv.tiers.host_crypto import BlockSealer

MAGIC = b"radix-kv-disk v2\n"
SUFFIX = ".kv"
TEMP_SUFFIX = ".tmp"
LOCK_NAME = "lock"
_META = struct.Struct(">QdH")  # arrival, expires_at (0: never), parent length


class DiskRecord(NamedTuple):
    """One block as stored: its name, owner, place in the LRU order, expiry (None:
    never), chain parent, tokens (key bytes) and its sealed K/V (opened only when it
    is read back)."""

    block_hash: BlockHash
    scope: str
    arrival: int
    expires_at: float | None
    parent: BlockHash | None
    tokens: bytes
    sealed_kv: bytes


def file_name(block_hash: BlockHash) -> str:
    """The file name of ``block_hash``."""
    return block_hash.hex() + SUFFIX


def encode(record: DiskRecord, sealer: BlockSealer) -> bytes:
    """The file contents of ``record`` (its meta sealed, its K/V as given)."""
    parent = record.parent or b""
    meta = _META.pack(record.arrival, record.expires_at or 0.0, len(parent)) + parent + record.tokens
    sealed_meta = sealer.seal(record.scope, record.block_hash, meta)
    scope = record.scope.encode()
    return b"".join((
        MAGIC, struct.pack(">H", len(scope)), scope,
        struct.pack(">H", len(record.block_hash)), record.block_hash,
        struct.pack(">I", len(sealed_meta)), sealed_meta, record.sealed_kv,
    ))


def decode(data: bytes, sealer: BlockSealer) -> DiskRecord | None:
    """The record in ``data``, or None when it is malformed or its meta fails
    authentication (the K/V is checked by whoever opens it)."""
    if not data.startswith(MAGIC):
        return None
    try:
        at = len(MAGIC)
        scope_bytes, at = _field(data, at, ">H")
        block_hash, at = _field(data, at, ">H")
        sealed_meta, at = _field(data, at, ">I")
        scope = scope_bytes.decode()
    except (struct.error, ValueError):
        return None
    meta = sealer.open(scope, block_hash, sealed_meta)
    if meta is None or len(meta) < _META.size:
        return None
    arrival, expires_at, parent_len = _META.unpack_from(meta)
    parent = meta[_META.size : _META.size + parent_len]
    tokens = meta[_META.size + parent_len :]
    return DiskRecord(
        BlockHash(block_hash), scope, arrival, expires_at or None,
        BlockHash(parent) if parent else None, tokens, data[at:],
    )


def _field(data: bytes, at: int, length_format: str) -> tuple[bytes, int]:
    """A length-prefixed field at ``at`` and the offset after it; ValueError if cut."""
    (length,) = struct.unpack_from(length_format, data, at)
    start = at + struct.calcsize(length_format)
    if start + length > len(data):
        raise ValueError("field runs past the end")
    return data[start : start + length], start + length


def write_atomic(directory: Path, name: str, data: bytes) -> None:
    """Write ``data`` as ``directory/name``: a temporary file, ``fsync``, rename,
    ``fsync`` of the directory (see the module docstring). On OSError the temporary
    file is gone and ``directory/name`` is as it was."""
    temp = directory / (name + TEMP_SUFFIX)
    try:
        temp.unlink(missing_ok=True)  # a crash's leftover (a link is removed, not followed)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, directory / name)
    except OSError:
        temp.unlink(missing_ok=True)
        raise
    sync_directory(directory)


def sync_directory(directory: Path) -> None:
    """``fsync`` the directory entry list (makes renames and deletions durable)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_private(directory: Path) -> None:
    """ValueError unless ``directory`` is a real directory (not a link), owned by this
    process's user, that no one else may write to."""
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise ValueError(f"the disk cache directory {directory} is not a directory (a link?)")
    if info.st_uid != os.getuid():
        raise ValueError(f"the disk cache directory {directory} belongs to another user")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ValueError(f"the disk cache directory {directory} is writable by others "
                         f"(mode {stat.S_IMODE(info.st_mode):o}): chmod go-w it")


def lock_directory(directory: Path) -> int:
    """An exclusive lock on ``directory``'s lock file, held by the returned descriptor
    until it is closed (or the process ends); ValueError when another holder (in any
    process) has it."""
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise ValueError(f"the disk cache directory {directory}: cannot open its lock file "
                         f"({exc.strerror}; a link there is refused)") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ValueError(f"the disk cache directory {directory} is in use by another "
                         f"worker") from None
    return fd
