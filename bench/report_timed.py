"""The timed end-to-end part of the report: its table (with, for our router, how
exactly it predicted each run's cached tokens: ``bench.exactness``), the load at which
each router's TTFT p99 crosses the SLO, and its plots (``bench.e2e_timed`` results,
``runs`` keyed ``workload/workers/load/router``)."""

from __future__ import annotations

from pathlib import Path

from bench.exactness import describe


def save_figure(fig, out: Path, name: str) -> str:
    """Write ``fig`` as ``out/name`` (PNG) and return ``name``."""
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    fig.clear()
    return name


def _cells(results: dict) -> dict[tuple[str, str], dict[str, dict[str, dict]]]:
    """(workload, workers) -> load -> router -> run."""
    cells: dict[tuple[str, str], dict[str, dict[str, dict]]] = {}
    for key, r in results["runs"].items():
        workload, workers, load, setup = key.split("/", 3)
        cells.setdefault((workload, workers), {}).setdefault(load, {})[setup] = r
    return cells


def timed_table(results: dict) -> list[str]:
    """One row per run, best TTFT p99 of each cell in bold; then SLO crossings."""
    lines = [f"profile `{results['profile']}`, waits x{results['time_scale']:g} (times below are "
             f"profile seconds), TTFT SLO {results['slo_s']:g} s", "",
             "| workload | workers | load | router | cached | TTFT p50 ms | TTFT p99 ms | "
             "goodput req/s | max/mean | errors | CPU per worker | sent late p99 ms | "
             "predicted exact/over/under/in_flight |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (workload, workers), loads in _cells(results).items():
        for load, runs in loads.items():
            best = min(r["ttft_p99_s"] for r in runs.values())
            for setup, r in runs.items():
                p99 = f"{1e3 * r['ttft_p99_s']:.0f}"
                lines.append(f"| {workload} | {workers} | {load} | {setup} | {r['cached_fraction']:.3f} | "
                             f"{1e3 * r['ttft_p50_s']:.0f} | {f'**{p99}**' if r['ttft_p99_s'] == best else p99} | "
                             f"{r['goodput_rps']:.1f} | {r['max_over_mean_load']:.2f} | {r['num_errors']} | "
                             f"{r.get('worker_cpu_cores', float('nan')):.3f} | "
                             f"{1e3 * r.get('send_late_p99_s', float('nan')):.1f} | "
                             f"{describe(r)} |")
    return lines + ["", *slo_crossings(results)]


def readme_tables(results: dict) -> list[str]:
    """README-ready: per load, a row per (workload, workers) and a column per router,
    each cell TTFT p50 / p99 ms, cached fraction, goodput req/s (bold: the row's
    lowest p99); then the router CPU each setup needed in real time at the largest
    size."""
    cells = _cells(results)
    setups = list(results["setups"])
    lines = []
    for load in sorted({load for loads in cells.values() for load in loads}, key=_load_order):
        lines += [f"Load {load}: TTFT p50 / p99 ms, cached fraction, goodput req/s under "
                  f"{1e3 * results['slo_s']:g} ms", "",
                  "| workload | workers | " + " | ".join(setups) + " |",
                  "|---|---:|" + "---|" * len(setups)]
        for (workload, workers), loads in cells.items():
            runs = loads.get(load)
            if runs is None:
                continue
            best = min(r["ttft_p99_s"] for r in runs.values())
            lines.append(f"| {workload} | {workers} | " + " | ".join(
                _readme_cell(runs[s], best) if s in runs else "" for s in setups) + " |")
        lines.append("")
    return lines + _router_cpu(cells)


def _load_order(load: str) -> float:
    return float("inf") if load == "closed" else float(load)


def _readme_cell(r: dict, best_p99_s: float) -> str:
    p50, p99 = f"{1e3 * r['ttft_p50_s']:.0f}", f"{1e3 * r['ttft_p99_s']:.0f}"
    return (f"{p50} / {f'**{p99}**' if r['ttft_p99_s'] == best_p99_s else p99}, "
            f"{r['cached_fraction']:.2f}, {r['goodput_rps']:.0f}")


def _router_cpu(cells: dict) -> list[str]:
    """Per setup, the highest router CPU (cores at the profile's real time) and CPU
    per request over the runs at the largest worker count."""
    largest = max((int(workers) for _, workers in cells), default=0)
    peak: dict[str, tuple[float, float]] = {}
    for (_, workers), loads in cells.items():
        if int(workers) != largest:
            continue
        for runs in loads.values():
            for setup, r in runs.items():
                if "router_cpu_cores_real_time" in r:
                    cores, ms = peak.get(setup, (0.0, 0.0))
                    peak[setup] = (max(cores, r["router_cpu_cores_real_time"]),
                                   max(ms, r["router_cpu_ms_per_request"]))
    if not peak:
        return []
    return [f"Router CPU at {largest} workers (highest over its runs; cores the router would "
            "need at the profile's real request rate, and CPU ms per request): "
            + "; ".join(f"{setup} {cores:.2f} cores, {ms:.2f} ms" for setup, (cores, ms) in peak.items())
            + "."]


def slo_crossings(results: dict) -> list[str]:
    """Per cell swept over loads: the lowest load at which each router's p99 exceeded
    the SLO (none: it held at every load run)."""
    lines = []
    for (workload, workers), loads in _cells(results).items():
        numeric = sorted((float(load), runs) for load, runs in loads.items() if load != "closed")
        if len(numeric) < 2:
            continue
        crossing = {setup: next((f"{load:g}" for load, runs in numeric
                                 if runs.get(setup, {}).get("ttft_p99_s", 0) > results["slo_s"]), "none")
                    for setup in numeric[0][1]}
        lines.append(f"{workload}, {workers} workers: p99 over the SLO from load "
                     + ", ".join(f"{setup} {load}" for setup, load in crossing.items()) + ".")
    return lines


def timed_plots(results: dict, out: Path, plt) -> list[str]:
    """TTFT p99 against load per router (cells run at several loads) and cached
    fraction per router (every cell at its highest open-loop load)."""
    names = []
    cells = _cells(results)
    swept = [(cell, loads) for cell, loads in cells.items() if sum(load != "closed" for load in loads) > 1]
    if swept:
        fig, axes = plt.subplots(1, len(swept), figsize=(4.5 * len(swept), 3.5), squeeze=False)
        for ax, ((workload, workers), loads) in zip(axes[0], swept, strict=True):
            numeric = sorted((float(load), runs) for load, runs in loads.items() if load != "closed")
            for setup in numeric[0][1]:
                ax.plot([load for load, _ in numeric], [1e3 * runs[setup]["ttft_p99_s"] for _, runs in numeric],
                        marker="o", label=setup)
            ax.axhline(1e3 * results["slo_s"], color="grey", linestyle=":")
            ax.set_title(f"{workload}, {workers} timed workers", fontsize=8)
            ax.set_xlabel("load (fraction of capacity)")
            ax.set_ylabel("TTFT p99 (ms)")
            ax.set_yscale("log")
        axes[0][-1].legend(fontsize=6)
        names.append(save_figure(fig, out, "timed_ttft_p99_vs_load.png"))
    fig, axes = plt.subplots(1, len(cells), figsize=(3.2 * len(cells), 3.5), squeeze=False)
    for ax, ((workload, workers), loads) in zip(axes[0], cells.items(), strict=True):
        load = max((load for load in loads if load != "closed"), key=float, default="closed")
        setups = list(loads[load])
        ax.bar(setups, [loads[load][s]["cached_fraction"] for s in setups])
        ax.set_title(f"{workload}, {workers} workers, load {load}", fontsize=8)
        ax.tick_params(axis="x", labelrotation=90, labelsize=6)
    axes[0][0].set_ylabel("cached fraction")
    names.append(save_figure(fig, out, "timed_cached_fraction.png"))
    return names
