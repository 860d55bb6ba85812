"""Phasor Fig. 6: KV fragmentation over time — Phasor against the baselines under bursts.

The production mix (:mod:`_phasor`: Azure conversation trace with ``--traces``, else bursty
``phasor_mix``) and Code Generation (``phasor_s_l``, where decode KV binds) at the rates of
:data:`WORKLOADS` for :data:`DURATION_S` s (long enough to read the value at the paper's
t = 470 s), Phasor, DistServe and Splitwise from the same 4P4D split, under each KV
allocation policy of :data:`ALLOCATIONS` (``reserve_output``: a request reserves its expected
output at admission, the allocation under which the paper's fragmentation can arise;
``on_demand``: KV grows block by block). Each tick the cluster fragmentation % is
100 · Σ stranded / Σ free blocks over decode-capable workers (:func:`_common.
cluster_fragmentation_series`); reported: its per-tick mean and peak (``fragmentation_mean_pct``
and ``fragmentation_peak_pct`` of the run's metrics), its value at t = 470 s, and the old run
ratio Σ_t stranded / Σ_t free (``fragmentation_pct``). Writes
``fragmentation_timeseries.csv``, ``fragmentation.csv``, ``fragmentation.png`` and the summary.

The paper's fragmentation % is not defined in the paper (Fig. 6 plots it; no formula or
accounting is given), so no pdopt figure is its equal, and the per-tick % here is bounded by how
stranded blocks are counted (DESIGN.md "Fragmentation"). Reported beside it, a figure that can
be compared across systems: ``kv_fits_nowhere`` (and its % of requests), the requests that
waited for decode KV fitting on no worker although the cluster's free blocks together would
have held them (:func:`pdopt.sim._result.fits_nowhere`).

    python experiments/fragmentation.py --out results/ [--quick] [--traces DIR] [--model M]
        [--cost-model roofline|phasor] [--burstgpt CSV]
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import _common as c
import _phasor as ph
import numpy as np
import pandas as pd

NAME = "fragmentation"
WORKLOADS = {"phasor_mix": 20.0, "phasor_s_l": 10.0}
"""Workload → rate (req/s): the production mix, and Code Generation, the generation-heavy
workload of the paper's "Memory Fragmentation" scenario (§4.2), where decode KV binds."""
DURATION_S, QUICK_DURATION_S = 480.0, 10.0
PAPER_T_S = 470.0
ALLOCATIONS = ("reserve_output", "on_demand")


def _metrics_and_series(scenario: Any) -> tuple[pd.Series, pd.DataFrame]:
    """One run's metrics and cluster fragmentation series (:func:`_common.map_runs`' unit)."""
    res = scenario.run()
    return res.metrics(), c.cluster_fragmentation_series(res)


