"""Benchmark workloads: seeded request streams in arrival order, and their JSONL traces.

Every generator yields ``TraceRequest`` values sorted by ``arrival_s``, lazily (a
million-request stream holds only its open sessions in memory), and the same
``(name, seed, ...)`` always yields the same requests. Token ids are random ids below
``vocab_size``; shared segments (system prompts, documents) are drawn once per
workload, so two requests share exactly the prefixes the workload says they share.

- ``rag``: a public system prompt + ``docs_per_request`` (1-3) documents of a corpus
  with Zipf popularity (the documents registered public, as an operator registers
  shared documents) + a private question.
- ``chat``: multi-turn sessions on a few public system prompts; each turn resends the
  previous turn's prompt, its reply and a new message, a think time after it.
- ``agent``: trajectories that loop tool calls (each step appends the tool result)
  and fork parallel sub-agents from a shared state, which then continue on their own.
- ``rag_chat``: both on one stream: a session start is a chat session with
  probability ``chat_session_share``, else a rag question.
- ``multitenant``: tenants with private documents (never public) plus public system
  prompts; a tenant's requests reuse its own documents only.
- ``replay``: a JSONL trace written by ``write_trace`` (or by hand in that format).

Arrivals are open-loop: a session's first request arrives by the process (``poisson``:
exponential gaps; ``bursty``: gamma gaps with coefficient of variation 3, the same
mean rate in clusters), its later turns a think time after the previous turn's
arrival, whatever the system does.
"""

from __future__ import annotations

import heapq
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from radix.keys import TOKEN_BYTES, from_key, to_key

BLOCK_SIZE = 16
BURSTY_CV = 3.0


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace. ``prompt`` and ``output`` are token keys (``radix.keys``
    encoding); the first ``num_public_tokens`` of the prompt (a multiple of
    ``BLOCK_SIZE``) are public prefixes, the rest belongs to ``tenant``. ``output`` is
    what the simulator decodes and what a later turn of the session resends."""

    arrival_s: float
    tenant: str
    session: str
    prompt: bytes
    output: bytes
    num_public_tokens: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt length in tokens."""
        return len(self.prompt) // TOKEN_BYTES

    @property
    def num_output_tokens(self) -> int:
        """Output length in tokens."""
        return len(self.output) // TOKEN_BYTES


@dataclass(frozen=True)
class WorkloadConfig:
    """Sizes shared by the generators; token ranges are [low, high) drawn uniformly."""

    num_docs: int = 200
    doc_tokens: tuple[int, int] = (1000, 4000)
    zipf_exponent: float = 1.1
    docs_per_request: tuple[int, int] = (1, 4)
    chat_session_share: float = 0.05
    num_system_prompts: int = 4
    system_tokens: tuple[int, int] = (256, 512)
    message_tokens: tuple[int, int] = (50, 200)
    output_tokens: tuple[int, int] = (32, 128)
    num_turns: tuple[int, int] = (2, 10)
    think_time_s: float = 5.0
    agent_steps: tuple[int, int] = (3, 12)
    agent_fork_probability: float = 0.2
    agent_fanout: tuple[int, int] = (2, 5)
    tool_result_tokens: tuple[int, int] = (100, 600)
    tool_time_s: float = 1.0
    num_tenants: int = 8
    docs_per_tenant: int = 20
    vocab_size: int = 32_000


def _block_floor(num_tokens: int) -> int:
    return num_tokens // BLOCK_SIZE * BLOCK_SIZE


class _Source:
    """The random state of one workload: segment draws, shared segments, arrivals."""

    def __init__(self, config: WorkloadConfig, seed: int, rate_per_s: float, arrival: str):
        if arrival not in ARRIVALS:
            raise ValueError(f"arrival: unknown process {arrival!r}; known: {', '.join(ARRIVALS)}")
        if rate_per_s <= 0:
            raise ValueError(f"rate_per_s: must be positive, got {rate_per_s!r}")
        self.config = config
        self.rng = np.random.default_rng(seed)
        self.systems = [self.tokens(config.system_tokens) for _ in range(config.num_system_prompts)]
        self.docs = [self.tokens(config.doc_tokens) for _ in range(config.num_docs)]
        popularity = np.arange(1, config.num_docs + 1, dtype=np.float64) ** -config.zipf_exponent
        self.popularity = np.cumsum(popularity / popularity.sum())
        self._gap = ARRIVALS[arrival](self.rng, rate_per_s)
        self._now = 0.0

    def tokens(self, bounds: tuple[int, int]) -> bytes:
        """A fresh random run of a length drawn from ``bounds``."""
        length = int(self.rng.integers(*bounds))
        return self.rng.integers(0, self.config.vocab_size, length, dtype=np.uint32).tobytes()

    def next_arrival(self) -> float:
        """The next session start of the arrival process."""
        self._now += self._gap()
        return self._now

    def pick(self, n: int) -> int:
        """A uniform index below ``n``."""
        return int(self.rng.integers(n))

    def popular_doc(self) -> int:
        """A document index by Zipf popularity."""
        return min(int(np.searchsorted(self.popularity, self.rng.random())), len(self.docs) - 1)

    def tenant(self) -> str:
        """A uniformly drawn tenant."""
        return f"tenant-{self.pick(self.config.num_tenants)}"


