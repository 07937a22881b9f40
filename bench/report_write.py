"""The routing report's files: ``summary.md`` (tables) and PNG plots, from the numbers
``bench.report`` collected. Plots need matplotlib (the ``bench`` extra); without it
they are skipped and the summary says so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from bench.lora_bench import markdown_table
from bench.report_timed import readme_tables, save_figure, timed_plots, timed_table

PEER_POLICIES = ("threshold_default", "threshold_tuned")


def sim_table(report: dict) -> list[str]:
    """One row per (workload, workers, policy), with our p99 against the rule's best."""
    lines = ["| workload | workers | policy | cached | TTFT p50 ms | TTFT p99 ms | req/s | max/mean |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for key, r in report["sim"].items():
        workload, workers, policy = key.split("/")
        lines.append(f"| {workload} | {workers} | {policy} | {r['cached_fraction']:.3f} | "
                     f"{1e3 * r['ttft_p50_s']:.0f} | {1e3 * r['ttft_p99_s']:.0f} | "
                     f"{r['requests_per_s']:.0f} | {r['max_over_mean_load']:.2f} |")
    return lines


def sim_targets(report: dict) -> list[str]:
    """Per (workload, workers): is ours lowest in TTFT p99, at least 10% under the
    threshold rule's best, with cached fraction no lower than any policy's at
    max/mean <= 1.25?"""
    groups: dict[tuple[str, str], dict[str, dict]] = {}
    for key, r in report["sim"].items():
        workload, workers, policy = key.split("/")
        groups.setdefault((workload, workers), {})[policy] = r
    lines = ["| workload | workers | ours p99 ms | rule best p99 ms | ours/rule | lowest p99 | "
             "ours cached | best cached at max/mean <= 1.25 | ours max/mean |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for (workload, workers), runs in groups.items():
        ours = runs["cache_aware"]
        rule = min((runs[p] for p in PEER_POLICIES), key=lambda r: r["ttft_p99_s"])
        lowest = min(runs, key=lambda p: runs[p]["ttft_p99_s"])
        balanced = [r["cached_fraction"] for p, r in runs.items()
                    if p != "cache_aware" and r["max_over_mean_load"] <= 1.25]
        lines.append(f"| {workload} | {workers} | {1e3 * ours['ttft_p99_s']:.0f} | "
                     f"{1e3 * rule['ttft_p99_s']:.0f} | {ours['ttft_p99_s'] / rule['ttft_p99_s']:.2f} | "
                     f"{lowest} | {ours['cached_fraction']:.3f} | "
                     f"{max(balanced) if balanced else float('nan'):.3f} | {ours['max_over_mean_load']:.2f} |")
    return lines


def e2e_table(report: dict) -> list[str]:
    """One row per router setup of the end-to-end run."""
    e2e = report["e2e"]
    lines = [f"workload `{e2e['workload']}`, {e2e['num_workers']} demo workers"
             + _not_installed(e2e),
             "", "| router | requests | errors | cached | TTFT p50 ms | TTFT p99 ms | output tok/s | "
             "max/mean | requests per worker |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for setup, r in _runs(e2e):
        lines.append(f"| {setup} | {r['num_requests']} | {r['num_errors']} | {r['cached_fraction']:.3f} | "
                     f"{1e3 * r['ttft_p50_s']:.0f} | {1e3 * r['ttft_p99_s']:.0f} | "
                     f"{r['output_tokens_per_s']:.0f} | {r['max_over_mean_load']:.2f} | "
                     f"{'/'.join(map(str, r['requests_per_worker']))} |")
    return lines


def reference_table(report: dict) -> list[str]:
    """One row per router of the reference harness, with the single-worker bound."""
    ref = report["reference"]
    lines = [f"{ref['num_requests']} requests; single-worker bound {ref['single_worker_bound']:.4f}; "
             f"LRU {ref['lru_tokens']} of {ref['working_set_tokens']} working-set tokens per worker"
             + _not_installed(ref),
             "", "| router | reuse unlimited | reuse at LRU | max/mean requests | failed | requests per worker |",
             "|---|---:|---:|---:|---:|---|"]
    for setup, r in _runs(ref):
        lines.append(f"| {setup} | {r['reuse_unlimited']:.4f} | {r['reuse_lru']:.3f} | "
                     f"{r['max_over_mean_requests']:.2f} | {r['num_failed']} | "
                     f"{'/'.join(map(str, r['requests_per_worker']))} |")
    return lines


def _not_installed(section: dict) -> str:
    """``; not installed: A, B`` for the peers a run section lacked; empty when none."""
    missing = section["missing_peers"]
    return f"; not installed: {', '.join(missing)}" if missing else ""


def _runs(section: dict) -> Iterator[tuple[str, dict]]:
    """(setup, figures) of each router setup a run section holds, in its order."""
    return ((setup, r) for setup, r in section.items() if isinstance(r, dict))


def chaos_table(report: dict) -> list[str]:
    """The chaos soak: request totals, then a row per fault, then what was left held."""
    chaos = report["chaos"]
    totals = {k: v for k, v in chaos["requests"].items() if k != "lost_details"}
    rows = [f"{chaos['duration_s']:.0f} s; requests: {totals}.", "",
            "| fault | at s | recover s | p99 during ms | p99 after ms | lost |",
            "|---|---:|---:|---:|---:|---:|"]
    rows += [f"| {f['fault']} | {f['at_s']} | {f['recover_s']} | {f['p99_during_ms']} | "
             f"{f['p99_after_ms']} | {f['num_lost']} |" for f in chaos["faults"]]
    growth = {name: rss["growth_pct"] for name, rss in chaos["rss_mb"].items()}
    return rows + ["", f"RSS growth %: {growth}. KV blocks in use at the end: "
                       f"{chaos['kv_blocks_in_use']}; Redis slots held: "
                       f"{chaos['redis_slots_held'] or 0}; healthy: {chaos['healthy_at_end']}."]


def sim_check_table(results: dict) -> list[str]:
    """Per workload: TTFT p50/p99 and cached fraction, timed cluster and simulator."""
    lines = ["| workload | figure | timed | simulator | sim / timed |", "|---|---|---:|---:|---:|"]
    for workload, both in results.items():
        for figure in ("ttft_p50_s", "ttft_p99_s", "cached_fraction"):
            timed, sim = both["timed"][figure], both["sim"][figure]
            lines.append(f"| {workload} | {figure} | {timed:.3f} | {sim:.3f} | {sim / max(timed, 1e-9):.2f} |")
    return lines + ["", "The timed client sent its requests late by (p99, profile ms; CPU queueing that "
                        "reads as GPU time): " + ", ".join(
                            f"{workload} {1e3 * both['timed'].get('send_late_p99_s', float('nan')):.1f}"
                            for workload, both in results.items()) + "."]


def write_summary(report: dict, plots: list[str] | None, out: Path) -> None:
    """``summary.md``: command, machine, every table, the plots."""
    scaling = report["scaling"]
    lines = [f"# Routing report ({report['started']})", "",
             f"Command: `{report['command']}` (`make bench` / `make bench-quick`); machine "
             f"`{report['machine']}`, shared with other jobs while it ran, so compare rows "
             f"of one run (ratios), not runs. Wall time {report['wall_s']:.0f} s ("
             + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in report["part_s"].items()) + ").", "",
             "## Simulator", "", f"Session starts per second per worker: {report['rates']}.", "",
             *sim_table(report), "", "### Targets", "", *sim_targets(report), "",
             "### Simulator scaling (ours, rag)", "", "| workers | requests | wall s |", "|---:|---:|---:|",
             *(f"| {r['num_workers']} | {r['num_requests']} | {r['wall_s']:.1f} |"
               for r in scaling["by_workers"] + scaling["by_requests"]), "",
             "### Cached fraction against KV capacity (8 workers, rag)", "",
             "| policy | " + " | ".join(f"{row['kv_capacity_tokens'] // 1000}k tokens"
                                      for row in next(iter(report["cache_sizes"].values()))) + " |",
             "|---|" + "---:|" * len(next(iter(report["cache_sizes"].values()))),
             *(f"| {policy} | " + " | ".join(f"{row['cached_fraction']:.3f}" for row in rows) + " |"
               for policy, rows in report["cache_sizes"].items()), "",
             "## End to end, same workers", "", *e2e_table(report), "",
             "## End to end at cluster scale (timed workers, `bench.e2e_timed`)", "",
             *readme_tables(report["e2e_timed"]), *timed_table(report["e2e_timed"]), "",
             "## Simulator against the timed cluster (`bench.sim_check`)", "",
             *sim_check_table(report["sim_check"]), "",
             "## Reference harness (stand-in workers, `bench.reference`)", "", *reference_table(report), "",
             "## Radix core", "", f"SGLang RadixCache: {report['sglang_radix']}.", "",
             "## LoRA adapters (`bench.lora_bench`)", "", *markdown_table(report["lora"]), "",
             "## Chaos soak (`bench.chaos`)", "", *chaos_table(report), ""]
    lines += ["## Plots", ""] + ([f"![{p}]({p})" for p in plots] if plots is not None
                                 else ["matplotlib is not installed (pip install -e '.[bench]'): no plots."])
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def write_plots(report: dict, out: Path) -> list[str] | None:
    """The PNGs (names returned), or None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    names = []
    groups: dict[tuple[str, str], dict[str, dict]] = {}
    for key, r in report["sim"].items():
        workload, workers, policy = key.split("/")
        groups.setdefault((workload, workers), {})[policy] = r
    fig, axes = plt.subplots(2, len(groups), figsize=(3.2 * len(groups), 6), squeeze=False)
    for i, ((workload, workers), runs) in enumerate(groups.items()):
        policies = list(runs)
        axes[0][i].bar(policies, [1e3 * runs[p]["ttft_p99_s"] for p in policies])
        axes[0][i].set_title(f"{workload}, {workers} workers", fontsize=8)
        axes[1][i].bar(policies, [runs[p]["cached_fraction"] for p in policies])
        for ax in (axes[0][i], axes[1][i]):
            ax.tick_params(axis="x", labelrotation=90, labelsize=6)
    axes[0][0].set_ylabel("TTFT p99 (ms)")
    axes[1][0].set_ylabel("cached fraction")
    names.append(save_figure(fig, out, "sim_ttft_cached.png"))
    num_cols = min(4, len(groups))
    num_rows = -(-len(groups) // num_cols)
    fig, axes = plt.subplots(num_rows, num_cols, figsize=(3.2 * num_cols, 2.8 * num_rows),
                             squeeze=False)
    for i, ((workload, workers), runs) in enumerate(groups.items()):
        ax = axes[i // num_cols][i % num_cols]
        for policy, run in runs.items():
            ax.plot(run["cached_fraction_over_time"], label=policy)
        ax.set_title(f"{workload}, {workers} workers: cached fraction", fontsize=8)
        ax.set_xlabel("twentieth of the run (by arrival)", fontsize=7)
    axes[0][-1].legend(fontsize=5)
    names.append(save_figure(fig, out, "sim_hit_rate_over_time.png"))
    e2e = {k: v for k, v in report["e2e"].items() if isinstance(v, dict)}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
    labels = list(e2e)
    axes[0].bar(labels, [1e3 * e2e[s]["ttft_p99_s"] for s in labels])
    axes[0].set_ylabel("TTFT p99 (ms)")
    axes[1].bar(labels, [e2e[s]["cached_fraction"] for s in labels])
    axes[1].set_ylabel("cached fraction")
    for j, s in enumerate(labels):
        per = e2e[s]["requests_per_worker"]
        axes[2].scatter([j] * len(per), per)
    axes[2].set_xticks(range(len(labels)), labels)
    axes[2].set_ylabel("requests per worker")
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=60, labelsize=7)
    names.append(save_figure(fig, out, "e2e_ttft_cached_load.png"))
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, rows, field in ((axes[0], report["scaling"]["by_workers"], "num_workers"),
                            (axes[1], report["scaling"]["by_requests"], "num_requests")):
        ax.plot([r[field] for r in rows], [r["wall_s"] for r in rows], marker="o")
        ax.set_xlabel(field.replace("num_", ""))
        ax.set_ylabel("simulator wall s")
    names.append(save_figure(fig, out, "sim_scaling.png"))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for policy, rows in report["cache_sizes"].items():
        ax.plot([r["kv_capacity_tokens"] for r in rows], [r["cached_fraction"] for r in rows],
                marker="o", label=policy)
    ax.set_xscale("log")
    ax.set_xlabel("KV capacity per worker (tokens)")
    ax.set_ylabel("cached fraction")
    ax.legend(fontsize=7)
    names.append(save_figure(fig, out, "cache_size.png"))
    return names + timed_plots(report["e2e_timed"], out, plt)
