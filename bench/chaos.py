"""``python -m bench chaos [--duration-s S] [--max-requests N]``: a chaos soak, bounded
in time and count, that stops by itself.

A deployment like configs/multi-router.toml (launched Redis, two routers, three demo
workers) runs under ``radix-router up``; greedy traffic from three tenants
(completions and chat, streaming and not) goes to both routers while the faults of
``bench.chaos_faults`` strike one after the other, each in its own slot of the
duration. A fault-free reference run of every prompt comes first, so every answer
is checked in full (``bench.chaos_traffic`` classifies each). At the end, with the
traffic stopped, it reports:

- requests: ok, lost (reset, truncated, timed out, or a text that differs from the
  reference), clean errors, 5xx (error events in a stream included), refused
  connections (a router was down), dropped (closed before any response);
- per fault: p99 latency of the requests that started during it and in the slot
  after it, requests lost around it, the time from its end to a healthy deployment
  (every router sees every worker and Redis, and answers);
- RSS of every child after warm-up and at the end (growth, when it was not restarted);
- KV blocks still in use on each worker and concurrency slots still held in Redis
  (both must be 0 once idle); whether everything is healthy and ``up`` exits cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import time
from pathlib import Path

import aiohttp
import redis

from bench.chaos_faults import FAULTS, ROUTERS, WORKERS, Deployment, wait_healthy
from bench.chaos_traffic import Outcome, Request, send
from harness.up_process import TENANT_KEYS, alive, all_pids

NUM_PROMPTS = 6
SETTLE_S = 20.0


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


class Soak:
    """One run: the deployment, the traffic, the outcomes, the fault windows."""

    def __init__(self, duration_s: float, max_requests: int, num_clients: int, seed: int,
                 faults: tuple[str, ...], workdir: Path | None) -> None:
        self.duration_s, self.max_requests, self.num_clients = duration_s, max_requests, num_clients
        self.fault_names = faults
        self.rng = random.Random(seed)
        self.requests = prompts(self.rng)
        self.deployment = Deployment(workdir)
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
            blocks = await self._blocks_in_use(session)
        report = {"duration_s": round(time.monotonic() - self.t0, 1),
                  "requests": self._totals(), "faults": self.faults,
                  "rss_mb": self._rss_growth(rss_start, self._rss()),
                  "kv_blocks_in_use": blocks, "redis_slots_held": self._slots_held(),
                  "healthy_at_end": healthy, "workdir": str(self.deployment.workdir)}
        report["up_exit_status"], report["children_left"] = self._stop()
        return report

    async def _reference(self, session: aiohttp.ClientSession) -> None:
        router = self.deployment.routers[0]
        for request in self.requests:
            if request.stream or request.reference_key in self.references:
                continue
            outcome = await send(session, router, request, None)
            if outcome.kind != "ok":
                raise RuntimeError(f"reference request failed: {outcome}")
            self.references[request.reference_key] = outcome.detail

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
            notes = await FAULTS[name](self.deployment, min(20.0, slot_s / 3))
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
        for name in ("redis", *WORKERS, *ROUTERS):
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

    async def _blocks_in_use(self, session: aiohttp.ClientSession) -> dict[str, int | None]:
        """Each worker's KV blocks in use, polled until all are 0 or SETTLE_S passes."""
        headers = {"Authorization": f"Bearer {self.deployment.worker_key()}"}
        deadline = time.monotonic() + SETTLE_S
        while True:
            used: dict[str, int | None] = {}
            for name in WORKERS:
                try:
                    async with session.get(f"{self.deployment.up.url(name)}/info",
                                           headers=headers) as response:
                        used[name] = (await response.json())["kv"]["num_used_blocks"]
                except (aiohttp.ClientError, KeyError, ValueError):
                    used[name] = None
            if all(n == 0 for n in used.values()) or time.monotonic() > deadline:
                return used
            await asyncio.sleep(0.5)

    def _slots_held(self) -> dict[str, int]:
        """Concurrency slots held in Redis per router and tenant, polled until none or
        SETTLE_S passes (a killed router's slots go when its lease ends)."""
        client = redis.Redis(host="127.0.0.1", port=self.deployment.redis_port,
                             decode_responses=True)
        deadline = time.monotonic() + SETTLE_S
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
        pids = all_pids(up, ["redis", *WORKERS, *ROUTERS])
        status = up.stop(signal.SIGTERM)
        return status, [pid for pid in pids if alive(pid)]


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _p99_ms(outcomes: list[Outcome]) -> float | None:
    latencies = sorted(o.latency_s for o in outcomes if o.kind == "ok")
    if not latencies:
        return None
    return round(1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1)


def run(duration_s: float = 1800.0, max_requests: int = 1_000_000, num_clients: int = 6,
        seed: int = 0, faults: tuple[str, ...] = tuple(FAULTS),
        workdir: Path | None = None) -> dict:
    """One soak with ``faults`` in this order; the report (see the module docstring)."""
    soak = Soak(duration_s, max_requests, num_clients, seed, faults, workdir)
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
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help=f"comma-separated, in order, from {', '.join(FAULTS)}")
    args = parser.parse_args(argv)
    faults = tuple(args.faults.split(","))
    if unknown := set(faults) - set(FAULTS):
        parser.error(f"unknown faults: {', '.join(sorted(unknown))}")
    report = run(args.duration_s, args.max_requests, args.clients, args.seed, faults)
    print_report(report)
    return report