def _poisson(rng: np.random.Generator, rate_per_s: float) -> Callable[[], float]:
    return lambda: float(rng.exponential(1.0 / rate_per_s))


def _bursty(rng: np.random.Generator, rate_per_s: float) -> Callable[[], float]:
    shape = 1.0 / BURSTY_CV**2
    return lambda: float(rng.gamma(shape, 1.0 / (rate_per_s * shape)))


ARRIVALS: dict[str, Callable[[np.random.Generator, float], Callable[[], float]]] = {
    "poisson": _poisson, "bursty": _bursty,
}

# A session: its first request, and a function giving the requests that follow one
# request of it (each at its own arrival time).
Follow = Callable[[TraceRequest], list[TraceRequest]]


def _sessions(source: _Source, start: Callable[[float, str], tuple[TraceRequest, Follow]],
              num_requests: int) -> Iterator[TraceRequest]:
    """Merge sessions into one stream in arrival order, ``num_requests`` in all."""
    pending: list[tuple[float, int, TraceRequest, Follow]] = []
    order = itertools.count()
    next_start = source.next_arrival()
    session_ids = itertools.count()
    while num_requests > 0:
        while pending and pending[0][0] <= next_start:
            _, _, request, follow = heapq.heappop(pending)
            yield request
            num_requests -= 1
            if num_requests <= 0:
                return
            for after in follow(request):
                heapq.heappush(pending, (after.arrival_s, next(order), after, follow))
        request, follow = start(next_start, f"s{next(session_ids)}")
        heapq.heappush(pending, (request.arrival_s, next(order), request, follow))
        next_start = source.next_arrival()


