"""The shared OpenAI layer: body decoding, bounds, refused and unknown fields, the
body sent to OpenAI-compatible backends, response shapes and cache salts."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radix.api_errors import ApiError
from radix.openai.json_body import decode_json_object
from radix.openai.requests import (
    CHAT,
    COMPLETIONS,
    MAX_PRIORITY,
    MIN_PRIORITY,
    OpenAIRequest,
    parse_openai_request,
)
from radix.openai.responses import ResponseShape, TokenUsage
from radix.openai.salt import CacheSalts
from radix.openai.sampling import MAX_TOKENS_LIMIT, SamplingBounds

BOUNDS = SamplingBounds(vocab_size=262, max_n=16)
CHAT_BODY = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION_BODY = {"model": "demo", "prompt": "hi"}


def parse(endpoint: str, **fields: object) -> OpenAIRequest:
    base = CHAT_BODY if endpoint == CHAT else COMPLETION_BODY
    return parse_openai_request({**base, **fields}, endpoint, BOUNDS)


def refusal(call) -> ApiError:
    with pytest.raises(ApiError) as info:
        call()
    return info.value


@pytest.mark.parametrize(("raw", "param"), [
    (b"\xff\xfe", None),
    (b'{"prompt": "\xed\xa0\x80"}', None),              # a surrogate encoded as UTF-8
    (b'{"prompt": "\\ud800"}', "prompt"),
    (b'{"messages": [{"content": "a\\udc00"}]}', "messages[0].content"),
    (b'{"x\\ud800": 1}', "x\\ud800"),
    (b'{"temperature": NaN}', None),
    (b'{"top_p": Infinity}', None),
    (b"[" * 100_000 + b"]" * 100_000, None),
    (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", None),
    (b"[1, 2]", None),
    (b'"text"', None),
    (b"", None),
])
def test_bodies_that_are_not_plain_json_objects_are_400(raw: bytes, param: str | None) -> None:
    error = refusal(lambda: decode_json_object(raw))
    assert (error.status, error.param) == (400, param)
    json.dumps(error.body())  # the error itself is sendable


def test_valid_surrogate_pairs_and_escapes_decode() -> None:
    assert decode_json_object(b'{"p": "\\ud83d\\ude00 \\\\ud800"}') == {"p": "😀 \\ud800"}


BOUND_CASES = [
    ("top_k", -2), ("top_k", 263), ("top_k", 9223372036854775808), ("top_k", 1.5),
    ("top_p", 0), ("top_p", 1.01), ("top_p", "1"), ("temperature", 2.01), ("temperature", -0.1),
    ("temperature", True), ("n", 0), ("n", 17), ("seed", -1), ("seed", 2**63),
    ("max_tokens", 0), ("max_tokens", MAX_TOKENS_LIMIT + 1), ("max_tokens", 10**30),
    ("max_tokens", 1e3), ("stop", ["s"] * 17), ("stop", "x" * 257), ("stop", [""]),
    ("stop", [["nested"]]), ("stop_token_ids", [1] * 65), ("stop_token_ids", [262]),
    ("stop_token_ids", [True]), ("ignore_eos", 0), ("stream", "yes"), ("stream_options", 5),
    ("user", 5), ("best_of", 2), ("presence_penalty", 0.5), ("frequency_penalty", 3),
    ("logit_bias", {"1": 5}), ("logprobs", 1), ("model", 7), ("model", ""),
]


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT])
@pytest.mark.parametrize(("field", "value"), BOUND_CASES)
def test_out_of_range_is_a_400_naming_the_field(endpoint: str, field: str, value: object) -> None:
    error = refusal(lambda: parse(endpoint, **{field: value}))
    assert (error.status, error.param) == (400, field), error.message


@pytest.mark.parametrize(("field", "value"), [
    ("top_k", -1), ("top_k", 0), ("top_k", 262), ("top_p", 1), ("temperature", 0),
    ("temperature", 2), ("n", 16), ("seed", 2**63 - 1), ("max_tokens", MAX_TOKENS_LIMIT),
    ("stop", ["s"] * 16), ("stop", "x" * 256), ("stop_token_ids", [261] * 64),
    ("presence_penalty", 0), ("logprobs", None), ("logit_bias", {}), ("best_of", 1),
    ("user", ""), ("stream_options", {"include_usage": True}),
])
def test_edges_inside_the_bounds_pass(field: str, value: object) -> None:
    parse(COMPLETIONS, **{field: value})


def test_chat_names_the_max_tokens_field_the_client_used() -> None:
    error = refusal(lambda: parse(CHAT, max_completion_tokens=0, max_tokens=5))
    assert error.param == "max_completion_tokens"
    request = parse(CHAT, max_completion_tokens=7, max_tokens=5)
    assert (request.sampling.max_tokens, request.sampling.max_tokens_param) == (7, "max_completion_tokens")
    assert refusal(lambda: parse(CHAT, max_completion_tokens=5, max_tokens=-1)).param == "max_tokens"


def test_upstream_error_params_are_renamed_as_the_client_sent_them() -> None:
    chat = parse(CHAT, max_completion_tokens=7)
    assert chat.client_param("sampling.max_tokens") == "max_completion_tokens"
    assert chat.client_param("max_tokens") == "max_completion_tokens"
    assert chat.client_param("token_ids_b64") == "messages"
    assert chat.client_param("prompt") == "messages"  # chat goes upstream as completions
    assert chat.client_param("sampling.top_k") == "top_k"
    assert chat.client_param("messages[0].content") == "messages[0].content"
    completion = parse(COMPLETIONS)
    assert completion.client_param("sampling.max_tokens") == "max_tokens"
    assert completion.client_param("token_ids") == "prompt"
    assert completion.client_param(None) is None


@pytest.mark.parametrize(("endpoint", "fields", "param"), [
    (COMPLETIONS, {"kv_transfer_params": {}}, "kv_transfer_params"),
    (COMPLETIONS, {"cache_salt": "s"}, "cache_salt"),
    (COMPLETIONS, {"echo": True}, "echo"),
    (COMPLETIONS, {"suffix": "x"}, "suffix"),
    (COMPLETIONS, {"messages": []}, "messages"),
    (COMPLETIONS, {"prompt": ["a", "b"]}, "prompt"),
    (COMPLETIONS, {"prompt": [1, 262]}, "prompt"),
    (COMPLETIONS, {"prompt": [1, True]}, "prompt"),
    (COMPLETIONS, {"prompt": ""}, "prompt"),
    (COMPLETIONS, {"prompt": None}, "prompt"),
    (CHAT, {"tools": [{"type": "function"}]}, "tools"),
    (CHAT, {"tool_choice": "auto"}, "tool_choice"),
    (CHAT, {"chat_template": "{{ x }}"}, "chat_template"),
    (CHAT, {"priority": 1}, "priority"),
    (CHAT, {"response_format": {"type": "json_object"}}, "response_format"),
    (CHAT, {"response_format": {"type": "text", "schema": {}}}, "response_format.schema"),
    (CHAT, {"stream_options": {"include_usage": True, "x": 1}}, "stream_options.x"),
    (CHAT, {"messages": [{"role": "user", "content": "x", "name": "eve"}]}, "messages[0].name"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a",
                                                        "cache_control": {}}]}]},
     "messages[0].content[0].cache_control"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0]"),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    (CHAT, {"messages": [{"role": ["user"], "content": "x"}]}, "messages[0].role"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (CHAT, {"messages": ["hi"]}, "messages[0]"),
    (CHAT, {"messages": []}, "messages"),
    (CHAT, {"prompt": "x"}, "prompt"),
])
def test_unknown_refused_and_malformed_fields_are_named(endpoint: str, fields: dict,
                                                       param: str) -> None:
    error = refusal(lambda: parse(endpoint, **fields))
    assert (error.status, error.param) == (400, param), error.message


def test_a_trusted_caller_may_send_cache_salt() -> None:
    request = parse_openai_request({**COMPLETION_BODY, "cache_salt": "s1"}, COMPLETIONS, BOUNDS,
                                   allow_cache_salt=True)
    assert request.cache_salt == "s1"


def allowed(endpoint: str, **fields: object) -> OpenAIRequest:
    base = CHAT_BODY if endpoint == CHAT else COMPLETION_BODY
    return parse_openai_request({**base, **fields}, endpoint, BOUNDS, allow_priority=True)


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT])
def test_priority_is_an_integer_where_the_caller_allows_it(endpoint: str) -> None:
    assert allowed(endpoint).priority == 0
    assert allowed(endpoint, priority=None).priority == 0
    assert allowed(endpoint, priority=-3).priority == -3
    assert allowed(endpoint, priority=MAX_PRIORITY).priority == MAX_PRIORITY
    assert allowed(endpoint, priority=MIN_PRIORITY).priority == MIN_PRIORITY
    for bad in (1.5, 2.0, True, "1", [1], MAX_PRIORITY + 1, MIN_PRIORITY - 1):
        error = refusal(lambda bad=bad: allowed(endpoint, priority=bad))
        assert (error.status, error.param) == (400, "priority"), bad
    assert parse(endpoint, priority=None).priority == 0  # null is absent, even unallowed


def test_a_replaced_priority_never_goes_to_an_openai_upstream() -> None:
    request = replace(allowed(COMPLETIONS, priority=2), priority=5)
    assert request.priority == 5
    assert "priority" not in request.upstream_body("served", 4, [1, 2], "salt")[1]


def test_upstream_body_holds_only_validated_fields_and_the_salt() -> None:
    request = parse(CHAT, messages=[{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                 {"type": "text", "text": "b"}]}],
                    temperature=0.5, stop="x", stream=True, user="u", max_completion_tokens=9)
    path, body = request.upstream_body("served", 4, [1, 2], "salt")
    assert path == "/v1/completions"  # the router renders chat; the backend never does
    assert body == {"model": "served", "n": 1, "temperature": 0.5, "max_tokens": 4, "stop": ["x"],
                    "stream": True, "cache_salt": "salt",
                    "stream_options": {"include_usage": True}, "prompt": [1, 2]}
    path, body = parse(COMPLETIONS, top_k=-1).upstream_body("served", None, [5, 6], "salt")
    assert path == "/v1/completions" and body["prompt"] == [5, 6] and body["top_k"] == -1


def test_num_text_chars_counts_what_will_be_tokenized() -> None:
    assert parse(COMPLETIONS, prompt="abcd").num_text_chars() == 4
    assert parse(COMPLETIONS, prompt=[1, 2, 3]).num_text_chars() == 0
    two = [{"role": "system", "content": "ab"}, {"role": "user", "content": None}]
    assert parse(CHAT, messages=two).num_text_chars() == 2


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT])
def test_stream_chunks(endpoint: str) -> None:
    shape = ResponseShape(endpoint, "demo")
    assert shape.chunk(0, "", None) == b""
    frames = [json.loads(shape.chunk(i, t, r)[6:]) for i, t, r in
              [(0, "a", None), (1, "", "length"), (0, "b", "stop")]]
    usage = json.loads(shape.usage_chunk(TokenUsage(3, 2, 1))[6:])
    assert {f["id"] for f in [*frames, usage]} == {shape.id}
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 5
    assert usage["usage"]["prompt_tokens_details"] == {"cached_tokens": 1}
    choices = [f["choices"][0] for f in frames]
    if endpoint == CHAT:
        assert [c["delta"] for c in choices] == [
            {"role": "assistant", "content": "a"}, {"role": "assistant"}, {"content": "b"}]
    else:
        assert [c["text"] for c in choices] == ["a", "", "b"]
    assert [c["finish_reason"] for c in choices] == [None, "length", "stop"]


def test_cache_salts_are_keyed_per_tenant_and_never_the_tenant_id() -> None:
    salts, other = CacheSalts(b"secret"), CacheSalts(b"another secret")
    assert salts.salt("alice") == CacheSalts(b"secret").salt("alice")
    assert len({salts.salt("alice"), salts.salt("bob"), other.salt("alice")}) == 3
    assert "alice" not in salts.salt("alice") and len(salts.salt("alice")) == 43


ROLES = ("system", "developer", "user", "assistant", "tool")
roles = st.sampled_from([*ROLES, "wizard", None]) | st.just(["user"])
contents = (st.text("xy", max_size=3) | st.none() | st.integers() | st.lists(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]),
                           "text": st.text("ab", max_size=2) | st.none()},
                          optional={"cache_control": st.just({})}) | st.just("part"),
    max_size=2))
chat_messages = st.lists(
    st.fixed_dictionaries({"role": roles, "content": contents})
    | st.fixed_dictionaries({"role": roles}, optional={"content": contents, "name": st.just("e")})
    | st.just("hi"), min_size=1, max_size=4)


def messages_model(messages: list) -> tuple[dict[str, str], ...] | str:
    """The documented contract, checked one message at a time: the messages as parsed,
    or the param of the first refusal."""
    parsed = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            return where
        unknown = [name for name in message if name not in ("role", "content")]
        if unknown:
            return f"{where}.{unknown[0]}"
        if message.get("role") not in ROLES:
            return f"{where}.role"
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict):
                    return f"{where}.content[{j}]"
                unknown = [name for name in part if name not in ("type", "text")]
                if unknown:
                    return f"{where}.content[{j}].{unknown[0]}"
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    return f"{where}.content[{j}]"
                texts.append(part["text"])
            content = "".join(texts)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            return f"{where}.content"
        parsed.append({"role": message["role"], "content": content})
    return tuple(parsed)


@given(chat_messages)
def test_chat_messages_parse_as_the_contract_says(messages: list) -> None:
    expected = messages_model(messages)
    if isinstance(expected, str):
        error = refusal(lambda: parse(CHAT, messages=messages))
        assert (error.status, error.param) == (400, expected), error.message
    else:
        assert parse(CHAT, messages=messages).messages == expected
