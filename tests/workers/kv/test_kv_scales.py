"""FP8 KV scales: per-channel calibration records, their checks, the unit-scales and
GPU refusals, and what enters the namespace."""

from __future__ import annotations

import json

import pytest
import torch

from radix.namespace import CacheNamespace
from workers.build import cache_namespace, check_fp8_device, kv_scales, kv_spec
from workers.config import KVSettings
from workers.kv.fp8_device import fp8_device_problem
from workers.kv.plan import plan_kv_cache
from workers.kv.scales import (
    FORMAT,
    STATS,
    KVScales,
    LayerScales,
    calibration_record,
    fp8_max,
    load_scales,
)
from workers.kv.spec import KVCacheSpec
from workers.model.calibrate import DEFAULT_PROMPTS, calibrate, read_prompt_set
from workers.model.demo import ensure_demo_checkpoint
from workers.model.loader import load_model
from workers.model.numerics import EngineNumerics

SHAPE = (4, 4, 32)  # the demo model: layers, KV heads, head dim
TOOL = {"name": "test", "version": "0", "parameters": {"headroom": 4.0}}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return load_model(ensure_demo_checkpoint(tmp_path_factory.mktemp("demo")))


@pytest.fixture(scope="module")
def record(demo):
    prompts = [demo.tokenizer.encode("hello there, calibrate me"), demo.tokenizer.encode("x" * 40)]
    return calibration_record(demo.weights_digest, TOOL, {"sha256": "p" * 64},
                              calibrate(demo, prompts))


def write(tmp_path, record) -> str:
    path = tmp_path / "scales.json"
    path.write_text(json.dumps(record))
    return str(path)


def settings(path: str | None = None, allow_unit: bool = False) -> KVSettings:
    return KVSettings(cache_dtype="fp8_e4m3", scales_file=path, allow_unit_scales=allow_unit)