def rag(source: _Source) -> Callable[[float, str], tuple[TraceRequest, Follow]]:
    """One-request sessions: system prompt + popular documents + a question."""
    def start(now: float, session: str) -> tuple[TraceRequest, Follow]:
        system = source.systems[source.pick(len(source.systems))]
        num_docs = int(source.rng.integers(*source.config.docs_per_request))
        docs = b"".join(source.docs[source.popular_doc()] for _ in range(num_docs))
        public = system + docs
        prompt = public + source.tokens(source.config.message_tokens)
        request = TraceRequest(now, source.tenant(), session, prompt,
                               source.tokens(source.config.output_tokens),
                               _block_floor(len(public) // TOKEN_BYTES))
        return request, lambda _: []
    return start


def chat(source: _Source) -> Callable[[float, str], tuple[TraceRequest, Follow]]:
    """Sessions of 2-10 turns on a public system prompt, a think time apart."""
    config = source.config

    def start(now: float, session: str) -> tuple[TraceRequest, Follow]:
        system = source.systems[source.pick(len(source.systems))]
        turns_left = [int(source.rng.integers(*config.num_turns)) - 1]

        def follow(previous: TraceRequest) -> list[TraceRequest]:
            if turns_left[0] <= 0:
                return []
            turns_left[0] -= 1
            arrival = previous.arrival_s + float(source.rng.exponential(config.think_time_s))
            prompt = previous.prompt + previous.output + source.tokens(config.message_tokens)
            return [TraceRequest(arrival, previous.tenant, session, prompt,
                                 source.tokens(config.output_tokens), previous.num_public_tokens)]

        first = TraceRequest(now, source.tenant(), session,
                             system + source.tokens(config.message_tokens),
                             source.tokens(config.output_tokens),
                             _block_floor(len(system) // TOKEN_BYTES))
        return first, follow
    return start


def agent(source: _Source) -> Callable[[float, str], tuple[TraceRequest, Follow]]:
    """Tool-call loops of 3-12 steps; a step forks 2-4 sub-agents with probability
    ``agent_fork_probability``, each continuing the shared state with its own steps."""
    config = source.config

    def start(now: float, session: str) -> tuple[TraceRequest, Follow]:
        system = source.systems[source.pick(len(source.systems))]
        steps_left: dict[bytes, int] = {}

        def step(previous: TraceRequest, branch: bytes) -> TraceRequest:
            arrival = previous.arrival_s + float(source.rng.exponential(config.tool_time_s))
            prompt = previous.prompt + previous.output + branch + source.tokens(config.tool_result_tokens)
            return TraceRequest(arrival, previous.tenant, session, prompt,
                                source.tokens(config.output_tokens), previous.num_public_tokens)

        def follow(previous: TraceRequest) -> list[TraceRequest]:
            left = steps_left.pop(previous.prompt, 0)
            if left <= 0:
                return []
            if source.rng.random() < config.agent_fork_probability:
                fanout = int(source.rng.integers(*config.agent_fanout))
                nexts = [step(previous, source.tokens((8, 16))) for _ in range(fanout)]
            else:
                nexts = [step(previous, b"")]
            for request in nexts:
                steps_left[request.prompt] = left - 1
            return nexts

        first = TraceRequest(now, source.tenant(), session,
                             system + source.tokens(config.message_tokens),
                             source.tokens(config.output_tokens),
                             _block_floor(len(system) // TOKEN_BYTES))
        steps_left[first.prompt] = int(source.rng.integers(*config.agent_steps)) - 1
        return first, follow
    return start


def rag_chat(source: _Source) -> Callable[[float, str], tuple[TraceRequest, Follow]]:
    """``chat`` sessions (share ``chat_session_share`` of session starts) among ``rag``
    questions, drawn from one source so they share its system prompts."""
    start_rag, start_chat = rag(source), chat(source)

    def start(now: float, session: str) -> tuple[TraceRequest, Follow]:
        if source.rng.random() < source.config.chat_session_share:
            return start_chat(now, session)
        return start_rag(now, session)
    return start


def multitenant(source: _Source) -> Callable[[float, str], tuple[TraceRequest, Follow]]:
    """One-request sessions: a public system prompt + one of the tenant's own private
    documents (Zipf within the tenant) + a question. Tenant t owns documents
    ``[t * docs_per_tenant, (t + 1) * docs_per_tenant)`` of the corpus (cycled)."""
    config = source.config
    weights = np.arange(1, config.docs_per_tenant + 1, dtype=np.float64) ** -config.zipf_exponent
    cumulative = np.cumsum(weights / weights.sum())

    def start(now: float, session: str) -> tuple[TraceRequest, Follow]:
        t = source.pick(config.num_tenants)
        rank = min(int(np.searchsorted(cumulative, source.rng.random())), config.docs_per_tenant - 1)
        doc = source.docs[(t * config.docs_per_tenant + rank) % len(source.docs)]
        system = source.systems[source.pick(len(source.systems))]
        prompt = system + doc + source.tokens(config.message_tokens)
        request = TraceRequest(now, f"tenant-{t}", session, prompt,
                               source.tokens(config.output_tokens),
                               _block_floor(len(system) // TOKEN_BYTES))
        return request, lambda _: []
    return start


GENERATORS: dict[str, Callable[[_Source], Callable[[float, str], tuple[TraceRequest, Follow]]]] = {
    "rag": rag, "chat": chat, "agent": agent, "rag_chat": rag_chat, "multitenant": multitenant,
}
WORKLOADS = (*GENERATORS, "replay")


def generate(name: str, num_requests: int, rate_per_s: float, seed: int = 0,
             arrival: str = "poisson", config: WorkloadConfig | None = None,
             trace: Path | None = None) -> Iterator[TraceRequest]:
    """``num_requests`` requests of workload ``name`` in arrival order, sessions starting
    at ``rate_per_s`` (``replay`` reads ``trace`` instead and ignores the rest);
    ValueError naming an unknown workload or arrival process."""
    if name == "replay":
        if trace is None:
            raise ValueError("replay: needs a trace file")
        return itertools.islice(read_trace(trace), num_requests)
    if name not in GENERATORS:
        raise ValueError(f"workload: unknown {name!r}; known: {', '.join(WORKLOADS)}")
    source = _Source(config or WorkloadConfig(), seed, rate_per_s, arrival)
    return _sessions(source, GENERATORS[name](source), num_requests)


def write_trace(requests: Iterable[TraceRequest], path: Path) -> int:
    """Write ``requests`` as JSONL (one object a line: ``arrival_s``, ``tenant``,
    ``session``, ``prompt_token_ids``, ``output_token_ids``, ``num_public_tokens``);
    returns how many were written."""
    count = 0
    with path.open("w", encoding="utf-8") as out:
        for r in requests:
            out.write(json.dumps({
                "arrival_s": r.arrival_s, "tenant": r.tenant, "session": r.session,
                "prompt_token_ids": from_key(r.prompt), "output_token_ids": from_key(r.output),
                "num_public_tokens": r.num_public_tokens,
            }) + "\n")
            count += 1
    return count


def read_trace(path: Path) -> Iterator[TraceRequest]:
    """The requests of a JSONL trace, in file order. A line gives the prompt as
    ``prompt_token_ids`` or as ``prompt`` text (its UTF-8 bytes as token ids, as the
    demo model's byte tokenizer reads it); likewise ``output_token_ids`` or
    ``output`` (absent: empty). ``tenant`` defaults to ``public-trace``, ``session``
    to the line number, ``num_public_tokens`` to 0. ValueError naming the line when
    a line is malformed or arrivals go backwards."""
    last = 0.0
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                request = TraceRequest(
                    float(record["arrival_s"]), str(record.get("tenant", "public-trace")),
                    str(record.get("session", number)), _tokens(record, "prompt"),
                    _tokens(record, "output"), int(record.get("num_public_tokens", 0)))
            except (KeyError, TypeError, ValueError, OverflowError) as exc:
                raise ValueError(f"{path}:{number}: bad trace line: {exc}") from exc
            if request.arrival_s < last:
                raise ValueError(f"{path}:{number}: arrival_s goes backwards")
            last = request.arrival_s
            yield request


def _tokens(record: dict, field: str) -> bytes:
    if f"{field}_token_ids" in record:
        return to_key([int(t) for t in record[f"{field}_token_ids"]])
    return to_key(list(str(record.get(field, "")).encode("utf-8")))
