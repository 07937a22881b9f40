"""Workload generators: seeded determinism, shapes, arrival order and JSONL traces."""

from __future__ import annotations

import itertools

import pytest

from bench.workloads import BLOCK_SIZE, WorkloadConfig, generate, read_trace, write_trace
from radix.keys import TOKEN_BYTES

SMALL = WorkloadConfig(num_docs=12, doc_tokens=(64, 128), system_tokens=(32, 48),
                       message_tokens=(8, 16), output_tokens=(4, 8), tool_result_tokens=(8, 16),
                       docs_per_tenant=3, num_tenants=4)
NAMES = ("rag", "chat", "agent", "rag_chat", "multitenant")


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_requests_other_seed_other_requests(name):
    first = list(generate(name, 60, 5.0, seed=3, config=SMALL))
    again = list(generate(name, 60, 5.0, seed=3, config=SMALL))
    other = list(generate(name, 60, 5.0, seed=4, config=SMALL))
    assert first == again
    assert [r.prompt for r in first] != [r.prompt for r in other]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("arrival", ["poisson", "bursty"])
def test_requests_come_in_arrival_order_with_block_aligned_public_prefixes(name, arrival):
    requests = list(generate(name, 80, 5.0, seed=0, arrival=arrival, config=SMALL))
    assert len(requests) == 80
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(requests))
    for r in requests:
        assert r.num_public_tokens % BLOCK_SIZE == 0
        assert 0 < r.num_public_tokens < r.num_prompt_tokens
        assert len(r.prompt) % TOKEN_BYTES == 0 and r.num_output_tokens >= 4


def test_chat_turn_resends_the_previous_turn_and_its_reply():
    requests = list(generate("chat", 200, 1.0, seed=1, config=SMALL))
    by_session: dict[str, list] = {}
    for r in requests:
        by_session.setdefault(r.session, []).append(r)
    multi = [turns for turns in by_session.values() if len(turns) > 1]
    assert multi
    for turns in multi:
        for previous, turn in itertools.pairwise(turns):
            assert turn.prompt.startswith(previous.prompt + previous.output)
            assert turn.tenant == previous.tenant and turn.arrival_s >= previous.arrival_s


def test_agent_forks_share_the_state_they_forked_from():
    requests = list(generate("agent", 400, 1.0, seed=2, config=SMALL))
    prompts = {r.prompt for r in requests}
    children: dict[bytes, int] = {}
    for r in requests:
        parents = [p for p in prompts if p != r.prompt and r.prompt.startswith(p)]
        if parents:
            children[max(parents, key=len)] = children.get(max(parents, key=len), 0) + 1
    assert max(children.values()) >= 2


def test_multitenant_tenants_share_only_public_system_prompts():
    requests = list(generate("multitenant", 200, 5.0, seed=0, config=SMALL))
    docs_of: dict[str, set[bytes]] = {}
    for r in requests:
        start = r.num_public_tokens * TOKEN_BYTES
        docs_of.setdefault(r.tenant, set()).add(r.prompt[start:start + 32 * TOKEN_BYTES])
    tenants = list(docs_of)
    assert len(tenants) == 4
    for a, b in itertools.combinations(tenants, 2):
        assert not docs_of[a] & docs_of[b]


def test_trace_round_trips_and_replay_reads_text_prompts(tmp_path):
    requests = list(generate("chat", 30, 2.0, seed=5, config=SMALL))
    path = tmp_path / "trace.jsonl"
    assert write_trace(requests, path) == 30
    assert list(generate("replay", 100, 1.0, trace=path)) == requests
    text = tmp_path / "text.jsonl"
    text.write_text('{"arrival_s": 0.5, "prompt": "hi"}\n\n{"arrival_s": 1, "prompt": "hi!", "tenant": "t"}\n')
    replayed = list(read_trace(text))
    assert [r.prompt for r in replayed] == [bytes([104, 0, 0, 0, 105, 0, 0, 0]),
                                            bytes([104, 0, 0, 0, 105, 0, 0, 0, 33, 0, 0, 0])]
    assert [r.tenant for r in replayed] == ["public-trace", "t"]


def test_bad_inputs_name_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="unknown 'nope'"):
        generate("nope", 1, 1.0)
    with pytest.raises(ValueError, match="arrival"):
        generate("rag", 1, 1.0, arrival="steady")
    backwards = tmp_path / "b.jsonl"
    backwards.write_text('{"arrival_s": 2, "prompt": "a"}\n{"arrival_s": 1, "prompt": "a"}\n')
    with pytest.raises(ValueError, match="b.jsonl:2: arrival_s goes backwards"):
        list(read_trace(backwards))
