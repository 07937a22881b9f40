"""Router config: the embedded default loads; every bad field is named in the error."""

from __future__ import annotations

import pytest

from router.cli import with_overrides
from router.config_toml import load_config, parse_config

BASE = {
    "models": {"demo": {"tokenizer": "demo"}},
    "workers": [{"id": "w0", "model": "demo", "url": "http://127.0.0.1:9"}],
}


def test_embedded_default_loads() -> None:
    config = load_config()
    assert [w.worker_id for w in config.workers] == ["w0", "w1"]
    assert all(w.launch and w.url is None for w in config.workers)
    assert config.models["demo"].block_size == 16
    assert {t.tenant_id for t in config.auth.tenants} == {"alice", "bob"}
    assert config.redis_url is None and not config.auth.allow_anonymous


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
        ({"proxy": {"idle_timeout_s": 0}}, "proxy.idle_timeout_s: must be positive"),
        ({"proxy": {"first_byte_timeout_s": "1"}}, "proxy.first_byte_timeout_s"),
        ({"proxy": {"first_byte_timeout_s": 700}}, "proxy.first_byte_timeout_s: must be at most"),
        ({"listen": {"drain_timeout_s": -1}}, "listen.drain_timeout_s"),
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
