"""Many concurrent streams, preemption under a tiny KV budget, and disconnects."""

from __future__ import annotations

import asyncio

import openai
import pytest

from harness.procs import start_worker
from tests.workers.server.worker_checks import metric, used_blocks_settle

# Its module-scoped processes start once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("worker_concurrency")]

NUM_CLIENTS = 32
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def big():
    process = start_worker(kv_cache_bytes="8MiB")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def tiny():
    process = start_worker(kv_cache_bytes="640KiB")  # 9 blocks = 144 tokens
    yield process
    process.stop()


def prompt(i: int) -> str:
    return f"request {i}: " + "".join(chr(65 + (i * 5 + j) % 26) for j in range(14))


async def stream_one(client: openai.AsyncOpenAI, i: int, max_tokens: int = MAX_TOKENS) -> tuple[str, int]:
    stream = await client.completions.create(
        model="demo", prompt=prompt(i), max_tokens=max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    text, completion_tokens = "", None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].text
        if chunk.usage is not None:
            completion_tokens = chunk.usage.completion_tokens
    return text, completion_tokens


def run_clients(url: str, indices: range, concurrent: bool, max_tokens: int = MAX_TOKENS) -> list:
    async def main() -> list:
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as client:
            if concurrent:
                return list(await asyncio.gather(*(stream_one(client, i, max_tokens) for i in indices)))
            return [await stream_one(client, i, max_tokens) for i in indices]

    return asyncio.run(main())


def test_concurrent_streams_complete_and_match_one_at_a_time(big):
    concurrent = run_clients(big.url, range(NUM_CLIENTS), concurrent=True)
    assert [tokens for _, tokens in concurrent] == [MAX_TOKENS] * NUM_CLIENTS
    sequential = run_clients(big.url, range(NUM_CLIENTS), concurrent=False)
    assert [text for text, _ in concurrent] == [text for text, _ in sequential]
    used_blocks_settle(big)


def test_tiny_budget_preempts_and_still_matches(big, tiny):
    indices = range(8)  # 8 x (~26 + 40 tokens) needs ~40 blocks; the tiny worker has 9
    expected = run_clients(big.url, indices, concurrent=False, max_tokens=40)
    got = run_clients(tiny.url, indices, concurrent=True, max_tokens=40)
    assert metric(tiny, "preemptions_total") > 0
    assert got == expected
    used_blocks_settle(tiny)


def test_disconnected_streams_free_their_blocks(big):
    baseline = used_blocks_settle(big)
    total = baseline["kv"]["num_total_blocks"]

    async def disconnect_after_two_chunks(client: openai.AsyncOpenAI, i: int) -> None:
        stream = await client.completions.create(
            model="demo", prompt=prompt(100 + i) * 8, max_tokens=1700, stream=True,
            extra_body={"ignore_eos": True},
        )
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 2:
                break
        await stream.close()

    async def main() -> None:
        async with openai.AsyncOpenAI(base_url=f"{big.url}/v1", api_key="x", max_retries=0) as client:
            await asyncio.gather(*(disconnect_after_two_chunks(client, i) for i in range(8)))

    asyncio.run(main())
    # Finishing 8 x 1,700 tokens would take minutes here: settling means the aborts did it.
    info = used_blocks_settle(big)
    assert info["kv"]["num_free_blocks"] + info["kv"]["num_cached_blocks"] == total
