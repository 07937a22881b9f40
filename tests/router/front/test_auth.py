"""Keys, tenants and limits: 401/413/400/429 with exact messages and Retry-After."""

from __future__ import annotations

import asyncio

import pytest

from radix.api_errors import ApiError
from router.config import AuthConfig, TenantConfig, TenantLimits
from router.config_toml import parse_config
from router.front.auth import ANONYMOUS, Authenticator, hash_key
from router.front.limits import TenantLimiter
from router.state.shared_state import InProcessSharedState

LIMITS = TenantLimits(max_prompt_tokens=100, max_output_tokens=20,
                      max_concurrent_requests=2, tokens_per_minute=250)
AUTH = AuthConfig(
    tenants=(TenantConfig("alice", (hash_key("key-a"), hash_key("key-a2")), LIMITS),
             TenantConfig("bob", (hash_key("key-b"),))),
    admin_key_digest=hash_key("admin"),
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run(coro):
    return asyncio.run(coro)


def test_hash_key_vector() -> None:
    # Published vector: configs/local.toml's digest of the demo key sk-demo-alice.
    assert hash_key("sk-demo-alice") == (
        "4424eacc7aae95f25c2b4b4926c685e6ac8115532a89b1271e15e48966ec4d88")


def test_keys_map_to_tenants() -> None:
    auth = Authenticator(AUTH)
    assert auth.tenant("Bearer key-a").tenant_id == "alice"
    assert auth.tenant("bearer  key-a2 ").tenant_id == "alice"
    assert auth.tenant("Bearer key-b").tenant_id == "bob"


@pytest.mark.parametrize("header", [None, "Bearer", "Basic key-a", "Bearer nope", "key-a"])
def test_bad_keys_are_401(header: str | None) -> None:
    with pytest.raises(ApiError) as info:
        Authenticator(AUTH).tenant(header)
    assert info.value.status == 401 and info.value.body()["error"]["code"] == "invalid_api_key"


def test_anonymous_only_without_a_key() -> None:
    auth = Authenticator(AuthConfig(tenants=AUTH.tenants, allow_anonymous=True))
    assert auth.tenant(None).tenant_id == ANONYMOUS
    with pytest.raises(ApiError):
        auth.tenant("Bearer wrong")


def test_admin_key() -> None:
    auth = Authenticator(AUTH)
    auth.check_admin("Bearer admin")
    for header in (None, "Bearer key-a"):
        with pytest.raises(ApiError) as info:
            auth.check_admin(header)
        assert info.value.status == 401
    with pytest.raises(ApiError) as info:
        Authenticator(AuthConfig()).check_admin("Bearer admin")
    assert info.value.status == 403


def test_each_admin_key_has_a_name_and_an_old_config_keeps_its_key_as_admin() -> None:
    config = parse_config({"models": {"demo": {"tokenizer": "demo"}}, "auth": {
        "admin_key_digest": hash_key("old"),
        "admin_keys": [{"name": "ops-alice", "key_digest": hash_key("alice-admin")},
                       {"name": "deploy-bot", "key_digest": hash_key("bot")}]}})
    auth = Authenticator(config.auth)
    assert [auth.check_admin(f"Bearer {key}") for key in ("old", "alice-admin", "bot")] == [
        "admin", "ops-alice", "deploy-bot"]
    with pytest.raises(ApiError) as info:
        auth.check_admin("Bearer key-a")
    assert info.value.status == 401
    assert Authenticator(AUTH).check_admin("Bearer admin") == "admin"


@pytest.mark.parametrize(("auth", "message"), [
    ({"admin_keys": [{"name": "a", "key_digest": hash_key("x")},
                     {"name": "a", "key_digest": hash_key("y")}]}, "two admin keys have one name"),
    ({"admin_key_digest": hash_key("x"), "admin_keys": [{"name": "admin",
                                                         "key_digest": hash_key("y")}]},
     "two admin keys have one name"),
    ({"admin_key_digest": hash_key("x"), "admin_keys": [{"name": "b",
                                                         "key_digest": hash_key("x")}]},
     "two admin keys have one digest"),
    ({"admin_keys": [{"name": "b c", "key_digest": hash_key("x")}]}, r"admin_keys\[0\].name"),
    ({"admin_keys": [{"name": "b", "key_digest": "x"}]}, r"admin_keys\[0\].key_digest"),
    ({"admin_keys": [{"key_digest": hash_key("x")}]}, r"admin_keys\[0\].name: required"),
])
def test_bad_admin_keys_are_refused_naming_the_field(auth: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_config({"models": {"demo": {"tokenizer": "demo"}}, "auth": auth})


def test_sizes() -> None:
    limiter = TenantLimiter(InProcessSharedState())
    alice = Authenticator(AUTH).tenant("Bearer key-a")
    limiter.check_prompt(alice, 100)
    assert limiter.output_cap(alice, None) == 20
    assert limiter.output_cap(alice, 5) == 5
    with pytest.raises(ApiError) as info:
        limiter.check_prompt(alice, 101)
    assert info.value.status == 413 and info.value.param == "prompt"
    with pytest.raises(ApiError) as info:
        limiter.output_cap(alice, 21)
    assert info.value.status == 400 and info.value.param == "max_tokens"
    bob = Authenticator(AUTH).tenant("Bearer key-b")
    limiter.check_prompt(bob, 10**6)
    assert limiter.output_cap(bob, None) is None


def test_concurrency_limit() -> None:
    async def scenario() -> None:
        limiter = TenantLimiter(InProcessSharedState())
        alice = Authenticator(AUTH).tenant("Bearer key-a")
        first = await limiter.admit(alice, 1, 0)
        await limiter.admit(alice, 1, 0)
        with pytest.raises(ApiError) as info:
            await limiter.admit(alice, 1, 0)
        assert info.value.status == 429 and info.value.headers == {"Retry-After": "1"}
        await limiter.release(first, 0)
        await limiter.admit(alice, 1, 0)

    run(scenario())


def test_tokens_per_minute_sliding_window() -> None:
    async def scenario() -> None:
        clock = Clock()
        limiter = TenantLimiter(InProcessSharedState(clock=clock))
        alice = Authenticator(AUTH).tenant("Bearer key-a")
        a = await limiter.admit(alice, 100, 0)               # t=1000: 100
        await limiter.release(a, 50)                      # t=1000: +50 -> 150
        clock.now = 1030.0
        b = await limiter.admit(alice, 100, 0)               # t=1030: 250 in window
        await limiter.release(b, 0)
        with pytest.raises(ApiError) as info:
            await limiter.admit(alice, 1, 0)
        # 1 token fits once the 100 recorded at t=1000 expire at t=1060: 30 s.
        assert info.value.status == 429 and info.value.headers["Retry-After"] == "30"
        clock.now = 1060.0
        c = await limiter.admit(alice, 100, 0)               # t=1000 entries gone: 100 + 100
        await limiter.release(c, 0)
        with pytest.raises(ApiError) as info:
            await limiter.admit(alice, 60, 0)
        assert info.value.headers["Retry-After"] == "30"  # the t=1030 entry expires at 1090
        # A refused request holds no concurrency slot: two more are still admitted.
        d = await limiter.admit(alice, 1, 0)
        e = await limiter.admit(alice, 1, 0)
        await limiter.release(d, 0)
        await limiter.release(e, 0)

    run(scenario())


def test_admission_reserves_max_output_and_settles_to_what_was_sent() -> None:
    async def scenario() -> None:
        state = InProcessSharedState(clock=Clock())
        limiter = TenantLimiter(state)
        carol = Authenticator(AuthConfig(tenants=(TenantConfig(
            "carol", (hash_key("k"),), TenantLimits(tokens_per_minute=100)),))).tenant("Bearer k")
        first = await limiter.admit(carol, 10, 4 * 15)          # prompt + max_tokens x n
        assert await state.tokens_in_window("carol") == 70
        with pytest.raises(ApiError) as info:
            await limiter.admit(carol, 10, 21)                   # 70 + 31 > 100
        assert info.value.status == 429
        await limiter.release(first, 7)                          # the client got 7 tokens
        assert await state.tokens_in_window("carol") == 17
        second = await limiter.admit(carol, 10, 21)
        await limiter.release(second, 30)                        # more than reserved: charged
        assert await state.tokens_in_window("carol") == 57
        with pytest.raises(ApiError) as info:
            await limiter.admit(carol, 50, 51)                   # could never fit: 413
        assert info.value.status == 413 and info.value.param == "max_tokens"

    run(scenario())


def test_output_of_a_request_outliving_the_window_is_charged_to_the_current_one() -> None:
    async def scenario() -> None:
        clock = Clock()
        state = InProcessSharedState(clock=clock)
        limiter = TenantLimiter(state)
        carol = Authenticator(AuthConfig(tenants=(TenantConfig(
            "carol", (hash_key("k"),), TenantLimits(tokens_per_minute=100)),))).tenant("Bearer k")
        long_one = await limiter.admit(carol, 10, 0)             # no max_tokens: prompt only
        clock.now += 90.0                                        # it streams for 90 s
        await limiter.release(long_one, 80)
        assert await state.tokens_in_window("carol") == 80       # 10 + 80 - 10 reserved
        with pytest.raises(ApiError) as info:
            await limiter.admit(carol, 30, 0)
        assert info.value.status == 429
        short_one = await limiter.admit(carol, 5, 10)
        clock.now += 70.0                                        # reservation expired too
        await limiter.release(short_one, 8)                      # within it: nothing new
        assert await state.tokens_in_window("carol") == 0

    run(scenario())


def test_prompt_above_tokens_per_minute_is_413() -> None:
    limiter = TenantLimiter(InProcessSharedState())
    alice = Authenticator(AuthConfig(tenants=(TenantConfig(
        "alice", (hash_key("k"),), TenantLimits(tokens_per_minute=50)),))).tenant("Bearer k")
    with pytest.raises(ApiError) as info:
        limiter.check_prompt(alice, 51)
    assert info.value.status == 413
