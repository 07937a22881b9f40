"""Agents on timed workers: forks and sessions that return (issue 49's benchmark;
docs/bench.md, "Agents: forks and returning sessions").

``python -m bench agents [--workers 16] [--time-scale 10] [--setups ...] [--seed 0]
[--trace-out FILE]``. One fleet of timed workers (``timed:llama31-8b-h100``, 128k
context, ``kv.timed_cache_bytes`` of KV so LRU turns over within the run, both
transfer roles, a failed pull recomputed) replays ``bench.agent_trace``'s trace behind
each setup, in turn, each run under its own tag (no run finds another's blocks):
``ours sources`` (the source planner and sessions: each request's missing blocks from
the cheapest source, sessions sent with their retention hints, sticky until
saturated), ``ours without`` (both off: today's router), and, when ``make
bench-peers`` installed them, sglang-router and vllm-router (cache_aware, default
thresholds; they get no session headers, which they do not read, and every request
under the one key they check).

Reported per setup, in profile seconds: the fork's branch-start TTFT p50/p90, the
parents' TTFT, TTFT p50/p99 by turn index of the returning sessions and p99 over
their returning turns (1 and later), the crowd's TTFT, the cached fraction, blocks
pulled (the workers' ``kv_transfer_blocks_received_total``), restored from a tier and
recomputed (prompt tokens not cached, in blocks), pulls planned and failed, plans
below the crossover (``router_kv_pulls_below_crossover_total``), sessions' blocks
kept, goodput (requests with TTFT within ``--slo-s`` per second) and errors; then the
targets: branch-start p90 at most 0.3x and returning p99 at most 0.5x of ``ours
without``, no pull below the crossover.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from openai import AsyncOpenAI

from bench import peers
from bench.agent_trace import (
    BRANCH,
    CROWD,
    PARENT,
    TURN,
    AgentRequest,
    AgentTrace,
    AgentTraceConfig,
    generate,
    segment_text,
    write,
)
from bench.e2e import TENANT_KEY, WORKER_KEY, workers
from harness.procs import ManagedProcess, http_json, router_args, start_process, wait_routable
from router.front.auth import hash_key

BLOCK = 16
PROFILE = "llama31-8b-h100"
SETUPS = {"ours without": False, "ours sources": True}
PEER_SETUPS = ("sglang cache_aware default", "vllm cache_aware")
READY_TIMEOUT_S = 120.0
WORKER_TOML = """[kv]
timed_cache_bytes = {cache_bytes}
[kv_transfer]
kv_role = "kv_both"
fallback = "recompute"
timeout_s = 120.0
pull_timeout_s = 120.0
max_held_pool_fraction = 0.9
max_scope_held_pool_fraction = 0.9
[retention]
max_retention_s = 3600.0
max_retained_pool_fraction = 0.4
max_scope_retained_pool_fraction = 0.4
"""
Outcome = tuple[int, int, float | None, str, str | None]  # prompt, cached, TTFT, text, error


def router_toml(urls: list[str], sources: bool, poll_interval_s: float) -> str:
    """Our router in front of ``urls`` with the source planner and sessions on or off."""
    lines = ["[models.demo]", 'tokenizer = "demo"', "[registry]",
             f"poll_interval_s = {poll_interval_s}", "[kv_sources]",
             f"enabled = {str(sources).lower()}", "hold_timeout_s = 10.0", "[sessions]",
             f"enabled = {str(sources).lower()}", "max_retention_s = 3600.0",
             "[auth.tenants.bench]", f'key_digests = ["{hash_key(TENANT_KEY)}"]']
    for i, url in enumerate(urls):
        lines += ["[[workers]]", f'id = "w{i}"', 'model = "demo"', f'url = "{url}"',
                  'api_key_env = "RADIX_WORKER_KEY_E2E"']
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def our_router(urls: list[str], sources: bool, poll_interval_s: float, directory: Path
               ) -> Iterator[ManagedProcess]:
    """Our router process, every worker ready behind it."""
    path = directory / "router.toml"
    path.write_text(router_toml(urls, sources, poll_interval_s))
    router = start_process(router_args(path), {"RADIX_WORKER_KEY_E2E": WORKER_KEY})
    try:
        wait_routable(router, len(urls), READY_TIMEOUT_S)
        yield router
    finally:
        router.stop()


@dataclasses.dataclass(frozen=True)
class RouterUnderTest:
    """A setup's router, started: where to send, the key to send, whether to send
    sessions' headers, and its metrics address (None: a peer's, not read)."""

    url: str
    api_key: str
    hints: bool
    metrics_url: str | None


@contextlib.contextmanager
def router_under_test(name: str, urls: list[str], poll_interval_s: float, directory: Path
                      ) -> Iterator[RouterUnderTest]:
    """``name`` (one of ``SETUPS`` or ``PEER_SETUPS``) in front of ``urls``."""
    if name in SETUPS:
        with our_router(urls, SETUPS[name], poll_interval_s, directory) as router:
            yield RouterUnderTest(router.url, TENANT_KEY, SETUPS[name], router.metrics_url)
        return
    peer = peers.start_peer(peers.PEER_SETUPS[name], urls, WORKER_KEY, "demo",
                            directory / f"{name.replace(' ', '_')}.log", READY_TIMEOUT_S)
    try:
        yield RouterUnderTest(peer.url, WORKER_KEY, False, None)
    finally:
        peer.stop()


async def complete(client: AsyncOpenAI, prompt: str, max_tokens: int,
                   headers: dict[str, str] | None) -> Outcome:
    """Stream one completion: (prompt tokens, cached tokens, TTFT, text, error); a
    failure is returned, never raised."""
    start, ttft, usage, parts = time.perf_counter(), None, None, []
    try:
        stream = await client.completions.create(
            model="demo", prompt=prompt, max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
            extra_headers=headers)
        async for chunk in stream:
            if chunk.choices:
                ttft = ttft or time.perf_counter() - start
                parts.append(chunk.choices[0].text)
            usage = chunk.usage or usage
    except Exception as exc:  # counted and reported; the run goes on
        return 0, 0, ttft, "".join(parts), f"{type(exc).__name__}: {exc}"
    if usage is None or usage.prompt_tokens_details is None:
        return 0, 0, ttft, "".join(parts), "stream ended without usage"
    return (usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens or 0, ttft,
            "".join(parts), None)


async def replay(router: RouterUnderTest, trace: AgentTrace, scale: float, tag: str
                 ) -> dict[int, Outcome]:
    """Send every request of ``trace`` through ``router`` when it is due (``scale`` x
    its profile time), its prompt's segments under ``tag``; sessions' headers when the
    router takes them."""
    client = AsyncOpenAI(base_url=f"{router.url}/v1", api_key=router.api_key, max_retries=0,
                         timeout=900)
    texts = {name: segment_text(name, n, tag) for name, n in trace.segments.items()}
    answers: dict[int, str] = {}
    done = {r.request_id: asyncio.Event() for r in trace.requests}
    start = time.perf_counter()

    async def one(request: AgentRequest) -> Outcome:
        if request.after is not None:
            await done[request.after].wait()
            await asyncio.sleep(request.gap_s * scale)
        else:
            await asyncio.sleep(max(0.0, start + request.gap_s * scale - time.perf_counter()))
        prompt = "".join(answers.get(int(p[4:]), "") if p.startswith("out:") else texts[p]
                         for p in request.prompt)
        headers = None
        if router.hints and request.retention_s is not None:
            headers = {"x-session-id": f"{tag}.{request.session}",
                       "x-session-retention-s": f"{request.retention_s * scale:.3f}"}
        outcome = await complete(client, prompt, request.output_tokens, headers)
        answers[request.request_id] = outcome[3]
        done[request.request_id].set()
        return outcome

    try:
        outcomes = await asyncio.gather(*(one(r) for r in trace.requests))
    finally:
        await client.close()
    return dict(zip((r.request_id for r in trace.requests), outcomes, strict=True))


def counter(text: str, name: str, labels: str = "") -> float:
    """The sum of a Prometheus counter's samples whose labels contain ``labels``."""
    pattern = rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$"
    return sum(float(value) for found, value in re.findall(pattern, text, re.M)
               if labels in found)