def test_calibration_finds_each_channel_s_mean_and_range(demo):
    """Against the K and V two prompts write into a cache of their own: the offsets are
    the means of K per channel over both, the ranges the largest distance from them
    (and the largest |V|)."""
    from workers.kv.tensors import KVCacheTensors
    from workers.model.runner import ModelRunner
    from workers.model.step_input import StepInput

    prompts = [demo.tokenizer.encode("a short prompt"), demo.tokenizer.encode("and another " * 5)]
    written: dict[str, list[torch.Tensor]] = {"k": [], "v": []}
    for prompt in prompts:
        tensors = KVCacheTensors(kv_spec(demo.config, 16), 8)
        runner = ModelRunner(demo.model, tensors.key_caches, tensors.value_caches, 16)
        runner.execute([StepInput(prompt, 0, [6, 2, 4, 0, 5])])
        slots = [16 * [6, 2, 4, 0, 5][p // 16] + p % 16 for p in range(len(prompt))]
        written["k"].append(tensors.key_caches[1].flatten(0, 1)[slots])
        written["v"].append(tensors.value_caches[1].flatten(0, 1)[slots])
    keys, values = torch.cat(written["k"]), torch.cat(written["v"])
    stats = calibrate(demo, prompts)[1]
    mean = keys.double().mean(0).float()
    assert torch.allclose(stats["k_offset"], mean, atol=1e-5)
    assert torch.allclose(stats["k_amax"], (keys - mean).abs().amax(0), atol=1e-5)
    assert torch.equal(stats["v_amax"], values.abs().amax(0))


def test_calibrated_ranges_become_per_channel_scales_for_either_format(demo, record, tmp_path):
    path = write(tmp_path, record)
    assert record["format"] == FORMAT and len(record["layers"]) == 4
    layer = record["layers"][2]
    for dtype in ("float8_e4m3fn", "float8_e5m2"):
        scales = load_scales(path, dtype, *SHAPE, demo.weights_digest)
        loaded = scales.layers[2]
        assert isinstance(loaded, LayerScales) and loaded.k_scale.shape == (4, 32)
        top = fp8_max(dtype)
        assert loaded.k_scale[1, 5].item() == pytest.approx(4.0 * layer["k_amax"][1][5] / top)
        assert loaded.v_scale[3, 0].item() == pytest.approx(4.0 * layer["v_amax"][3][0] / top)
        assert loaded.k_offset[0, 7].item() == pytest.approx(layer["k_offset"][0][7])
        assert scales.digest == record["sha256"] and scales.source == path
        assert not scales.is_unit


def test_edited_foreign_misshapen_or_per_layer_records_are_refused(demo, record, tmp_path):
    def load(edited, digest=demo.weights_digest, shape=SHAPE):
        return load_scales(write(tmp_path, edited), "float8_e4m3fn", *shape, digest)

    edited = {**record, "layers": record["layers"][::-1]}
    with pytest.raises(ValueError, match="sha256 does not match"):
        load(edited)
    with pytest.raises(ValueError, match="calibrated for weights"):
        load(record, digest="other-weights")
    with pytest.raises(ValueError, match="needs 5 layers"):
        load(record, shape=(5, 4, 32))
    with pytest.raises(ValueError, match=r"layer 0: k_offset must be 4 x 16"):
        load(record, shape=(4, 4, 16))
    with pytest.raises(ValueError, match="not a radix-router-kv-scales/2 record"):
        load({"k_amax": []})
    with pytest.raises(ValueError, match="per-layer scales .* recalibrate"):
        load({"format": "radix-router-kv-scales/1", "k_amax": [1.0] * 4})
    no_headroom = calibration_record(demo.weights_digest, {"name": "x"}, {}, [])
    with pytest.raises(ValueError, match="headroom must be a number >= 1"):
        load(no_headroom)


def test_the_record_says_which_tool_version_parameters_and_prompt_set_made_it(demo):
    prompts, prompt_set = read_prompt_set(DEFAULT_PROMPTS, demo.tokenizer, 64)
    assert prompt_set["file"] == "calibration-prompts.jsonl" and len(prompt_set["sha256"]) == 64
    assert {"long", "rag", "tool_use", "multilingual"} <= set(prompt_set["kinds"])
    assert prompt_set["num_prompts"] == len(prompts) and max(map(len, prompts)) == 64
    tool = {"name": "workers.model.calibrate", "version": "1.2.3",
            "parameters": {"headroom": 4.0, "max_prompt_tokens": 64}}
    stats = [dict.fromkeys(STATS, torch.ones(4, 32))] * 4
    record = calibration_record(demo.weights_digest, tool, prompt_set, stats)
    assert record["tool"] == tool and record["prompts"] == prompt_set
    assert record["model_digest"] == demo.weights_digest


def test_read_prompt_set_names_the_line_of_a_bad_entry(demo, tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"kind": "short", "prompt": "hi"}\n\n{"prompt": "no kind"}\n')
    with pytest.raises(ValueError, match="prompts.jsonl line 3"):
        read_prompt_set(path, demo.tokenizer, 64)


def test_fp8_plan_halves_bytes_per_token_against_bf16():
    bf16 = plan_kv_cache(KVCacheSpec(30, 3, 64, "bf16"), 2**26)
    for fp8 in ("fp8_e4m3", "fp8_e5m2"):
        plan = plan_kv_cache(KVCacheSpec(30, 3, 64, fp8), 2**26)
        assert plan.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
        assert plan.num_blocks >= 2 * bf16.num_blocks


def test_fp8_without_scales_is_refused_unless_allowed(demo):
    fp8 = kv_spec(demo.config, 16, "fp8_e4m3")
    with pytest.raises(ValueError, match="needs a scales file .* --allow-unit-kv-scales"):
        kv_scales(fp8, settings(), demo.weights_digest)
    assert kv_scales(fp8, settings(allow_unit=True), demo.weights_digest) == KVScales.unit(4)
    assert kv_scales(kv_spec(demo.config, 16), KVSettings(), demo.weights_digest).is_unit


def test_fp8_is_refused_on_gpus_below_sm89_with_the_capability_named():
    for capability in ((7, 0), (7, 5), (8, 0), (8, 6), (8, 7)):
        problem = fp8_device_problem("float8_e4m3fn", capability)
        assert problem is not None and "compute capability 8.9 or newer" in problem
        assert f"sm_{capability[0]}{capability[1]}" in problem
        assert "--kv-cache-dtype auto" in problem
    for capability in ((8, 9), (9, 0), (10, 0), (12, 0)):
        assert fp8_device_problem("float8_e5m2", capability) is None
    check_fp8_device(KVCacheSpec(2, 1, 8, "fp8_e4m3"), torch.device("cpu"))  # CPU: allowed


def test_an_fp8_namespace_never_equals_one_without(demo, record, tmp_path):
    secret = b"s"
    auto = kv_spec(demo.config, 16)
    fp8 = kv_spec(demo.config, 16, "fp8_e4m3")
    e5m2 = kv_spec(demo.config, 16, "fp8_e5m2")
    assert auto.dtype == "float32" and fp8.dtype == "float8_e4m3fn"
    path = write(tmp_path, record)
    calibrated = kv_scales(fp8, settings(path), demo.weights_digest)
    unit = kv_scales(fp8, settings(allow_unit=True), demo.weights_digest)
    ids = (demo.weights_digest, demo.tokenizer, demo.config.rope_fingerprint())
    numerics = EngineNumerics("torch-reference", 1)
    namespaces = [
        cache_namespace("demo", *ids, auto, KVScales.unit(4), numerics),
        cache_namespace("demo", *ids, fp8, unit, numerics),
        cache_namespace("demo", *ids, fp8, calibrated, numerics),
        cache_namespace("demo", *ids, e5m2, kv_scales(
            e5m2, KVSettings(cache_dtype="fp8_e5m2", scales_file=path), demo.weights_digest),
            numerics),
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
        kv = settings(write(tmp_path, record)) if spec.is_fp8 else KVSettings()
        scales = kv_scales(spec, kv, demo.weights_digest)
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
    half = torch.full((4, 32), 0.5)
    scales = KVScales((LayerScales(half, half, half),) * 4, "x.json", "d")
    with pytest.raises(ValueError, match="need an FP8 cache"):
        ModelRunner(demo.model, tensors.key_caches, tensors.value_caches, 16, scales)
