"""Published vectors for the namespace encoding and block hash chain.

Any implementation of the contract (another router, a worker in another language)
must reproduce these bytes exactly. The first vectors are also recomputed here from
the written rule with the standard library, so the pinned hex is not self-referential.
"""

import hashlib
import hmac
import struct

import pytest

from radix.hashing import BlockHasher
from radix.keys import from_key, to_key
from radix.namespace import CacheNamespace

SECRET = b"test-secret"
NAMESPACE = CacheNamespace(
    model_id="demo",
    weights_digest="ab12",
    tokenizer_digest="cd34",
    rope=CacheNamespace.canonical_rope(
        {"rope_theta": 10000.0, "rope_scaling": None, "max_position_embeddings": 4096}
    ),
    kv_dtype="float32",
    block_size=16,
)
ENCODING_HEX = (
    "52524e530200730000000464656d6f01730000000461623132027300000004636433340373000000000473"
    "000000000573000000497b226d61785f706f736974696f6e5f656d62656464696e6773223a343039362c22"
    "726f70655f7363616c696e67223a6e756c6c2c22726f70655f7468657461223a31303030302e307d067300"
    "000007666c6f61743332076900000002313608690000000131097300000000"
)
FINGERPRINT = "38d8c0958c8c80a8e3e5b63b8f6e6eb1ae5b2e534f0906a5d3e142ee7f0a2538"
CHAIN = {
    "blake2b": ["46fa3b6e0077a5eeb27ed458c981b08d", "4246addb19aaa6de004522d2b70e543c",
                "e710ec5b64389febb21e489fdbfe39e2"],
    "xxh3_128": ["d6c7bad0e5012e5ebdc1e13297cc8278", "a7b871638ee6b654024abefe8857f94b",
                 "e3911803557a777ce20884dd1adf86a4"],
}


def field(tag: int, kind: bytes, raw: bytes) -> bytes:
    return struct.pack(">Bc", tag, kind) + struct.pack(">I", len(raw)) + raw


def test_namespace_encoding_vector():
    assert NAMESPACE.encode().hex() == ENCODING_HEX
    assert NAMESPACE.encode().startswith(b"RRNS\x02" + field(0, b"s", b"demo"))
    assert NAMESPACE.fingerprint(SECRET) == FINGERPRINT
    expected = hmac.new(SECRET, bytes.fromhex(ENCODING_HEX), hashlib.sha256).hexdigest()
    assert expected == FINGERPRINT


@pytest.mark.parametrize(
    "left, right",
    [
        (dict(adapter_name="a", adapter_digest="bc"), dict(adapter_name="ab", adapter_digest="c")),
        (dict(model_id="ab", weights_digest="c"), dict(model_id="a", weights_digest="bc")),
        (dict(tokenizer_digest="x", rope="{}"), dict(tokenizer_digest="x{", rope="}")),
    ],
)
def test_field_splits_never_collide(left, right):
    base = dict(model_id="m", weights_digest="w", tokenizer_digest="t")
    a = CacheNamespace(**{**base, **left})
    b = CacheNamespace(**{**base, **right})
    assert a.encode() != b.encode()
    assert a.digest(SECRET) != b.digest(SECRET)


def test_every_field_changes_the_digest():
    base = CacheNamespace("m", "w", "t")
    variants = [
        CacheNamespace("m2", "w", "t"), CacheNamespace("m", "w2", "t"),
        CacheNamespace("m", "w", "t2"), CacheNamespace("m", "w", "t", "lora", "d"),
        CacheNamespace("m", "w", "t", rope='{"rope_theta":1}'),
        CacheNamespace("m", "w", "t", kv_dtype="bfloat16"),
        CacheNamespace("m", "w", "t", block_size=32),
        CacheNamespace("m", "w", "t", kv_layout_version=2),
    ]
    digests = {base.digest(SECRET)} | {v.digest(SECRET) for v in variants}
    assert len(digests) == len(variants) + 1
    assert base.digest(SECRET) != base.digest(b"other-secret")


def test_namespace_validation_names_the_field():
    with pytest.raises(ValueError, match="block_size"):
        CacheNamespace("m", "w", "t", block_size=0)
    with pytest.raises(ValueError, match="model_id"):
        CacheNamespace(3, "w", "t")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="adapter"):
        CacheNamespace("m", "w", "t", adapter_name="lora")
    with pytest.raises(ValueError, match="unknown"):
        CacheNamespace.from_dict({**NAMESPACE.to_dict(), "salt": "x"})
    assert CacheNamespace.from_dict(NAMESPACE.to_dict()) == NAMESPACE


@pytest.mark.parametrize("algorithm", ["blake2b", "xxh3_128"])
def test_block_hash_chain_vector(algorithm):
    hasher = BlockHasher(NAMESPACE.digest(SECRET), algorithm)
    chain = hasher.chain(to_key(range(40)), 16, "public")
    assert [h.hex() for h in chain] == CHAIN[algorithm]


def test_block_hash_rule_recomputed_with_hashlib():
    key = hashlib.blake2b(NAMESPACE.digest(SECRET), digest_size=64).digest()
    scope = struct.pack(">I", 6) + b"public"
    root = hashlib.blake2b(b"root" + scope, digest_size=16, key=key).digest()
    first = hashlib.blake2b(root + scope + struct.pack("<16I", *range(16)), digest_size=16, key=key)
    assert first.hexdigest() == CHAIN["blake2b"][0]


def test_chain_depends_on_scope_parent_and_every_token():
    hasher = BlockHasher(NAMESPACE.digest(SECRET))
    tokens = to_key(range(32))
    base = hasher.chain(tokens, 16, "alice")
    assert hasher.chain(tokens, 16, "bob") != base
    assert hasher.chain(to_key([*range(31), 99]), 16, "alice")[0] == base[0]
    assert hasher.chain(to_key([*range(31), 99]), 16, "alice")[1] != base[1]
    assert hasher.chain(tokens[64:], 16, "alice", parent=base[0]) == base[1:]
    assert from_key(tokens) == list(range(32))
    with pytest.raises(ValueError):
        BlockHasher(b"x", "md5")
