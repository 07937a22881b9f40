"""Router config: the embedded configs load; every bad field is named in the error."""

from __future__ import annotations

import pytest

from radix.config_flags import flags_table
from radix.openai.rendered import RenderSpec
from radix.openai.requests import COMPLETIONS, parse_openai_request
from radix.tokenizer import PromptTokenizer
from router.cli import _parser, limits_for_processes, with_flags
from router.config import DEFAULT_CONFIG, RouterConfig
from router.config_toml import load_config, parse_config
from router.forward.proxy import Call, generate_request
from router.models import ModelTokenizer


def flagged(config, *flags: str):
    """``config`` with the ``router`` command's ``flags`` applied."""
    return with_flags(config, _parser().parse_args(["router", *flags]))


BASE = {
    "models": {"demo": {"tokenizer": "demo"}},
    "workers": [{"id": "w0", "model": "demo", "url": "http://127.0.0.1:9"}],
}


@pytest.mark.parametrize(("path", "model"), [
    (DEFAULT_CONFIG, "SmolLM2-135M-Instruct"),
    (DEFAULT_CONFIG.with_name("demo.toml"), "demo"),
])
def test_embedded_configs_load(path, model) -> None:
    config = load_config(path)
    assert [w.worker_id for w in config.workers] == ["w0", "w1"]
    assert all(w.launch and w.url is None and w.model == model for w in config.workers)
    assert config.models[model].block_size == 16
    assert {t.tenant_id for t in config.auth.tenants} == {"alice", "bob"}
    assert not config.redis.enabled and not config.auth.allow_anonymous


def test_minimal_config_defaults() -> None:
    config = parse_config(BASE)
    assert config.listen.port == 0 and config.policy.name == "cache_aware"
    assert config.proxy.max_attempts == 3 and config.registry.poll_interval_s == 1.0
    assert (config.proxy.connect_timeout_s, config.proxy.first_byte_timeout_s,
            config.proxy.idle_timeout_s, config.proxy.request_timeout_s) == (2, 60, 30, 600)
    assert config.listen.drain_timeout_s == 60


