"""Record per-channel K offsets and K/V ranges for FP8 KV scales.

``python -m workers.model.calibrate --model M --out SCALES.json [--prompts FILE]
[--headroom H] [--max-prompt-tokens N]`` prefills each prompt of a prompt set (by
default ``configs/kv-scales/calibration-prompts.jsonl``: short, multi-turn, long,
RAG, tool-use, multilingual and refusal prompts) alone into a fresh cache in the
model's dtype, then reads back the K and V it wrote and keeps, per layer, KV head and
channel, the mean of K (the offset), the largest distance of K from that mean and the
largest ``|V|``. ``workers.kv.scales`` turns them into scales for either FP8 format.

The prompt set is JSONL, one object a line: ``{"kind": K, "prompt": TEXT}`` (a
completion prompt) or ``{"kind": K, "messages": [...]}`` (through the model's chat
template; joined contents for a model without one). The record names the weights
digest, this tool's name, version and parameters, the prompt file's name, sha256 and
counts per kind, and carries a sha256 of itself; a worker refuses a record made for
other weights or edited since.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from radix.model_source import DEMO_MODEL, resolve_model_path
from radix.tokenizer import PromptTokenizer
from radix.version import project_version
from workers.kv.scales import calibration_record
from workers.model.demo import ensure_demo_checkpoint
from workers.model.loader import LoadedModel, load_model
from workers.model.runner import ModelRunner
from workers.model.step_input import StepInput

TOOL = "workers.model.calibrate"
BLOCK_SIZE = 16
DEFAULT_HEADROOM = 4.0
DEFAULT_PROMPTS = (Path(__file__).resolve().parents[2] / "configs" / "kv-scales"
                   / "calibration-prompts.jsonl")


class _Channels:
    """Running per-channel statistics of one layer's K and V ([kv_heads, head_dim])."""

    def __init__(self, shape: tuple[int, int]) -> None:
        self.num_tokens = 0
        self.k_sum = torch.zeros(shape, dtype=torch.float64)
        self.k_min = torch.full(shape, math.inf, dtype=torch.float64)
        self.k_max = torch.full(shape, -math.inf, dtype=torch.float64)
        self.v_amax = torch.zeros(shape, dtype=torch.float64)

    def add(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Take ``keys``/``values`` [T, kv_heads, head_dim] into the statistics."""
        keys, values = keys.double().cpu(), values.double().cpu()
        self.num_tokens += keys.shape[0]
        self.k_sum += keys.sum(0)
        self.k_min = torch.minimum(self.k_min, keys.amin(0))
        self.k_max = torch.maximum(self.k_max, keys.amax(0))
        self.v_amax = torch.maximum(self.v_amax, values.abs().amax(0))

    def stats(self) -> dict[str, torch.Tensor]:
        """``k_offset`` (the mean), ``k_amax`` (largest distance from it), ``v_amax``."""
        mean = self.k_sum / max(self.num_tokens, 1)
        k_amax = torch.maximum(self.k_max - mean, mean - self.k_min)
        return {"k_offset": mean.float(), "k_amax": k_amax.float(), "v_amax": self.v_amax.float()}


def calibrate(loaded: LoadedModel, prompts: Sequence[Sequence[int]]) -> list[dict[str, torch.Tensor]]:
    """Per layer, ``k_offset``, ``k_amax`` and ``v_amax`` [kv_heads, head_dim] over every
    token of ``prompts`` (each prefilled alone into a fresh cache in the model's dtype)."""
    config = loaded.model.config
    shape = (config.num_key_value_heads, config.head_dim)
    layers = [_Channels(shape) for _ in range(config.num_hidden_layers)]
    dtype, device = loaded.model.lm_head.weight.dtype, loaded.model.lm_head.weight.device
    for token_ids in prompts:
        num_blocks = math.ceil(len(token_ids) / BLOCK_SIZE)
        cache_shape = (num_blocks, BLOCK_SIZE, *shape)
        keys = [torch.zeros(cache_shape, dtype=dtype, device=device) for _ in layers]
        values = [torch.zeros(cache_shape, dtype=dtype, device=device) for _ in layers]
        runner = ModelRunner(loaded.model, keys, values, BLOCK_SIZE)
        runner.execute([StepInput(list(token_ids), 0, list(range(num_blocks)))])
        for layer, key, value in zip(layers, keys, values, strict=True):
            # A fresh cache's blocks in order: slot p holds position p.
            layer.add(key.flatten(0, 1)[: len(token_ids)], value.flatten(0, 1)[: len(token_ids)])
    return [layer.stats() for layer in layers]


def read_prompt_set(path: Path, tokenizer: PromptTokenizer, max_prompt_tokens: int
                    ) -> tuple[list[list[int]], dict[str, object]]:
    """The prompts of a JSONL prompt set as token ids (each cut to ``max_prompt_tokens``)
    and what the record says of the set: file name, sha256, prompts and tokens, prompts
    per kind. ValueError naming the line of a malformed entry."""
    raw = path.read_bytes()
    prompts, kinds = [], Counter()
    for number, line in enumerate(raw.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            kinds[str(entry["kind"])] += 1
            prompts.append(_encode(tokenizer, entry)[:max_prompt_tokens])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path} line {number}: {exc}") from exc
    if not prompts:
        raise ValueError(f"{path} holds no prompt")
    return prompts, {"file": path.name, "sha256": hashlib.sha256(raw).hexdigest(),
                     "num_prompts": len(prompts), "num_tokens": sum(map(len, prompts)),
                     "kinds": dict(sorted(kinds.items()))}


def _encode(tokenizer: PromptTokenizer, entry: Mapping[str, object]) -> list[int]:
    if "prompt" in entry:
        return tokenizer.encode(str(entry["prompt"]))
    messages = entry["messages"]
    if not isinstance(messages, list):
        raise ValueError("messages must be a list")
    if tokenizer.chat_template:
        return tokenizer.encode_chat(messages)
    return tokenizer.encode("\n".join(str(m["content"]) for m in messages) + "\n")


def main(argv: list[str] | None = None) -> dict[str, object]:
    """CLI entry point; writes the record and returns it."""
    parser = argparse.ArgumentParser(description="Calibrate per-channel FP8 KV scales.")
    parser.add_argument("--model", required=True, help="demo, a packaged model, GGUF or HF dir")
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS,
                        help="JSONL prompt set (default: the shipped one)")
    parser.add_argument("--out", required=True, help="where to write the JSON record")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-prompt-tokens", type=int, default=8192,
                        help="cut longer prompts (and at the model's context)")
    parser.add_argument("--headroom", type=float, default=DEFAULT_HEADROOM,
                        help="scales leave this factor above the calibrated range (>= 1)")
    args = parser.parse_args(argv)
    if args.headroom < 1 or args.max_prompt_tokens < 1:
        parser.error("--headroom must be >= 1 and --max-prompt-tokens >= 1")
    path = ensure_demo_checkpoint() if args.model == DEMO_MODEL else resolve_model_path(args.model)
    loaded = load_model(path, torch.device(args.device))
    max_prompt_tokens = min(args.max_prompt_tokens, loaded.config.max_position_embeddings)
    try:
        prompts, prompt_set = read_prompt_set(args.prompts, loaded.tokenizer, max_prompt_tokens)
    except (OSError, ValueError) as exc:
        parser.error(f"--prompts: {exc}")
    parameters = {"headroom": args.headroom, "max_prompt_tokens": max_prompt_tokens,
                  "block_size": BLOCK_SIZE, "device": args.device,
                  "dtype": str(loaded.model.lm_head.weight.dtype).removeprefix("torch.")}
    tool = {"name": TOOL, "version": project_version(), "parameters": parameters}
    record = calibration_record(loaded.weights_digest, tool, prompt_set,
                                calibrate(loaded, prompts))
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {len(prompts)} prompts, {prompt_set['num_tokens']} tokens, "
          f"sha256 {record['sha256']}")
    return record


if __name__ == "__main__":
    main()