WORKER_COUNTERS = {"pulled": ("kv_transfer_blocks_received_total", ""),
                   "pull_recomputes": ("kv_transfer_recomputes_total", ""),
                   **{f"pull_failed_{reason}": ("kv_transfer_failures_total",
                                                f'reason="{reason}"')
                      for reason in ("unreachable", "timeout", "refused", "evicted", "protocol",
                                     "mismatch")},
                   "restored": ("kv_host_hit_blocks_total", ""),
                   "kept": ("kv_retentions_total", 'outcome="kept"')}
ROUTER_COUNTERS = {**{f"planned_{source}": ("router_kv_sources_total", f'source="{source}"')
                      for source in ("local", "restore", "recompute")},
                   "pulls_planned": ("router_kv_sources_total", 'source="pull"'),
                   "pulls_failed": ("router_kv_sources_total", 'source="pull_failed"'),
                   "below_crossover": ("router_kv_pulls_below_crossover_total", "")}


def read_counters(started: list[ManagedProcess], metrics_url: str | None) -> dict[str, float]:
    """The workers' counters summed over the fleet, and the router's."""
    totals = dict.fromkeys([*WORKER_COUNTERS, *ROUTER_COUNTERS], 0.0)
    for worker in started:
        text = str(http_json("GET", f"{worker.url}/metrics",
                             headers={"Authorization": f"Bearer {WORKER_KEY}"})[1])
        for key, (name, labels) in WORKER_COUNTERS.items():
            totals[key] += counter(text, name, labels)
    if metrics_url is not None:
        text = str(http_json("GET", f"{metrics_url}/metrics")[1])
        for key, (name, labels) in ROUTER_COUNTERS.items():
            totals[key] = counter(text, name, labels)
    return totals


