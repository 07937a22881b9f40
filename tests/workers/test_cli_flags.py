"""The worker's command line is generated from its config fields (workers.config,
radix.config_flags): every flag it had before keeps its name and its field."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from harness.procs import REPO_ROOT, child_env
from radix.config_flags import flags_table
from workers.cli import _parser, config_from_args
from workers.config import WorkerConfig

# Each flag of the hand-written parser before the flags were generated, with a valid
# value and the (section, field) it set (None: not a config field of its own).
OLD_FLAGS = {
    "--config": None, "--log-level": None, "--kv-transfer-config": None,
    "--model": (["m"], ("model", "name"), "m"),
    "--served-model-name": (["a", "b"], ("model", "served_model_names"), ("a", "b")),
    "--device": (["cuda"], ("model", "device"), "cuda"),
    "--max-model-len": (["64"], ("model", "max_model_len"), 64),
    "--num-threads": (["1"], ("model", "num_threads"), 1),
    "--time-scale": (["2.5"], ("model", "time_scale"), 2.5),
    "--enforce-eager": ([], ("model", "enforce_eager"), True),
    "--host": (["0.0.0.0"], ("server", "host"), "0.0.0.0"),
    "--port": (["8000"], ("server", "port"), 8000),
    "--worker-id": (["w7"], ("server", "worker_id"), "w7"),
    "--self-test-delay-s": (["0.5"], ("server", "self_test_delay_s"), 0.5),
    "--drain-timeout-s": (["3"], ("server", "drain_timeout_s"), 3.0),
    "--kv-cache-bytes": (["64MiB"], ("kv", "cache_bytes"), 64 * 2**20),
    "--gpu-memory-utilization": (["0.5"], ("kv", "gpu_memory_utilization"), 0.5),
    "--kv-watermark": (["0.1"], ("kv", "watermark"), 0.1),
    "--host-ttl-s": (["60"], ("kv", "host_ttl_s"), 60.0),
    "--block-size": (["32"], ("kv", "block_size"), 32),
    "--kv-cache-dtype": (["fp8_e4m3"], ("kv", "cache_dtype"), "fp8_e4m3"),
    "--kv-scales": (["s.json"], ("kv", "scales_file"), "s.json"),
    "--host-cache-bytes": (["1MiB"], ("kv", "host_cache_bytes"), 2**20),
    "--disk-cache-dir": (["d"], ("kv", "disk_cache_dir"), "d"),
    "--disk-cache-bytes": (["2GiB"], ("kv", "disk_cache_bytes"), 2 * 2**30),
    "--no-prefix-cache": ([], ("kv", "prefix_cache"), False),
    "--preemption-mode": (["swap"], ("engine", "preemption_mode"), "swap"),
    "--max-batched-tokens": (["128"], ("engine", "max_batched_tokens"), 128),
    "--max-num-seqs": (["8"], ("engine", "max_num_seqs"), 8),
    "--max-waiting-requests": (["9"], ("engine", "max_waiting_requests"), 9),
    "--enable-lora": ([], ("lora", "enable"), True),
    "--lora-modules": (["a=/p"], ("lora", "modules"), ("a=/p",)),
    "--max-loras": (["2"], ("lora", "max_loras"), 2),
    "--max-lora-rank": (["8"], ("lora", "max_lora_rank"), 8),
    "--allow-runtime-lora-updates": ([], ("lora", "allow_runtime_updates"), True),
    "--lora-root": (["/r", "/s"], ("lora", "roots"), ("/r", "/s")),
    "--kv-transfer-timeout-s": (["9"], ("kv_transfer", "timeout_s"), 9.0),
    "--kv-transfer-fallback": (["recompute"], ("kv_transfer", "fallback"), "recompute"),
}


def test_every_old_flag_is_in_the_help() -> None:
    done = subprocess.run([sys.executable, "-m", "workers", "--help"], cwd=REPO_ROOT,
                          env=child_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    shown = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", done.stdout))
    assert set(OLD_FLAGS) <= shown, sorted(set(OLD_FLAGS) - shown)


def test_every_old_flag_sets_the_same_field() -> None:
    alone = {"--no-prefix-cache"}  # the host tier given with the rest needs the prefix cache
    for chosen in (set(OLD_FLAGS) - alone, alone):
        given = {flag: OLD_FLAGS[flag] for flag in chosen if OLD_FLAGS[flag]}
        flags = [part for flag, (values, _, _) in given.items() for part in (flag, *values)]
        config = config_from_args(_parser().parse_args(flags))
        for flag, (_, (section, name), expected) in given.items():
            assert getattr(getattr(config, section), name) == expected, flag
    assert config_from_args(_parser().parse_args([])) == WorkerConfig()


def test_the_docs_table_of_flags_is_the_generated_one() -> None:
    text = (Path(REPO_ROOT) / "docs" / "worker.md").read_text(encoding="utf-8")
    assert flags_table(WorkerConfig) in text, (
        "regenerate the flags table in docs/worker.md:\n" + flags_table(WorkerConfig))
