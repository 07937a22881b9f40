"""The metadata of a GGUF file (its key-value section), read without its tensors.

A GGUF file (llama.cpp's format, versions 2 and 3) starts with the magic ``GGUF``, a
u32 version, a u64 tensor count and a u64 key count, then each key: a string (u64
length, UTF-8 bytes), a u32 value type and the value: a scalar, a string, or an array
(u32 item type, u64 count, the items; arrays may nest). Little-endian, or big-endian
when the version reads byte-swapped. ``gguf.GGUFReader`` parses the same and the
tensor infos, but builds a numpy view of every item: 3.7 s of CPU for the metadata of
SmolLM2's 49,152-token vocabulary, where ``read_metadata`` takes about a tenth of a
second. A router that loads a GGUF tokenizer needs the metadata only; a worker reads
the tensors through ``GGUFReader`` as well.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
# value type -> struct format of one item
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}


def read_metadata(path: str | Path) -> dict[str, Any]:
    """Every key of the GGUF file at ``path`` with its value (scalars as Python values,
    arrays as lists): what ``GGUFReader``'s ``field.contents()`` gives for each key.
    ValueError when the file is empty, not a GGUF, or its metadata is cut short or
    malformed; OSError when it cannot be read."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        try:
            return _Parser(data).metadata()
        except struct.error as exc:
            raise ValueError(f"GGUF metadata cut short or malformed: {exc}") from exc


class _Parser:
    """A cursor over a GGUF file's bytes."""

    def __init__(self, data: mmap.mmap) -> None:
        self._data = data
        self._at = 0
        self._order = "<"

    def metadata(self) -> dict[str, Any]:
        if self._data[:4] != _MAGIC:
            raise ValueError("no GGUF magic at the start of the file")
        self._at = 4
        version = self._unpack("I")
        if not version & 0xFFFF:
            self._order, self._at = ">", 4
            version = self._unpack("I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported (2 or 3)")
        self._unpack("Q")  # tensor count
        num_keys = self._unpack("Q")
        metadata = {}
        for _ in range(num_keys):
            key = self._string()
            metadata[key] = self._value(self._unpack("I"))
        return metadata

    def _unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(self._order + fmt, self._data, self._at)
        self._at += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        length = self._unpack("Q")
        end = self._at + length
        if end > len(self._data):
            raise ValueError(f"a string of {length} bytes runs past the end of the file")
        text = self._data[self._at:end].decode("utf-8")
        self._at = end
        return text

    def _value(self, kind: int) -> Any:
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            item_kind, count = self._unpack("I"), self._unpack("Q")
            return self._array(item_kind, count)
        if kind not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {kind}")
        return self._unpack(_SCALARS[kind])

    def _array(self, kind: int, count: int) -> list[Any]:
        if kind in _SCALARS:
            fmt = f"{self._order}{count}{_SCALARS[kind]}"
            items = list(struct.unpack_from(fmt, self._data, self._at))  # struct.error if short
            self._at += struct.calcsize(fmt)
            return items
        if count > len(self._data) - self._at:
            raise ValueError(f"an array of {count} items runs past the end of the file")
        return [self._value(kind) for _ in range(count)]
