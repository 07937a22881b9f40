"""``read_metadata`` against ``gguf.GGUFReader`` (what it replaces on the router's
path): the same keys and values on files ``gguf.GGUFWriter`` writes with every value
type, in both byte orders, and on the packaged SmolLM2 file; a clear ValueError on a
file that is not a GGUF or is cut short."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFEndian, GGUFReader, GGUFValueType, GGUFWriter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radix.gguf_metadata import read_metadata
from radix.model_source import packaged_model_path

_INTS = {
    GGUFValueType.UINT8: (0, 2**8 - 1), GGUFValueType.INT8: (-(2**7), 2**7 - 1),
    GGUFValueType.UINT16: (0, 2**16 - 1), GGUFValueType.INT16: (-(2**15), 2**15 - 1),
    GGUFValueType.UINT32: (0, 2**32 - 1), GGUFValueType.INT32: (-(2**31), 2**31 - 1),
    GGUFValueType.UINT64: (0, 2**64 - 1), GGUFValueType.INT64: (-(2**63), 2**63 - 1),
}


def _reference(path: Path) -> dict[str, Any]:
    reader = GGUFReader(path)
    return {name: field.contents() for name, field in reader.fields.items()
            if not name.startswith("GGUF.")}


def _write(path: Path, values: list[tuple[str, Any, GGUFValueType, GGUFValueType | None]],
           endian: GGUFEndian = GGUFEndian.LITTLE) -> Path:
    writer = GGUFWriter(str(path), "llama", endianess=endian)
    for key, value, kind, sub_kind in values:
        writer.add_key_value(key, value, kind, sub_kind)
    writer.add_tensor("token_embd.weight", np.zeros((2, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _scalar(kind: GGUFValueType) -> st.SearchStrategy[Any]:
    if kind in _INTS:
        return st.integers(*_INTS[kind])
    if kind is GGUFValueType.FLOAT32:
        return st.floats(width=32, allow_nan=False)
    if kind is GGUFValueType.FLOAT64:
        return st.floats(allow_nan=False)
    if kind is GGUFValueType.BOOL:
        return st.booleans()
    return st.text(max_size=20)


_KINDS = [*_INTS, GGUFValueType.FLOAT32, GGUFValueType.FLOAT64, GGUFValueType.BOOL,
          GGUFValueType.STRING]


@st.composite
def _entry(draw: st.DrawFn, index: int) -> tuple[str, Any, GGUFValueType, GGUFValueType | None]:
    kind = draw(st.sampled_from(_KINDS))
    if draw(st.booleans()):
        return (f"k{index}", draw(_scalar(kind)), kind, None)
    items = draw(st.lists(_scalar(kind), min_size=1, max_size=8))  # the writer refuses []
    return (f"k{index}", items, GGUFValueType.ARRAY, kind)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 8).flatmap(lambda n: st.tuples(*[_entry(i) for i in range(n)])),
       st.sampled_from([GGUFEndian.LITTLE, GGUFEndian.BIG]))
def test_every_value_type_reads_as_the_gguf_reader_reads_it(tmp_path, entries, endian) -> None:
    path = _write(tmp_path / "values.gguf", list(entries), endian)
    assert read_metadata(path) == _reference(path)


def test_the_packaged_smollm2_file_reads_as_the_gguf_reader_reads_it() -> None:
    try:
        path = packaged_model_path("SmolLM2-135M-Instruct")
    except ValueError:
        pytest.skip("the SmolLM2 package is not installed")
    metadata = read_metadata(path)
    assert len(metadata["tokenizer.ggml.tokens"]) == 49152
    assert metadata == _reference(path)


def test_a_file_that_is_not_a_gguf_or_is_cut_short_is_refused(tmp_path) -> None:
    path = _write(tmp_path / "full.gguf", [("general.name", "x" * 100, GGUFValueType.STRING, None),
                                           ("a", list(range(50)), GGUFValueType.ARRAY,
                                            GGUFValueType.UINT32)])
    data = path.read_bytes()
    for name, content in [("empty", b""), ("text", b"not a gguf at all"),
                          ("head", data[:30]), ("string", data[:60]), ("array", data[:200])]:
        broken = tmp_path / f"{name}.gguf"
        broken.write_bytes(content)
        with pytest.raises(ValueError):
            read_metadata(broken)
