"""``radix.generate``: what the router sends is what the worker parses, and the
worker's refusals name the field."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from radix.api_errors import ApiError
from radix.generate import GenerateRequest
from radix.keys import to_key
from radix.openai.fields import Fields
from radix.openai.rendered import RenderSpec
from radix.openai.requests import MAX_PRIORITY, MIN_PRIORITY
from radix.openai.sampling import Sampling, SamplingBounds

BOUNDS = SamplingBounds(vocab_size=1000)
BLOCK_SIZE = 4

requests = st.builds(
    lambda ids, scope, n_public, resumed, sampling, render, quota, rid, adapter, priority:
    GenerateRequest(
        to_key(ids), scope, sampling, stream=render is not None or bool(resumed),
        render=render, num_public_tokens=min(n_public, len(ids)) // BLOCK_SIZE * BLOCK_SIZE,
        num_resumed_tokens=min(resumed, len(ids) - 1) if sampling.n == 1 else 0,
        max_cached_tokens=quota, request_id=rid, adapter=adapter, priority=priority),
    st.lists(st.integers(0, 999), min_size=1, max_size=40),
    st.text("abc", min_size=1, max_size=5),
    st.integers(0, 40),
    st.integers(0, 5),
    st.builds(Sampling, max_tokens=st.none() | st.integers(1, 100),
              temperature=st.none() | st.sampled_from([0.0, 0.5, 2.0]),
              seed=st.none() | st.integers(0, 10), n=st.integers(1, 3),
              stop=st.lists(st.text("xyz", min_size=1, max_size=3), max_size=2).map(tuple),
              ignore_eos=st.none() | st.booleans()),
    st.none() | st.builds(RenderSpec, st.sampled_from(["completions", "chat"]),
                          st.just("cmpl-1"), st.integers(0, 2**40), st.just("m"),
                          st.booleans(), st.booleans()),
    st.none() | st.integers(0, 10_000),
    st.none() | st.text("rq", min_size=1, max_size=4),
    st.none() | st.text("ad", min_size=1, max_size=4),
    st.sampled_from([0, -1, 3]) | st.integers(MIN_PRIORITY, MAX_PRIORITY),
)


@given(requests)
def test_a_request_parses_back_to_itself(request: GenerateRequest):
    parsed, token_ids = GenerateRequest.parse(Fields(request.to_wire()), BOUNDS, BLOCK_SIZE)
    assert to_key(token_ids) == request.prompt_key
    # the parsed sampling names its max_tokens by its path in the body, for errors
    assert parsed == replace(request, sampling=replace(request.sampling,
                                                       max_tokens_param="sampling.max_tokens"))


@given(requests)
def test_the_json_bytes_are_the_wire_dict_encoded(request: GenerateRequest):
    assert request.to_json() == orjson.dumps(request.to_wire())


def test_a_json_id_list_and_base64_give_the_same_request():
    wire = GenerateRequest(to_key([5, 6, 7])).to_wire()
    listed = {**{k: v for k, v in wire.items() if k != "token_ids_b64"}, "token_ids": [5, 6, 7]}
    assert (GenerateRequest.parse(Fields(listed), BOUNDS, BLOCK_SIZE)
            == GenerateRequest.parse(Fields(wire), BOUNDS, BLOCK_SIZE))


@pytest.mark.parametrize(("change", "param"), [
    ({"token_ids": [1]}, "token_ids"),
    ({"token_ids_b64": "!!"}, "token_ids_b64"),
    ({"num_public_tokens": 2}, "num_public_tokens"),
    ({"num_resumed_tokens": 8}, "num_resumed_tokens"),
    ({"render": {"endpoint": "completions", "id": "x", "created": 1, "model": "m"}}, "render"),
    ({"sampling": {"n": 2}, "num_resumed_tokens": 1}, "num_resumed_tokens"),
    ({"priority": 1.5}, "priority"),
    ({"priority": 2.0}, "priority"),
    ({"priority": True}, "priority"),
    ({"priority": "1"}, "priority"),
    ({"priority": MAX_PRIORITY + 1}, "priority"),
    ({"priority": MIN_PRIORITY - 1}, "priority"),
])
def test_a_bad_field_is_a_400_naming_it(change: dict, param: str):
    wire = {**GenerateRequest(to_key(list(range(8)))).to_wire(), **change}
    with pytest.raises(ApiError) as raised:
        GenerateRequest.parse(Fields(wire), BOUNDS, BLOCK_SIZE)
    assert raised.value.status == 400
    assert raised.value.param == param


def test_priority_is_left_out_at_0_and_travels_otherwise():
    """Old bodies are unchanged; a replaced priority reaches the worker as sent."""
    request = GenerateRequest(to_key([1, 2, 3]))
    assert "priority" not in request.to_wire() and request.priority == 0
    lowered = replace(request, priority=7)
    assert lowered.to_wire()["priority"] == 7
    assert GenerateRequest.parse(Fields(lowered.to_wire()), BOUNDS, BLOCK_SIZE)[0].priority == 7
    assert GenerateRequest.parse(Fields({**request.to_wire(), "priority": None}), BOUNDS,
                                 BLOCK_SIZE)[0].priority == 0
    assert lowered.resumed(to_key([1, 2, 3, 4]), 1).priority == 7
