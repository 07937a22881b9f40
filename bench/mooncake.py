"""Traces in the Mooncake FAST'25 format, read or generated, and their token ids.

One JSON object a line: ``timestamp`` (ms from the start), ``input_length``,
``output_length`` and ``hash_ids``, the prompt's blocks of ``HASH_BLOCK_TOKENS`` tokens
(equal ids are the same reusable block, in position). A replayer turns each hash id
into a fixed run of token ids, seeded by the id, and cuts the prompt to
``input_length`` (the last hash block may be partial).

``generate`` writes a trace of the same shape without a file: Zipf-popular shared
contexts (long documents, system prompts) continued by multi-turn sessions and unique
questions, Poisson arrivals; its sizes follow the Mooncake release's synthetic trace
(mean input about 15,000 tokens, mean output about 150).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.workloads import TraceRequest
from radix.keys import to_key

HASH_BLOCK_TOKENS = 512
VOCAB_SIZE = 32_000


@dataclass(frozen=True)
class TraceRow:
    """One request of a Mooncake trace."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def read(path: Path) -> list[TraceRow]:
    """Every row of the JSONL trace at ``path``; ValueError naming the line when one is
    malformed."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            rows.append(TraceRow(float(item["timestamp"]), int(item["input_length"]),
                                 int(item["output_length"]), tuple(item["hash_ids"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: not a Mooncake trace row: {exc}") from None
    return rows


def write(rows: list[TraceRow], path: Path) -> None:
    """``rows`` as a JSONL trace at ``path``."""
    path.write_text("".join(json.dumps({
        "timestamp": row.timestamp_ms, "input_length": row.input_length,
        "output_length": row.output_length, "hash_ids": list(row.hash_ids)}) + "\n"
        for row in rows))


def generate(num_requests: int, seed: int = 0, rate_per_s: float = 4.0,
             num_contexts: int = 400) -> list[TraceRow]:
    """A trace shaped like the Mooncake synthetic one (module docstring): each request
    extends a Zipf-chosen context (1-60 hash blocks) by a session's earlier turns and
    a new part (1-12 unique hash blocks, the last one partial)."""
    rng = np.random.default_rng(seed)
    context_sizes = rng.integers(1, 61, num_contexts)
    next_id = int(context_sizes.sum())
    starts = np.concatenate(([0], np.cumsum(context_sizes)[:-1]))
    weights = 1.0 / np.arange(1, num_contexts + 1) ** 1.1
    weights /= weights.sum()
    sessions: dict[int, tuple[int, ...]] = {}
    rows, now_ms = [], 0.0
    for _ in range(num_requests):
        now_ms += float(rng.exponential(1000.0 / rate_per_s))
        context = int(rng.choice(num_contexts, p=weights))
        previous = sessions.get(context) if rng.random() < 0.5 else None
        if previous is None:
            previous = tuple(range(int(starts[context]),
                                   int(starts[context] + context_sizes[context])))
        num_new = int(rng.integers(1, 13))
        hash_ids = previous + tuple(range(next_id, next_id + num_new))
        next_id += num_new
        sessions[context] = hash_ids
        input_length = (len(hash_ids) - 1) * HASH_BLOCK_TOKENS + int(rng.integers(1, 512))
        rows.append(TraceRow(round(now_ms), input_length, int(rng.integers(20, 300)),
                             hash_ids))
    return rows


class TokenSource:
    """The token ids of trace rows: each hash id's run drawn once (from ``vocab_size``
    ids), seeded by the id."""

    def __init__(self, seed: int = 0, vocab_size: int = VOCAB_SIZE) -> None:
        self._seed = seed
        self._vocab_size = vocab_size
        self._runs: dict[int, bytes] = {}

    def run(self, hash_id: int) -> bytes:
        """The ``HASH_BLOCK_TOKENS`` token ids of ``hash_id`` as a ``radix.keys`` key."""
        run = self._runs.get(hash_id)
        if run is None:
            rng = np.random.default_rng((self._seed, hash_id))
            run = self._runs[hash_id] = to_key(rng.integers(0, self._vocab_size, HASH_BLOCK_TOKENS,
                                                            dtype=np.uint32).tolist())
        return run

    def prompt(self, row: TraceRow) -> bytes:
        """The row's prompt: its hash ids' runs, cut to ``input_length`` tokens."""
        key = b"".join(self.run(hash_id) for hash_id in row.hash_ids)
        return key[: row.input_length * 4]


def as_requests(rows: list[TraceRow], vocab_size: int, max_prompt_tokens: int,
                max_output_tokens: int, seed: int = 0) -> list[TraceRequest]:
    """The rows as a workload's requests: ``timestamp`` as the arrival, one tenant, a
    session a row, prompts and outputs cut to fit a worker's context (a cut keeps the
    prompt's shared prefix: its leading hash blocks), outputs drawn per row."""
    tokens = TokenSource(seed, vocab_size)
    requests = []
    for i, row in enumerate(rows):
        rng = np.random.default_rng((seed, i))
        num_output = min(row.output_length, max_output_tokens)
        requests.append(TraceRequest(
            row.timestamp_ms / 1000.0, "trace", str(i),
            tokens.prompt(row)[: max_prompt_tokens * 4],
            to_key(rng.integers(0, vocab_size, num_output, dtype=np.uint32).tolist())))
    return requests
