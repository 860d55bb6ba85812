"""Phasor Fig. 4/10: the latency panorama — P99 TTFT, TPOT and E2E versus request rate.

Phasor, DistServe and Splitwise on the 8-GPU V100 / Qwen2.5-7B cluster, for each Table 1
workload, Poisson arrivals at 0.5×, 0.8×, 1.1× and 1.4× a back-of-envelope 4P4D service rate
(:func:`_common.nominal_rate_per_s`). Writes ``latency_panorama.csv`` (one row per system ×
workload × rate), ``latency_panorama.png`` and ``latency_panorama_summary.csv`` (Phasor's P99
E2E over each baseline's at the top rate, geometric mean over workloads).

    python experiments/latency_panorama.py --out results/ [--quick]
"""

from __future__ import annotations

from typing import Any

import _common as c
import numpy as np
import pandas as pd

NAME = "latency_panorama"
DEFAULT_SYSTEMS = ("phasor", "distserve", "splitwise")
RATE_FACTORS = (0.5, 0.8, 1.1, 1.4)
QUICK_RATE_FACTORS = (0.6, 1.0, 1.4)


def sweep(args: Any) -> pd.DataFrame:
    """Simulate every system × workload × rate; one row of P99 metrics each."""
    cost = c.v100_cost_model()
    workloads = ("production_mix",) if args.quick else c.PHASOR_WORKLOADS
    factors = QUICK_RATE_FACTORS if args.quick else RATE_FACTORS
    rows: list[dict[str, Any]] = []
    for name in workloads:
        slo = c.SLOS[name]
        nominal = c.nominal_rate_per_s(name, cost)
        for factor in factors:
            rate = nominal * factor
            floor, cap = (150, 200) if args.quick else (400, 2000)
            n = c.requests_for(name, cost, rate, floor, cap)
            wl = c.workload(name, rate, n, args.seed)
            for label in args.systems:
                m = c.run_system(c.SYSTEMS[label], wl, cost, slo, seed=args.seed).metrics()
                rows.append(
                    {
                        "system": label,
                        "workload": name,
                        "rate_factor": factor,
                        "rate_per_s": rate,
                        "requests": n,
                        "ttft_p99_s": m["ttft_p99_s"],
                        "tpot_p99_s": m["tpot_p99_s"],
                        "e2e_p99_s": m["e2e_p99_s"],
                        "slo_attainment": m["slo_attainment"],
                        "goodput_rps": m["goodput_rps"],
                    }
                )
    return pd.DataFrame(rows)


def plot(frame: pd.DataFrame, args: Any) -> None:
    """One row of three panels (TTFT, TPOT, E2E P99, log scale) per workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(frame["workload"]))
    fig, axes = plt.subplots(len(workloads), 3, figsize=(11, 2.6 * len(workloads)), squeeze=False)
    for i, name in enumerate(workloads):
        sub = frame[frame["workload"] == name]
        for j, metric in enumerate(("ttft_p99_s", "tpot_p99_s", "e2e_p99_s")):
            ax = axes[i][j]
            for label, grp in sub.groupby("system", sort=False):
                ax.plot(grp["rate_per_s"], grp[metric], marker="o", label=str(label))
            ax.set_yscale("log")
            ax.set_xlabel("rate (req/s)")
            ax.set_ylabel(f"{metric.split('_')[0].upper()} P99 (s)")
            ax.set_title(name, fontsize=9)
            if metric != "e2e_p99_s":
                slo = c.SLOS[name]
                ax.axhline(slo.ttft_s if metric == "ttft_p99_s" else slo.tpot_s, ls=":", c="k")
        axes[i][0].legend(fontsize=7)
    c.save_figure(fig, args.out, NAME)


def summarise(frame: pd.DataFrame, args: Any) -> list[dict[str, Any]]:
    """Phasor's P99 E2E relative to each baseline, at the top rate of each workload."""
    rows: list[dict[str, Any]] = []
    if "phasor" not in args.systems:
        return rows
    for base in (s for s in args.systems if s != "phasor"):
        ratios = []
        for _, sub in frame.groupby("workload"):
            top = sub[sub["rate_factor"] == sub["rate_factor"].max()].set_index("system")
            ratios.append(float(top.loc["phasor", "e2e_p99_s"] / top.loc[base, "e2e_p99_s"]))
        rows.append(
            {
                "experiment": "Fig. 4/10 latency panorama",
                "quantity": f"P99 E2E phasor/{base} at the top rate (geo-mean)",
                "pdopt_value": float(np.exp(np.mean(np.log(ratios)))),
                "unit": "ratio",
                "detail": f"{len(ratios)} workloads; per workload: "
                + ", ".join(f"{r:.2f}" for r in ratios),
            }
        )
    return rows


def main() -> None:
    args = c.parse_args(__doc__ or NAME, DEFAULT_SYSTEMS)
    timer = c.Timer()
    frame = sweep(args)
    c.save_csv(frame, args.out, NAME)
    plot(frame, args)
    c.save_summary(summarise(frame, args), args.out, NAME)
    print(f"{NAME}: {len(frame)} runs in {timer.elapsed_s():.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
