"""Router overhead: what a router adds on top of an upstream that answers instantly.

Starts four ``harness.instant_upstream`` processes (a stand-in that answers ``/generate``
and the OpenAI routes at once: it measures the router, not a model) and, in turn,
our router (cache-aware policy) and each peer router installed in bench/.peers
(sglang-router and vllm-router, cache_aware, ``bench.peers``) in front of them. Each
drives 2 KB prompts with 1 and 64 concurrent clients, streaming and not, unique
(``_text``) or a repeated 2 KB document plus a short question (``_repeat``, as RAG
prompts repeat), and 10-turn chat conversations whose history repeats (``_chat``),
and compares with the upstream's
``/generate`` driven directly with the same token ids. Reports requests/s, the
router's CPU time per request (utime + stime from ``/proc/<pid>/stat``: for ours
tokenization, the tree walk, proxying and JSON on both sides), p50/p99 latency
added, and for streams the longest gap between chunks (a stall shows there).

``python -m bench.router_overhead [--requests N] [--processes N] [--without-peers]
[--tokenizer NAME]`` (the demo tokenizer, or a real BPE such as the packaged
``SmolLM2-135M-Instruct``; ``encode us`` is that tokenizer's own time for one prompt,
what ours spends beyond a router that does not tokenize); ``main`` returns the
numbers as a dict.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import peers
from bench.overhead_load import PROMPT_BYTES, drive, prompts
from bench.router_stages import (
    KEY,
    NUM_UPSTREAMS,
    router_config,
    stage_breakdown,
    stage_table,
    start_upstreams,
)
from bench.router_stages import NUM_CLIENTS as NUM_CLIENTS_STAGES
from harness.procs import ManagedProcess, process_cpu_s, start_router
from radix.model_source import DEMO_MODEL, load_tokenizer
from radix.openai.prompt import encode_messages

MAX_TOKENS = 16
# name, concurrent clients, streaming, prompt sent as token ids (no router tokenization),
# prompts: unique, "repeat" (a repeated document + question) or "chat" (10-turn
# conversations sent to /v1/chat/completions, each turn the previous one's history)
SCENARIOS = (
    ("1c_text", 1, False, False, "unique"),
    ("1c_text_stream", 1, True, False, "unique"),
    ("64c_text", 64, False, False, "unique"),
    ("64c_text_stream", 64, True, False, "unique"),
    ("64c_repeat", 64, False, False, "repeat"),
    ("64c_chat", 64, False, False, "chat"),
    ("64c_ids", 64, False, True, "unique"),
)
PEER_SETUPS = ("sglang cache_aware default", "vllm cache_aware")


async def _bench(num_requests: int, processes: int, with_peers: bool, tokenizer: str
                 ) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    upstreams = await start_upstreams(tokenizer)
    results: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp) / "router.toml"
            config.write_text(router_config([u.url for u in upstreams], tokenizer))
            flags = ["--processes", str(processes)] if processes > 1 else []
            router = await asyncio.to_thread(start_router, config, *flags)
            try:
                await asyncio.sleep(1.5)  # the first probes pass
                results["ours"] = await _scenarios(router.url, router.cpu_s, upstreams,
                                                   num_requests, tokenizer, token_ids=True)
            finally:
                router.stop()
            stages = await stage_breakdown(config, num_requests, {"Authorization": f"Bearer {KEY}"},
                                           Path(tmp) / "stages.json")
            installed = peers.available()
            for name in PEER_SETUPS if with_peers else ():
                setup = peers.PEER_SETUPS[name]
                if not installed[setup.module]:
                    print(f"{name}: not installed (make bench-peers); skipped")
                    continue
                peer = await asyncio.to_thread(peers.start_peer, setup, [u.url for u in upstreams],
                                               KEY, "demo", Path(tmp) / f"{setup.module}.log")
                try:
                    results[name] = await _scenarios(
                        peer.url, lambda pid=peer.process.pid: process_cpu_s(pid),
                        upstreams, num_requests, tokenizer, token_ids=False)
                finally:
                    peer.stop()
    finally:
        for process in upstreams:
            process.stop()
    return results, stages


async def _scenarios(url: str, cpu_s: Callable[[], float], upstreams: list[ManagedProcess],
                     num_requests: int, tokenizer_name: str, token_ids: bool) -> dict[str, Any]:
    """Every scenario through the router at ``url`` (token-id prompts only if it takes
    them) and directly against the first upstream; ``encode_us`` is the tokenizer's
    own time for one of the scenario's prompts (one full encode, in this process),
    ``cluster_cpu_us_per_request`` the router's CPU plus the upstreams' (where
    vllm-router's per-request tokenization runs)."""
    direct_url = upstreams[0].url

    def upstreams_cpu_s() -> float:
        return sum(u.cpu_s() for u in upstreams)

    tokenizer = load_tokenizer(tokenizer_name)
    auth = {"Authorization": f"Bearer {KEY}"}
    results: dict[str, Any] = {}
    for name, num_clients, stream, as_ids, workload in SCENARIOS:
        if as_ids and not token_ids:
            continue
        n = num_requests if num_clients > 1 else max(num_requests // 4, 50)
        picked = prompts(n, workload)
        chat = workload == "chat"
        encode_started = time.perf_counter()
        ids = [encode_messages(tokenizer, p) if chat else tokenizer.encode(p) for p in picked]
        encode_us = 1e6 * (time.perf_counter() - encode_started) / n
        prompt_field = "messages" if chat else "prompt"
        via_router = [{"model": "demo", prompt_field: i if as_ids else p,
                       "max_tokens": MAX_TOKENS, "stream": stream}
                      for p, i in zip(picked, ids, strict=True)]
        path = "/v1/chat/completions" if chat else "/v1/completions"
        direct = [{"token_ids": i, "scope": "bench", "stream": stream,
                   "sampling": {"max_tokens": MAX_TOKENS}} for i in ids]
        await drive(f"{url}{path}", via_router[:20], auth, 4, stream)
        cpu_before, upstreams_before = cpu_s(), upstreams_cpu_s()
        routed = await drive(f"{url}{path}", via_router, auth, num_clients, stream)
        cpu_after, upstreams_after = cpu_s(), upstreams_cpu_s()
        router_us = 1e6 * (cpu_after - cpu_before) / n
        baseline = await drive(f"{direct_url}/generate", direct, {}, num_clients, stream)
        results[name] = {
            "requests": n,
            "router_rps": n / routed.wall_s,
            "direct_rps": n / baseline.wall_s,
            "router_cpu_us_per_request": router_us,
            "encode_us": encode_us,
            "cluster_cpu_us_per_request":
                router_us + 1e6 * (upstreams_after - upstreams_before) / n,
            "added_p50_ms": routed.percentile_ms(0.5) - baseline.percentile_ms(0.5),
            "added_p99_ms": routed.percentile_ms(0.99) - baseline.percentile_ms(0.99),
            "router_p50_ms": routed.percentile_ms(0.5),
            "direct_p50_ms": baseline.percentile_ms(0.5),
            "max_stream_gap_ms": 1000 * routed.max_gap_s if stream else None,
            "direct_max_stream_gap_ms": 1000 * baseline.max_gap_s if stream else None,
        }
    return results


def _table(results: dict[str, Any]) -> str:
    header = (f"{'router':<26} {'scenario':<16} {'req':>5} {'router r/s':>10} {'direct r/s':>10} "
              f"{'CPU us/req':>10} {'encode us':>9} {'cluster us':>10} {'+p50 ms':>8} {'+p99 ms':>8} "
              f"{'max gap ms':>10} {'(direct)':>8}")
    rows = [header, "-" * len(header)]
    for router, scenarios in results.items():
        for name, r in scenarios.items():
            rows.append(f"{router:<26} " + _row(name, r))
    return "\n".join(rows)


def _row(name: str, r: dict[str, Any]) -> str:
    gap, direct_gap = (("-", "-") if r["max_stream_gap_ms"] is None else
                       (f"{r['max_stream_gap_ms']:.1f}", f"{r['direct_max_stream_gap_ms']:.1f}"))
    return (f"{name:<16} {r['requests']:>5} {r['router_rps']:>10.0f} "
            f"{r['direct_rps']:>10.0f} {r['router_cpu_us_per_request']:>10.0f} "
            f"{r['encode_us']:>9.0f} {r['cluster_cpu_us_per_request']:>10.0f} "
            f"{r['added_p50_ms']:>8.2f} {r['added_p99_ms']:>8.2f} {gap:>10} {direct_gap:>8}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the scenarios, print the table, return the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000,
                        help="requests per 64-client scenario (a quarter for 1 client)")
    parser.add_argument("--processes", type=int, default=1, help="our router's processes")
    parser.add_argument("--without-peers", action="store_true",
                        help="measure our router only")
    parser.add_argument("--tokenizer", default=DEMO_MODEL,
                        help="the model's tokenizer (radix.model_source: demo, "
                             "SmolLM2-135M-Instruct, a GGUF file)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as the router runs it
    results, stages = asyncio.run(_bench(args.requests, args.processes, not args.without_peers,
                                 args.tokenizer))
    print(f"router overhead: {NUM_UPSTREAMS} instant stand-in upstreams, {PROMPT_BYTES} B "
          f"prompts, {MAX_TOKENS} output tokens, {args.processes} router process(es), "
          f"tokenizer {args.tokenizer}")
    print(_table(results))
    print(f"our router's CPU us per request by stage, {NUM_CLIENTS_STAGES} clients "
          "(bench.stage_profile):")
    print(stage_table(stages))
    print("CPU us/req: router processes' CPU (user+sys; sys = kernel, mostly loopback TCP) "
          "per request; +p50/+p99: router minus direct latency (direct = the upstream's "
          "/generate with the same token ids); _ids: prompts sent as token ids, so no "
          "tokenization on the router; _repeat: a repeated document + question; _chat: "
          "10-turn conversations as chat; encode us: one full encode of one prompt by "
          "this tokenizer; cluster us: router + upstreams CPU per request. sglang-router routes on text and does not tokenize; "
          "vllm-router asks an upstream to tokenize.")
    return {"processes": args.processes, "tokenizer": args.tokenizer, "stages": stages,
            **results}


if __name__ == "__main__":
    main()
