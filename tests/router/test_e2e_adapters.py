"""End to end: LoRA adapters through a router process in front of two timed worker
processes with config-only adapters (w0 registers sql-0 and chat-0, w1 chat-0 and
poem-0; one slot each). Shows the router's model list, that an adapter goes only to workers that
registered it and to the one holding it, and that adapters never share cache entries
with each other or with the base model."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from harness.lora_adapters import lora_module_flags, write_config_adapters
from harness.procs import ManagedProcess, http_json, start_router, start_worker
from tests.support.polling import wait_until
from tests.support.router_calls import admin, openai_client, openai_complete, wait_until_ready
from tests.support.router_configs import WORKER_KEY, WORKER_KEY_ENV, keyed_demo_config, to_toml

# Its module-scoped processes start once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e_adapters")]
TIMED = ("--model", "timed:llama3-8b-h100", "--served-model-name", "demo")
SQL, CHAT, POEM = "sql-0", "chat-0", "poem-0"  # as write_config_adapters names them
REGISTERED = {"w0": [SQL, CHAT], "w1": [CHAT, POEM]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[ManagedProcess, dict[str, ManagedProcess]]]:
    root = tmp_path_factory.mktemp("adapters")
    paths = dict(pair for prefix in ("sql", "chat", "poem")
                 for pair in write_config_adapters(root, 1, prefix=prefix))
    workers = {name: start_worker(*TIMED, *lora_module_flags([(n, paths[n]) for n in names]),
                                  "--max-loras", "1", kv_cache_bytes="64MiB", wait=False,
                                  api_key=WORKER_KEY)
               for name, names in REGISTERED.items()}
    router = None
    try:
        for worker in workers.values():
            worker.wait_ready(120)
        path = root / "router.toml"
        path.write_text(to_toml(keyed_demo_config({name: w.url for name, w in workers.items()})))
        router = start_router(path, env={WORKER_KEY_ENV: WORKER_KEY})
        wait_until_ready(router)
        wait_until(lambda: len(admin_workers(router)["w1"]["adapters"]) == 2)
        yield router, workers
    finally:
        if router is not None:
            router.stop()
        for worker in workers.values():
            worker.stop()


def admin_workers(router: ManagedProcess) -> dict[str, Any]:
    return {w["id"]: w for w in admin(router, "/admin/workers")["workers"]}


def requests_sent(router: ManagedProcess) -> dict[str, int]:
    return {name: w["stats"]["num_requests"] for name, w in admin_workers(router).items()}


def test_models_lists_each_adapter_once_with_its_parent(cluster) -> None:
    router, _ = cluster
    listed = {m.id: getattr(m, "parent", None) for m in openai_client(router).models.list().data}
    assert listed == {"demo": None, CHAT: "demo", POEM: "demo", SQL: "demo"}


def test_an_unknown_model_is_404_model_not_found(cluster) -> None:
    router, _ = cluster
    with pytest.raises(openai.NotFoundError) as refused:
        openai_complete(router, model="no-such-adapter", prompt="hello")
    assert refused.value.code == "model_not_found"


def test_an_adapter_goes_to_the_worker_holding_it_and_to_no_worker_without_it(cluster) -> None:
    router, workers = cluster
    before = requests_sent(router)
    for i in range(3):
        assert openai_complete(router, model=SQL, prompt=f"select {i} from nowhere").model == SQL
    assert requests_sent(router) == {"w0": before["w0"] + 3, "w1": before["w1"]}
    # chat is registered on both; load it into w1's only slot by asking w1 itself.
    status, body = http_json("POST", f"{workers['w1'].url}/v1/completions",
                             {"model": CHAT, "prompt": "hi", "max_tokens": 1},
                             {"Authorization": f"Bearer {WORKER_KEY}"})
    assert status == 200, body
    wait_until(lambda: admin_workers(router)["w1"]["resident_adapters"] == [CHAT])
    before = requests_sent(router)
    for i in range(4):
        openai_complete(router, model=CHAT, prompt=f"a new conversation number {i}")
    assert requests_sent(router) == {"w0": before["w0"], "w1": before["w1"] + 4}


def test_adapters_and_the_base_model_never_share_cached_prefixes(cluster) -> None:
    router, _ = cluster
    prompt = "The same long system prompt, under two adapters and the base model. " * 4
    openai_complete(router, model=POEM, prompt=prompt)
    again = openai_complete(router, model=POEM, prompt=prompt)
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    # Every prompt starts with the same BOS token, so an earlier request under the same
    # model may have cached that one token; a shared entry would show the whole prompt.
    for model in (CHAT, "demo"):
        before = {n: w["stats"]["num_matched_tokens"] for n, w in admin_workers(router).items()}
        answer = openai_complete(router, model=model, prompt=prompt)
        after = {n: w["stats"]["num_matched_tokens"] for n, w in admin_workers(router).items()}
        assert answer.usage.prompt_tokens_details.cached_tokens <= 1
        assert all(after[n] - before[n] <= 1 for n in after)