def run(args: Any, source: ph.MixSource) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(per system × allocation table, time series)``."""
    cost = ph.cost_model(args.cost_model, args.model)
    rows: list[dict[str, Any]] = []
    series: list[pd.DataFrame] = []
    duration = QUICK_DURATION_S if args.quick else DURATION_S
    grid: list[tuple[str, float, str, str, int]] = []
    scenarios = []
    for (name, rate), allocation in itertools.product(WORKLOADS.items(), ALLOCATIONS):
        wl = ph.workload(name, rate, duration, args.seed, source)
        for label in args.systems:
            system = c.SYSTEMS[label]
            cluster = c.system_cluster(system, cost, ph.testbed(args.model))
            workers = tuple(
                dataclasses.replace(w, kv_allocation=allocation) for w in cluster.workers
            )
            cluster = dataclasses.replace(cluster, workers=workers)
            scenarios.append(
                c.system_scenario(
                    system,
                    wl,
                    ph.slo(name),
                    cluster=cluster,
                    seed=args.seed,
                    record_timeseries=True,
                )
            )
            grid.append((name, rate, allocation, label, len(wl)))
    # every run is independent: serially or on --dask, its metrics and fragmentation series
    for (name, rate, allocation, label, n), (m, ts) in zip(
        grid, c.map_runs(_metrics_and_series, scenarios, args), strict=True
    ):
        ts.insert(1, "workload", name)
        ts.insert(2, "system", label)
        ts.insert(3, "kv_allocation", allocation)
        series.append(ts)
        at = ts[ts["t_s"] <= PAPER_T_S]
        rows.append(
            {
                "workload": name,
                "system": label,
                "kv_allocation": allocation,
                "rate_per_s": rate,
                "requests": n,
                "fragmentation_mean_pct": m["fragmentation_mean_pct"],
                "fragmentation_peak_pct": m["fragmentation_peak_pct"],
                "fragmentation_at_470s_pct": float(at["fragmentation_pct"].iloc[-1])
                if len(at) and ts["t_s"].max() >= PAPER_T_S
                else np.nan,
                "fragmentation_ratio_pct": m["fragmentation_pct"],
                "false_oom": m["false_oom"],
                "kv_fits_nowhere": m["kv_fits_nowhere"],
                "kv_fits_nowhere_pct": m["kv_fits_nowhere_pct"],
                "preemptions": m["preemptions"],
                "migrations": m["migrations"],
                "tpot_p99_s": m["tpot_p99_s"],
                "e2e_p99_s": m["e2e_p99_s"],
            }
        )
    return pd.DataFrame(rows), pd.concat(series, ignore_index=True)


def plot(series: pd.DataFrame) -> Any:
    panels = list(itertools.product(WORKLOADS, ALLOCATIONS))
    fig, axes = c.new_figure(len(panels), width_in=4.5)
    for ax, (name, allocation) in zip(axes, panels, strict=True):
        part = series[(series["kv_allocation"] == allocation) & (series["workload"] == name)]
        for label, grp in part.groupby("system", sort=False):
            ax.plot(grp["t_s"], grp["fragmentation_pct"], lw=0.8, label=str(label))
        ax.axvline(PAPER_T_S, c="k", ls=":")
        ax.set_title(f"{ph.TASKS[name]}, KV {allocation}", fontsize=9)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("cluster fragmentation (% of free KV stranded)")
        ax.legend(fontsize=7)
    return fig


def summarise(frame: pd.DataFrame, stated: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for _, r in frame.iterrows():
        for col, what in (
            ("fragmentation_mean_pct", "per-tick mean"),
            ("fragmentation_peak_pct", "per-tick peak"),
            ("fragmentation_at_470s_pct", "at t = 470 s"),
            ("kv_fits_nowhere_pct", "as requests fitting no worker (% of requests)"),
        ):
            if np.isnan(r[col]):
                continue  # a run shorter than 470 s (--quick)
            rows.append(
                {
                    "experiment": "Fig. 6 fragmentation",
                    "quantity": f"{ph.TASKS[r['workload']]} fragmentation {what}, "
                    f"{r['kv_allocation']}, {r['system']}",
                    "pdopt_value": float(r[col]),
                    "unit": "%",
                    "detail": f"old run ratio {r['fragmentation_ratio_pct']:.3g}%, false OOMs "
                    f"{int(r['false_oom'])}, migrations {int(r['migrations'])}, preemptions "
                    f"{int(r['preemptions'])}; {r['rate_per_s']:g} req/s; {stated}",
                }
            )
    return rows


def main() -> None:
    args = ph.parse_args(__doc__ or NAME, ph.HEAD_TO_HEAD)
    timer = c.Timer()
    source = ph.mix_source(args)
    frame, series = run(args, source)
    c.save_csv(frame, args.out, NAME)
    c.save_csv(series, args.out, f"{NAME}_timeseries")
    c.save_figure(plot(series), args.out, NAME)
    c.save_summary(summarise(frame, ph.stated(args, source)), args.out, NAME)
    print(frame.round(3).to_string(index=False))
    print(f"{NAME}: {len(frame)} runs in {timer.elapsed_s():.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
