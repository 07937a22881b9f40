"""``python -m bench fairness``: its arithmetic by hand, and a tiny run end to end on two
timed workers behind ours with and without flow control."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench import fairness
from bench.fairness import Sent, jain, percentile, router_config, runs, tenant_figures
from router.config_toml import load_config


def test_jain_is_one_when_equal_and_one_over_n_when_one_gets_all():
    assert jain([3.0, 3.0, 3.0, 3.0]) == pytest.approx(1.0)
    assert jain([5.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain([2.0, 1.0]) == pytest.approx(9 / 10)
    assert math.isnan(jain([0.0, 0.0]))


def test_a_percentile_over_a_cut_request_is_only_a_lower_bound():
    assert percentile([(1.0, False), (2.0, False), (3.0, False)], 50) == (2.0, False)
    # The cut request waited 0.5 s and had no first token: the median may be higher.
    assert percentile([(1.0, False), (2.0, False), (0.5, True)], 50) == (1.0, True)
    # Cut after 5 s, above the median: the median stands.
    assert percentile([(1.0, False), (2.0, False), (5.0, True)], 50) == (2.0, False)


def test_figures_count_served_tokens_within_the_window_and_errors_by_status():
    records = [Sent("a", 0.0, 100, first_s=1.0, done_s=2.0, cached_tokens=50, output_tokens=10),
               Sent("a", 1.0, 100, first_s=3.0, done_s=5.0, cached_tokens=0, output_tokens=10),
               Sent("a", 2.0, 100, error="429"),
               Sent("a", 3.0, 100)]  # cut at 6 s: waited 3 s, no first token
    f = tenant_figures(records, window_s=4.0, cut_s=6.0, scale=2.0)
    assert (f["sent"], f["completed"], f["num_errors"], f["cut"]) == (4, 2, 1, 1)
    assert f["errors"] == {"429": 1}
    assert f["served_rps"] == pytest.approx(1 / 2.0)  # one done by 4 s wall = 2 profile s
    assert f["served_tokens_per_s"] == pytest.approx(110 / 2.0)
    assert f["cached_fraction"] == pytest.approx(50 / 200)
    assert f["ttft_p99_s"] == pytest.approx(float(np.percentile([1.0, 2.0, 3.0], 99)) / 2.0)
    assert f["ttft_p99_lower_bound"]


def test_the_held_flood_gets_the_slots_the_victim_leaves():
    held = [run for scenario, run in runs(["noisy"], 128) if run.case == "held flood"][0]
    assert [t.hold for t in held.tenants] == [None, 96]


def test_our_configs_parse_with_each_tenants_band_and_scaled_ttls(tmp_path):
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    for setup, enabled in (("ours flow queue_per_worker=2", True), ("ours cache_aware", False)):
        path = tmp_path / "router.toml"
        path.write_text(router_config(setup, urls, 10.0))
        config = load_config(path)
        assert config.flow.enabled is enabled and config.policy.name == "cache_aware"
        assert {b.name: b.queue_ttl_s for b in config.flow.bands}["batch"] == 1200.0
        bands = {t.tenant_id: t.band for t in config.auth.tenants}
        assert bands["interactive"] == "interactive" and bands["batch"] == "batch"
        assert bands["victim"] is None and len(config.workers) == 2
    assert config.flow.queue_per_worker == 0


@pytest.mark.slow
def test_a_tiny_run_on_two_workers_reports_every_case():
    # Our router with flow control is the setup the benchmark is about; the one without
    # runs the same code path minus the queue step (every other benchmark covers it).
    results = fairness.main(["--workers", "2", "--routers", "ours flow",
                             "--scenarios", "noisy", "bands", "--duration-s", "0.6",
                             "--drain-s", "2", "--time-scale", "5"])
    cases = ["noisy alone", "noisy held flood", "noisy full flood", "bands alone",
             "bands with batch"]
    for case in cases:
        for setup in ("ours flow",):
            run = results["runs"][f"{case}/2/{setup}"]
            for name, figures in run["tenants"].items():
                assert figures["sent"] > 0
                assert figures["num_errors"] == 0, (case, setup, name, figures["errors"])
    victim = results["runs"]["noisy alone/2/ours flow"]["tenants"]["victim"]
    assert victim["completed"] == victim["sent"] and victim["ttft_p99_s"] > 0
    assert any("victim p99 full flood / held flood" in line for line in results["targets"])
