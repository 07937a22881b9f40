"""A model whose ready workers are in several cache namespaces is reported: grouped in
``GET /admin/workers``, counted by ``router_model_namespaces{model}``, logged once per
change (``router.fleet.model_namespaces``). Hand-set worker states, no process."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from radix.namespace import CacheNamespace
from router.fleet.model_namespaces import ModelNamespaces
from router.fleet.worker_state import WorkerState
from tests.support.metric_samples import sample
from tests.support.router_configs import make_config

BASE = CacheNamespace("demo", "w", "t", attention_backend="triton", engine_numerics_version=1)
NEWER = dataclasses.replace(BASE, engine_numerics_version=2)
SPLIT = "cache namespaces"


def workers(*namespaces: CacheNamespace | None) -> list[WorkerState]:
    """Ready workers u0, u1, ... of model demo in ``namespaces`` (None: a kind whose
    namespace the router builds, filed under ``"openai"``)."""
    config = make_config([f"http://127.0.0.1:{9 + i}" for i in range(len(namespaces))])
    states = []
    for spec, namespace in zip(config.workers, namespaces, strict=True):
        state = WorkerState(spec, spec.url or "", {})
        state.ready, state.cache_namespace = True, namespace
        state.namespace = "openai" if namespace is None else namespace.fingerprint(b"s")
        states.append(state)
    return states


def gauge(namespaces: ModelNamespaces, model: str = "demo") -> float:
    registry = CollectorRegistry()
    registry.register(namespaces)
    return sample(generate_latest(registry).decode(), "router_model_namespaces",
                  {"model": model})


def splits(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and SPLIT in r.getMessage()]


def test_a_healthy_pool_reads_one_and_an_empty_one_zero(caplog):
    namespaces = ModelNamespaces(["demo", "other"])
    assert gauge(namespaces) == 0 and gauge(namespaces, "other") == 0
    with caplog.at_level(logging.INFO, "router.fleet.model_namespaces"):
        namespaces.observe({"demo": workers(BASE, BASE)})
    assert gauge(namespaces) == 1 and gauge(namespaces, "other") == 0
    assert not caplog.records
    assert namespaces.to_dict()["demo"] == {"num_namespaces": 1, "namespaces": {
        BASE.fingerprint(b"s"): {"workers": ["u0", "u1"], "fields": BASE.to_dict()}}}


def test_a_split_is_counted_grouped_and_logged_once_per_change(caplog):
    namespaces = ModelNamespaces(["demo"])
    u0, u1, u2 = workers(BASE, NEWER, NEWER)
    with caplog.at_level(logging.INFO, "router.fleet.model_namespaces"):
        namespaces.observe({"demo": [u0]})
        namespaces.observe({"demo": [u0, u1]})
        namespaces.observe({"demo": [u0, u1, u2]})  # same two namespaces: no new warning
        assert gauge(namespaces) == 2
        assert len(splits(caplog)) == 1
        assert "u0" in splits(caplog)[0] and "engine_numerics_version" in splits(caplog)[0]
        groups = namespaces.to_dict()["demo"]["namespaces"]
        assert groups[NEWER.fingerprint(b"s")]["workers"] == ["u1", "u2"]
        namespaces.observe({"demo": [u1, u2]})
    assert gauge(namespaces) == 1
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.INFO]
    assert "one cache namespace again" in caplog.records[-1].getMessage()


def test_workers_of_another_kind_are_their_own_namespace(caplog):
    namespaces = ModelNamespaces(["demo"])
    with caplog.at_level(logging.WARNING, "router.fleet.model_namespaces"):
        namespaces.observe({"demo": workers(BASE, None)})
    assert gauge(namespaces) == 2
    assert namespaces.to_dict()["demo"]["namespaces"]["openai"]["fields"] is None
    assert len(splits(caplog)) == 1
