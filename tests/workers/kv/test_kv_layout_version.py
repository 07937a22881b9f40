"""The KV layout version moves with the block layout: a changed layout without a new
``KV_LAYOUT_VERSION`` (and its recorded fingerprint) fails here."""

from __future__ import annotations

from radix.tokenizer import PromptTokenizer
from workers.build import cache_namespace
from workers.kv.scales import KVScales
from workers.kv.spec import KVCacheSpec
from workers.kv.tensors import KV_LAYOUT_FINGERPRINTS, KV_LAYOUT_VERSION, layout_fingerprint
from workers.model.numerics import EngineNumerics


def test_the_current_layout_is_the_one_recorded_for_the_current_version():
    assert max(KV_LAYOUT_FINGERPRINTS) == KV_LAYOUT_VERSION, "the newest version is current"
    assert layout_fingerprint() == KV_LAYOUT_FINGERPRINTS[KV_LAYOUT_VERSION], (
        "the KV block layout changed: add KV_LAYOUT_VERSION + 1 with the new fingerprint")
    assert len(set(KV_LAYOUT_FINGERPRINTS.values())) == len(KV_LAYOUT_FINGERPRINTS)


def test_worker_namespaces_carry_the_current_version():
    namespace = cache_namespace("m", "w", PromptTokenizer.demo(), {}, KVCacheSpec(1, 1, 2),
                                KVScales.unit(1), EngineNumerics("torch-reference", 1))
    assert namespace.kv_layout_version == KV_LAYOUT_VERSION
