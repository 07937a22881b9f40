"""The namespace fields added after encoding version 2 (the engine numerics and the key
mode): every field is in the digest, the published digests of namespaces that leave
the new fields at their defaults do not move, and the new fields' encoding follows the
written rule.

The brute-force model of the digest is field equality: two namespaces have the same
encoding and digest exactly when all their fields are equal.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radix.namespace import KEY_MODES, CacheNamespace

SECRET = b"test-secret"
NEW_FIELDS = {"attention_backend": ("triton", "torch-reference"),
              "engine_numerics_version": (1, 2),
              "key_mode": ("bigram",)}
# Small alphabets, so equal draws are common and the "equal digests" side is exercised.
namespaces = st.builds(
    CacheNamespace,
    model_id=st.sampled_from(["m", "m2"]),
    weights_digest=st.sampled_from(["w", "w2"]),
    tokenizer_digest=st.just("t"),
    kv_dtype=st.sampled_from(["float32", "bfloat16"]),
    block_size=st.sampled_from([16, 32]),
    attention_backend=st.sampled_from(["", "triton", "torch-reference"]),
    engine_numerics_version=st.integers(0, 2),
    key_mode=st.sampled_from(KEY_MODES),
)


def field(tag: int, kind: bytes, raw: bytes) -> bytes:
    return struct.pack(">Bc", tag, kind) + struct.pack(">I", len(raw)) + raw


@given(namespaces, namespaces)
def test_digests_are_equal_exactly_when_every_field_is(a, b):
    equal = dataclasses.asdict(a) == dataclasses.asdict(b)
    assert (a.encode() == b.encode()) is equal
    assert (a.digest(SECRET) == b.digest(SECRET)) is equal
    assert CacheNamespace.from_dict(a.to_dict()) == a


@pytest.mark.parametrize("name", sorted(NEW_FIELDS))
def test_each_new_field_value_is_its_own_namespace(name):
    base = CacheNamespace("m", "w", "t", attention_backend="torch-reference",
                          engine_numerics_version=1)
    values = {getattr(base, name), *NEW_FIELDS[name],
              dataclasses.fields(CacheNamespace)[_tag(name)].default}
    variants = [dataclasses.replace(base, **{name: value}) for value in values]
    assert len({v.fingerprint(SECRET) for v in variants}) == len(values)


def test_defaults_keep_the_digest_of_a_namespace_without_the_new_fields():
    old = CacheNamespace("m", "w", "t", kv_scales_digest="s")
    encoded_before = b"".join(
        [b"RRNS\x02"] + [field(tag, kind, raw) for tag, (kind, raw) in enumerate(
            [(b"s", b"m"), (b"s", b"w"), (b"s", b"t"), (b"s", b""), (b"s", b""),
             (b"s", b"{}"), (b"s", b"float32"), (b"i", b"16"), (b"i", b"1"), (b"s", b"s")])])
    assert old.encode() == encoded_before
    assert old.fingerprint(SECRET) == hmac.new(SECRET, encoded_before, hashlib.sha256).hexdigest()


def test_new_fields_are_encoded_under_their_own_tags_after_the_old_ones():
    old = CacheNamespace("m", "w", "t")
    new = dataclasses.replace(old, attention_backend="triton", engine_numerics_version=3,
                              key_mode="bigram")
    assert new.encode() == old.encode() + field(10, b"s", b"triton") + field(11, b"i", b"3") + (
        field(12, b"s", b"bigram"))


@pytest.mark.parametrize(("fields", "message"), [
    ({"engine_numerics_version": -1}, "engine_numerics_version must not be negative"),
    ({"engine_numerics_version": "1"}, "engine_numerics_version must be int"),
    ({"attention_backend": None}, "attention_backend must be str"),
    ({"key_mode": "trigram"}, "key_mode must be one of"),
])
def test_a_bad_new_field_is_refused_by_name(fields, message):
    with pytest.raises(ValueError, match=message):
        CacheNamespace("m", "w", "t", **fields)
    with pytest.raises(ValueError, match=message):
        CacheNamespace.from_dict({**CacheNamespace("m", "w", "t").to_dict(), **fields})


def _tag(name: str) -> int:
    return [f.name for f in dataclasses.fields(CacheNamespace)].index(name)