def test_timeouts_and_drain_are_read() -> None:
    config = parse_config({**BASE, "listen": {"drain_timeout_s": 5},
                           "proxy": {"first_byte_timeout_s": 3, "idle_timeout_s": 0.5}})
    assert config.listen.drain_timeout_s == 5
    assert config.proxy.first_byte_timeout_s == 3 and config.proxy.idle_timeout_s == 0.5


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"listen": {"port": 70000}}, "listen.port"),
        ({"listen": {"prot": 1}}, "listen.prot: unknown key"),
        ({"models": {"demo": {"tokenizer": "demo", "block_size": 0}}}, "models.demo.block_size"),
        ({"models": {"demo": {}}}, "models.demo.tokenizer: required"),
        ({"models": {"demo": {"tokenizer": "demo", "public_prefixes": [{"text": "a",
                                                                       "token_ids": [1]}]}}},
         "models.demo.public_prefixes[0]"),
        ({"workers": [{"id": "w0", "model": "nope", "url": "http://x"}]}, "workers[0].model"),
        ({"workers": [{"id": "w0", "model": "demo", "url": "http://x", "kind": "trtllm"}]},
         "workers[0].kind"),
        ({"workers": [{"id": "w0", "model": "demo"}]}, "workers[0]: give url"),
        ({"workers": [{"id": "w0", "model": "demo", "url": "http://x",
                       "kv_events": "ipc:///tmp/e"}]}, "workers[0].kv_events: only"),
        ({"workers": [{"id": "w0", "model": "demo", "url": "http://x", "kind": "vllm",
                       "kv_events": "tcp://*:5557"}]}, "workers[0].kv_events: give"),
        ({"workers": [{"id": "w0", "model": "demo", "url": "http://x", "kind": "vllm",
                       "kv_events_replay": "ipc:///tmp/r"}]}, "workers[0].kv_events_replay"),
        ({"workers": [{"id": "w0", "model": "demo", "url": "ftp://x"}]}, "workers[0].url"),
        ({"workers": [{"id": "w0\n", "model": "demo", "url": "http://x"}]}, "workers[0].id"),
        ({"redis": {"key_prefix": "radix\n"}}, "redis.key_prefix"),
        ({"auth": {"tenants": {"public": {"key_digests": []}}}}, "auth.tenants.public"),
        ({"auth": {"tenants": {"anonymous": {"key_digests": []}}}}, "auth.tenants.anonymous"),
        ({"auth": {"tenants": {"direct": {"key_digests": []}}}}, "auth.tenants.direct"),
        ({"auth": {"tenants": {"a": {"key_digests": ["abc"]}}}}, "auth.tenants.a.key_digests"),
        ({"auth": {"tenants": {"a": {"key_digests": [], "max_prompt_tokens": 0}}}},
         "auth.tenants.a.max_prompt_tokens"),
        ({"auth": {"allow_anonymous": "yes"}}, "auth.allow_anonymous"),
        ({"proxy": {"max_attempts": 0}}, "proxy.max_attempts"),
        ({"proxy": {"idle_timeout_s": 0}}, "proxy.idle_timeout_s: must be positive"),
        ({"proxy": {"first_byte_timeout_s": "1"}}, "proxy.first_byte_timeout_s"),
        ({"proxy": {"first_byte_timeout_s": 700}}, "proxy.first_byte_timeout_s: must be at most"),
        ({"listen": {"drain_timeout_s": -1}}, "listen.drain_timeout_s"),
        ({"registry": {"poll_interval_s": -1}}, "registry.poll_interval_s"),
        ({"index": {"speculative_ttl_s": 0}}, "index.speculative_ttl_s"),
        ({"policy": {"weights": {"x": "y"}}}, "policy.weights.x"),
        ({"redis_url": "redis://x"}, "redis_url: unknown key"),
        ({"redis": {"url": "http://127.0.0.1:6379"}}, "redis.url"),
        ({"redis": {"url": "redis://127.0.0.1", "launch": True}}, "redis.launch"),
        ({"redis": {"launch": "yes"}}, "redis.launch"),
        ({"redis": {"key_prefix": "a b"}}, "redis.key_prefix"),
        ({"redis": {"command_timeout_s": 0}}, "redis.command_timeout_s"),
        ({"redis": {"heartbeat_interval_s": 1, "lease_ttl_s": 1.5}}, "redis.lease_ttl_s"),
        ({"redis": {"max_workers": 0}}, "redis.max_workers"),
        ({"redis": {"urll": "redis://x"}}, "redis.urll: unknown key"),
        ({"launch": {"routers": 0}}, "launch.routers"),
        ({"launch": {"max_crashes": 0}}, "launch.max_crashes"),
        ({"launch": {"restart_backoff_initial_s": 2, "restart_backoff_max_s": 1}},
         "launch.restart_backoff_max_s: must be at least"),
        ({"discovery": {"kind": "consul"}}, "discovery.kind"),
        ({"discovery": {"kind": "kubernetes", "port": 8000}}, "discovery.selector: give"),
        ({"discovery": {"kind": "kubernetes", "selector": {"app": "w"}}}, "discovery.port: give"),
        ({"discovery": {"kind": "kubernetes", "selector": {"app": "w"}, "port": 1,
                        "port_name": "http"}}, "discovery.port: give port or port_name"),
        ({"discovery": {"kind": "kubernetes", "selector": {"bad key!": "w"}, "port": 1}},
         "discovery.selector.bad key!"),
        ({"discovery": {"kind": "inferencepool"}}, "discovery.pool: give"),
        ({"discovery": {"namespace": "Not_A_Namespace"}}, "discovery.namespace"),
        ({"discovery": {"model": "nope"}}, "discovery.model: unknown model 'nope'"),
        ({"discovery": {"worker_kind": "trtllm"}}, "discovery.worker_kind"),
    ],
)
def test_errors_name_the_field(patch: dict, field: str) -> None:
    data = {**BASE, **patch}
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_config(data)


