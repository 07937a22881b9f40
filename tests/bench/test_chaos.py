"""The two-minute chaos soak (``python -m bench chaos --duration-s 120``): every fault
kind strikes once under mixed greedy traffic through the supervisor. Asserts the
correctness outcomes only, never timings: no request lost (each answered in full
with the fault-free text, or with a clean error), every fault recovered from, no KV
block in use once idle, everything healthy at the end, and `up` stopping every
child on SIGTERM.

Also no Redis concurrency slot left held, every slowloris connection closed by the
router's header timeout, and each attack fault answered only with its refusal (431
for heads that never end, 413 for oversize prompts) or, for bodies on routes handed
to aiohttp, with 200. Reported but not asserted: ``dropped`` requests, sent on
a kept-alive connection in the instant a draining router closed it (a race every
HTTP/1.1 server has; clients retry such a request).
"""

from __future__ import annotations

import pytest

from bench import chaos

# Same group as the PD soak (test_chaos_pd.py): each starts a whole deployment under
# `up`, and side by side on a small machine they would starve each other.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("chaos")]


# Two minutes of soak plus start-up, on a machine that may still be starting the
# run's vLLM servers: more than the suite's default timeout.
@pytest.mark.timeout(900)
def test_chaos_soak_loses_nothing_and_leaks_no_blocks(tmp_path) -> None:
    report = chaos.run(duration_s=120.0, workdir=tmp_path)
    chaos.print_report(report)
    requests = report["requests"]
    assert requests["lost"] == 0 and requests["mismatch"] == 0, requests["lost_details"]
    assert requests["ok"] > 100
    assert [f["fault"] for f in report["faults"]] == list(chaos.FAULTS)
    assert all(f["recover_s"] is not None for f in report["faults"]), report["faults"]
    assert set(report["kv_blocks_in_use"].values()) == {0}, report["kv_blocks_in_use"]
    assert report["redis_slots_held"] == {}, report["redis_slots_held"]
    slowloris = next(f for f in report["faults"] if f["fault"] == "slowloris")
    assert slowloris["num_closed_by_server"] == slowloris["num_clients"], slowloris
    statuses = {f["fault"]: set(f["statuses"]) for f in report["faults"] if "statuses" in f}
    assert statuses == {"header_flood": {"431"}, "body_flood": {"413"},
                        "handed_off_flood": {"200"}}, statuses
    assert report["healthy_at_end"]
    assert report["up_exit_status"] == 0 and report["children_left"] == []
