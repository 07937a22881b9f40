"""The agent trace (docs/bench.md, "Agents: forks and returning sessions"): its shape
follows its config, every prompt names segments it declares (or an earlier request's
answer), branches start when their parent answered, a session's turns extend the
previous turn's prompt with its answer, and the JSON lines round-trip."""

from __future__ import annotations

import json
from dataclasses import replace

from bench.agent_trace import BRANCH, CROWD, PARENT, TURN, AgentTraceConfig, generate, lines
from bench.agent_trace import segment_text as text


def test_the_trace_has_the_configured_structure():
    config = replace(AgentTraceConfig(), num_forks=2, num_sessions=5, turns=3)
    trace = generate(config, seed=3)
    by_id = {r.request_id: r for r in trace.requests}
    kinds = [r.kind for r in trace.requests]
    assert kinds.count(PARENT) == 2 and kinds.count(TURN) == 15 and kinds.count(CROWD) > 0
    for request in trace.requests:
        for part in request.prompt:
            assert part in trace.segments or by_id[int(part[4:])].request_id < request.request_id
        if request.kind == BRANCH:
            parent = by_id[request.after]
            assert parent.kind == PARENT and request.prompt[: len(parent.prompt)] == parent.prompt
        if request.kind == TURN and request.turn:
            previous = by_id[request.after]
            assert request.prompt[: len(previous.prompt) + 1] == (
                *previous.prompt, f"out:{previous.request_id}")
            assert request.retention_s >= request.gap_s
    forks = [r for r in trace.requests if r.kind == PARENT]
    for fork in forks:
        num_branches = sum(r.after == fork.request_id for r in trace.requests)
        assert config.branches[0] <= num_branches <= config.branches[1]
        assert config.parent_tokens[0] <= trace.segments[fork.prompt[1]] <= config.parent_tokens[1]


def test_segments_are_letters_fixed_by_name_and_tag_and_lines_round_trip():
    assert text("a", 50) == text("a", 50) and len(text("a", 50)) == 50
    assert text("a", 50) != text("a", 50, "run1") and text("a", 50).isalpha()
    trace = generate(replace(AgentTraceConfig(), num_sessions=1, crowd_tokens_per_s=1.0))
    parsed = [json.loads(line) for line in lines(trace)]
    segments = {p["segment"]: p["tokens"] for p in parsed if "segment" in p}
    requests = [p for p in parsed if "id" in p]
    assert segments == trace.segments
    assert [r["id"] for r in requests] == [r.request_id for r in trace.requests]
    assert requests[1]["prompt"] == list(trace.requests[1].prompt)