def percentile(values: list[float], q: float) -> float:
    """The ``q`` percentile of ``values`` (nan when empty)."""
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(trace: AgentTrace, outcomes: dict[int, Outcome], counters: dict[str, float],
              scale: float, slo_s: float, duration_s: float) -> dict[str, object]:
    """One run's figures, times in profile seconds (module docstring)."""
    def ttfts(kind: str, turn: int | None = None, first_turn: int = 0) -> list[float]:
        return [o[2] / scale for r in trace.requests if r.kind == kind
                and (turn is None or r.turn == turn) and r.turn >= first_turn
                and (o := outcomes[r.request_id])[2] is not None and o[4] is None]

    ok = [o for o in outcomes.values() if o[4] is None]
    prompt, cached = sum(o[0] for o in ok), sum(o[1] for o in ok)
    turns = max((r.turn for r in trace.requests if r.kind == TURN), default=0) + 1
    all_ttft = [o[2] / scale for o in ok if o[2] is not None]
    branches = [outcomes[r.request_id] for r in trace.requests if r.kind == BRANCH]
    reused = [o for o in branches if o[4] is None and o[1] >= 0.8 * o[0]]
    return {
        "branches_reusing_parent": len(reused), "num_branches": len(branches),
        "branch_ttft_p50_s": percentile(ttfts(BRANCH), 50),
        "branch_ttft_p90_s": percentile(ttfts(BRANCH), 90),
        "parent_ttft_p50_s": percentile(ttfts(PARENT), 50),
        "turn_ttft_s": {turn: (percentile(ttfts(TURN, turn), 50), percentile(ttfts(TURN, turn), 99))
                        for turn in range(turns)},
        "returning_ttft_p99_s": percentile(ttfts(TURN, first_turn=1), 99),
        "crowd_ttft_p50_s": percentile(ttfts(CROWD), 50),
        "crowd_ttft_p99_s": percentile(ttfts(CROWD), 99),
        "cached_fraction": cached / prompt if prompt else 0.0,
        "blocks_recomputed": sum((o[0] - o[1]) // BLOCK for o in ok),
        "goodput_rps": sum(t <= slo_s for t in all_ttft) / duration_s,
        "num_requests": len(outcomes), "num_errors": len(outcomes) - len(ok),
        **counters}


def run_setup(name: str, started: list[ManagedProcess], trace: AgentTrace,
              args: argparse.Namespace, directory: Path, tag: str) -> dict[str, object]:
    """One setup's run of the trace on the started workers."""
    urls = [w.url for w in started]
    with router_under_test(name, urls, 1.0 / args.time_scale, directory) as router:
        before = read_counters(started, router.metrics_url)
        started_at = time.perf_counter()
        outcomes = asyncio.run(replay(router, trace, args.time_scale, tag))
        wall_s = time.perf_counter() - started_at
        after = read_counters(started, router.metrics_url)
    counters = {k: after[k] - before[k] for k in after}
    result = summarize(trace, outcomes, counters, args.time_scale, args.slo_s,
                       wall_s / args.time_scale)
    result["wall_s"] = wall_s
    errors = [o[4] for o in outcomes.values() if o[4] is not None]
    if errors:
        print(f"{name}: {len(errors)} errors, first: {errors[0]}", flush=True)
    return result


def _branches(r: dict) -> str:
    return f"branches reusing the parent's blocks {r['branches_reusing_parent']}/{r['num_branches']}"


def _row(name: str, r: dict) -> str:
    turns = "  ".join(f"t{t} {1e3 * p50:.0f}/{1e3 * p99:.0f}" for t, (p50, p99)
                      in r["turn_ttft_s"].items())
    return (f"{name:<27}{1e3 * r['branch_ttft_p50_s']:>8.0f}{1e3 * r['branch_ttft_p90_s']:>8.0f}"
            f"{1e3 * r['parent_ttft_p50_s']:>8.0f}{1e3 * r['returning_ttft_p99_s']:>9.0f}"
            f"{1e3 * r['crowd_ttft_p99_s']:>8.0f}{r['cached_fraction']:>8.1%}{r['pulled']:>8.0f}"
            f"{r['restored']:>6.0f}{r['blocks_recomputed']:>9.0f}{r['pulls_planned']:>6.0f}"
            f"{r['below_crossover']:>5.0f}{r['kept']:>6.0f}{r['goodput_rps']:>8.1f}"
            f"{r['num_errors']:>5}  {turns}  {_branches(r)}")


def report(results: dict[str, dict]) -> dict[str, object]:
    """Print the targets (ours with sources against ours without) and ours with sources
    against each peer that ran."""
    ours, base = results.get("ours sources"), results.get("ours without")
    if ours is None or base is None:
        return {}
    targets = {"branch_p90_ratio": ours["branch_ttft_p90_s"] / base["branch_ttft_p90_s"],
               "returning_p99_ratio": ours["returning_ttft_p99_s"] / base["returning_ttft_p99_s"],
               "below_crossover": ours["below_crossover"]}
    print(f"targets: branch-start TTFT p90 {targets['branch_p90_ratio']:.2f}x (at most 0.3x), "
          f"returning sessions' TTFT p99 {targets['returning_p99_ratio']:.2f}x (at most 0.5x), "
          f"pulls below the crossover {targets['below_crossover']:.0f} (0)")
    for peer in PEER_SETUPS:
        if peer in results:
            branch = ours["branch_ttft_p90_s"] / results[peer]["branch_ttft_p90_s"]
            returning = ours["returning_ttft_p99_s"] / results[peer]["returning_ttft_p99_s"]
            targets[f"against {peer}"] = {"branch_p90_ratio": branch,
                                          "returning_p99_ratio": returning}
            print(f"ours sources against {peer}: branch-start TTFT p90 {branch:.2f}x, "
                  f"returning sessions' TTFT p99 {returning:.2f}x")
    return targets


def trace_config(items: list[str]) -> AgentTraceConfig:
    """The default trace with ``FIELD=VALUE`` changes (numeric fields)."""
    config = AgentTraceConfig()
    changes = {}
    for item in items:
        name, _, value = item.partition("=")
        kind = type(getattr(config, name))
        changes[name] = kind(float(value)) if kind in (int, float) else value
    return dataclasses.replace(config, **changes)


def main(argv: list[str] | None = None) -> dict:
    """Replay the trace behind each setup; print a table and return the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--time-scale", type=float, default=10.0)
    parser.add_argument("--cache-bytes", type=int, default=8 * 2**30,
                        help="each worker's KV memory (the profile's shape)")
    parser.add_argument("--setups", nargs="+", choices=[*SETUPS, *PEER_SETUPS],
                        default=[*SETUPS, *PEER_SETUPS],
                        help="peers run only when installed (make bench-peers)")
    parser.add_argument("--slo-s", type=float, default=1.0, help="TTFT SLO (profile s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace-out", type=Path, help="also write the trace as JSON lines")
    parser.add_argument("--trace", nargs="*", default=[], metavar="FIELD=VALUE",
                        help="AgentTraceConfig fields to change (numbers: num_sessions=0)")
    args = parser.parse_args(argv)
    trace = generate(trace_config(args.trace), args.seed)
    if args.trace_out is not None:
        write(trace, args.trace_out)
    setups, missing = peers.installed(args.setups)
    if missing:
        print(f"peer routers not installed ({', '.join(missing)}): run `make bench-peers`",
              flush=True)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="agents-") as tmp:
        directory = Path(tmp)
        (directory / "worker.toml").write_text(WORKER_TOML.format(cache_bytes=args.cache_bytes))
        flags = ("--model", f"timed:{PROFILE}", "--served-model-name", "demo", "--time-scale",
                 str(args.time_scale), "--max-batched-tokens", "2048",
                 "--config", str(directory / "worker.toml"))
        with workers(args.workers, "64MiB", *flags, ready_timeout_s=60 + 10 * args.workers
                     ) as started:
            print(f"{'setup':<27}{'br p50':>8}{'br p90':>8}{'parent':>8}{'ret p99':>9}"
                  f"{'crowd99':>8}{'cached':>8}{'pulled':>8}{'rest':>6}{'recomp':>9}"
                  f"{'pulls':>6}{'<x':>5}{'kept':>6}{'goodput':>8}{'errs':>5}  turn p50/p99 ms",
                  flush=True)
            for run, name in enumerate(setups):
                results[name] = run_setup(name, started, trace, args, directory, f"run{run}")
                print(_row(name, results[name]), flush=True)
    return {"profile": PROFILE, "time_scale": args.time_scale, "runs": results,
            "targets": report(results)}
