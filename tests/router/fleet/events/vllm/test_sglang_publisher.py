"""The router follows SGLang's own KV event publisher into its index exactly.

SGLang's ``ZmqEventPublisher`` and ``KVCacheEventRecorder`` run in their own
environment (``make sglang``; tests/support/sglang_recorder_main.py says what stands
in for the GPU parts) behind a radix tree that random operations drive: sequences
inserted for two tenants' salts, a salt the router never issued and none, under the
base model and an adapter, leaves evicted, the cache cleared. After each batch the
index must credit each tenant, for each query, with exactly the whole pages of the
longest path SGLang holds for that tenant's salt and adapter. Skipped where
``.sglang/venv`` is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from pathlib import Path

import pytest
import zmq.asyncio
from prometheus_client import CollectorRegistry

from radix.keys import to_key
from router.config import WorkerSpec
from router.fleet.events.health import StreamHealth
from router.fleet.events.metrics import KVEventMetrics
from router.fleet.events.vllm.follower import Endpoints, VllmEventFollower
from router.fleet.events.vllm.translate import VllmTranslator
from router.fleet.worker_state import WorkerState
from router.routing.index import RouterIndex
from tests.support.aio import eventually
from tests.support.sglang_publisher import HeldNode, SglangPublisher, available

MISSING = available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]
PAGE = 4
SALTS = {"salt-alice": "alice", "salt-bob": "bob"}
WRITERS = ("salt-alice", "salt-bob", "salt-stranger", None)
ADAPTERS = (None, "adapter-a")
DOCS = [list(range(100 + 40 * d, 100 + 40 * d + 24)) for d in range(3)]


def namespace(lora: str | None) -> str:
    return f"ns:{lora or '-'}"


def expected(nodes: tuple[HeldNode, ...], salt: str, lora: str | None,
             query: list[int]) -> int:
    """The whole pages of the longest path SGLang holds that ``query`` starts with."""
    best = 0
    for node in nodes:
        if node.salt == salt and node.lora == lora:
            common = 0
            for a, b in zip(node.tokens, query, strict=False):
                if a != b:
                    break
                common += 1
            best = max(best, common // PAGE * PAGE)
    return best


def random_sequence(rng: random.Random, bigram: bool) -> list[int]:
    doc = rng.choice(DOCS)
    cut = rng.randrange(1, len(doc) // PAGE + 1) * PAGE
    tail = [rng.choice((1, 2, 3)) for _ in range(rng.choice((0, 3, 8)))]
    return doc[:cut] + tail + ([7] if bigram else [])


def operate(publisher: SglangPublisher, rng: random.Random, bigram: bool,
            queries: list[list[int]]) -> None:
    """One to three random operations, mostly inserts."""
    for _ in range(rng.randint(1, 3)):
        roll = rng.random()
        if roll < 0.65:
            tokens = random_sequence(rng, bigram)
            queries.append(tokens)
            publisher.insert(tokens, rng.choice(WRITERS), rng.choice(ADAPTERS))
        elif roll < 0.97:
            publisher.evict(rng.randrange(1000))
        else:
            publisher.clear()


@pytest.mark.parametrize("bigram", [False, True])
def test_the_index_holds_what_sglang_holds(tmp_path: Path, bigram: bool) -> None:
    rng = random.Random(20261207 + bigram)
    endpoints = Endpoints(f"ipc://{tmp_path}/events", f"ipc://{tmp_path}/replay", 2.0)

    async def main() -> None:
        publisher = SglangPublisher(endpoints.events, endpoints.replay or "", PAGE, bigram)
        index = RouterIndex()
        registry = CollectorRegistry()
        context = zmq.asyncio.Context()
        worker = WorkerState(WorkerSpec(worker_id="s0", model="m", kind="sglang",
                                        url="http://127.0.0.1:9", kv_events=endpoints.events),
                             "http://127.0.0.1:9", {})
        follower = VllmEventFollower(index, VllmTranslator("s0", SALTS.get, namespace),
                                     endpoints, KVEventMetrics(registry), context,
                                     StreamHealth(worker, index))
        queries: list[list[int]] = []
        num_held = 0
        task = None
        try:
            for step in range(40):
                operate(publisher, rng, bigram, queries)
                published = publisher.publish()
                if step == 3:  # a late follower: the replay from seq 0 catches it up
                    task = asyncio.create_task(follower.run())
                if task is None or published.seq is None:
                    continue
                await eventually(lambda seq=published.seq: follower.last_seq == seq)
                for salt, tenant in SALTS.items():
                    for lora in ADAPTERS:
                        for query in queries:
                            held = index.match(namespace(lora), to_key(query), tenant)
                            want = expected(published.nodes, salt, lora, query)
                            assert held.get("s0", 0) == want, (step, tenant, lora, query)
                            num_held += want > 0
                index.check_invariants()
            assert num_held > 100  # the comparisons were not all of empty caches
            assert registry.get_sample_value("router_kv_event_malformed_total",
                                             {"worker": "s0", "reason": "conflict"}) in (None, 0)
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            publisher.close()
            context.destroy(linger=0)

    asyncio.run(main())
