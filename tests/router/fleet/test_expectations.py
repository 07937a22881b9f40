"""A model's expectations of its workers: each field met, unmet and unreported; release
numbers compared as numbers (against a brute-force comparison); the table read from
TOML with errors naming the bad key."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.config import ExpectConfig
from router.config_toml import parse_config
from router.fleet.expectations import (
    EXPECT_FIELDS,
    Mismatch,
    Reported,
    describe,
    mismatches,
    version_at_least,
)
from tests.support.router_configs import model_table

WEIGHTS, OTHER_WEIGHTS = "a" * 64, "b" * 64
SCALES, OTHER_SCALES = "c" * 64, "d" * 64
WORKER = Reported(WEIGHTS, "float8_e4m3fn", SCALES, "0.4.2")
EVERYTHING = ExpectConfig(weights_digest=WEIGHTS, kv_dtype="fp8_e4m3", kv_scales_digest=SCALES,
                          min_engine_version="0.4")


def fields(expect: ExpectConfig, reported: Reported) -> list[str]:
    return [m.field for m in mismatches(expect, reported)]


def test_a_worker_that_reports_what_the_model_expects_passes_every_field() -> None:
    assert mismatches(EVERYTHING, WORKER) == ()
    assert mismatches(ExpectConfig(), Reported()) == ()  # no table: nothing checked


def test_the_weights_digest_must_be_the_expected_one() -> None:
    expect = ExpectConfig(weights_digest=WEIGHTS)
    assert mismatches(expect, WORKER._replace(weights_digest=OTHER_WEIGHTS)) == (
        Mismatch("weights_digest", WEIGHTS, OTHER_WEIGHTS),)


def test_the_kv_dtype_is_compared_by_its_torch_name_whatever_alias_the_table_uses() -> None:
    for alias in ("fp8", "fp8_e4m3", "float8_e4m3fn"):
        assert fields(ExpectConfig(kv_dtype=alias), WORKER) == []
    assert mismatches(ExpectConfig(kv_dtype="bf16"), WORKER) == (
        Mismatch("kv_dtype", "bfloat16", "float8_e4m3fn"),)


def test_the_scales_digest_is_the_file_s_or_none_for_unit_scales() -> None:
    assert fields(ExpectConfig(kv_scales_digest=OTHER_SCALES), WORKER) == ["kv_scales_digest"]
    unit = WORKER._replace(kv_scales_digest="")
    assert mismatches(ExpectConfig(kv_scales_digest=SCALES), unit) == (
        Mismatch("kv_scales_digest", SCALES, "none"),)
    assert fields(ExpectConfig(kv_scales_digest="none"), unit) == []
    assert fields(ExpectConfig(kv_scales_digest="none"), WORKER) == ["kv_scales_digest"]


def test_an_engine_older_than_the_minimum_is_refused() -> None:
    expect = ExpectConfig(min_engine_version="0.5")
    assert mismatches(expect, WORKER) == (Mismatch("min_engine_version", "0.5", "0.4.2"),)
    assert fields(ExpectConfig(min_engine_version="0.4.2"), WORKER) == []
    assert fields(ExpectConfig(min_engine_version="0.4.2.0"), WORKER) == []
    assert fields(expect, WORKER._replace(engine_version="0.10.0")) == []
    assert fields(expect, WORKER._replace(engine_version="0.5.0.dev3")) == []
    assert fields(expect, WORKER._replace(engine_version="nightly")) == ["min_engine_version"]


def test_a_worker_that_reports_nothing_fails_every_expected_field() -> None:
    found = mismatches(EVERYTHING, Reported())
    assert [m.field for m in found] == list(EXPECT_FIELDS)
    assert all(m.reported is None for m in found)
    reason = describe("demo", found)
    assert reason.startswith("does not meet models.demo.expect: weights_digest: expected")
    assert "min_engine_version: expected '0.4', not reported" in reason


def test_only_the_fields_the_table_names_are_checked() -> None:
    stranger = Reported(OTHER_WEIGHTS, "bfloat16", "", "0.0.1")
    for size in range(len(EXPECT_FIELDS) + 1):
        for chosen in itertools.combinations(EXPECT_FIELDS, size):
            expect = ExpectConfig(**{f: getattr(EVERYTHING, f) for f in chosen})
            assert fields(expect, stranger) == list(chosen)
            assert fields(expect, WORKER) == []


releases = st.lists(st.integers(0, 30), min_size=1, max_size=4)


@given(releases, releases)
def test_release_numbers_compare_as_zero_padded_integer_tuples(version, minimum) -> None:
    width = max(len(version), len(minimum))
    padded = [tuple(v + [0] * (width - len(v))) for v in (version, minimum)]
    text = ".".join(map(str, version)), ".".join(map(str, minimum))
    assert version_at_least(*text) is (padded[0] >= padded[1])


def test_the_expect_table_is_read_from_toml_and_bad_values_name_their_key() -> None:
    def config(expect: dict[str, str]) -> ExpectConfig:
        return parse_config({"models": {"demo": model_table(expect=expect)}}).models["demo"].expect

    assert config({"weights_digest": WEIGHTS, "kv_dtype": "fp8", "kv_scales_digest": "none",
                   "min_engine_version": "1.2"}) == ExpectConfig(WEIGHTS, "fp8", "none", "1.2")
    assert config({}) == ExpectConfig()
    for key, value in (("weights_digest", "abc"), ("kv_dtype", "int8"),
                       ("kv_scales_digest", ""), ("min_engine_version", "v1"),
                       ("weights", WEIGHTS)):
        with pytest.raises(ValueError, match=rf"^models\.demo\.expect\.{key}: "):
            config({key: value})
