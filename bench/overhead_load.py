"""The load of ``bench.router_overhead``: its prompts, and clients that drive a URL.

``prompts(n, workload)`` builds the scenario's prompts (unique, a repeated document
plus a question, or chat turns); ``drive`` posts bodies from concurrent clients over
keep-alive connections and returns each request's latency (``Run``).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

PROMPT_BYTES = 2048
CHAT_TURNS = 10


@dataclass
class Run:
    """Latencies (s) of one scenario, wall time, and the longest gap inside a stream."""

    latencies_s: list[float]
    wall_s: float
    max_gap_s: float

    def percentile_ms(self, q: float) -> float:
        """The ``q`` quantile of the latencies, in milliseconds."""
        ordered = sorted(self.latencies_s)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def prompts(n: int, workload: str) -> list[str] | list[list[dict[str, str]]]:
    """``n`` unique 2 KB prompts; or (``repeat``) one of 16 2 KB documents each followed
    by a unique question; or (``chat``) the turns of ``n / 10`` conversations, in
    turn order across conversations, each turn's messages the previous turn's plus
    its reply (about 300 bytes) and a new user message (about 150)."""
    rng = random.Random(0)
    words = [f"w{rng.randrange(10**6)}" for _ in range(4096)]

    def text(num_bytes: int) -> str:
        return " ".join(rng.choices(words, k=num_bytes // 7))[:num_bytes]

    if workload == "unique":
        return [text(PROMPT_BYTES) for _ in range(n)]
    if workload == "repeat":
        documents = [text(PROMPT_BYTES) for _ in range(16)]
        return [f"{rng.choice(documents)}\nQuestion {i}: {text(60)}?" for i in range(n)]
    histories = [[{"role": "system", "content": f"You are assistant {c}. {text(200)}"}]
                 for c in range(max(n // CHAT_TURNS, 1))]
    turns: list[list[dict[str, str]]] = []
    while len(turns) < n:
        for history in histories[: n - len(turns)]:
            if len(history) > 1:
                history.append({"role": "assistant", "content": text(300)})
            history.append({"role": "user", "content": text(150)})
            turns.append(list(history))
    return turns


def chat_turn10(n: int) -> tuple[list[list[dict[str, str]]], list[list[dict[str, str]]]]:
    """Turn 10 alone: (turns 1-9, unmeasured; turn 10) of ``n / 10`` conversations
    other than those of ``prompts(n, "chat")`` (their system prompts differ, so a
    router that served the ``chat`` workload first has seen none of them)."""
    num_chats = max(n // CHAT_TURNS, 1)
    turns = prompts(2 * num_chats * CHAT_TURNS, "chat")
    fresh = [turns[t * 2 * num_chats + c] for t in range(CHAT_TURNS)
             for c in range(num_chats, 2 * num_chats)]
    return fresh[: -num_chats], fresh[-num_chats:]


async def _one(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
               headers: dict[str, str], stream: bool) -> tuple[float, float]:
    """Latency to the end of the response, and the longest gap between stream lines."""
    started = time.perf_counter()
    max_gap = 0.0
    async with session.post(url, json=body, headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")
        if stream:
            last = time.perf_counter()
            async for _ in resp.content:
                now = time.perf_counter()
                max_gap, last = max(max_gap, now - last), now
        else:
            await resp.read()
    return time.perf_counter() - started, max_gap


async def drive(url: str, bodies: list[dict[str, Any]], headers: dict[str, str],
                num_clients: int, stream: bool) -> Run:
    """Post ``bodies`` from ``num_clients`` concurrent clients; each request's latency."""
    latencies: list[float] = []
    gaps: list[float] = [0.0]
    queue = list(reversed(bodies))
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def client() -> None:
            while queue:
                latency, gap = await _one(session, url, queue.pop(), headers, stream)
                latencies.append(latency)
                gaps.append(gap)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(num_clients)))
        wall = time.perf_counter() - started
    return Run(latencies, wall, max(gaps))
