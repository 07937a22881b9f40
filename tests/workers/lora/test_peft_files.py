"""Reading PEFT adapter directories: the scale rules, every refusal naming its field
before anything is loaded, the digest, and a timed worker's load cost."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file, save_file

from harness.lora_adapters import (
    adapter_config,
    model_shapes,
    write_config_adapters,
    write_peft_adapter,
)
from radix.cost_model import get_profile
from workers.lora.peft_files import AdapterError, load_tensors, read_adapter, weight_key
from workers.model.timed import TimedSlotLoader, timed_lora_shapes

TINY = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(TINY))
    return tmp_path / "model"


def test_scale_is_alpha_over_r_or_over_sqrt_r_with_rslora(model_dir, tmp_path):
    plain = write_peft_adapter(tmp_path / "plain", model_dir, 4, 8, seed=0)
    rs = write_peft_adapter(tmp_path / "rs", model_dir, 4, 8, seed=0, use_rslora=True)
    assert read_adapter("p", plain, model_shapes(model_dir), 8).scale == 2.0
    spec = read_adapter("r", rs, model_shapes(model_dir), 8)
    assert spec.scale == 4.0 and spec.rank == 4
    assert spec.digest != read_adapter("p", plain, model_shapes(model_dir), 8).digest


def edit_tensors(path, edit):
    tensors = load_file(str(path / "adapter_model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "adapter_model.safetensors"))


@pytest.mark.parametrize("breakage, param", [
    ("rank", "r"),
    ("target", "target_modules"),
    ("shape", weight_key(1, "v_proj", "lora_B")),
    ("missing", weight_key(0, "down_proj", "lora_A")),
    ("weights", "lora_path"),
])
def test_an_adapter_that_does_not_fit_is_refused_naming_the_field(model_dir, tmp_path, breakage,
                                                                  param):
    path = write_peft_adapter(tmp_path / "a", model_dir, 4, 8, seed=1)
    config = json.loads((path / "adapter_config.json").read_text())
    if breakage == "rank":
        config["r"] = 16
    elif breakage == "target":
        config["target_modules"] = ["q_proj", "embed_tokens"]
    elif breakage == "shape":
        edit_tensors(path, lambda t: t.update({param: t[param][:-1]}))
    elif breakage == "missing":
        edit_tensors(path, lambda t: t.pop(param))
    else:
        (path / "adapter_model.safetensors").unlink()
    (path / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(AdapterError) as refused:
        read_adapter("a", path, model_shapes(model_dir), max_rank=8)
    assert refused.value.param == param


def test_a_timed_load_waits_the_adapter_bytes_over_the_link(tmp_path):
    profile = get_profile("llama3-8b-h100")
    (_, path), = write_config_adapters(tmp_path, 1, rank=8)
    spec = read_adapter("x", path, timed_lora_shapes(profile), 16, needs_weights=False)
    per_layer = 8 * ((4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096) + 3 * (4096 + 14336))
    assert spec.num_bytes == per_layer * 32 * 2
    waits = []
    TimedSlotLoader(profile, time_scale=0.5, sleep=waits.append).load(0, spec)
    assert waits == [0.5 * (spec.num_bytes / profile.h2d_bytes_per_s + profile.lora_load_overhead_s)]
    config = adapter_config(32, 64)
    (path / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(AdapterError, match="max_lora_rank"):
        read_adapter("x", path, timed_lora_shapes(profile), 16, needs_weights=False)


def test_an_adapter_changed_on_disk_after_registration_is_refused_at_load(model_dir, tmp_path):
    path = write_peft_adapter(tmp_path / "a", model_dir, 4, 8, seed=0)
    spec = read_adapter("a", path, model_shapes(model_dir), 8)
    assert set(load_tensors(spec)) == set(load_file(str(path / "adapter_model.safetensors")))
    tensors = load_file(str(path / "adapter_model.safetensors"))
    key = next(iter(tensors))
    save_file({**tensors, key: tensors[key] * 2}, str(path / "adapter_model.safetensors"))
    with pytest.raises(AdapterError, match="changed on disk"):
        load_tensors(spec)