def test_an_sglang_worker_names_its_zmq_endpoints_as_a_vllm_worker_does() -> None:
    config = parse_config({**BASE, "workers": [
        {"id": "s0", "model": "demo", "url": "http://x", "kind": "sglang",
         "kv_events": "tcp://127.0.0.1:5557", "kv_events_replay": "tcp://127.0.0.1:5558"}]})
    (worker,) = config.workers
    assert (worker.kind, worker.kv_events, worker.kv_events_replay) == (
        "sglang", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558")


def test_digest_used_twice_is_refused() -> None:
    digest = "a" * 64
    tenants = {"a": {"key_digests": [digest]}, "b": {"key_digests": [digest]}}
    with pytest.raises(ValueError, match="auth.tenants.b.key_digests: digest used by two"):
        parse_config({**BASE, "auth": {"tenants": tenants}})


def test_duplicate_worker_ids_are_refused() -> None:
    workers = BASE["workers"] * 2
    with pytest.raises(ValueError, match="workers: ids must be unique"):
        parse_config({**BASE, "workers": workers})


def test_invalid_toml_names_the_file(tmp_path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[listen\nport = 1")
    with pytest.raises(ValueError, match="bad.toml: invalid TOML"):
        load_config(path)


def test_worker_url_overrides() -> None:
    config = flagged(load_config(), "--host", "0.0.0.0", "--port", "0", "--metrics-port", "9100",
                     "--worker-url", "w1=http://127.0.0.1:5555")
    assert config.listen.host == "0.0.0.0" and config.listen.port == 0
    assert config.metrics.port == 9100
    assert [w.url for w in config.workers] == [None, "http://127.0.0.1:5555"]
    with pytest.raises(ValueError, match="--worker-url: no configured worker 'w9'"):
        flagged(config, "--worker-url", "w9=http://x")
    with pytest.raises(ValueError, match="--worker-url: expected"):
        flagged(config, "--worker-url", "w1")
    with pytest.raises(ValueError, match="listen.port: must be at most 65535"):
        flagged(config, "--port", "70000")


def test_redis_section_parses() -> None:
    config = parse_config({**BASE, "redis": {"url": "redis://10.0.0.5:6379/2", "key_prefix": "prod",
                                             "lease_ttl_s": 3}})
    assert config.redis.enabled and config.redis.url == "redis://10.0.0.5:6379/2"
    assert config.redis.key_prefix == "prod" and config.redis.lease_ttl_s == 3.0
    assert parse_config({**BASE, "redis": {"launch": True}}).redis.enabled


def test_limits_shared_by_processes_are_conservative() -> None:
    tenants = {"a": {"key_digests": [], "max_concurrent_requests": 5, "tokens_per_minute": 1000,
                     "max_prompt_tokens": 100},
               "b": {"key_digests": [], "max_concurrent_requests": 1}}
    auth = parse_config({**BASE, "auth": {"tenants": tenants}}).auth.shared_by(3)
    a, b = (t.limits for t in auth.tenants)
    assert (a.max_concurrent_requests, a.tokens_per_minute, a.max_prompt_tokens) == (1, 333, 100)
    assert b.max_concurrent_requests == 1 and b.tokens_per_minute is None


def test_processes_without_redis_get_a_share_of_each_limit(caplog) -> None:
    tenants = {"a": {"key_digests": [], "max_concurrent_requests": 4, "tokens_per_minute": 900}}
    config = parse_config({**BASE, "auth": {"tenants": tenants}})
    with caplog.at_level("WARNING"):
        shared = limits_for_processes(config, 4)
    limits = shared.auth.tenants[0].limits
    assert (limits.max_concurrent_requests, limits.tokens_per_minute) == (1, 225)
    assert "each of the 4 router processes enforces 1/4" in caplog.text
    with_redis = parse_config({**BASE, "auth": {"tenants": tenants},
                               "redis": {"url": "redis://127.0.0.1:6379"}})
    assert limits_for_processes(with_redis, 4) is with_redis
    assert limits_for_processes(config, 1) is config


def test_redis_url_override_replaces_launch() -> None:
    config = parse_config({**BASE, "redis": {"launch": True}})
    overridden = flagged(config, "--redis-url", "redis://127.0.0.1:7000/0")
    assert overridden.redis.url == "redis://127.0.0.1:7000/0" and not overridden.redis.launch
    with pytest.raises(ValueError, match="redis.url: must be redis://"):
        flagged(config, "--redis-url", "http://127.0.0.1:7000")


def test_tenant_cache_quota_is_parsed_and_sent_with_each_generate() -> None:
    tenants = {"a": {"key_digests": [], "max_cached_tokens": 4096}, "b": {"key_digests": []}}
    config = parse_config({**BASE, "auth": {"tenants": tenants}})
    limits = {t.tenant_id: t.limits.max_cached_tokens for t in config.auth.tenants}
    assert limits == {"a": 4096, "b": None}
    model = ModelTokenizer(config.models["demo"], PromptTokenizer.demo())
    request = parse_openai_request({"model": "demo", "prompt": "hi", "max_tokens": 8},
                                   COMPLETIONS, model.bounds)
    prompt = model.prompt(request, "a")
    call = Call(request, "demo", prompt, "a", 8, "salt", limits["a"])
    render = RenderSpec(COMPLETIONS, "cmpl-1", 0, "demo", False, False)
    assert generate_request(call, render).to_wire()["max_cached_tokens"] == 4096
    unlimited = Call(request, "demo", prompt, "b", 8, "salt", limits["b"])
    assert "max_cached_tokens" not in generate_request(unlimited, render).to_wire()


def pooled(pools: dict, canary: dict | None = None, workers: tuple[str, ...] = ("w0", "w1")
           ) -> dict:
    """BASE with ``workers`` of model demo, and these pools and canary tables."""
    model = {"tokenizer": "demo", "pools": pools, **({"canary": canary} if canary else {})}
    return {"models": {"demo": model},
            "workers": [{"id": w, "model": "demo", "url": "http://127.0.0.1:9"}
                        for w in workers]}


POOLS = {"baseline": {"workers": ["w0"], "weight": 95}, "candidate": {"workers": ["w1"],
                                                                      "weight": 5}}


def test_canary_pools_are_read_in_order_with_their_guards() -> None:
    config = parse_config(pooled(POOLS, {"probe_interval_s": 5, "max_ttft_p99_s": 2}))
    model = config.models["demo"]
    assert list(model.pools) == ["baseline", "candidate"]
    assert model.pools["candidate"].workers == ("w1",) and model.pools["candidate"].weight == 5.0
    assert model.canary.probe_interval_s == 5 and model.canary.max_ttft_p99_s == 2
    assert model.canary.baseline == "baseline" and model.canary.max_error_rate == 0.05
    assert not parse_config(BASE).models["demo"].pools


@pytest.mark.parametrize(("config", "message"), [
    (pooled({**POOLS, "candidate": {"workers": ["w9"], "weight": 5}}),
     "models.demo.pools.candidate.workers: 'w9' is no worker of model 'demo'"),
    (pooled({**POOLS, "candidate": {"workers": ["w0", "w1"], "weight": 5}}),
     "models.demo.pools.candidate.workers: 'w0' is in pool 'baseline' too"),
    (pooled(POOLS, workers=("w0", "w1", "w2")), "models.demo.pools: worker 'w2' of this model "
                                                "is in no pool"),
    (pooled({"main": POOLS["baseline"], "candidate": POOLS["candidate"]}),
     "models.demo.canary.baseline: no pool 'baseline'"),
    (pooled({k: {**v, "weight": 0} for k, v in POOLS.items()}),
     "models.demo.pools: at least one pool needs a weight above 0"),
    (pooled({**POOLS, "candidate": {"workers": ["w1"], "weight": -1}}),
     "models.demo.pools.candidate.weight: must be at least 0"),
    (pooled({**POOLS, "candidate": {"workers": ["w1"]}}),
     "models.demo.pools.candidate.weight: required"),
    (pooled({**POOLS, "candidate": {"workers": [], "weight": 5}}),
     "models.demo.pools.candidate.workers: give at least one worker id"),
    (pooled({**POOLS, "candidate": {"workers": ["w1"], "weight": 5, "wieght": 1}}),
     "models.demo.pools.candidate.wieght: unknown key"),
    (pooled({**POOLS, "bad name": {"workers": ["w1"], "weight": 5}}),
     "models.demo.pools.bad name: 'bad name' is not a name"),
    (pooled({f"p{i}": {"workers": [f"w{i}"], "weight": 1} for i in range(9)}),
     "models.demo.pools: at most 8 pools"),
    (pooled(POOLS, {"probe_prompts": ["a"], "probe_max_diverged": 1}),
     "models.demo.canary.probe_max_diverged: must be below the number of probe_prompts"),
    (pooled({}, {"window_s": 5}), "models.demo.canary: give pools too"),
    (pooled(POOLS, {"max_error_rate": 1.5}), "models.demo.canary.max_error_rate: must be at most"),
    (pooled(POOLS, {"probe_interval_s": 0}), "models.demo.canary.probe_interval_s: must be "
                                             "positive"),
])
def test_canary_errors_name_the_field(config: dict, message: str) -> None:
    with pytest.raises(ValueError) as error:
        parse_config(config)
    assert str(error.value).startswith(message), str(error.value)


def test_sglang_router_discovery_flags_set_the_discovery_section() -> None:
    config = parse_config(BASE)
    found = flagged(config, "--service-discovery", "--selector", "app=vllm", "tier=gpu",
                    "--service-discovery-namespace", "serving",
                    "--service-discovery-port", "8000").discovery
    assert (found.kind, dict(found.selector), found.namespace, found.port) == (
        "kubernetes", {"app": "vllm", "tier": "gpu"}, "serving", 8000)
    assert flagged(config) == config
    with pytest.raises(ValueError, match="discovery.selector: give the labels"):
        flagged(config, "--service-discovery", "--service-discovery-port", "8000")
    named = parse_config({**BASE, "discovery": {"port_name": "http"}})
    assert flagged(named, "--service-discovery-port", "8000").discovery.port_name is None


def test_the_docs_table_of_router_flags_is_the_generated_one() -> None:
    text = (DEFAULT_CONFIG.parents[1] / "docs" / "router.md").read_text(encoding="utf-8")
    assert flags_table(RouterConfig) in text, (
        "regenerate the flags table in docs/router.md:\n" + flags_table(RouterConfig))


def test_a_bad_selector_exits_with_status_2_naming_the_flag(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        _parser().parse_args(["router", "--selector", "app"])
    assert done.value.code == 2
    assert "argument --selector: expected KEY=VALUE, got 'app'" in capsys.readouterr().err


def test_the_redis_url_can_come_from_a_variable_named_in_the_config(monkeypatch) -> None:
    config = parse_config({**BASE, "redis": {"url_env": "TEST_REDIS_URL"}})
    assert config.redis.enabled
    monkeypatch.setenv("TEST_REDIS_URL", "redis://:s3cret@127.0.0.1:6390/0")
    resolved = flagged(config)
    assert resolved.redis.url == "redis://:s3cret@127.0.0.1:6390/0"
    monkeypatch.setenv("TEST_REDIS_URL", "http://:s3cret@host")
    with pytest.raises(ValueError, match=r"redis.url_env: \$TEST_REDIS_URL is not a Redis URL") as bad:
        flagged(config)
    assert "s3cret" not in str(bad.value)
    monkeypatch.delenv("TEST_REDIS_URL")
    with pytest.raises(ValueError, match=r"\$TEST_REDIS_URL is not set"):
        flagged(config)
    with pytest.raises(ValueError, match="redis.url_env: give url or url_env, not both"):
        parse_config({**BASE, "redis": {"url_env": "X", "url": "redis://127.0.0.1:1"}})


def test_a_request_priority_only_ever_lowers_its_tenants_band() -> None:
    flow = parse_config(BASE).flow
    assert [b.name for b in flow.bands] == ["interactive", "standard", "batch"]
    assert flow.effective_band("interactive", 0) == 0
    assert flow.effective_band("interactive", 1) == 1
    assert flow.effective_band(None, -1000) == 1  # the default band, standard
    assert flow.effective_band("standard", 5) == 2  # the last band at most
    with pytest.raises(ValueError, match="auth.tenants.t.band: 'gold' is not one of flow.bands"):
        parse_config({**BASE, "auth": {"tenants": {"t": {"key_digests": ["a" * 64],
                                                          "band": "gold"}}}})
