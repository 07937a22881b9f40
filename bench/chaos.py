"""``python -m bench chaos [--fleet multi|pd] [--duration-s S] [--max-requests N]``: a
chaos soak, bounded in time and count, that stops by itself.

A deployment runs under ``radix-router up`` (``bench.chaos_faults.FLEETS``): by
default one like configs/multi-router.toml (launched Redis, two routers, three demo
workers); with ``--fleet pd`` a prefill/decode fleet (one router, a prefill, a decode
and a ``both`` worker) whose prompts are long enough to be split. Greedy traffic from
three tenants (completions and chat, streaming and not) goes to the routers while the
fleet's faults strike one after the other, each in its own slot of the duration. A
fault-free reference run of every prompt comes first, so every answer is checked in
full (``bench.chaos_traffic`` classifies each); in the PD fleet the reference of a
tenant's prompt is asked as another tenant, so no tenant's scope caches its prompts
before the soak and their first requests are disaggregated. At the end, with the
traffic stopped, it reports:

- requests: ok, lost (reset, truncated, timed out, or a text that differs from the
  reference), clean errors, 5xx (error events in a stream included), refused
  connections (a router was down), dropped (closed before any response);
- per fault: p99 latency of the requests that started during it and in the slot
  after it, requests lost around it, the time from its end to a healthy deployment
  (every router sees every worker and Redis, and answers);
- RSS of every child after warm-up and at the end (growth, when it was not restarted);
- KV blocks still in use on each worker and concurrency slots still held in Redis
  (both must be 0 once idle); whether everything is healthy and ``up`` exits cleanly;
- in the PD fleet, also the blocks the prefill worker still holds for consumers
  (``/info`` ``load.num_held_blocks`` and its ``kv_transfer_held_blocks`` gauge, 0 once
  idle), its hold counters, and the router's requests by PD mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import time
from dataclasses import replace
from pathlib import Path

import aiohttp
import redis

from bench.chaos_faults import FAULTS, FLEETS, Deployment, wait_healthy
from bench.chaos_traffic import Outcome, Request, send
from harness.up_process import TENANT_KEYS, alive, all_pids

NUM_PROMPTS = 6
NUM_PD_PROMPTS = 12
REFERENCE_CONCURRENCY = 4


def prompts(rng: random.Random) -> list[Request]:
    """Every request kind: tenant x endpoint x prompt (sharing prefixes) x stream."""
    shared = "You are a helpful assistant. Use the document below. " * 3
    requests = []
    for tenant, key in TENANT_KEYS.items():
        for i in range(NUM_PROMPTS):
            text = f"{shared}Document of {tenant}: {'lorem ipsum ' * i} Question {i}?"
            requests += [Request(key, chat, text, stream) for chat in (False, True)
                         for stream in (False, True)]
    rng.shuffle(requests)
    return requests


def pd_prompts(rng: random.Random) -> list[Request]:
    """Every request kind with ``NUM_PD_PROMPTS`` documents per tenant, each sharing the
    tenant's prefix and going on for at least a hundred tokens of its own (far past
    ``[pd] min_uncached_tokens``), so a decode worker that holds only the prefix has
    the request disaggregated."""
    shared = "You are a helpful assistant. Use the document below. " * 3
    words = ("kv", "block", "prefill", "decode", "cache", "hold", "pull", "router", "tenant")
    requests = []
    for tenant, key in TENANT_KEYS.items():
        for i in range(NUM_PD_PROMPTS):
            document = " ".join(rng.choice(words) for _ in range(20 + 2 * i))
            text = f"{shared}Document {i} of {tenant}: {document}. Question {i}?"
            requests += [Request(key, chat, text, stream) for chat in (False, True)
                         for stream in (False, True)]
    rng.shuffle(requests)
    return requests


class Soak:
    """One run: the deployment, the traffic, the outcomes, the fault windows."""

    def __init__(self, duration_s: float, max_requests: int, num_clients: int, seed: int,
                 faults: tuple[str, ...], workdir: Path | None, fleet: str = "multi") -> None:
        self.duration_s, self.max_requests, self.num_clients = duration_s, max_requests, num_clients
        self.fault_names = faults
        self.rng = random.Random(seed)
        self.pd = fleet == "pd"
        self.requests = pd_prompts(self.rng) if self.pd else prompts(self.rng)
        self.deployment = Deployment(workdir, fleet)
        self.fleet = self.deployment.fleet
        self.references: dict[tuple[bool, str], str] = {}
        self.outcomes: list[Outcome] = []
        self.faults: list[dict] = []
        self.stop_traffic = asyncio.Event()

    async def run(self) -> dict:
        async with aiohttp.ClientSession() as session:
            await self.deployment.start(session)
            await self._reference(session)
            rss_start = self._rss()
            self.t0 = time.monotonic()
            clients = [asyncio.create_task(self._client(session, i))
                       for i in range(self.num_clients)]
            await self._faults(session)
            self.stop_traffic.set()
            await asyncio.gather(*clients)
            healthy = await wait_healthy(session, self.deployment, 120.0)
            blocks, held = await self._blocks_in_use(session)
            pd = await self._pd_counters(session) if self.pd else None
        report = {"fleet": self.fleet.name, "duration_s": round(time.monotonic() - self.t0, 1),
                  "requests": self._totals(), "faults": self.faults,
                  "rss_mb": self._rss_growth(rss_start, self._rss()),
                  "kv_blocks_in_use": blocks, "redis_slots_held": self._slots_held(),
                  "healthy_at_end": healthy, "workdir": str(self.deployment.workdir)}
        if pd is not None:
            report["held_blocks"], report["pd"] = held, pd
        report["up_exit_status"], report["children_left"] = self._stop()
        return report

    async def _reference(self, session: aiohttp.ClientSession) -> None:
        """The fault-free text of every prompt, ``REFERENCE_CONCURRENCY`` at a time."""
        router = self.deployment.routers[0]
        keys = list(TENANT_KEYS.values())
        todo = {r.reference_key: r for r in self.requests if not r.stream}
        semaphore = asyncio.Semaphore(REFERENCE_CONCURRENCY)

        async def reference(request: Request) -> None:
            if self.pd:  # asked as the next tenant: the tenant's own scope stays cold
                request = replace(request, tenant_key=keys[
                    (keys.index(request.tenant_key) + 1) % len(keys)])
            async with semaphore:
                outcome = await send(session, router, request, None)
            if outcome.kind != "ok":
                raise RuntimeError(f"reference request failed: {outcome}")
            self.references[request.reference_key] = outcome.detail

        await asyncio.gather(*(reference(r) for r in todo.values()))

    async def _client(self, session: aiohttp.ClientSession, index: int) -> None:
        rng = random.Random(index)
        while not self.stop_traffic.is_set() and len(self.outcomes) < self.max_requests:
            request = rng.choice(self.requests)
            router = rng.choice(self.deployment.routers)
            outcome = await send(session, router, request, self.references[request.reference_key])
            self.outcomes.append(outcome)
            if outcome.kind == "refused":
                await asyncio.sleep(0.1)

    async def _faults(self, session: aiohttp.ClientSession) -> None:
        slot_s = self._slot_s
        await asyncio.sleep(slot_s / 2)  # traffic before the first fault
        for i, name in enumerate(self.fault_names):
            start = time.monotonic()
            notes = await self.fleet.faults[name](self.deployment, min(20.0, slot_s / 3))
            end = time.monotonic()
            recovered = await wait_healthy(session, self.deployment, max(slot_s, 60.0))
            self.faults.append({"fault": name, "at_s": round(start - self.t0, 1),
                                "start": start, "end": end,
                                "recover_s": round(time.monotonic() - end, 2) if recovered else None,
                                **notes})
            next_start = self.t0 + slot_s * (i + 1.5)
            await asyncio.sleep(max(next_start - time.monotonic(), 0.0))

    def _totals(self) -> dict:
        kinds = [o.kind for o in self.outcomes]
        totals = {kind: kinds.count(kind)
                  for kind in ("ok", "mismatch", "lost", "error", "refused", "dropped")}
        totals["total"] = len(kinds)
        totals["status_5xx"] = sum(1 for o in self.outcomes if (o.status or 0) >= 500
                                   or (o.kind == "error" and o.status == 200))
        totals["lost_details"] = [o.detail for o in self.outcomes
                                  if o.kind in ("lost", "mismatch", "dropped")][:10]
        after_slot = self._slot_s / 2
        for fault in self.faults:
            start, end = fault.pop("start"), fault.pop("end")
            during = [o for o in self.outcomes if start <= o.started < end]
            after = [o for o in self.outcomes if end <= o.started < end + after_slot]
            fault["p99_during_ms"] = _p99_ms(during)
            fault["p99_after_ms"] = _p99_ms(after)
            fault["num_lost"] = sum(1 for o in self.outcomes if o.kind in ("lost", "mismatch")
                                    and o.started < end + after_slot
                                    and o.started + o.latency_s >= start)
        return totals

    @property
    def _slot_s(self) -> float:
        return self.duration_s / (len(self.fault_names) + 1)

    def _rss(self) -> dict[str, tuple[int, float]]:
        rss = {}
        for name in self.fleet.children:
            pid = self.deployment.up.pid(name)
            for line in _read(f"/proc/{pid}/status").splitlines():
                if line.startswith("VmRSS:"):
                    rss[name] = (pid, int(line.split()[1]) / 1024)
        return rss

    @staticmethod
    def _rss_growth(start: dict, end: dict) -> dict:
        growth = {}
        for name, (pid, mb) in start.items():
            end_pid, end_mb = end.get(name, (None, 0.0))
            growth[name] = {"start": round(mb, 1), "end": round(end_mb, 1),
                            "growth_pct": round(100 * (end_mb / mb - 1), 1)
                            if end_pid == pid else "restarted"}
        return growth

    async def _blocks_in_use(self, session: aiohttp.ClientSession
                             ) -> tuple[dict[str, int | None], dict[str, dict[str, float | None]]]:
        """Each worker's KV blocks in use (``/info`` ``kv.num_used_blocks``) and, per
        worker that has a transfer role, the blocks it holds for consumers (``/info``
        ``load.num_held_blocks`` and the ``kv_transfer_held_blocks`` gauge), polled
        until all are 0 or the fleet's settle time passes."""
        deadline = time.monotonic() + self.fleet.settle_s
        producers = [name for name, role in zip(self.fleet.workers, self.fleet.roles or (),
                                                strict=False) if role != "decode"]
        while True:
            used: dict[str, int | None] = {}
            held: dict[str, dict[str, float | None]] = {}
            for name in self.fleet.workers:
                info = await self._worker_json(session, name, "/info")
                used[name] = info["kv"]["num_used_blocks"] if info else None
                if name in producers:
                    text = await self._worker_text(session, name, "/metrics")
                    held[name] = {"info": info["load"].get("num_held_blocks") if info else None,
                                  "metric": _sample(text, "kv_transfer_held_blocks")}
            counts = [*used.values(), *(n for h in held.values() for n in h.values())]
            if all(n == 0 for n in counts) or time.monotonic() > deadline:
                return used, held
            await asyncio.sleep(0.5)

    async def _worker_text(self, session: aiohttp.ClientSession, name: str, path: str) -> str:
        headers = {"Authorization": f"Bearer {self.deployment.worker_key()}"}
        try:
            async with session.get(f"{self.deployment.up.url(name)}{path}", headers=headers,
                                   timeout=aiohttp.ClientTimeout(total=5)) as response:
                return await response.text() if response.status == 200 else ""
        except (TimeoutError, aiohttp.ClientError):
            return ""

    async def _worker_json(self, session: aiohttp.ClientSession, name: str,
                           path: str) -> dict | None:
        try:
            return json.loads(await self._worker_text(session, name, path))
        except ValueError:
            return None

    async def _pd_counters(self, session: aiohttp.ClientSession) -> dict:
        """The router's requests by PD mode and retries, and the hold counters of the
        workers that produce (since their last start)."""
        counters: dict[str, dict[str, float | None]] = {}
        async with session.get(f"{self.deployment.metrics[0]}/metrics") as response:
            text = await response.text()
        counters["router"] = {
            **{mode: _sample(text, "router_pd_requests_total", f'mode="{mode}"')
               for mode in ("aggregated", "disaggregated", "fallback")},
            "retries": _sample(text, "router_retries_total")}
        for name, role in zip(self.fleet.workers, self.fleet.roles or (), strict=False):
            text = await self._worker_text(session, name, "/metrics")
            names = {"decode": ("kv_transfer_blocks_received_total",
                                "kv_transfer_ack_failures_total",
                                "kv_transfer_recomputes_total")}.get(role, (
                "kv_transfer_blocks_sent_total", "kv_transfer_expired_holds_total",
                "kv_transfer_orphan_pins_freed_total", "kv_transfer_cancelled_pins_total"))
            counters[name] = {"role": role, **{n: _sample(text, n) for n in names}}  # type: ignore[dict-item]
            if role != "decode":
                counters[name].update({
                    f"released_{reason}": _sample(text, "kv_transfer_released_holds_total",
                                                  f'reason="{reason}"')
                    for reason in ("acknowledged", "abandoned")})
                counters[name].update({
                    f"refused_{cap}": _sample(text, "kv_transfer_refused_holds_total",
                                              f'cap="{cap}"') for cap in ("producer", "scope")})
        return counters

    def _slots_held(self) -> dict[str, int]:
        """Concurrency slots held in Redis per router and tenant, polled until none or
        the settle time passes (a killed router's slots go when its lease ends); {}
        without a launched Redis."""
        if not self.fleet.launch_redis:
            return {}
        client = redis.Redis(host="127.0.0.1", port=self.deployment.redis_port,
                             decode_responses=True)
        deadline = time.monotonic() + self.fleet.settle_s
        while True:
            held = {f"{key.rsplit(':', 1)[1]}/{tenant}": int(count)
                    for key in client.scan_iter("chaos:slots:*")
                    for tenant, count in client.hgetall(key).items() if int(count)}
            if not held or time.monotonic() > deadline:
                client.close()
                return held
            time.sleep(0.5)

    def _stop(self) -> tuple[int, list[int]]:
        up = self.deployment.up
        pids = all_pids(up, list(self.fleet.children))
        status = up.stop(signal.SIGTERM)
        return status, [pid for pid in pids if alive(pid)]


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _sample(text: str, name: str, labels: str = "") -> float | None:
    """The value of metric ``name`` (with exactly ``labels``, as Prometheus prints
    them) in an exposition ``text``; None when absent."""
    head = f"{name}{{{labels}}} " if labels else f"{name} "
    for line in text.splitlines():
        if line.startswith(head):
            return float(line.split()[-1])
    return None


