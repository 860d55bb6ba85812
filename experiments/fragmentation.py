"""Phasor Fig. 6: KV fragmentation over time, with and without defragmentation.

A generation-heavy, bursty workload (Table 1 short/long, 128/2048 tokens, gamma arrivals with
CV 3 at 1.5× the nominal 4P4D rate) fills the decode workers' KV. Each tick the cluster
fragmentation % is 100 · Σ stranded / Σ free blocks over decode-capable workers (DESIGN.md
"Fragmentation"). Systems: Phasor, Phasor without defragmentation, DistServe. Writes
``fragmentation_timeseries.csv`` (t_s, system, fragmentation_pct, kv_used_pct),
``fragmentation.csv`` (per system: time-averaged and peak fragmentation, false OOMs, preemptions,
migrations, P99 TPOT), ``fragmentation.png`` and the summary.

    python experiments/fragmentation.py --out results/ [--quick]
"""

from __future__ import annotations

from typing import Any

import _common as c
import pandas as pd

NAME = "fragmentation"
DEFAULT_SYSTEMS = ("phasor", "phasor_no_defrag", "distserve")
WORKLOAD = "short_long"


def run(args: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(per-system table, time series)``."""
    cost = c.v100_cost_model()
    slo = c.SLOS[WORKLOAD]
    rate = 1.5 * c.nominal_rate_per_s(WORKLOAD, cost)
    n = 400 if args.quick else 2500
    wl = c.workload(WORKLOAD, rate, n, args.seed, cv=3.0)
    rows: list[dict[str, Any]] = []
    series: list[pd.DataFrame] = []
    for label in args.systems:
        res = c.run_system(c.SYSTEMS[label], wl, cost, slo, seed=args.seed, record_timeseries=True)
        m = res.metrics()
        ts = c.cluster_fragmentation_series(res)
        ts.insert(1, "system", label)
        series.append(ts)
        rows.append(
            {
                "system": label,
                "workload": WORKLOAD,
                "rate_per_s": rate,
                "requests": n,
                "fragmentation_pct": m["fragmentation_pct"],
                "peak_fragmentation_pct": float(ts["fragmentation_pct"].max()),
                "false_oom": m["false_oom"],
                "preemptions": m["preemptions"],
                "migrations": m["migrations"],
                "tpot_p99_s": m["tpot_p99_s"],
                "e2e_p99_s": m["e2e_p99_s"],
            }
        )
    return pd.DataFrame(rows), pd.concat(series, ignore_index=True)


def plot(series: pd.DataFrame) -> Any:
    fig, axes = c.new_figure(2, width_in=5.0)
    for label, grp in series.groupby("system", sort=False):
        axes[0].plot(grp["t_s"], grp["fragmentation_pct"], lw=0.8, label=str(label))
        axes[1].plot(grp["t_s"], grp["kv_used_pct"], lw=0.8, label=str(label))
    axes[0].set_ylabel("cluster fragmentation (% of free KV stranded)")
    axes[1].set_ylabel("decode KV used (%)")
    for ax in axes:
        ax.set_xlabel("time (s)")
        ax.legend(fontsize=7)
    return fig


def summarise(frame: pd.DataFrame) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    table = frame.set_index("system")
    for label, r in table.iterrows():
        rows.append(
            {
                "experiment": "Fig. 6 fragmentation",
                "quantity": f"time-averaged fragmentation, {label}",
                "pdopt_value": float(r["fragmentation_pct"]),
                "unit": "%",
                "detail": f"peak {r['peak_fragmentation_pct']:.1f}%, false OOMs "
                f"{int(r['false_oom'])}, migrations {int(r['migrations'])}, preemptions "
                f"{int(r['preemptions'])}",
            }
        )
    return rows


def main() -> None:
    args = c.parse_args(__doc__ or NAME, DEFAULT_SYSTEMS)
    timer = c.Timer()
    frame, series = run(args)
    c.save_csv(frame, args.out, NAME)
    c.save_csv(series, args.out, f"{NAME}_timeseries")
    c.save_figure(plot(series), args.out, NAME)
    c.save_summary(summarise(frame), args.out, NAME)
    print(f"{NAME}: {len(frame)} runs in {timer.elapsed_s():.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
