"""Flow control: tenants apart in time (issue 46), on timed workers behind each router.

``python -m bench fairness [--workers 8 16] [--routers ...] [--scenarios noisy equal
bands] [--duration-s 3] [--time-scale 20]``. K timed workers (``bench.e2e_timed``'s
profile, flags and GPU-sized rag workload; batch slots ``--max-num-seqs``, default
``DECODE_BATCH``, the decode batch ``capacity_rps`` assumes) start once per size, and
every setup runs in front of the same processes: ours with flow control (``ours
flow``, optionally followed by ``[flow]`` settings as ``name=value``), ours without
(``ours cache_aware``: today's default) and, when ``bench/.peers`` has them,
sglang-router and vllm-router (cache_aware). The peers have no tenants: every
tenant's requests reach them as one stream under one key, the baseline users have
today. Ours knows each tenant by its key (``[auth.tenants]``, with its band and
weight); flow control's times (band TTLs, ``aging_s``) are scaled by the time scale,
so they mean profile seconds as every time here does.

Each tenant sends its own rag trace (its own seed: its own documents and system
prompts, shared within the tenant, so the cached fraction means something), open
loop: Poisson arrivals at ``load`` x the cluster's capacity (``capacity_rps`` of a
300-request trace of the tenant's seed, times K) over ``--duration-s`` profile
seconds. A run ends when every request has ended, or ``--drain-s`` profile seconds
after the last arrival, when what is left is cancelled (the client leaves; counted
``cut``). Scenarios:

- ``noisy``: a victim at 25% of capacity (a) alone, (b) beside a flood at 200% *held at
  the client* to the batch slots the victim leaves (a semaphore of K x slots x 0.75:
  the ideal fair queue), (c) beside the full flood.
- ``equal``: two, then four tenants, each at 100%: Jain's index over the token rates
  each was served (prompt + output tokens of its requests completed within the
  arrival window) divided by its weight.
- ``bands``: an interactive tenant at 30% (band ``interactive``) alone, then beside a
  batch tenant at 150% (band ``batch``).

Per tenant and run, in profile seconds: TTFT p50/p99 from the request's arrival (a
held request's wait at the client counts), where a request with no first token when
the run was cut counts with what it had waited (a lower bound: the percentile is
then printed ``>=``); errors (non-200 answers, by status); served requests per
second and tokens per second within the arrival window; the cached fraction (usage
``cached_tokens`` / ``prompt_tokens`` of its completed requests). Before each run
the workers are waited idle (their ``/info`` load), and every run tags its prompts
so none finds another's blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import openai
from openai import AsyncOpenAI

from bench import peers
from bench.e2e import WORKER_KEY, prompt_text, workers
from bench.e2e_timed import (
    CONFIG,
    DECODE_BATCH,
    POLL_INTERVAL_S,
    at_load,
    capacity_rps,
    tagged,
    warm_up,
)
from bench.workloads import TraceRequest, generate
from harness.procs import http_json, start_router, wait_routable
from radix.cost_model import Profile, get_profile
from router.config import DEFAULT_BANDS, BandConfig
from router.front.auth import hash_key

SETUPS = ("ours flow", "ours cache_aware", "sglang cache_aware default", "vllm cache_aware")
SCENARIOS = ("noisy", "equal", "bands")
WORKER_KEY_ENV = "RADIX_WORKER_KEY_E2E"
CAPACITY_REQUESTS = 300
VICTIM_LOAD, FLOOD_LOAD = 0.25, 2.0
INTERACTIVE_LOAD, BATCH_LOAD = 0.3, 1.5
READY_TIMEOUT_S = 90.0
IDLE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Tenant:
    """One tenant of a run: its name (and key at our router), band, weight, offered
    load (fraction of the cluster's capacity), trace seed, and ``hold``: at most this
    many of its requests in flight, the rest waiting at the client (None: open)."""

    name: str
    load: float
    seed: int
    band: str | None = None
    weight: float = 1.0
    hold: int | None = None

    @property
    def key(self) -> str:
        """The API key it sends our router."""
        return f"fairness-{self.name}-key"


@dataclass
class Sent:
    """One request's life, wall seconds from the run's start."""

    tenant: str
    arrival_s: float
    prompt_tokens: int
    first_s: float | None = None
    done_s: float | None = None
    cached_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None


@dataclass
class Run:
    """A scenario's case: its tenants and which of them the targets read."""

    case: str
    tenants: list[Tenant] = field(default_factory=list)


def runs(scenarios: Sequence[str], total_slots: int) -> Iterator[tuple[str, Run]]:
    """The cases of each scenario, in order (module docstring)."""
    victim, flood = Tenant("victim", VICTIM_LOAD, 1), Tenant("flood", FLOOD_LOAD, 2)
    if "noisy" in scenarios:
        held = total_slots - math.ceil(VICTIM_LOAD * total_slots)
        yield "noisy", Run("alone", [victim])
        yield "noisy", Run("held flood", [victim, Tenant("flood", FLOOD_LOAD, 2, hold=held)])
        yield "noisy", Run("full flood", [victim, flood])
    if "equal" in scenarios:
        for count in (2, 4):
            equal = [Tenant(f"t{i}", 1.0, 10 + i) for i in range(count)]
            yield "equal", Run(f"{count} tenants", equal)
    if "bands" in scenarios:
        interactive = Tenant("interactive", INTERACTIVE_LOAD, 3, band="interactive")
        yield "bands", Run("alone", [interactive])
        batch = Tenant("batch", BATCH_LOAD, 4, band="batch")
        yield "bands", Run("with batch", [interactive, batch])


def all_tenants() -> list[Tenant]:
    """Every tenant any run uses, once by name (our router's config lists them all)."""
    seen: dict[str, Tenant] = {}
    for _, run in runs(SCENARIOS, 4):
        for tenant in run.tenants:
            seen.setdefault(tenant.name, tenant)
    return list(seen.values())


def router_config(setup: str, urls: Sequence[str], time_scale: float) -> str:
    """Our router's TOML for ``setup`` (``ours flow [NAME=VALUE ...]`` or ``ours
    POLICY``): every tenant with its key, band and weight; flow control on for
    ``ours flow``, its band TTLs and ``aging_s`` in profile seconds."""
    _, name, *items = setup.split()
    band_items = [item for item in items if "." in item.split("=")[0]]
    lines = ["[models.demo]", 'tokenizer = "demo"', "[registry]",
             f"poll_interval_s = {POLL_INTERVAL_S / time_scale}", "[policy]",
             f'name = "{"cache_aware" if name == "flow" else name}"']
    if name == "flow":
        lines += ["[flow]", "enabled = true", f"aging_s = {10.0 * time_scale}",
                  *(item for item in items if item not in band_items)]
    for band in DEFAULT_BANDS:
        lines += _band_lines(band, time_scale, band_items)
    for tenant in all_tenants():
        lines += [f"[auth.tenants.{tenant.name}]", f'key_digests = ["{hash_key(tenant.key)}"]',
                  f"weight = {tenant.weight}"]
        if tenant.band is not None:
            lines.append(f'band = "{tenant.band}"')
    for i, url in enumerate(urls):
        lines += ["[[workers]]", f'id = "w{i}"', 'model = "demo"', f'url = "{url}"',
                  f'api_key_env = "{WORKER_KEY_ENV}"']
    return "\n".join(lines) + "\n"


def _band_lines(band: BandConfig, time_scale: float, band_items: Sequence[str]) -> list[str]:
    """One ``[[flow.bands]]`` table: the band's defaults (its TTL in profile seconds),
    with the setup's ``BAND.NAME=VALUE`` items for it in their place."""
    fields = {"name": f'"{band.name}"', "queue_ttl_s": str(band.queue_ttl_s * time_scale),
              "max_slot_fraction": str(band.max_slot_fraction)}
    if band.max_pending_prefill_tokens is not None:
        fields["max_pending_prefill_tokens"] = str(band.max_pending_prefill_tokens)
    for item in band_items:
        key, value = item.split("=", 1)
        owner, field = key.split(".", 1)
        if owner == band.name:
            fields[field] = value
    return ["[[flow.bands]]", *(f"{key} = {value}" for key, value in fields.items())]


class RouterUnderTest:
    """``setup`` started in front of ``urls``: ``url``, and the key each tenant sends."""

    def __init__(self, setup: str, urls: Sequence[str], log_dir: Path, time_scale: float):
        self.setup, self.ours = setup, setup.startswith("ours ")
        if self.ours:
            path = log_dir / "router.toml"
            path.write_text(router_config(setup, urls, time_scale))
            self._process = start_router(path, env={WORKER_KEY_ENV: WORKER_KEY})
            self._peer = None
            wait_routable(self._process, len(urls), READY_TIMEOUT_S)
            self.url = self._process.url
        else:
            self._peer = peers.start_peer(peers.PEER_SETUPS[setup], urls, WORKER_KEY, "demo",
                                          log_dir / f"{setup.replace(' ', '_')}.log",
                                          READY_TIMEOUT_S)
            self.url = self._peer.url

    def key(self, tenant: Tenant) -> str:
        """Ours: the tenant's own key; a peer: the one key all share."""
        return tenant.key if self.ours else WORKER_KEY

    def flow_metrics(self) -> dict[str, float]:
        """Ours: the flow control counters (shed by reason, Jain's gauge) from its
        metrics address, when it has one; else nothing."""
        url = getattr(self._process, "metrics_url", None) if self.ours else None
        if not url:
            return {}
        status, text = http_json("GET", f"{url}/metrics")
        found: dict[str, float] = {}
        for line in str(text).splitlines() if status == 200 else []:
            if line.startswith(("router_flow_shed_total", "router_flow_jain_fairness")):
                name, value = line.rsplit(" ", 1)
                found[name] = float(value)
        return found

    def stop(self) -> None:
        """Stop the router by its process id."""
        if self._peer is not None:
            self._peer.stop()
        else:
            self._process.stop()


@functools.cache
def worker_capacity(seed: int, profile: str) -> float:
    """One worker's capacity (req/s) on the rag workload of ``seed``: ``capacity_rps``
    of its first ``CAPACITY_REQUESTS`` requests."""
    reference = list(generate("rag", CAPACITY_REQUESTS, 1.0, seed, config=CONFIG))
    return capacity_rps(reference, get_profile(profile))


def tenant_requests(tenant: Tenant, num_workers: int, duration_s: float, profile: Profile
                    ) -> tuple[list[TraceRequest], list[float], float]:
    """The tenant's requests, their arrivals (profile seconds from the start) at its
    load over ``duration_s``, and the cluster's capacity on its workload (req/s)."""
    capacity = worker_capacity(tenant.seed, profile.name) * num_workers
    count = max(2, round(tenant.load * capacity * duration_s))
    requests = list(generate("rag", count, 1.0, tenant.seed, config=CONFIG))
    return requests, at_load(requests, tenant.load * capacity), capacity


async def send(client: AsyncOpenAI, request: TraceRequest, record: Sent, start: float) -> None:
    """Stream ``request``, noting its first token, end, usage or error in ``record``."""
    try:
        stream = await client.completions.create(
            model="demo", prompt=prompt_text(request), max_tokens=request.num_output_tokens,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        usage = None
        async for chunk in stream:
            if chunk.choices and record.first_s is None:
                record.first_s = time.perf_counter() - start
            usage = chunk.usage or usage
    except openai.APIStatusError as exc:
        record.error = str(exc.status_code)
        return
    except openai.APIError as exc:
        record.error = type(exc).__name__
        return
    record.done_s = time.perf_counter() - start
    if usage is None:
        record.error = "no usage"
        return
    record.prompt_tokens = usage.prompt_tokens
    record.cached_tokens = (usage.prompt_tokens_details.cached_tokens or 0
                            if usage.prompt_tokens_details else 0)
    record.output_tokens = usage.completion_tokens


async def drive(router: RouterUnderTest, plan: list[tuple[Tenant, list[TraceRequest], list[float]]],
                end_s: float) -> tuple[list[Sent], float]:
    """Send every tenant's requests at their arrivals (wall seconds), a held tenant's
    through its semaphore; cancel what is left at ``end_s``. The records and the
    wall seconds until every request ended or the rest was cut."""
    clients = {t.name: AsyncOpenAI(base_url=f"{router.url}/v1", api_key=router.key(t),
                                   max_retries=0, timeout=end_s + 60) for t, _, _ in plan}
    records: list[Sent] = []
    start = time.perf_counter()

    async def one(tenant: Tenant, request: TraceRequest, record: Sent,
                  hold: asyncio.Semaphore | None) -> None:
        await asyncio.sleep(max(0.0, start + record.arrival_s - time.perf_counter()))
        if hold is None:
            await send(clients[tenant.name], request, record, start)
            return
        async with hold:
            await send(clients[tenant.name], request, record, start)

    tasks = []
    for tenant, requests, arrivals in plan:
        hold = asyncio.Semaphore(tenant.hold) if tenant.hold else None
        for request, arrival in zip(requests, arrivals, strict=True):
            record = Sent(tenant.name, arrival, request.num_prompt_tokens)
            records.append(record)
            tasks.append(asyncio.create_task(one(tenant, request, record, hold)))
    try:
        _, pending = await asyncio.wait(tasks, timeout=end_s)
        cut_s = time.perf_counter() - start
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    finally:
        for client in clients.values():
            await client.close()
    return records, cut_s


def percentile(values: list[tuple[float, bool]], q: float) -> tuple[float, bool]:
    """The ``q``th percentile of (value, censored) pairs and whether it is only a
    lower bound: a censored value at or below the sample it interpolates up to."""
    if not values:
        return math.nan, False
    p = float(np.percentile([v for v, _ in values], q))
    upper = min(v for v, _ in values if v >= p)
    return p, any(censored and v <= upper for v, censored in values)


def tenant_figures(records: list[Sent], window_s: float, cut_s: float, scale: float
                   ) -> dict[str, object]:
    """One tenant's figures in one run (module docstring), in profile seconds; the run
    ended (or what was left was cut) ``cut_s`` wall seconds after its start."""
    ttfts = [((r.first_s if r.first_s is not None else cut_s) - r.arrival_s, r.first_s is None)
             for r in records if r.error is None]
    done = [r for r in records if r.error is None and r.done_s is not None]
    in_window = [r for r in done if r.done_s <= window_s]
    errors: dict[str, int] = {}
    for r in records:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
    cached, prompt = sum(r.cached_tokens for r in done), sum(r.prompt_tokens for r in done)
    p50, p50_bound = percentile(ttfts, 50)
    p99, p99_bound = percentile(ttfts, 99)
    return {
        "sent": len(records), "completed": len(done), "num_errors": sum(errors.values()),
        "errors": errors, "cut": sum(1 for r in records if r.error is None and r.done_s is None),
        "ttft_p50_s": p50 / scale, "ttft_p50_lower_bound": p50_bound,
        "ttft_p99_s": p99 / scale, "ttft_p99_lower_bound": p99_bound,
        "served_rps": len(in_window) / (window_s / scale),
        "served_tokens_per_s": sum(r.prompt_tokens + r.output_tokens for r in in_window)
        / (window_s / scale),
        "cached_tokens": cached, "completed_prompt_tokens": prompt,
        "cached_fraction": cached / max(prompt, 1),
    }


def cached_fraction(run: dict) -> float:
    """A run's cached fraction over all its tenants' completed requests."""
    tenants = run["tenants"].values()
    return (sum(f["cached_tokens"] for f in tenants)
            / max(sum(f["completed_prompt_tokens"] for f in tenants), 1))


def jain(rates: Sequence[float]) -> float:
    """Jain's fairness index of ``rates``: 1 when all are equal, 1/n when one gets all."""
    total, squares = sum(rates), sum(x * x for x in rates)
    return total * total / (len(rates) * squares) if squares > 0 else math.nan


def wait_idle(started: list, timeout_s: float = IDLE_TIMEOUT_S) -> float:
    """Wait until no worker runs or queues a request; the seconds it took (negative:
    still busy after ``timeout_s``, the run goes on and the results say so)."""
    start = time.monotonic()
    while True:
        busy = 0
        for worker in started:
            status, body = http_json("GET", f"{worker.url}/info",
                                     headers={"Authorization": f"Bearer {WORKER_KEY}"})
            load = body["load"] if status == 200 and isinstance(body, dict) else {}
            busy += load.get("num_requests_running", 1) + load.get("num_requests_waiting", 0)
        if busy == 0:
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            print(f"workers still busy ({busy} requests) after {timeout_s} s; going on")
            return -timeout_s
        time.sleep(0.5)


def run_case(router: RouterUnderTest, num_workers: int, run: Run, run_tag: int,
             args: argparse.Namespace, profile: Profile) -> dict[str, object]:
    """One case behind one router (started for it): every tenant's figures and Jain's
    index (tokens served per weight within the arrival window)."""
    plan, capacity = [], {}
    for tenant in run.tenants:
        requests, arrivals, capacity[tenant.name] = tenant_requests(
            tenant, num_workers, args.duration_s, profile)
        plan.append((tenant, tagged(requests, run_tag), [a * args.time_scale for a in arrivals]))
    window_s = max(arrivals[-1] for _, _, arrivals in plan)
    end_s = window_s + args.drain_s * args.time_scale
    records, cut_s = asyncio.run(drive(router, plan, end_s))
    by_tenant = {t.name: tenant_figures([r for r in records if r.tenant == t.name], window_s,
                                        cut_s, args.time_scale) for t in run.tenants}
    rates = [by_tenant[t.name]["served_tokens_per_s"] / t.weight for t in run.tenants]
    return {"tenants": by_tenant, "jain": jain(rates) if len(rates) > 1 else None,
            "capacity_rps": capacity, "window_s": window_s / args.time_scale,
            "wall_s": cut_s, "flow_metrics": router.flow_metrics()}


def _ms(figures: dict, name: str) -> str:
    bound = ">=" if figures[f"{name}_lower_bound"] else ""
    return f"{bound}{1e3 * figures[f'{name}_s']:.0f}"


def print_row(key: str, tenant: str, f: dict) -> None:
    """One tenant's row of the table."""
    print(f"{key:<60}{tenant:<12}{f['sent']:>6}{f['num_errors']:>6}{f['cut']:>6}"
          f"{f['cached_fraction']:>8.1%}{_ms(f, 'ttft_p50'):>9}{_ms(f, 'ttft_p99'):>9}"
          f"{f['served_rps']:>9.1f}{f['served_tokens_per_s'] / 1e3:>9.1f}", flush=True)


def targets(results: dict, setups: Sequence[str], sizes: Sequence[int]) -> list[str]:
    """Each target (docs/bench.md, "Flow control: tenants apart in time") with its
    measured value, per setup and size, met or missed."""
    lines: list[str] = []
    runs_ = results["runs"]

    def get(case: str, size: int, setup: str) -> dict | None:
        return runs_.get(f"{case}/{size}/{setup}")

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    for size in sizes:
        for setup in setups:
            held, full = get("noisy held flood", size, setup), get("noisy full flood", size, setup)
            if held and full:
                v_held, v_full = held["tenants"]["victim"], full["tenants"]["victim"]
                ratio = v_full["ttft_p99_s"] / v_held["ttft_p99_s"]
                ok = ratio <= 1.5 and v_full["num_errors"] == 0 and v_full["cut"] == 0
                lines.append(f"{size} workers, {setup}: victim p99 full flood / held flood = "
                             f"{ratio:.2f} (<= 1.5), victim errors {v_full['num_errors']}, cut "
                             f"{v_full['cut']}: {verdict(ok)}")
            for count in (2, 4):
                equal = get(f"equal {count} tenants", size, setup)
                if equal:
                    lines.append(f"{size} workers, {setup}: Jain's index, {count} tenants = "
                                 f"{equal['jain']:.3f} (>= 0.95): {verdict(equal['jain'] >= 0.95)}")
            alone, mixed = get("bands alone", size, setup), get("bands with batch", size, setup)
            if alone and mixed:
                ratio = (mixed["tenants"]["interactive"]["ttft_p99_s"]
                         / alone["tenants"]["interactive"]["ttft_p99_s"])
                lines.append(f"{size} workers, {setup}: interactive p99 with batch / alone = "
                             f"{ratio:.2f} (<= 1.5): {verdict(ratio <= 1.5)}")
        flow = [s for s in setups if s.startswith("ours flow")]
        if flow and "ours cache_aware" in setups:
            for key, on in runs_.items():
                case, size_, setup = key.split("/")
                off = get(case, size, "ours cache_aware")
                if int(size_) != size or setup not in flow or off is None:
                    continue
                cached_on, cached_off = cached_fraction(on), cached_fraction(off)
                change = cached_on / cached_off - 1 if cached_off else math.nan
                lines.append(f"{size} workers, {case}: cached {cached_on:.1%} with {setup}, "
                             f"{cached_off:.1%} without ({change:+.1%}; within 5%): "
                             f"{verdict(abs(change) <= 0.05)}")
    return lines


def main(argv: list[str] | None = None) -> dict:
    """Every case of every scenario behind every setup on every size; prints the table
    and the targets, returns the numbers by ``scenario case/workers/setup``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="llama3-8b-h100")
    parser.add_argument("--workers", type=int, nargs="+", default=[8])
    parser.add_argument("--routers", nargs="+", default=list(SETUPS),
                        help='setups: the peers\' names, "ours POLICY" (flow off) or '
                             '"ours flow [NAME=VALUE ...]" ([flow] settings)')
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--duration-s", type=float, default=3.0,
                        help="arrival window per run, profile seconds")
    parser.add_argument("--drain-s", type=float, default=3.0,
                        help="after the last arrival, profile seconds until what is left is cut")
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--max-num-seqs", type=int, default=DECODE_BATCH,
                        help="each worker's batch slots")
    parser.add_argument("--max-batched-tokens", type=int, default=2048)
    args = parser.parse_args(argv)
    profile = get_profile(args.profile)
    setups, missing = peers.installed(args.routers)
    if missing:
        print(f"peer routers not installed ({', '.join(missing)}): run `make bench-peers`; "
              "going on without them")
    results: dict[str, object] = {"profile": profile.name, "time_scale": args.time_scale,
                                  "duration_s": args.duration_s, "drain_s": args.drain_s,
                                  "max_num_seqs": args.max_num_seqs, "setups": setups,
                                  "missing_peers": missing, "runs": {}}
    print(f"{'scenario case/workers/router':<60}{'tenant':<12}{'sent':>6}{'errs':>6}{'cut':>6}"
          f"{'cached':>8}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>9}{'ktok/s':>9}")
    flags = ("--model", f"timed:{profile.name}", "--served-model-name", "demo", "--time-scale",
             str(args.time_scale), "--max-batched-tokens", str(args.max_batched_tokens),
             "--max-num-seqs", str(args.max_num_seqs))
    run_tag = 0
    for num_workers in args.workers:
        ready_s = 60 + 10 * num_workers
        with workers(num_workers, "1GiB", *flags, ready_timeout_s=ready_s) as started, \
                tempfile.TemporaryDirectory(prefix="fairness-") as tmp:
            warm_up(started)
            for scenario, run in runs(args.scenarios, num_workers * args.max_num_seqs):
                for setup in setups:
                    run_tag += 1
                    key = f"{scenario} {run.case}/{num_workers}/{setup}"
                    idle_s = wait_idle(started)
                    router = RouterUnderTest(setup, [w.url for w in started], Path(tmp),
                                             args.time_scale)
                    try:
                        r = {**run_case(router, len(started), run, run_tag, args, profile),
                             "idle_wait_s": idle_s}
                    finally:
                        router.stop()
                    results["runs"][key] = r  # type: ignore[index]
                    for tenant, figures in r["tenants"].items():
                        print_row(key, tenant, figures)
                    if scenario == "equal":
                        print(f"{key:<60}Jain's index {r['jain']:.3f}", flush=True)
    results["targets"] = targets(results, setups, args.workers)
    print("\n".join(results["targets"]))
    return results


if __name__ == "__main__":
    main()