def _p99_ms(outcomes: list[Outcome]) -> float | None:
    latencies = sorted(o.latency_s for o in outcomes if o.kind == "ok")
    if not latencies:
        return None
    return round(1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1)


def run(duration_s: float = 1800.0, max_requests: int = 1_000_000, num_clients: int = 6,
        seed: int = 0, faults: tuple[str, ...] | None = None,
        workdir: Path | None = None, fleet: str = "multi") -> dict:
    """One soak of ``fleet`` with ``faults`` in this order (None: all of the fleet's, in
    their order); the report (see the module docstring)."""
    if faults is None:
        faults = tuple(FLEETS[fleet].faults)
    soak = Soak(duration_s, max_requests, num_clients, seed, faults, workdir, fleet)
    try:
        return asyncio.run(soak.run())
    finally:
        soak.deployment.up.stop(signal.SIGKILL)


def print_report(report: dict) -> None:
    print(json.dumps(report["requests"], indent=1))
    print(f"{'fault':20} {'at s':>6} {'recover s':>9} {'p99 during':>11} {'p99 after':>10} "
          f"{'lost':>5}  notes")
    for f in report["faults"]:
        notes = {k: v for k, v in f.items() if k not in (
            "fault", "at_s", "recover_s", "p99_during_ms", "p99_after_ms", "num_lost")}
        print(f"{f['fault']:20} {f['at_s']:>6} {f['recover_s']!s:>9} {f['p99_during_ms']!s:>11} "
              f"{f['p99_after_ms']!s:>10} {f['num_lost']:>5}  {notes or ''}")
    for name, rss in report["rss_mb"].items():
        print(f"RSS {name:8} {rss['start']:>7} MB -> {rss['end']:>7} MB ({rss['growth_pct']})")
    if "pd" in report:
        print(f"PD counters: {json.dumps(report['pd'])}")
        print(f"Held blocks (prefill side): {report['held_blocks']}")
    print(f"KV blocks in use: {report['kv_blocks_in_use']}; Redis slots held: "
          f"{report['redis_slots_held']}; healthy at end: {report['healthy_at_end']}; "
          f"up exit status: {report['up_exit_status']}; children left: {report['children_left']}")


def main(argv: list[str]) -> dict:
    """``python -m bench chaos``: run, print and return the report."""
    parser = argparse.ArgumentParser(prog="python -m bench chaos", description=__doc__)
    parser.add_argument("--duration-s", type=float, default=1800.0)
    parser.add_argument("--max-requests", type=int, default=1_000_000)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fleet", choices=tuple(FLEETS), default="multi",
                        help="multi: Redis, two routers, three workers; pd: one router, a "
                             "prefill, a decode and a both worker")
    parser.add_argument("--faults", default=None,
                        help="comma-separated, in order; default: all of the fleet's "
                             f"(multi: {', '.join(FAULTS)}; pd: "
                             f"{', '.join(FLEETS['pd'].faults)})")
    args = parser.parse_args(argv)
    known = FLEETS[args.fleet].faults
    faults = tuple(known) if args.faults is None else tuple(args.faults.split(","))
    if unknown := set(faults) - set(known):
        parser.error(f"unknown faults for fleet {args.fleet}: {', '.join(sorted(unknown))}")
    report = run(args.duration_s, args.max_requests, args.clients, args.seed, faults,
                 fleet=args.fleet)
    print_report(report)
    return report
