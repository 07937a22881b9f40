"""The routes sglang-router and vllm-router probe, on a real worker over HTTP."""

from __future__ import annotations

import pytest

from harness.procs import http_json

# Its module-scoped processes start once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("worker_peer_routes")]

KEY = "peer-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
# What the peers add to every forwarded request, at the values they send.
PEER_FIELDS = {"no_stop_trim": False, "ignore_eos": False, "skip_special_tokens": True,
               "return_hidden_states": False}
CHAT_PEER_FIELDS = {**PEER_FIELDS, "continue_final_message": False, "separate_reasoning": True,
                    "stream_reasoning": True, "include_reasoning": True}
MESSAGES = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def worker(request):
    from harness.procs import start_worker
    process = start_worker(api_key=KEY)
    request.addfinalizer(process.stop)
    return process.url


def call(worker, method, path, body=None, headers=AUTH):
    return http_json(method, f"{worker}{path}", body, headers)


def test_probe_routes_need_the_key(worker):
    for method, path, body in [("GET", "/server_info", None), ("GET", "/get_model_info", None),
                               ("POST", "/tokenize", {"prompt": "hi"}),
                               ("POST", "/v1/completions/render", {"prompt": "hi"})]:
        assert call(worker, method, path, body, headers={})[0] == 401, path


def test_server_and_model_info_name_the_served_model(worker):
    status, info = call(worker, "GET", "/server_info")
    assert status == 200
    assert info["served_model_name"] == "demo" and info["is_generation"] is True
    assert info["max_total_num_tokens"] > 0 and info["max_running_requests"] > 0
    assert call(worker, "GET", "/get_server_info") == (200, info)
    status, model = call(worker, "GET", "/model_info")
    assert status == 200 and model["model_path"] == info["model_path"]
    assert call(worker, "GET", "/get_model_info") == (200, model)


def test_tokenize_and_render_give_the_ids_the_completion_prefills(worker):
    status, tokens = call(worker, "POST", "/tokenize", {"model": "demo", "prompt": "hello"})
    assert status == 200 and tokens["count"] == len(tokens["tokens"]) > 0
    status, rendered = call(worker, "POST", "/v1/completions/render",
                            {"model": "demo", "prompt": "hello", "max_tokens": 3, **PEER_FIELDS})
    assert status == 200 and rendered[0]["token_ids"] == tokens["tokens"]
    status, completion = call(worker, "POST", "/v1/completions",
                              {"model": "demo", "prompt": "hello", "max_tokens": 2, **PEER_FIELDS})
    assert status == 200 and completion["usage"]["prompt_tokens"] == tokens["count"]


def test_chat_tokenize_and_render_apply_the_template(worker):
    status, tokens = call(worker, "POST", "/tokenize",
                          {"model": "demo", "messages": MESSAGES, "continue_final_message": False})
    assert status == 200
    status, rendered = call(worker, "POST", "/v1/chat/completions/render",
                            {"model": "demo", "messages": MESSAGES, **CHAT_PEER_FIELDS})
    assert status == 200 and rendered["token_ids"] == tokens["tokens"]
    status, chat = call(worker, "POST", "/v1/chat/completions",
                        {"model": "demo", "messages": MESSAGES, "max_completion_tokens": 2,
                         **CHAT_PEER_FIELDS})
    assert status == 200 and chat["usage"]["prompt_tokens"] == tokens["count"]


def test_peer_fields_off_their_neutral_value_are_refused(worker):
    status, error = call(worker, "POST", "/v1/completions",
                         {"model": "demo", "prompt": "hi", "no_stop_trim": True})
    assert status == 400 and error["error"]["param"] == "no_stop_trim"
    assert call(worker, "POST", "/tokenize", {"model": "other", "prompt": "hi"})[0] == 404
