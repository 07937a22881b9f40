"""Router config: the embedded configs load; every bad field is named in the error."""

from __future__ import annotations

import pytest

from router.cli import with_overrides
from router.config import DEFAULT_CONFIG
from router.config_toml import load_config, parse_config

BASE = {
    "models": {"demo": {"tokenizer": "demo"}},
    "workers": [{"id": "w0", "model": "demo", "url": "http://127.0.0.1:9"}],
}


@pytest.mark.parametrize(("path", "model"), [
    (DEFAULT_CONFIG, "SmolLM2-135M-Instruct"),
    (DEFAULT_CONFIG.with_name("demo.toml"), "demo"),
])  # fmt: skip
def test_embedded_configs_load(path, model) -> None:
    config = load_config(path)
    assert [w.worker_id for w in config.workers] == ["w0", "w1"]
    assert all(w.launch and w.url is None and w.model == model for w in config.workers)
    assert config.models[model].block_size == 16
    assert {t.tenant_id for t in config.auth.tenants} == {"alice", "bob"}
    assert config.redis_url is None and not config.auth.allow_anonymous


def test_minimal_config_defaults() -> None:
    config = parse_config(BASE)
    assert config.listen.port == 0 and config.policy.name == "cache_aware"
    assert config.proxy.max_attempts == 3 and config.registry.poll_interval_s == 1.0


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
        ({"workers": [{"id": "w0", "model": "demo", "url": "http://x", "kind": "vllm"}]},
         "workers[0].kind"),
        ({"workers": [{"id": "w0", "model": "demo"}]}, "workers[0]: give url"),
        ({"workers": [{"id": "w0", "model": "demo", "url": "ftp://x"}]}, "workers[0].url"),
        ({"auth": {"tenants": {"public": {"key_digests": []}}}}, "auth.tenants.public"),
        ({"auth": {"tenants": {"a": {"key_digests": ["abc"]}}}}, "auth.tenants.a.key_digests"),
        ({"auth": {"tenants": {"a": {"key_digests": [], "max_prompt_tokens": 0}}}},
         "auth.tenants.a.max_prompt_tokens"),
        ({"auth": {"allow_anonymous": "yes"}}, "auth.allow_anonymous"),
        ({"proxy": {"max_attempts": 0}}, "proxy.max_attempts"),
        ({"registry": {"poll_interval_s": -1}}, "registry.poll_interval_s"),
        ({"index": {"speculative_ttl_s": 0}}, "index.speculative_ttl_s"),
        ({"policy": {"weights": {"x": "y"}}}, "policy.weights.x"),
        ({"redis_url": 5}, "redis_url"),
    ],
)
def test_errors_name_the_field(patch: dict, field: str) -> None:
    data = {**BASE, **patch}
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_config(data)


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
    config = with_overrides(load_config(), "0.0.0.0", 0, ["w1=http://127.0.0.1:5555"])
    assert config.listen.host == "0.0.0.0" and config.listen.port == 0
    assert [w.url for w in config.workers] == [None, "http://127.0.0.1:5555"]
    with pytest.raises(ValueError, match="--worker-url: no configured worker 'w9'"):
        with_overrides(config, None, None, ["w9=http://x"])
    with pytest.raises(ValueError, match="--worker-url: expected"):
        with_overrides(config, None, None, ["w1"])


def test_tenant_cache_quota_is_parsed_and_sent_with_each_generate() -> None:
    from router.proxy import Call, Proxy

    tenants = {"a": {"key_digests": [], "max_cached_tokens": 4096}, "b": {"key_digests": []}}
    config = parse_config({**BASE, "auth": {"tenants": tenants}})
    limits = {t.tenant_id: t.limits.max_cached_tokens for t in config.auth.tenants}
    assert limits == {"a": 4096, "b": None}

    class _Sampling:
        def to_wire(self, max_tokens):
            return {"max_tokens": max_tokens}

    class _Request:
        sampling, stream = _Sampling(), False

    class _Prompt:
        key, num_public_tokens = b"\x01\x00\x00\x00", 0

    call = Call(_Request(), "m", _Prompt(), "a", 8, "salt", 4096)  # type: ignore[arg-type]
    assert Proxy._generate_body(call)["max_cached_tokens"] == 4096
    unlimited = Call(_Request(), "m", _Prompt(), "b", 8, "salt")  # type: ignore[arg-type]
    assert "max_cached_tokens" not in Proxy._generate_body(unlimited)
