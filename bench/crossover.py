"""Where a pull beats a recompute: the prefix length above which moving a prefix's KV
from a peer is faster than computing it (docs/pd.md, "Peer pulls"; the router's
``kv_sources.min_pull_tokens``).

``python -m bench crossover [--backend timed|cpu] [--lengths 64 128 ...] [--trials 3]``.
Two workers that hold blocks for each other and pull (``kv_both``): timed ones
(``--model timed:<profile>`` at ``--time-scale``: a recompute waits the profile's
prefill, a pull the profile's link time for its real bytes, plus this machine's real
HTTP, TCP and HMAC overhead divided by the scale), or CPU demo-model workers (real
compute, real bytes over loopback). For each prompt length, each trial times two
ways to serve a prompt of that many tokens on worker B with one output token:

- recompute: a fresh prompt B never saw, computed whole;
- pull: a fresh prompt A cached first; the router's path, timed from the hold on A
  (``POST /kv_transfer/hold``) to B's answer, B pulling every whole block.

Reported per length (medians, profile seconds): both times, the pulled blocks (every
whole block, checked), and the crossover: the shortest length from which every
longer one pulls faster. A linear fit of the pull times gives the fixed overhead and
the per-token link cost; of the CPU recompute times, the per-token prefill cost (the
router's ``pull_overhead_s``, ``link_bytes_per_s`` and ``prefill_s_per_token``).
"""

from __future__ import annotations

import argparse
import base64
import time

import numpy as np

from bench.e2e import workers
from harness.procs import ManagedProcess
from radix.keys import to_key

BLOCK = 16
TIMED_LENGTHS = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
CPU_LENGTHS = (32, 64, 128, 256, 512, 1024, 2048, 3072)
FLAGS = ("--kv-transfer-config", '{"kv_role": "kv_both"}', "--kv-transfer-fallback",
         "recompute")


def generate(worker: ManagedProcess, token_ids: list[int], params: dict | None = None
             ) -> dict:
    """One greedy token for ``token_ids`` in scope bench; the answer (raises on an error)."""
    body: dict = {"token_ids_b64": base64.b64encode(to_key(token_ids)).decode(),
                  "scope": "bench", "sampling": {"max_tokens": 1, "temperature": 0}}
    if params is not None:
        body["kv_transfer_params"] = params
    status, answer = worker.post_json("/generate", body)
    if status != 200:
        raise RuntimeError(f"/generate answered {status}: {answer}")
    return answer  # type: ignore[return-value]


def hold(worker: ManagedProcess, token_ids: list[int]) -> dict:
    """``worker``'s hold of what it caches of ``token_ids`` (the router's ask)."""
    status, answer = worker.post_json("/kv_transfer/hold", {
        "token_ids_b64": base64.b64encode(to_key(token_ids)).decode(), "scope": "bench",
        "max_blocks": len(token_ids) // BLOCK})
    if status != 200:
        raise RuntimeError(f"/kv_transfer/hold answered {status}: {answer}")
    return answer["kv_transfer_params"]  # type: ignore[index]


def one_trial(a: ManagedProcess, b: ManagedProcess, length: int, rng: np.random.Generator
              ) -> tuple[float, float, int]:
    """(recompute s, pull s, blocks pulled) of fresh prompts of ``length`` tokens."""
    fresh = [rng.integers(20, 220, length).tolist() for _ in range(2)]
    started = time.perf_counter()
    answer = generate(b, fresh[0])
    recompute_s = time.perf_counter() - started
    assert answer["usage"]["cached_tokens"] < BLOCK, answer["usage"]  # no whole block
    generate(a, fresh[1])
    started = time.perf_counter()
    answer = generate(b, fresh[1], hold(a, fresh[1]))
    pull_s = time.perf_counter() - started
    return recompute_s, pull_s, answer["usage"]["cached_tokens"] // BLOCK


def crossover(lengths: list[int], recompute_s: list[float], pull_s: list[float]) -> int | None:
    """The shortest length from which every longer one pulls faster (None: none)."""
    found = None
    for length, rec, pull in reversed(list(zip(lengths, recompute_s, pull_s, strict=True))):
        if pull >= rec:
            break
        found = length
    return found


def main(argv: list[str] | None = None) -> dict:
    """Measure both ways at every length; print a table and return the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=["timed", "cpu"], default="timed")
    parser.add_argument("--profile", default="llama31-8b-h100")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--lengths", type=int, nargs="+")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    timed = args.backend == "timed"
    lengths = args.lengths or list(TIMED_LENGTHS if timed else CPU_LENGTHS)
    scale = args.time_scale if timed else 1.0
    flags = (*FLAGS, *(("--model", f"timed:{args.profile}", "--time-scale", str(scale),
                        "--max-batched-tokens", "2048") if timed else ()))
    rng = np.random.default_rng(args.seed)
    rows = []
    with workers(2, "64MiB", *flags) as (a, b):
        for warm in (a, b):
            generate(warm, rng.integers(20, 220, 64).tolist())
        print(f"{'tokens':>7}{'recompute ms':>14}{'pull ms':>10}{'blocks':>8}", flush=True)
        for length in lengths:
            trials = [one_trial(a, b, length, rng) for _ in range(args.trials)]
            rec, pull = (float(np.median([t[i] for t in trials])) / scale for i in (0, 1))
            blocks = min(t[2] for t in trials)
            if blocks != (length - 1) // BLOCK:
                raise RuntimeError(f"{length} tokens: {blocks} blocks pulled, expected "
                                   f"{(length - 1) // BLOCK}")
            rows.append({"tokens": length, "recompute_s": rec, "pull_s": pull, "blocks": blocks})
            print(f"{length:>7}{1e3 * rec:>14.1f}{1e3 * pull:>10.1f}{blocks:>8}", flush=True)
    return summarize(rows, args.backend, scale)


def summarize(rows: list[dict], backend: str, scale: float) -> dict:
    """The crossover and the linear fits (module docstring), printed and returned."""
    lengths = [r["tokens"] for r in rows]
    found = crossover(lengths, [r["recompute_s"] for r in rows], [r["pull_s"] for r in rows])
    pull_per_token, pull_overhead_s = np.polyfit(lengths, [r["pull_s"] for r in rows], 1)
    rec_per_token, rec_overhead_s = np.polyfit(lengths, [r["recompute_s"] for r in rows], 1)
    result = {"backend": backend, "time_scale": scale, "rows": rows, "crossover_tokens": found,
              "pull_overhead_s": float(pull_overhead_s), "pull_s_per_token": float(pull_per_token),
              "recompute_overhead_s": float(rec_overhead_s),
              "recompute_s_per_token": float(rec_per_token)}
    print(f"crossover: {found} tokens; pull = {1e3 * pull_overhead_s:.2f} ms + "
          f"{1e6 * pull_per_token:.3f} us/token; recompute = {1e3 * rec_overhead_s:.2f} ms + "
          f"{1e6 * rec_per_token:.3f} us/token")
    return result
