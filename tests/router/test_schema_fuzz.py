"""Schemathesis over every route of a real router and a real demo worker, from the
documents they serve (``bench.fuzz``): generated and mutated bodies, headers and
query strings, a bounded number per route so it fits a CI minute or two. No 500, no
hang, nothing slower than a generous bound (a stuck request on a loaded CI machine, not
a speed check: ``python -m bench fuzz`` reports against 5 s), responses as documented,
and both servers healthy afterwards. ``python -m bench fuzz --examples N`` runs the long
version."""

from __future__ import annotations

import pytest

from bench import fuzz

pytestmark = pytest.mark.slow
EXAMPLES = 12  # per route and mode: about 600 requests


def test_fuzzing_every_route_finds_no_500_no_hang_and_leaves_both_servers_healthy():
    with fuzz.fuzz_cluster() as (router, worker):
        report = fuzz.fuzz(fuzz.targets(router, worker), EXAMPLES, timeout_s=60.0,
                           max_response_s=30.0, derandomize=True)
        problems = fuzz.healthy_after(router, worker)
        logs = router.log_text() + worker.log_text()
    summary = report.summary()
    assert report.num_requests >= 400, summary
    assert (report.num_500, report.num_hangs, report.num_slow) == (0, 0, 0), summary
    assert not report.failures, summary
    assert not problems
    assert "Traceback" not in logs
    answered = {label.split(" (")[0] for label in report.answered_2xx}
    assert {"router POST /v1/completions", "router POST /v1/chat/completions",
            "worker POST /generate", "worker POST /v1/completions"} <= answered, summary
