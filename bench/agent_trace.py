"""An agent trace with structure: forks and sessions that return (docs/bench.md, "Agents:
forks and returning sessions", which also gives the JSONL format ``write`` emits).

Generated from what coding-agent traces report (TraceLab, arXiv 2606.30560: 4,300
Claude Code and Codex sessions; long contexts, short outputs, heavy-tailed tool
calls, human- and tool-paced gaps, most input tokens cached): three kinds of request,
in profile seconds and tokens.

- **Forks**: a parent agent's context (``parent_tokens``, 20-26k: in the 20-40k of
  issue 49 and small enough that a worker of the benchmark's KV holds it beside its
  other work) runs once; when it
  has answered, ``branches`` (16-48) sub-agents start at once, each the parent's
  context plus a task of its own (``task_tokens``). Their TTFT is the branch start.
- **Sessions that return**: ``num_sessions`` sessions of ``turns`` turns; turn 0 is a
  context of ``session_tokens``; each next turn is the previous prompt, its answer and
  a tool result (``append_tokens``, log-normal: heavy-tailed), sent a tool call's
  time after the previous answer (``tool_gap_s``, log-normal, mostly past the
  workers' LRU horizon). Every turn carries a retention hint of
  ``retention_factor`` x its session's longest gap.
- **Crowd**: other tenants' one-shot prompts (``crowd_tokens``), at
  ``crowd_tokens_per_s`` in all, which turn the workers' LRU over between turns.

Prompts are named segments of letters (one token each), generated from the segment's
name, and ``out:<id>``: the text the request ``id`` answered, filled in when it does.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

PARENT, BRANCH, TURN, CROWD = "parent", "branch", "turn", "crowd"


@dataclass(frozen=True)
class AgentTraceConfig:
    """The trace's shape (module docstring); ranges are inclusive, times in profile
    seconds."""

    num_forks: int = 2
    fork_at_s: tuple[float, ...] = (0.5, 5.0)
    parent_tokens: tuple[int, int] = (20000, 26000)
    branches: tuple[int, int] = (16, 48)
    task_tokens: tuple[int, int] = (200, 1000)
    num_sessions: int = 16
    session_start_s: tuple[float, float] = (0.0, 2.0)
    session_tokens: tuple[int, int] = (6000, 12000)
    turns: int = 3
    append_tokens: tuple[float, float] = (800.0, 0.6)   # log-normal: median, sigma
    tool_gap_s: tuple[float, float] = (5.0, 0.3)        # log-normal: median, sigma
    retention_factor: float = 1.5
    output_tokens: tuple[int, int] = (16, 48)
    crowd_tokens: tuple[int, int] = (2000, 4000)
    crowd_tokens_per_s: float = 80000.0
    duration_s: float = 14.0


@dataclass(frozen=True)
class AgentRequest:
    """One request: sent ``gap_s`` after request ``after`` answered (after the trace's
    start when None); its prompt the concatenation of ``prompt`` (segment names, or
    ``out:<id>``); ``retention_s`` its hint (None: none)."""

    request_id: int
    kind: str
    session: str
    turn: int
    prompt: tuple[str, ...]
    output_tokens: int
    after: int | None
    gap_s: float
    retention_s: float | None = None


@dataclass
class AgentTrace:
    """The requests and the length of every named segment."""

    requests: list[AgentRequest] = field(default_factory=list)
    segments: dict[str, int] = field(default_factory=dict)

    def add(self, **fields: object) -> int:
        """Append a request (its id is its position); returns the id."""
        request = AgentRequest(len(self.requests), **fields)  # type: ignore[arg-type]
        self.requests.append(request)
        return request.request_id

    def segment(self, name: str, num_tokens: int) -> str:
        """Declare segment ``name`` of ``num_tokens`` tokens; returns the name."""
        self.segments[name] = num_tokens
        return name


def segment_text(name: str, num_tokens: int, tag: str = "") -> str:
    """The letters of a segment: a function of its name (and the run's ``tag``)."""
    seed = int.from_bytes(hashlib.blake2b(f"{tag}/{name}".encode(), digest_size=8).digest(),
                          "little")
    letters = np.random.default_rng(seed).integers(0, 26, num_tokens, dtype=np.uint8)
    return (letters + ord("a")).tobytes().decode()


def generate(config: AgentTraceConfig, seed: int = 0) -> AgentTrace:
    """The trace of ``config`` (module docstring), deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    trace = AgentTrace()
    system = trace.segment("system", 512)
    for fork in range(config.num_forks):
        _fork(trace, rng, config, fork, system)
    for session in range(config.num_sessions):
        _session(trace, rng, config, session, system)
    _crowd(trace, rng, config)
    return trace


def _fork(trace: AgentTrace, rng: np.random.Generator, config: AgentTraceConfig, fork: int,
          system: str) -> None:
    context = trace.segment(f"fork{fork}", int(rng.integers(*config.parent_tokens,
                                                             endpoint=True)))
    parent = trace.add(kind=PARENT, session=f"fork{fork}", turn=0, prompt=(system, context),
                       output_tokens=_output(rng, config), after=None,
                       gap_s=config.fork_at_s[fork % len(config.fork_at_s)])
    for branch in range(int(rng.integers(*config.branches, endpoint=True))):
        task = trace.segment(f"fork{fork}.task{branch}",
                             int(rng.integers(*config.task_tokens, endpoint=True)))
        trace.add(kind=BRANCH, session=f"fork{fork}.b{branch}", turn=0,
                  prompt=(system, context, task), output_tokens=_output(rng, config),
                  after=parent, gap_s=0.0)


def _session(trace: AgentTrace, rng: np.random.Generator, config: AgentTraceConfig,
             session: int, system: str) -> None:
    name = f"s{session}"
    gaps = [float(np.clip(rng.lognormal(np.log(config.tool_gap_s[0]), config.tool_gap_s[1]),
                          0.5 * config.tool_gap_s[0], 3 * config.tool_gap_s[0]))
            for _ in range(config.turns - 1)]
    retention_s = config.retention_factor * max(gaps, default=config.tool_gap_s[0])
    prompt: tuple[str, ...] = (system, trace.segment(name, int(rng.integers(
        *config.session_tokens, endpoint=True))))
    previous = trace.add(kind=TURN, session=name, turn=0, prompt=prompt,
                         output_tokens=_output(rng, config), after=None,
                         gap_s=float(rng.uniform(*config.session_start_s)),
                         retention_s=retention_s)
    for turn in range(1, config.turns):
        append = float(rng.lognormal(np.log(config.append_tokens[0]), config.append_tokens[1]))
        tool = trace.segment(f"{name}.tool{turn}", int(np.clip(append, 100, 4000)))
        prompt = (*prompt, f"out:{previous}", tool)
        previous = trace.add(kind=TURN, session=name, turn=turn, prompt=prompt,
                             output_tokens=_output(rng, config), after=previous,
                             gap_s=gaps[turn - 1], retention_s=retention_s)


def _crowd(trace: AgentTrace, rng: np.random.Generator, config: AgentTraceConfig) -> None:
    at_s, number = 0.0, 0
    mean_tokens = sum(config.crowd_tokens) / 2
    while True:
        at_s += float(rng.exponential(mean_tokens / config.crowd_tokens_per_s))
        if at_s >= config.duration_s:
            return
        own = trace.segment(f"crowd{number}", int(rng.integers(*config.crowd_tokens,
                                                               endpoint=True)))
        trace.add(kind=CROWD, session=f"crowd{number}", turn=0, prompt=(own,),
                  output_tokens=_output(rng, config), after=None, gap_s=at_s)
        number += 1


def _output(rng: np.random.Generator, config: AgentTraceConfig) -> int:
    return int(rng.integers(*config.output_tokens, endpoint=True))


def lines(trace: AgentTrace) -> Iterator[str]:
    """The trace as JSON lines: every segment, then every request (docs/bench.md)."""
    for name, num_tokens in trace.segments.items():
        yield json.dumps({"segment": name, "tokens": num_tokens})
    for request in trace.requests:
        yield json.dumps({"id": request.request_id, **{k: v for k, v in asdict(request).items()
                                                        if k != "request_id"}})


def write(trace: AgentTrace, path: Path) -> None:
    """Write ``trace`` as JSON lines to ``path``."""
    path.write_text("\n".join(lines(trace)) + "\n")
