"""One worker configuration's KV path, driven one sequence at a time.

A ``Session`` builds what a worker builds from its config (KV spec and dtype, scales,
plan, KV manager with the radix or null prefix cache, model runner) and runs each
prompt through it: admit (prefix match), chunked prefill of the uncached rest,
then decode step by step, either greedily or forced along a given path, keeping
the next-token log-probabilities of every step. Finished sequences are committed,
so later prompts hit the prefix cache exactly as in a worker. The engine's batching
is left out on purpose: scoring needs the distribution at every step and a forced
path, which the engine does not expose, and one sequence at a time makes runs
reproducible.

The blocks are named under the namespace a worker with the same config derives
(``workers.build.cache_namespace``, its digest under the deployment secret), the
config's host and disk tiers sit below the device as in a worker, and decode steps
replay captured graphs when the session is given a capture (batch size 1, the only
one a session runs). ``cold_device`` empties the device cache before every
admission, so every prefix hit comes back from the tiers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from radix.tree import Scope
from workers.build import cache_namespace, kv_scales, kv_spec
from workers.config import DEFAULT_CACHE_BYTES, WorkerConfig
from workers.kv.build import build_kv_cache_manager
from workers.kv.ids import SeqId
from workers.kv.manager import KVCacheManager
from workers.kv.plan import plan_kv_cache
from workers.kv.spec import KVCacheSpec
from workers.kv.tiers.host_link import HostLink
from workers.model.decode_graphs import GraphCapture
from workers.model.loader import LoadedModel
from workers.model.numerics import EngineNumerics
from workers.model.runner import GraphPlan, ModelRunner
from workers.model.step_input import StepInput

SCOPE = Scope("quality")


@dataclass(frozen=True)
class Generation:
    """The tokens a run produced (or was forced along) and the log-probabilities
    [len(token_ids), vocab] of the distribution each was chosen from."""

    token_ids: tuple[int, ...]
    logprobs: torch.Tensor


class Session:
    """The KV path of ``config`` over an already loaded model, its blocks named under
    the namespace digest a worker with ``config`` and ``secret`` would report."""

    def __init__(
        self,
        config: WorkerConfig,
        loaded: LoadedModel,
        secret: bytes,
        *,
        graphs: GraphCapture | None = None,
        cold_device: bool = False,
    ) -> None:
        spec = kv_spec(loaded.config, config.kv.block_size, config.kv.cache_dtype)
        scales = kv_scales(spec, config.kv, loaded.weights_digest)
        device = loaded.model.lm_head.weight.device
        self.namespace = cache_namespace(
            config.model.served_names[0], loaded.weights_digest, loaded.tokenizer,
            loaded.config.rope_fingerprint(), spec, scales,
            EngineNumerics.on(device, config.model.numerics_version),
        )
        digest = self.namespace.digest(secret)
        self.namespace_digest = digest.hex()
        self.manager = _manager(config, spec, digest, secret, device)
        tensors = self.manager.tensors
        plan = None if graphs is None else GraphPlan(
            graphs, 1, loaded.config.max_position_embeddings)
        self.runner = ModelRunner(loaded.model, tensors.key_caches, tensors.value_caches,
                                  spec.block_size, scales, None, plan)
        self.chunk_tokens = config.engine.max_batched_tokens
        self.stop_token_ids = frozenset(loaded.tokenizer.eos_token_ids)
        self.cold_device = cold_device
        self.description = f"{spec.dtype} KV, {scales.describe()}, prefix cache " + (
            "on" if config.kv.prefix_cache else "off"
        ) + _tiers_text(self.manager) + (", decode graphs" if self.runner.graphs else "")
        self._next_seq_id = 0

    def tier_counters(self) -> dict[str, int]:
        """The worker's tier counters so far, by their ``/metrics`` names: blocks the
        host and disk tiers gave back on prefix hits, blocks demoted to the host tier,
        bytes written to disk (empty without a host tier)."""
        stats = self.manager.stats()
        if not stats.host.num_host_blocks_total:
            return {}
        return {
            "kv_host_hit_blocks_total": stats.host.host_hit_blocks_total,
            "kv_disk_hit_blocks_total": stats.disk.disk_hit_blocks_total,
            "kv_host_blocks_to_host_total": stats.host.host_blocks_to_host_total,
            "kv_disk_bytes_written_total": stats.disk.disk_bytes_written_total,
        }

    def close(self) -> None:
        """Finish the disk tier's writes and unlock its directory (nothing without one)."""
        tiers = self.manager.prefix_cache.tiers
        if isinstance(tiers, HostLink):
            tiers.disk.close()

    def generate(
        self, prompt: Sequence[int], max_new_tokens: int, forced: Sequence[int] | None = None
    ) -> Generation:
        """Greedy decoding of up to ``max_new_tokens`` (stopping after an EOS token), or,
        with ``forced``, exactly those tokens fed back whatever the model prefers."""
        self._next_seq_id += 1
        seq_id = SeqId(self._next_seq_id)
        manager = self.manager
        if self.cold_device:
            manager.evict(manager.pool.num_total_blocks)
        if manager.admit(seq_id, prompt, SCOPE) is None:
            raise ValueError(f"a prompt of {len(prompt)} tokens does not fit the KV cache")
        tokens = list(prompt)
        steps: list[torch.Tensor] = []
        try:
            logits = self._prefill(seq_id, tokens)
            num_new = max_new_tokens if forced is None else len(forced)
            for step in range(num_new):
                steps.append(torch.log_softmax(logits.float(), -1))
                token = int(logits.argmax()) if forced is None else int(forced[step])
                tokens.append(token)
                if step + 1 == num_new or (forced is None and token in self.stop_token_ids):
                    break
                logits = self._run(seq_id, tokens[-1:])
            manager.commit(seq_id, tokens, manager.num_computed_tokens(seq_id))
        finally:
            manager.free(seq_id)
        return Generation(tuple(tokens[len(prompt) :]), torch.stack(steps))

    def _prefill(self, seq_id: SeqId, tokens: list[int]) -> torch.Tensor:
        done = self.manager.num_computed_tokens(seq_id)
        logits = None
        while done < len(tokens):
            chunk = tokens[done : done + self.chunk_tokens]
            logits = self._run(seq_id, chunk)
            done += len(chunk)
        assert logits is not None
        return logits

    def _run(self, seq_id: SeqId, new_tokens: list[int]) -> torch.Tensor:
        start = self.manager.num_computed_tokens(seq_id)
        if not self.manager.append_slots(seq_id, len(new_tokens)):
            raise ValueError("the KV cache ran out of blocks")
        step = StepInput(new_tokens, start, self.manager.block_table(seq_id))
        return self.runner.execute([step])[0]


