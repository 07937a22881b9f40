"""The PD chaos soak, short (``python -m bench chaos --fleet pd --duration-s 60``): a
prefill worker, a decode worker and a ``both`` worker behind one router under
``radix-router up``, with long greedy prompts that the router disaggregates, while
clients hang up at random points, the prefill worker is frozen (SIGSTOP) past the
router's first-byte wait, and the decode and prefill workers are killed and
restarted. Asserts the correctness outcomes only, never timings: no request lost
(each answered in full with the fault-free text, or with a clean error), requests
really disaggregated, every fault recovered from, and once idle no KV block in use on
any worker and no block held for a consumer (``/info`` and the
``kv_transfer_held_blocks`` gauge), no orphan pin freed by the sweep, everything
healthy, and ``up`` stopping every child on SIGTERM.
"""

from __future__ import annotations

import pytest

from bench import chaos

# Same group as the other soak: both start a whole deployment under `up`, and side by
# side on a small machine they would starve each other.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("chaos")]


@pytest.mark.timeout(600)
def test_pd_chaos_soak_loses_nothing_and_leaks_no_blocks(tmp_path) -> None:
    report = chaos.run(duration_s=60.0, workdir=tmp_path, fleet="pd")
    chaos.print_report(report)
    requests = report["requests"]
    assert requests["lost"] == 0 and requests["mismatch"] == 0, requests["lost_details"]
    assert requests["ok"] > 50, requests
    assert [f["fault"] for f in report["faults"]] == list(chaos.FLEETS["pd"].faults)
    assert all(f["recover_s"] is not None for f in report["faults"]), report["faults"]
    assert report["pd"]["router"]["disaggregated"] > 20, report["pd"]
    assert set(report["kv_blocks_in_use"].values()) == {0}, report["kv_blocks_in_use"]
    held = {(name, source): n for name, counts in report["held_blocks"].items()
            for source, n in counts.items()}
    assert set(held.values()) == {0}, held
    for name, counters in report["pd"].items():
        assert counters.get("kv_transfer_orphan_pins_freed_total") in (None, 0), (name, counters)
    assert report["healthy_at_end"]
    assert report["up_exit_status"] == 0 and report["children_left"] == []
