"""``priority`` on a real worker process: accepted as an integer on the OpenAI routes
and on ``/generate`` (where it changes scheduling order only, never the answer), and
anything else is a 400 naming the field."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.procs import ManagedProcess, start_worker

# Its module-scoped process starts once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("worker_priority")]

GREEDY = {"max_tokens": 4, "temperature": 0.0}
COMPLETION = {"prompt": "priority", **GREEDY}
CHAT = {"messages": [{"role": "user", "content": "priority"}], **GREEDY}
GENERATE = {"token_ids": [5, 17, 200, 3, 99], "sampling": GREEDY}
BAD_PRIORITIES = (1.5, 2.0, "1", True, [0], 2**31, -(2**31) - 1)


@pytest.fixture(scope="module")
def worker() -> Iterator[ManagedProcess]:
    process = start_worker()
    yield process
    process.stop()


def answer_text(path: str, result: dict) -> list[object]:
    """What a greedy answer said, per choice."""
    if path == "/generate":
        return [choice["token_ids"] for choice in result["choices"]]
    key = "message" if path.endswith("chat/completions") else "text"
    return [choice[key] for choice in result["choices"]]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT), ("/generate", GENERATE)])
def test_an_integer_priority_is_accepted_and_changes_no_answer(worker, path, body):
    status, plain = worker.post_json(path, body)
    assert status == 200, plain
    for priority in (-3, 0, 7, 2**31 - 1, -(2**31), None):
        status, result = worker.post_json(path, {**body, "priority": priority})
        assert status == 200, result
        assert answer_text(path, result) == answer_text(path, plain)


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT), ("/generate", GENERATE)])
def test_a_priority_that_is_not_a_bounded_integer_is_a_400_naming_it(worker, path, body):
    for priority in BAD_PRIORITIES:
        status, result = worker.post_json(path, {**body, "priority": priority})
        assert status == 400, (priority, result)
        assert result["error"]["param"] == "priority", result