def _manager(
    config: WorkerConfig, spec: KVCacheSpec, digest: bytes, secret: bytes, device: torch.device
) -> KVCacheManager:
    """The KV manager a worker builds from ``config`` (pool, prefix cache, host and disk
    tiers), one sequence at a time, so no watermark."""
    plan = plan_kv_cache(spec, config.kv.cache_bytes or DEFAULT_CACHE_BYTES)
    kv = config.kv
    return build_kv_cache_manager(
        spec, plan.num_blocks, namespace_digest=digest, worker_id="quality", device=device,
        prefix_caching=kv.prefix_cache, hash_algorithm=kv.hash_algorithm, secret=secret,
        host_ttl_s=kv.host_ttl_s, num_host_blocks=kv.host_cache_bytes // spec.kv_bytes_per_block,
        num_disk_blocks=kv.disk_cache_bytes // spec.kv_bytes_per_block,
        disk_dir=None if kv.disk_cache_dir is None else Path(kv.disk_cache_dir),
    )


def _tiers_text(manager: KVCacheManager) -> str:
    stats = manager.stats()
    host, disk = stats.host.num_host_blocks_total, stats.disk.num_disk_blocks_total
    if not host:
        return ""
    return (f", {stats.num_total_blocks} device blocks, host tier {host} blocks"
            + (f", disk tier {disk} blocks" if disk else ""))
