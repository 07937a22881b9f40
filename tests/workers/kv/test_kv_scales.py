"""FP8 KV scales: calibration records, their checks, and what enters the namespace."""

from __future__ import annotations

import json

import pytest
import torch

from radix.namespace import CacheNamespace
from workers.build import cache_namespace, kv_scales, kv_spec
from workers.kv.plan import plan_kv_cache
from workers.kv.scales import KVScales, calibration_record, fp8_max, load_scales
from workers.kv.spec import KVCacheSpec
from workers.model.calibrate import calibrate
from workers.model.demo import ensure_demo_checkpoint
from workers.model.loader import load_model
from workers.model.numerics import EngineNumerics


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return load_model(ensure_demo_checkpoint(tmp_path_factory.mktemp("demo")))


@pytest.fixture(scope="module")
def record(demo):
    prompts = [demo.tokenizer.encode("hello there, calibrate me"), demo.tokenizer.encode("x" * 40)]
    k_amax, v_amax = calibrate(demo, prompts)
    return calibration_record(demo.weights_digest, "p" * 64, k_amax, v_amax)


def write(tmp_path, record) -> str:
    path = tmp_path / "scales.json"
    path.write_text(json.dumps(record))
    return str(path)


def test_calibrated_maxima_become_scales_for_either_format(demo, record, tmp_path):
    path = write(tmp_path, record)
    assert len(record["k_amax"]) == 4 and min(record["k_amax"]) > 0
    for dtype in ("float8_e4m3fn", "float8_e5m2"):
        scales = load_scales(path, dtype, 4, demo.weights_digest)
        assert scales.k_scales[0] == pytest.approx(record["k_amax"][0] / fp8_max(dtype))
        assert scales.v_scales[3] == pytest.approx(record["v_amax"][3] / fp8_max(dtype))
        assert scales.digest == record["sha256"] and scales.source == path


def test_edited_or_foreign_records_are_refused(demo, record, tmp_path):
    edited = {**record, "k_amax": [1.0] * 4}
    with pytest.raises(ValueError, match="sha256 does not match"):
        load_scales(write(tmp_path, edited), "float8_e4m3fn", 4, demo.weights_digest)
    with pytest.raises(ValueError, match="calibrated for weights"):
        load_scales(write(tmp_path, record), "float8_e4m3fn", 4, "other-weights")
    with pytest.raises(ValueError, match="needs 5 K and V maxima"):
        load_scales(write(tmp_path, record), "float8_e4m3fn", 5, demo.weights_digest)
    with pytest.raises(ValueError, match="not a"):
        load_scales(write(tmp_path, {"k_amax": []}), "float8_e4m3fn", 4, demo.weights_digest)


def test_fp8_plan_halves_bytes_per_token_against_bf16():
    bf16 = plan_kv_cache(KVCacheSpec(30, 3, 64, "bf16"), 2**26)
    for fp8 in ("fp8_e4m3", "fp8_e5m2"):
        plan = plan_kv_cache(KVCacheSpec(30, 3, 64, fp8), 2**26)
        assert plan.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
        assert plan.num_blocks >= 2 * bf16.num_blocks


def test_an_fp8_namespace_never_equals_one_without(demo, record, tmp_path):
    secret = b"s"
    auto = kv_spec(demo.config, 16)
    fp8 = kv_spec(demo.config, 16, "fp8_e4m3")
    e5m2 = kv_spec(demo.config, 16, "fp8_e5m2")
    assert auto.dtype == "float32" and fp8.dtype == "float8_e4m3fn"
    calibrated = kv_scales(fp8, write(tmp_path, record), demo.weights_digest)
    unit = kv_scales(fp8, None, demo.weights_digest)
    assert unit == KVScales.unit(4)
    ids = (demo.weights_digest, demo.tokenizer, demo.config.rope_fingerprint())
    numerics = EngineNumerics("torch-reference", 1)
    namespaces = [
        cache_namespace("demo", *ids, auto, KVScales.unit(4), numerics),
        cache_namespace("demo", *ids, fp8, unit, numerics),
        cache_namespace("demo", *ids, fp8, calibrated, numerics),
        cache_namespace("demo", *ids, e5m2, kv_scales(e5m2, write(tmp_path, record),
                                                      demo.weights_digest), numerics),
    ]
    assert namespaces[2].kv_scales_digest == record["sha256"]
    digests = {ns.fingerprint(secret) for ns in namespaces}
    assert len(digests) == len(namespaces)
    assert CacheNamespace.from_dict(namespaces[2].to_dict()) == namespaces[2]


def test_runner_with_an_fp8_cache_tracks_the_fp32_logits(demo, record, tmp_path):
    from workers.kv.tensors import KVCacheTensors
    from workers.model.runner import ModelRunner
    from workers.model.step_input import StepInput

    prompt = demo.tokenizer.encode("The quick brown fox jumps over the lazy dog")
    logits = {}
    for dtype in ("auto", "fp8_e4m3"):
        spec = kv_spec(demo.config, 16, dtype)
        scales = kv_scales(spec, write(tmp_path, record) if spec.is_fp8 else None,
                           demo.weights_digest)
        tensors = KVCacheTensors(spec, 8)
        runner = ModelRunner(demo.model, tensors.key_caches, tensors.value_caches, 16, scales)
        first = runner.execute([StepInput(prompt, 0, [3, 1, 5, 7])])
        second = runner.execute([StepInput([int(first.argmax())], len(prompt), [3, 1, 5, 7])])
        logits[dtype] = torch.cat([first, second])
        if spec.is_fp8:
            assert tensors.key_caches[0].dtype == torch.float8_e4m3fn
    assert torch.equal(logits["auto"].argmax(-1), logits["fp8_e4m3"].argmax(-1))
    assert (logits["auto"] - logits["fp8_e4m3"]).abs().max().item() < 0.5


def test_runner_refuses_scales_on_a_cache_in_the_model_dtype(demo):
    from workers.kv.tensors import KVCacheTensors
    from workers.model.runner import ModelRunner

    tensors = KVCacheTensors(kv_spec(demo.config, 16), 2)
    scales = KVScales((0.5,) * 4, (0.5,) * 4, "x.json", "d")
    with pytest.raises(ValueError, match="need an FP8 cache"):
        ModelRunner(demo.model, tensors.key_caches, tensors.value_caches, 16, scales)
